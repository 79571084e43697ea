"""Run the reference (``qwen-tts``) on a Qwen3-TTS folder, in ITS environment.

Owns: the script the reference environment's Python runs (never imported
by omnix: scripts/reference-env.sh builds that environment, with
transformers 4.57.3 there, 5.19 here, so it cannot run in-process).
``omnix.testing.qwen3_tts_oracle`` starts it for the oracle tests
(tests/engines/test_qwen3_tts.py) and ``omnix bench tts``.

    python qwen3_tts_reference.py FOLDER CASES.json OUT.json

Loads FOLDER with ``Qwen3TTSModel.from_pretrained``, reports which tensors
of the checkpoint the reference's modules lack or miss, then for each case
calls the reference's own ``generate_custom_voice`` (for a VoiceDesign
folder ``generate_voice_design``, for a Base folder ``generate_voice_clone``
from a case's ``ref_audio``, ``ref_text`` and ``x_vector_only``) greedy (the talker and its code
predictor), capturing the codes its ``generate`` returns on the way, and
writes the codes and the waveform the reference's decoder made of them.
A case ``{"decode": codes}`` runs the reference's decoder alone.  A case
``{"batch": [case, ...], "timed": true}`` runs its cases as one batched
call (the reference's own batching) and, being timed, writes only each
row's frames and samples beside the call's wall ``seconds`` (every case
has its ``seconds``: the reference does not stream, so its first audio is
its whole answer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _key_diff(module, files: list[Path], prefix: str = "") -> dict[str, list[str]]:
    from safetensors import safe_open

    stored: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            stored |= {k for k in fh.keys() if k.startswith(prefix)}
    have = set(module.state_dict())
    return {"missing": sorted(have - stored), "unexpected": sorted(stored - have)}


def _speak(tts, rows: list[dict]):
    """The reference's greedy call over ``rows`` (one row: not a batch):
    its waveforms, their rate, and for a Base folder (one row) the clone
    prompt's speaker vector and reference codes."""

    def field(key: str, default=None):
        values = [r.get(key, default) for r in rows]
        return values[0] if len(rows) == 1 else values

    first = rows[0]
    common = {
        "text": field("text"),
        "language": field("language", "Auto"),
        "non_streaming_mode": first.get("non_streaming", True),
        "do_sample": False,
        "subtalker_dosample": False,
        "max_new_tokens": first["max_new_tokens"],
    }
    kind = tts.model.tts_model_type
    if kind == "base":
        ref = {
            "ref_audio": first["ref_audio"],
            "ref_text": first.get("ref_text"),
            "x_vector_only_mode": first.get("x_vector_only", False),
        }
        (item,) = tts.create_voice_clone_prompt(**ref)
        clone = {
            "speaker": [float(x) for x in item.ref_spk_embedding.float()],
            "ref_codes": None if item.ref_code is None else item.ref_code.tolist(),
        }
        return (*tts.generate_voice_clone(**ref, **common), clone)
    if kind == "voice_design":
        instruct = field("instruct")
        instruct = [i or "" for i in instruct] if isinstance(instruct, list) else instruct or ""
        return (*tts.generate_voice_design(instruct=instruct, **common), {})
    voice = tts.generate_custom_voice(
        speaker=field("speaker"), instruct=field("instruct"), **common
    )
    return (*voice, {})


def main(folder: str, cases_path: str, out_path: str) -> None:
    import torch
    from qwen_tts import Qwen3TTSModel  # type: ignore[import-not-found]

    torch.set_num_threads(1)
    root = Path(folder)
    tts = Qwen3TTSModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    speech = tts.model.speech_tokenizer.model
    keys = {
        "model": _key_diff(tts.model, sorted(root.glob("*.safetensors"))),
        "speech_tokenizer": _key_diff(speech, [root / "speech_tokenizer" / "model.safetensors"]),
    }
    captured: list = []
    generate = tts.model.generate

    def capture(*args, **kwargs):
        out = generate(*args, **kwargs)
        captured.append(out[0])
        return out

    tts.model.generate = capture
    results = []
    for case in json.loads(Path(cases_path).read_text()):
        if "decode" in case:  # the decoder alone, on given codes
            codes = torch.tensor(case["decode"])
            wavs, rate = tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
            results.append(
                {"codes": case["decode"], "wav": [float(x) for x in wavs[0]], "sample_rate": rate}
            )
            continue
        captured.clear()
        rows = case.get("batch") or [case]
        start = time.perf_counter()
        wavs, rate, clone = _speak(tts, rows)
        seconds = time.perf_counter() - start
        if case.get("timed"):
            results.append(
                {
                    "seconds": seconds,
                    "frames": [len(c) for c in captured[0]],
                    "samples": [len(w) for w in wavs],
                    "sample_rate": rate,
                }
            )
            continue
        codes = captured[0][0]
        results.append(
            {
                "codes": codes.tolist(),
                "wav": [float(x) for x in wavs[0]],
                "sample_rate": rate,
                "seconds": seconds,
                **clone,
            }
        )
    Path(out_path).write_text(json.dumps({"keys": keys, "results": results}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
