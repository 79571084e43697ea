"""``omnix bench duplex --sizes tiny|real``: the duplex engine's tick alone,
in this process, on one device.

Owns one measurement of what the ``moshi_duplex`` engine's thread does for
each 80 ms tick, done the way it does it: every session's user frame
encoded by its own Mimi encode stream (``MimiEncodeStream``), then one
batched ``DuplexBatch.tick`` (the temporal transformer one position for
every session, the depth decoder's codes, each session's frame decoded by
its own ``MimiStream``).  A frame's latency here is that tick's time:
from its user PCM in to every session's model frame out (a client's frame
that waits for the tick, and the socket, are the served bench's:
``duplex.py``).

The model: ``--sizes real`` is Moshi at its published size (moshiko: a 7B
temporal transformer, ``omnix.models.moshi_real``), ``--sizes tiny`` the
tiny checkpoint's config; both with random weights built on the device in
``--dtype``.  At each level of ``--levels`` sessions join (each with a
prompt of ``--context-frames`` random frames first, so the ticks are
measured that far into a conversation, with that much KV cache), then
``--warmup`` ticks, then ``--frames`` timed ticks; ``--runs`` times, a
fresh batch each.  Levels stop rising after the first whose p99 tick
exceeds the frame (80 ms): ``sessions_held`` is the largest level under
it.  The parts (encode, step, decode) are timed too, each ended by a
device synchronisation (as the engine's own reads of the frame end it).

Imports only torch, transformers, numpy and omnix's engines (no server,
no aiohttp): a GPU machine with torch and the carried wheels runs it
(``scripts/gpu-duplex-bench.sh``).

Does not own the engine (``omnix.engines``) nor the figures' summary
(``duplex.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from omnix.bench.duplex_client import FRAME, speech

if TYPE_CHECKING:
    from omnix.engines.duplex_model import DuplexModel


@dataclass
class LevelRun:
    """One run of one level: per tick, milliseconds."""

    tick: list[float] = field(default_factory=list)
    encode: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)


def build(sizes: str, device: str, dtype: str, seed: int = 0) -> tuple[DuplexModel, int]:
    """Moshi at ``sizes`` with random weights on ``device``: (the model,
    its parameters)."""
    from omnix.engines.duplex_model import DuplexModel
    from omnix.models.moshi import TEXT_VOCAB, moshi_config
    from omnix.models.moshi_real import random_moshi, real_moshi_config

    config = real_moshi_config() if sizes == "real" else moshi_config(TEXT_VOCAB)
    model = random_moshi(config, device, dtype, seed)
    return DuplexModel(model), sum(p.numel() for p in model.parameters())


def _sync(device: Any) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _prompt(model: DuplexModel, frames: int, gen: Any) -> Any:
    """``frames`` random frames given as a session's opening (its context)."""
    import torch

    from omnix.engines.duplex_model import Prompt

    if not frames:
        return None
    lay = model.layout
    k = lay.num_codebooks
    return Prompt(
        text=torch.randint(0, lay.text_vocab, (frames,), generator=gen),
        moshi=torch.randint(0, lay.audio_vocab, (k, frames), generator=gen),
        user=torch.randint(0, lay.audio_vocab, (k, frames), generator=gen),
    )


def run_level(
    model: DuplexModel, sessions: int, frames: int, warmup: int, context: int, seed: int = 0
) -> LevelRun:
    """``sessions`` sessions in one batch, ``warmup`` then ``frames`` ticks
    timed (each session its own voice: the tone at its own pitch)."""
    import torch

    from omnix.engines.duplex_batch import DuplexBatch
    from omnix.engines.mimi_stream import MimiEncodeStream

    gen = torch.Generator().manual_seed(seed)
    batch = DuplexBatch(model)
    encode = MimiEncodeStream(model.mimi, model.layout.num_codebooks)
    names = [f"s{i}" for i in range(sessions)]
    streams = {}
    voices = {}
    for i, sid in enumerate(names):
        batch.join(sid, prompt=_prompt(model, context, gen))
        streams[sid] = encode.start()
        pcm = speech(warmup + frames, pitch=110.0 + 7 * i)
        voices[sid] = torch.from_numpy(pcm).reshape(-1, FRAME)  # on the host, as a socket's
    _sync(model.device)
    out = LevelRun()
    for t in range(warmup + frames):
        t0 = time.perf_counter()
        # As the engine: each session's frame encoded alone, its codes read back.
        user = {sid: encode.encode(streams[sid], voices[sid][t])[:, 0].cpu() for sid in names}
        t1 = time.perf_counter()
        frames_out = batch.step(user)
        _sync(model.device)
        t2 = time.perf_counter()
        batch.decode(frames_out)
        _sync(model.device)
        t3 = time.perf_counter()
        if t >= warmup:
            out.encode.append((t1 - t0) * 1000)
            out.step.append((t2 - t1) * 1000)
            out.decode.append((t3 - t2) * 1000)
            out.tick.append((t3 - t0) * 1000)
    for sid in names:
        batch.leave(sid)
    return out


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if xs else float("nan")
