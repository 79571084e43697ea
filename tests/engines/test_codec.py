"""The codec decoder and engine: streaming is bit-identical to one-shot
decoding for any chunking, frames split across pieces wait, abort stops, a
continuation (``Resume``) delivers exactly the samples after the cut."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnix.events.types import StageParams
from omnix.models.codec import CodecConfig, CodecDecoder, CodecStream, load_codec
from omnix.transport.work import GenerateRequest, InputPiece, Resume

pytestmark = pytest.mark.engines
in_session_loop = pytest.mark.asyncio(loop_scope="session")  # where the engines live


@pytest.fixture(scope="module")
def decoder(tiny_models) -> CodecDecoder:
    return load_codec(tiny_models.path("code2wav"), "cpu")


def _codes(n_frames: int, seed: int = 0, k: int = 2, c: int = 1024) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, c, size=n_frames * k)


def _random_chunks(codes: np.ndarray, rng: np.random.Generator, max_len: int) -> list[np.ndarray]:
    out, i = [], 0
    while i < codes.size:
        n = int(rng.integers(1, max_len + 1))
        out.append(codes[i : i + n])
        i += n
    return out


def test_layout_and_hop(decoder: CodecDecoder) -> None:
    cfg = decoder.config
    assert cfg.hop == 320 and cfg.sample_rate == 24000
    pcm = decoder.decode(_codes(75))  # 75 frames = one second
    assert pcm.dtype == np.float32 and pcm.shape == (24000,)
    assert 0.001 < float(np.abs(pcm).mean()) and float(np.abs(pcm).max()) <= cfg.out_scale
    # A trailing partial frame is dropped, not padded.
    assert decoder.decode(np.concatenate([_codes(10), [5]])).shape == (3200,)


@pytest.mark.parametrize("max_len", [1, 3, 17, 64, 400])
def test_stream_equals_one_shot_bit_for_bit(decoder: CodecDecoder, max_len: int) -> None:
    # Frame counts that are not a multiple of the block size; fewer frames
    # and trials for the tiny chunkings (every push recomputes a block).
    codes = _codes(37 if max_len < 8 else 101, seed=max_len)
    ref = decoder.decode(codes)
    rng = np.random.default_rng(1000 + max_len)
    for _ in range(2 if max_len < 8 else 3):
        stream = CodecStream(decoder)
        parts = [stream.push(chunk) for chunk in _random_chunks(codes, rng, max_len)]
        parts.append(stream.flush())
        got = np.concatenate(parts)
        # Every complete frame's samples are out as soon as the frame is in.
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, ref)


def test_samples_are_out_as_soon_as_their_frame_is_in(decoder: CodecDecoder) -> None:
    stream = CodecStream(decoder)
    assert stream.push([1]).size == 0  # half a frame: nothing yet
    assert stream.push([2]).size == 320  # the frame completed
    assert stream.push([3, 4, 5, 6, 7]).size == 640  # two more frames, half of a third
    assert stream.frames_in == 3


def test_one_pass_decode_agrees_within_float_rounding(decoder: CodecDecoder) -> None:
    codes = _codes(150, seed=3)
    np.testing.assert_allclose(decoder.decode_full(codes), decoder.decode(codes), atol=1e-5, rtol=0)


def test_out_of_range_codes_are_refused(decoder: CodecDecoder) -> None:
    with pytest.raises(ValueError, match="outside"):
        decoder.decode([0, 1024])


def test_config_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="channels"):
        CodecDecoder(CodecConfig(channels=(8, 8)))


async def _pieces(chunks, delay: float = 0.0):
    for chunk in chunks:
        if delay:
            await asyncio.sleep(delay)  # input that trickles in, as from a streaming talker
        yield InputPiece(token_ids=tuple(int(x) for x in chunk), modality="codec")


@in_session_loop
async def test_engine_streams_exact_pcm_per_piece(codec_engine) -> None:
    codes = _codes(120, seed=9)
    ref = codec_engine.decoder.decode(codes)
    rng = np.random.default_rng(5)
    for trial in range(3):
        chunks = _random_chunks(codes, rng, 50)
        req = GenerateRequest(f"codec-{trial}", "code2wav", StageParams())
        outs = [o async for o in codec_engine.generate(req, _pieces(chunks))]
        audio = [o for o in outs if o.array is not None]
        assert all(
            o.modality == "audio" and o.array.dtype == np.float32 and o.array.ndim == 1
            for o in audio
        )
        np.testing.assert_array_equal(np.concatenate([o.array for o in audio]), ref)
        last = outs[-1]
        assert (last.finish_reason, last.prompt_tokens, last.output_tokens) == (
            "stop",
            codes.size,
            120,
        )
        assert last.array is None


@in_session_loop
async def test_engine_abort_stops_output(codec_engine) -> None:
    chunks = [c for c in _codes(400, seed=2).reshape(-1, 8)]
    req = GenerateRequest("codec-abort", "code2wav", StageParams())
    got = 0
    async for _out in codec_engine.generate(req, _pieces(chunks, delay=0.001)):
        got += 1
        if got == 3:
            await codec_engine.abort("codec-abort")
    assert got == 3
    await codec_engine.abort("codec-abort")  # idempotent, and unknown ids are ignored
    await codec_engine.abort("never-seen")


@in_session_loop
async def test_engine_refuses_text_input(codec_engine) -> None:
    async def text():
        yield InputPiece(text="hello")

    with pytest.raises(ValueError, match="codec codes"):
        async for _ in codec_engine.generate(
            GenerateRequest("codec-text", "code2wav", StageParams()), text()
        ):
            pass


# Cut points in samples (hop 320, block 8 frames = 2560 samples): the start,
# inside a frame of the first block, a frame boundary inside a block, a block
# boundary, inside a later block, one sample before the end, the end.
_CUTS = [0, 1, 123, 960, 2560, 2561, 7777, 120 * 320 - 1, 120 * 320]


@in_session_loop
@pytest.mark.parametrize("cut", _CUTS)
async def test_engine_continuation_is_sample_exact(codec_engine, cut: int) -> None:
    codes = _codes(120, seed=21)
    rng = np.random.default_rng(cut)
    # The undisturbed run, its input in pieces of its own.
    req = GenerateRequest(f"codec-undisturbed-{cut}", "code2wav", StageParams())
    outs = [o async for o in codec_engine.generate(req, _pieces(_random_chunks(codes, rng, 50)))]
    ref = np.concatenate([o.array for o in outs if o.array is not None])
    np.testing.assert_array_equal(ref, codec_engine.decoder.decode(codes))
    # The continuation gets every code again, in other pieces (one code at a
    # time at the start, so frames and blocks are split differently).
    chunks = [codes[:1], codes[1:3], *_random_chunks(codes[3:], rng, 37)]
    resume = Resume(chunks=5, samples=cut)
    req = GenerateRequest(f"codec-resumed-{cut}", "code2wav", StageParams(), resume=resume)
    cont = [o async for o in codec_engine.generate(req, _pieces(chunks))]
    audio = [o.array for o in cont if o.array is not None]
    assert all(a.size for a in audio)  # nothing empty is yielded for the skipped prefix
    tail = np.concatenate(audio) if audio else np.zeros(0, dtype=np.float32)
    np.testing.assert_array_equal(np.concatenate([ref[:cut], tail]), ref)
    last = cont[-1]
    # The counts are the undisturbed run's: usage does not depend on the move.
    assert (last.finish_reason, last.prompt_tokens, last.output_tokens) == ("stop", codes.size, 120)
