"""The thinker's hidden states for the talker, taken from inside vLLM.

Owns: ``HiddenCapture``, a vLLM worker extension (``worker_extension_cls``)
that records, during each prompt's prefill, the thinker's hidden state at
one layer for the prompt's media placeholder positions (Qwen3-Omni's talker
reads them through its hidden projection), and hands them out by request
over ``collective_rpc``, with what the processor measured of the media
(image / video grids, audio feature lengths).  Does not own what the
thinker stage does with them (``vllm_engine.py`` sends them on as a chunk)
nor the talker (``talker_engine.py``).

What of vLLM this leans on (vLLM 0.32; docs/engines.md lists it too):

- ``worker_extension_cls`` and ``collective_rpc``, vLLM's supported way to
  add methods to its workers and call them;
- the thinker's own class, ``vllm_thinker.CapturingThinker`` (vLLM's
  Qwen3-Omni thinker whose decoder layer writes its output into a buffer
  through a custom op), whose forward hands the step's rows to the sink
  set here: it survives compilation and piecewise CUDA graphs;
- the model runner's per-step buffers, read in the sink to map the batch's
  token rows to requests: ``input_batch.req_ids``, ``query_start_loc``,
  ``input_ids`` and ``positions``; and ``requests[id].mm_features`` for the
  media's grids.  These are internals: a vLLM upgrade that renames them
  breaks the capture loudly (an ``AttributeError`` at the first prefill).

vLLM's decoder layers return the hidden state and the residual apart; the
reference's ``hidden_states[k]`` is their sum (before the deepstack visual
features are added), which is what is recorded.
Captures of requests nobody takes are bounded (oldest dropped first).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Requests whose captures are kept until taken (a thinker request nobody
#: speaks, with media, leaves one behind until this many are newer).
MAX_KEPT = 256


class HiddenCapture:
    """Mixed into vLLM's worker by ``worker_extension_cls``; ``self`` is the
    worker (``self.model_runner`` is vLLM's)."""

    def omnix_capture_start(self, layer: int, media_ids: list[int]) -> None:
        """Record the thinker's hidden layer ``layer`` (the output of decoder
        layer ``layer - 1``, the reference's ``hidden_states[layer]``) at
        tokens whose id is in ``media_ids``: the sink of the model, which
        must be ``CapturingThinker`` built for that layer."""
        import torch

        from omnix.engines.vllm_plugin import THINKER_ARCHITECTURE

        runner: Any = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model()
        if not hasattr(model, "omnix_sink"):
            raise ValueError(
                f"the thinker runs {type(model).__name__}, not {THINKER_ARCHITECTURE}: talker_context "
                "needs omnix's vLLM plugin installed (pip install -e . registers it)"
            )
        built, _ = capture_settings(Path(runner.model_config.model))
        if built != layer:
            raise ValueError(f"the thinker captures layer {built}, asked for {layer}")
        self._omnix_kept: OrderedDict[str, tuple[list[Any], dict[str, Any]]] = OrderedDict()
        media = torch.tensor(sorted(media_ids))

        def sink(total: Any) -> None:
            try:
                self._omnix_record(runner, total, media)
            except Exception:
                # A capture that breaks must not take the thinker down with
                # it: the talker then fails for want of the hidden states.
                log.exception("hidden-state capture failed; it is off from now on")
                model.omnix_sink = None

        model.omnix_sink = sink

    def _omnix_record(self, runner: Any, total: Any, media: Any) -> None:
        import torch

        batch = runner.input_batch
        n = batch.num_reqs
        if n == 0:
            return
        starts = runner.query_start_loc.np[: n + 1]
        ids = runner.input_ids.cpu[: int(starts[-1])]
        hit = torch.isin(ids, media)
        if not bool(hit.any()):
            return
        positions = runner.positions[: int(starts[-1])].cpu()
        for i, rid in enumerate(batch.req_ids[:n]):
            a, b = int(starts[i]), int(starts[i + 1])
            prompt = runner.requests[rid].prompt_token_ids or ()
            rows = hit[a:b] & (positions[a:b] < len(prompt))
            if bool(rows.any()):
                if rid not in self._omnix_kept:
                    # The grids now: the request's state goes when it ends.
                    self._omnix_kept[rid] = ([], _grids(runner.requests[rid].mm_features))
                self._omnix_kept[rid][0].append(total[a:b][rows.to(total.device)].float().cpu())
                self._omnix_kept.move_to_end(rid)
        while len(self._omnix_kept) > MAX_KEPT:
            self._omnix_kept.popitem(last=False)

    def omnix_capture_take(self, request_id: str) -> dict[str, Any]:
        """The recorded rows of the request vLLM knows as ``request_id``
        (or ``request_id-<suffix>``: vLLM adds one), and its media's grids,
        as plain data (``collective_rpc`` results travel as msgpack):
        ``{"rows": float32 bytes, "shape": [m, hidden], "grids": {...}}``;
        ``rows`` is empty when the prompt had no media.  Read it back with
        ``read_capture``."""
        import torch

        rid = next((k for k in self._omnix_kept if _same(k, request_id)), None)
        if rid is None:
            return {"rows": b"", "shape": [0, 0], "grids": {}}
        rows, grids = self._omnix_kept.pop(rid)
        whole = torch.cat(rows).contiguous()
        return {"rows": whole.numpy().tobytes(), "shape": list(whole.shape), "grids": grids}


def read_capture(result: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``omnix_capture_take``'s answer as (float32 array [m, hidden] or
    None, grids)."""
    import numpy as np

    shape = tuple(int(n) for n in result["shape"])
    data = result["rows"]
    rows = np.frombuffer(bytes(data), dtype=np.float32).reshape(shape) if data else None
    return rows, dict(result["grids"])


def _same(internal: str, external: str) -> bool:
    return internal == external or internal.startswith(external + "-")


def _grids(features: list[Any]) -> dict[str, Any]:
    """What the talker's positions need of the media, from vLLM's processed
    items: image / video grids (t, h, w), audio feature lengths, a video's
    seconds per temporal patch, and whether videos were heard with their
    sound (Qwen3-Omni's ``use_audio_in_video``: the talker's positions
    interleave the two as the thinker's did)."""
    out: dict[str, Any] = {}
    for feature in features or ():
        data = feature.data
        if data is None:
            continue
        if "use_audio_in_video" in data and bool(data["use_audio_in_video"].data.reshape(-1)[0]):
            out["use_audio_in_video"] = True
        for key, name, width in (
            ("image_grid_thw", "image_grid_thw", 3),
            ("video_grid_thw", "video_grid_thw", 3),
            ("audio_feature_lengths", "audio_seqlens", 0),
            ("video_second_per_grid", "video_second_per_grid", 0),
            # vLLM's name for it (the processor's output, renamed)
            ("second_per_grid_ts", "video_second_per_grid", 0),
        ):
            if key in data:
                value = data[key].data
                rows = value.reshape(-1, width) if width else value.reshape(-1)
                out.setdefault(name, []).extend(rows.tolist())
    return out


def capture_settings(folder: Path) -> tuple[int, list[int]]:
    """From a Qwen3-Omni folder's ``config.json``: the thinker layer its
    talker reads (``talker_config.accept_hidden_layer``) and the thinker's
    media placeholder ids (audio, image, video)."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    talker, thinker = cfg.get("talker_config"), cfg.get("thinker_config")
    if not talker or not thinker or "accept_hidden_layer" not in talker:
        raise ValueError(
            f"{folder}/config.json has no talker_config.accept_hidden_layer: talker_context "
            "is for a Qwen3-Omni thinker whose checkpoint has its talker"
        )
    ids = [
        thinker[k] for k in ("audio_token_id", "image_token_id", "video_token_id") if k in thinker
    ]
    return int(talker["accept_hidden_layer"]), ids
