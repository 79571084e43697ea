"""Qwen3-Omni's Code2Wav as a stage: frames streamed in pieces of any size
decode to exactly the reference's ``chunked_decode`` with the same chunk
and context sizes; a continuation drops what was delivered; a checkpoint
that cannot speak says so in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from omnix.events.types import StageParams
from omnix.models.paths import ModelPaths
from omnix.transport.work import GenerateRequest, InputPiece, Resume

pytestmark = pytest.mark.asyncio(loop_scope="session")

torch = pytest.importorskip("torch")


def _codes(frames: int, seed: int = 0) -> np.ndarray:
    gen = np.random.default_rng(seed)
    return gen.integers(0, 2048, size=(frames, 16), dtype=np.int64)


async def _decode(engine, codes: np.ndarray, piece: int, resume: Resume | None = None):
    flat = [int(c) for c in codes.reshape(-1)]

    async def pieces():
        for i in range(0, len(flat), piece):
            yield InputPiece(token_ids=tuple(flat[i : i + piece]))

    request = GenerateRequest(request_id="r", stage="code2wav", params=StageParams(), resume=resume)
    outs = [o async for o in engine.generate(request, pieces())]
    wav = np.concatenate([o.array for o in outs if o.array is not None])
    return wav, outs[-1]


def _reference(engine, codes: np.ndarray, chunk: int, context: int) -> np.ndarray:
    with torch.no_grad():
        wav = engine.model.chunked_decode(
            torch.from_numpy(codes.T.copy())[None], chunk_size=chunk, left_context_size=context
        )
    return wav[0, 0].numpy()


@pytest.mark.parametrize(
    ("chunk", "context", "piece"), [(25, 25, 16 * 5), (10, 4, 37), (7, 25, 16)]
)
async def test_streamed_audio_is_the_chunked_decode_sample_for_sample(
    tiny_models: ModelPaths, chunk: int, context: int, piece: int
) -> None:
    from omnix.engines.code2wav_engine import Code2WavEngine
    from omnix.pipelines.config import Code2WavArgs

    engine = Code2WavEngine(
        Code2WavArgs(model=tiny_models.omni, chunk_frames=chunk, context_frames=context)
    )
    await engine.start()
    try:
        codes = _codes(53)
        wav, last = await _decode(engine, codes, piece)
        np.testing.assert_array_equal(wav, _reference(engine, codes, chunk, context))
        assert (last.finish_reason, last.output_tokens) == ("stop", 53)
        # A continuation after some samples gives exactly the rest.
        cut = len(wav) // 3
        rest, _ = await _decode(engine, codes, piece, Resume(chunks=2, samples=cut))
        np.testing.assert_array_equal(rest, wav[cut:])
    finally:
        await engine.close()


async def test_a_checkpoint_without_code2wav_weights_says_so(
    tiny_models: ModelPaths, tmp_path: Path
) -> None:
    from omnix.engines.code2wav_engine import load_code2wav

    mute = tmp_path / "mute"
    shutil.copytree(tiny_models.omni_thinker, mute)  # the thinker alone
    with pytest.raises(ValueError, match="enable_audio_output false"):
        load_code2wav(mute, "cpu")
    cfg = json.loads((Path(tiny_models.omni) / "config.json").read_text())
    (mute / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FileNotFoundError, match="no code2wav"):
        load_code2wav(mute, "cpu")


async def test_a_bfloat16_stage_streams_the_chunked_decode_of_its_own_weights(
    tiny_models: ModelPaths,
) -> None:
    """``dtype = "bfloat16"``: the module runs in bfloat16, streams exactly
    its own chunked decode, and sounds like the float32 stage's within
    bfloat16's rounding."""
    from omnix.engines.code2wav_engine import Code2WavEngine
    from omnix.pipelines.config import Code2WavArgs

    half = Code2WavEngine(Code2WavArgs(model=tiny_models.omni, dtype="bfloat16"))
    full = Code2WavEngine(Code2WavArgs(model=tiny_models.omni))
    await half.start()
    await full.start()
    try:
        assert next(half.model.parameters()).dtype == torch.bfloat16
        codes = _codes(30, seed=3)
        wav, _ = await _decode(half, codes, 16 * 4)
        assert wav.dtype == np.float32
        with torch.no_grad():
            ref = half.model.chunked_decode(
                torch.from_numpy(codes.T.copy())[None], chunk_size=25, left_context_size=25
            )
        np.testing.assert_array_equal(wav, ref[0, 0].float().numpy())
        exact, _ = await _decode(full, codes, 16 * 4)
        assert np.abs(wav - exact).max() < 0.05 * max(np.abs(exact).max(), 1e-3)
    finally:
        await half.close()
        await full.close()
