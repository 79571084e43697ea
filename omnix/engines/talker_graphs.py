"""The talker's decode step and code predictor frame over static buffers,
captured as CUDA graphs per batch bucket.

Owns: ``TalkerGraphs``, which keeps every decoding request of a talker in a
*slot* (a row of static buffers: its KV cache in one buffer per layer, its
length, rope offset, last code and hidden state, the codes it has emitted
for the repetition penalty, its sampling values), and runs a step of the
first ``B`` slots as two functions of those buffers alone:

- ``frame``: the code predictor completes each row's frame (the whole
  15-step loop, each chosen code feeding the next embedding) and sums the
  frame's sixteen code embeddings;
- ``step``: that sum plus the row's text vector through the talker's
  backbone (each row's key and value written at its own length, attention
  masked to it), the codec head and the first-group choice.

Rows whose next text is not in yet stay in their slots but are inactive:
their outputs are not kept and their lengths do not move (what the step
wrote at their next position is written again when they step).  Slots are
kept dense: a request that leaves gives its slot to the last one.

On CUDA each ``(function, bucket)`` is compiled first (``torch.compile``,
optional) and captured as a CUDA graph at start; a step then replays two
graphs and copies one small result to the host.  Buckets are batch sizes
(1, 2, 4, ...): a step of ``n`` rows runs the smallest bucket that holds
its slots.  Off CUDA (tests, CPU) the same functions run eagerly.

Does not own the prefill (eager, ``TalkerModel.prefill``: its cache is
copied into a slot), nor scheduling (``talker_engine.py``).  Greedy, a
graphed step equals ``TalkerModel.step`` code for code in float32 (the
device tests hold it); compiled kernels are not bit-equal (docs/engines.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import apply_rotary_pos_emb

from omnix.engines.talker_choose import RowSampling, choose_first, choose_residual
from omnix.engines.talker_model import PREDICTOR_TOP_K, PREDICTOR_TOP_P, Sampling

if TYPE_CHECKING:
    from omnix.engines.talker_model import TalkerModel

log = logging.getLogger(__name__)

#: The batch sizes captured by default (vLLM captures sizes alike).
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32)


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, unseen: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query position per row against its slot's whole cache: ``q``
    [b, kv_heads, group, head_dim], ``keys``/``values`` [b, kv_heads,
    max_len, head_dim], ``unseen`` [b, 1, 1, max_len] true past each row's
    length.  Two batched matmuls and a float32 softmax: SDPA runs this
    shape as a masked prefill, at half of a graphed step's time on an H100
    (docs/bench.md)."""
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() * scale
    probs = torch.softmax(scores.masked_fill(unseen, float("-inf")), dim=-1)
    return torch.matmul(probs.to(values.dtype), values)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n`` rows."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest captured batch bucket ({max(buckets)})")


def _capturable_experts(talker: Any, dtype: torch.dtype) -> None:
    """transformers' MoE experts in an implementation a graph can hold:
    its eager loop routes with ``nonzero()`` (a host sync), and its
    ``grouped_mm`` falls back to a host copy below bfloat16's kernels."""
    if not hasattr(talker, "set_experts_implementation"):
        return  # a dense talker (Qwen3-TTS's): no experts
    impl = talker.config.text_config._experts_implementation
    if impl == "eager" or (impl == "grouped_mm" and dtype != torch.bfloat16):
        log.info("talker experts: %s -> batched_mm (capturable)", impl)
        talker.set_experts_implementation("batched_mm")


@dataclass
class StepResult:
    """A step's host copy: each active row's frame and next first code."""

    frames: list[list[int]]
    codes: list[int]


class TalkerGraphs:
    """Static-buffer decoding for one ``TalkerModel`` (see the module doc)."""

    def __init__(
        self,
        model: TalkerModel,
        *,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        max_len: int = 4096,
        capture: bool | None = None,
        compile: bool = True,
    ) -> None:
        if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"graph buckets must be increasing sizes >= 1, got {list(buckets)}")
        self.model = model
        self.buckets = tuple(buckets)
        self.slots = self.buckets[-1]
        self.max_len = max_len
        dev = model.device
        self.capture = (dev.type == "cuda") if capture is None else capture
        if self.capture and dev.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the talker is on {dev}")
        self.compile = compile and self.capture
        talker = model.talker
        if self.capture:
            _capturable_experts(talker, model.dtype)
        text = talker.config.text_config
        self.hidden_size = int(text.hidden_size)
        self.kv_heads = int(text.num_key_value_heads)
        self.head_dim = int(
            getattr(text, "head_dim", 0) or text.hidden_size // text.num_attention_heads
        )
        self.vocab = int(text.vocab_size)
        pred = talker.code_predictor
        self.groups = model.layout.num_code_groups
        self.pred_vocab = int(pred.config.vocab_size)
        S, H, dt = self.slots, self.hidden_size, model.dtype

        def z(*shape: int, dtype: Any = dt) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=dev)

        layers = len(talker.model.layers)
        # [slots, kv_heads, max_len, head_dim]: the first b slots are one
        # contiguous batch of matrices, so attention is two plain batched
        # matmuls with no copy of the cache.
        kv = (S, self.kv_heads, max_len, self.head_dim)
        self.keys = [z(*kv) for _ in range(layers)]
        self.values = [z(*kv) for _ in range(layers)]
        self.lengths = z(S, dtype=torch.long)
        self.delta = z(S, dtype=torch.long)
        self.active = z(S, dtype=torch.bool)
        self.codes = z(S, dtype=torch.long)
        self.hidden = z(S, H)
        self.text = z(S, H)
        self.total = z(S, H)
        self.frames = z(S, self.groups, dtype=torch.long)
        self.seen = z(S, self.vocab, dtype=torch.bool)
        self.noise = torch.ones(S, self.vocab, dtype=torch.float32, device=dev)
        self.pnoise = torch.ones(
            S, self.groups - 1, self.pred_vocab, dtype=torch.float32, device=dev
        )
        self.rows = RowSampling(
            temperature=z(S, dtype=torch.float32),
            top_k=z(S, dtype=torch.long),
            top_p=torch.ones(S, dtype=torch.float32, device=dev),
            penalty=torch.ones(S, dtype=torch.float32, device=dev),
        )
        self.suppressed = z(self.vocab, dtype=torch.bool)
        self.suppressed[list(model.layout.suppressed)] = True
        self.eos = model.layout.codec_eos
        #: first codes each row must still choose before its end of speech
        #: may be one (``Sampling.min_tokens``)
        self.eos_wait = z(S, dtype=torch.long)
        self._positions = torch.arange(max_len, device=dev)
        self._slot_ids = torch.arange(S, device=dev)
        self.samplings: list[Sampling | None] = [None] * S
        self.used = 0  # slots 0 .. used-1 hold requests
        self._graphs: dict[int, tuple[Any, Any]] = {}
        self._copied = torch.cuda.Event() if self.capture else None
        self._frame_fn: Callable[[int], None] = self._frame
        self._step_fn: Callable[[int], None] = self._step
        self.capture_s = 0.0

    # -- the two functions ----------------------------------------------------

    def _rows(self, b: int) -> RowSampling:
        r = self.rows
        return RowSampling(r.temperature[:b], r.top_k[:b], r.top_p[:b], r.penalty[:b])

    def _frame(self, b: int) -> None:
        """The code predictor on slots ``0..b-1``: ``frames`` and ``total``."""
        model = self.model
        predictor = model.talker.code_predictor
        rows = self._rows(b)
        first = self.codes[:b]
        first_embed = model.talker.get_input_embeddings()(first)
        backbone = model._predictor
        backbone.start()
        inputs = torch.stack([self.hidden[:b], first_embed], dim=1)
        total = first_embed
        out = [first]
        project = model._to_predictor  # Qwen3-TTS's width change; None for Qwen3-Omni
        for g in range(self.groups - 1):
            last = backbone.forward(inputs if project is None else project(inputs))
            logits = predictor.lm_head[g](last)
            code = choose_residual(
                logits, rows, PREDICTOR_TOP_K, PREDICTOR_TOP_P, self.pnoise[:b, g]
            )
            out.append(code)
            inputs = predictor.model.codec_embedding[g](code)[:, None]
            total = total + inputs[:, 0]
        self.frames[:b].copy_(torch.stack(out, dim=1))
        self.total[:b].copy_(total)

    def _step(self, b: int) -> None:
        """The backbone on ``total + text`` of slots ``0..b-1``, each row at
        its own length; the next first codes and hidden states of the
        active rows, their lengths advanced."""
        talker = self.model.talker
        L, hd = self.max_len, self.head_dim
        lengths = self.lengths[:b]
        active = self.active[:b]
        h = (self.total[:b] + self.text[:b])[:, None]  # [b, 1, H]
        pos = (lengths + self.delta[:b])[None, :, None].expand(3, b, 1)
        cos, sin = talker.model.rotary_emb(h, pos)
        # A full row waiting (never stepped: the engine ends it) writes
        # inside its own slot all the same.
        at = (
            torch.arange(b, device=h.device)[:, None],
            torch.arange(self.kv_heads, device=h.device)[None, :],
            lengths.clamp_max(L - 1)[:, None],
        )
        unseen = (self._positions[None, :] > lengths[:, None])[:, None, None, :]  # [b, 1, 1, L]
        for i, layer in enumerate(talker.model.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_norm(a.q_proj(x).view(b, 1, -1, hd)).transpose(1, 2)
            k = a.k_norm(a.k_proj(x).view(b, 1, -1, hd)).transpose(1, 2)
            v = a.v_proj(x).view(b, 1, -1, hd).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            self.keys[i].index_put_(at, k[:, :, 0])
            self.values[i].index_put_(at, v[:, :, 0])
            # One query position: a KV head's query heads become its queries.
            qg = q.reshape(b, self.kv_heads, -1, hd)
            att = _attend(qg, self.keys[i][:b], self.values[i][:b], unseen, a.scaling)
            h = h + a.o_proj(att.reshape(b, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = talker.model.norm(h)[:, 0]
        logits = talker.codec_head(hidden)
        early = self.eos_wait[:b] > 0
        logits[:, self.eos] = logits[:, self.eos].masked_fill(early, float("-inf"))
        code = choose_first(logits, self.seen[:b], self.suppressed, self._rows(b), self.noise[:b])
        self.eos_wait[:b].sub_((early & active).long())
        self.codes[:b].copy_(torch.where(active, code, self.codes[:b]))
        self.hidden[:b].copy_(torch.where(active[:, None], hidden, self.hidden[:b]))
        self.lengths[:b].add_(active.long())
        mark = F.one_hot(code, self.vocab).bool() & active[:, None]
        self.seen[:b].logical_or_(mark)

    # -- start: compile and capture --------------------------------------------

    def prepare(self, progress: Callable[[str], None] | None = None) -> None:
        """Compile (if asked) and capture every bucket; a no-op off CUDA."""
        if not self.capture:
            return
        start = time.perf_counter()
        if self.compile:
            self._frame_fn = torch.compile(self._frame)
            self._step_fn = torch.compile(self._step)
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for b in self.buckets:
            t0 = time.perf_counter()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):  # compiles, then settles allocations
                    self._frame_fn(b)
                    self._step_fn(b)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            frame, step = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.inference_mode():
                with torch.cuda.graph(frame, pool=pool):
                    self._frame_fn(b)
                with torch.cuda.graph(step, pool=pool):
                    self._step_fn(b)
            self._graphs[b] = (frame, step)
            if progress is not None:
                progress(f"talker graphs: batch {b} ready in {time.perf_counter() - t0:.1f} s")
        self._reset_rows()
        self.capture_s = time.perf_counter() - start

    def _reset_rows(self) -> None:
        """What warming up wrote into the buffers, forgotten."""
        for t in (self.lengths, self.delta, self.codes, self.hidden, self.text, self.total):
            t.zero_()
        self.active.zero_()
        self.seen.zero_()

    # -- slots ------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.slots - self.used

    def join(
        self, cache: Any, length: int, rope_delta: int, generated: list[int], code: int,
        hidden: torch.Tensor, sampling: Sampling,
    ) -> int:  # fmt: skip
        """A prefilled request takes the next slot: its cache (a
        ``DynamicCache`` of ``length`` positions), its codes so far, its
        current first code and hidden state.  Returns the slot."""
        if self.used >= self.slots:
            raise RuntimeError(f"every one of the {self.slots} talker slots is taken")
        if length >= self.max_len:
            raise ValueError(
                f"the talker's prefill has {length} positions but its graphs hold "
                f"{self.max_len}: raise the talker's max_len or shorten the prompt"
            )
        s = self.used
        with torch.inference_mode():
            for i, layer in enumerate(cache.layers):
                # DynamicCache rows are [1, kv_heads, n, head_dim].
                self.keys[i][s, :, :length].copy_(layer.keys[0])
                self.values[i][s, :, :length].copy_(layer.values[0])
            self.lengths[s] = length
            self.delta[s] = rope_delta
            self.codes[s] = code
            self.hidden[s].copy_(hidden)
            self.seen[s].zero_()
            if generated:
                self.seen[s, torch.tensor(sorted(set(generated)), device=self.seen.device)] = True
            r = self.rows
            r.temperature[s] = max(sampling.temperature, 0.0)
            r.top_k[s] = sampling.top_k
            r.top_p[s] = sampling.top_p
            r.penalty[s] = sampling.repetition_penalty
            self.eos_wait[s] = max(0, self.model.end_held_for(sampling) - len(generated))
        self.samplings[s] = sampling
        self.used += 1
        return s

    def leave(self, slot: int) -> int | None:
        """Free ``slot``; the last slot's request moves into it.  Returns the
        slot that moved (its request is now at ``slot``), or None."""
        last = self.used - 1
        if not 0 <= slot <= last:
            raise ValueError(f"slot {slot} is not in use ({self.used} are)")
        self.used = last
        if slot == last:
            self.samplings[last] = None
            self.lengths[last] = 0
            return None
        with torch.inference_mode():
            n = int(self.lengths[last]) + 1
            for k, v in zip(self.keys, self.values, strict=True):
                k[slot, :, :n].copy_(k[last, :, :n])
                v[slot, :, :n].copy_(v[last, :, :n])
            for t in (self.lengths, self.delta, self.codes, self.hidden, self.seen, self.eos_wait):
                t[slot].copy_(t[last])
            r = self.rows
            for t in (r.temperature, r.top_k, r.top_p, r.penalty):
                t[slot].copy_(t[last])
            self.lengths[last] = 0
        self.samplings[slot], self.samplings[last] = self.samplings[last], None
        return last

    def length(self, slot: int) -> int:
        return int(self.lengths[slot])

    # -- a step -------------------------------------------------------------

    def step(self, active: dict[int, torch.Tensor]) -> StepResult:
        """One decode step: the slots in ``active`` (slot -> its text vector
        [H]) step, the others in use wait.  Returns, in the order of
        ``active``, each row's frame (the codes of the frame it finished) and
        its next first code."""
        if not active:
            return StepResult([], [])
        b = bucket_for(self.used, self.buckets)
        rows = list(active)
        with torch.inference_mode():
            self.active.zero_()
            if rows == list(range(len(rows))):  # every slot in use steps: the usual case
                index = self._slot_ids[: len(rows)]
            else:
                # Pinned, so the copy does not wait for the device's queue.
                host = torch.tensor(rows, pin_memory=self.capture)
                index = host.to(self.active.device, non_blocking=True)
            self.active[index] = True
            self.text[index] = torch.stack(list(active.values())).to(self.text.dtype)
            for s in rows:
                sampling = self.samplings[s]
                if sampling is not None and sampling.temperature > 0:
                    self.noise[s].exponential_(generator=sampling.generator)
                    self.pnoise[s].exponential_(generator=sampling.generator)
            if self.capture:
                frame, step = self._graphs[b]
                frame.replay()
                step.replay()
            else:
                self._frame(b)
                self._step(b)
            both = torch.cat([self.frames[index], self.codes[index, None]], dim=1)
            rows_out = self._to_host(both)
        return StepResult([row[:-1] for row in rows_out], [row[-1] for row in rows_out])

    def _to_host(self, t: torch.Tensor) -> list[list[int]]:
        """``t.tolist()``, waiting for the GPU with the GIL released: a
        plain ``tolist`` holds it through the step's kernels, starving the
        event loop's and the decoder's threads of this process."""
        if not self.capture:
            out: list[list[int]] = t.tolist()
            return out
        assert self._copied is not None
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        self._copied.record()
        self._copied.synchronize()
        return host.tolist()
