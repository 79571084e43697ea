"""The duplex stage engine (``moshi_duplex``) driven in-process as a stage
worker drives it: sessions' user audio in as pieces (PCM of any length, or
Mimi codes), per user frame the model's text token, codes and 80 ms of PCM
out, each session's exactly what ``DuplexBatch`` gives that session alone,
however the sessions' frames interleave or pause; an abort frees the slot;
bad pieces fail only their session."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from omnix.events.types import StageParams
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

K = 8
FRAME = 1920


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from omnix.models.moshi import write_folder

    out = tmp_path_factory.mktemp("moshi") / "moshi"
    write_folder(out, seed=0)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(folder: Path) -> AsyncIterator:
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.pipelines.config import DuplexArgs

    eng = DuplexEngine(DuplexArgs(model=str(folder), device="cpu", max_sessions=2, tick_ms=0))
    await eng.start()
    yield eng
    await eng.close()


def _audio(kind: str, frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME) / 24000
    if kind == "chirp":
        return (0.3 * np.sin(2 * math.pi * (180 + 250 * t) * t)).astype(np.float32)
    f0 = 140 + 20 * np.sin(2 * math.pi * 5 * t)
    phase = 2 * math.pi * np.cumsum(f0) / 24000
    voice = sum(np.sin(h * phase) / h for h in range(1, 6))
    return (0.2 * voice).astype(np.float32)


def _alone(folder: Path, audio: np.ndarray):
    """What DuplexBatch gives one session alone over ``audio`` encoded whole."""
    import torch

    from omnix.engines.duplex_batch import DuplexBatch
    from omnix.engines.duplex_model import DuplexModel

    model = DuplexModel.load(folder)
    with torch.inference_mode():
        user = model.mimi.encode(torch.from_numpy(audio)[None, None], num_quantizers=K)[0][0]
    batch = DuplexBatch(model)
    batch.join("s")
    ticks = [batch.tick({"s": user[:, i]})["s"] for i in range(user.shape[1])]
    return [(t.frame.text, *t.frame.codes) for t in ticks], [t.pcm.numpy() for t in ticks], user


def _request(rid: str, temperature: float | None = None, seed: int = 0) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, stage="duplex", params=StageParams(temperature=temperature), seed=seed
    )


async def _pcm_pieces(audio: np.ndarray, sizes: list[int], pause: float = 0.0):
    at = 0
    for n in sizes:
        if pause:
            await asyncio.sleep(pause)
        yield InputPiece(modality="audio", array=audio[at : at + n])
        at += n
    if at < len(audio):
        yield InputPiece(modality="audio", array=audio[at:])


async def _held(q: asyncio.Queue[InputPiece | None]):
    """The pieces put on ``q`` until None; each done once the engine took it."""
    while (piece := await q.get()) is not None:
        yield piece
        q.task_done()
    q.task_done()


async def _collect(stream: AsyncIterator[EngineOutput]) -> list[EngineOutput]:
    return [out async for out in stream]


async def test_two_sessions_each_get_what_the_model_gives_it_alone(
    engine, folder: Path, monkeypatch
) -> None:
    batch = engine._batch
    set_aside, tick = batch.set_aside, batch.tick
    waited: list[str] = []
    stepped: list[list[str]] = []

    def spy_aside(key: str) -> None:
        waited.append(key.split("#")[0])  # a row's name: the request id, #n
        set_aside(key)

    def spy_tick(user, forced=None):
        stepped.append(sorted(key.split("#")[0] for key in user))
        return tick(user, forced)

    monkeypatch.setattr(batch, "set_aside", spy_aside)
    monkeypatch.setattr(batch, "tick", spy_tick)
    a, b = _audio("chirp", 10), _audio("voice", 14)
    want_a, pcm_a, _ = _alone(folder, a)
    want_b, pcm_b, _ = _alone(folder, b)

    def feed(q: asyncio.Queue[InputPiece | None], audio: np.ndarray, at: int, sizes: list[int]):
        for n in sizes:
            q.put_nowait(InputPiece(modality="audio", array=audio[at : at + n]))
            at += n
        return at

    qa: asyncio.Queue[InputPiece | None] = asyncio.Queue()
    qb: asyncio.Queue[InputPiece | None] = asyncio.Queue()
    sa = engine.generate(_request("a"), _held(qa))
    sb = engine.generate(_request("b"), _held(qb))
    # b's first frame, in two halves
    at_b = feed(qb, b, 0, [960, 960])
    got_b = [await anext(sb)]
    # a's first four frames in odd-sized pieces while b's input is held:
    # b is set aside at each of a's ticks
    at_a = feed(qa, a, 0, [700, 3000, 4000])
    got_a = [await anext(sa) for _ in range(4)]
    assert waited.count("b") >= 4
    # the rest of both while the tick thread reads no input, so that the
    # two then step together
    with engine._lock:
        at_a = feed(qa, a, at_a, [5000, 6500])
        at_b = feed(qb, b, at_b, [960] * 6 + [FRAME] * 10)
        assert (at_a, at_b) == (len(a), len(b))
        qa.put_nowait(None)
        qb.put_nowait(None)
        await asyncio.gather(qa.join(), qb.join())
    more_a, more_b = await asyncio.gather(_collect(sa), _collect(sb))
    got_a += more_a
    got_b += more_b
    assert ["a", "b"] in stepped  # batched: one tick stepped both
    for got, want, pcm in ((got_a, want_a, pcm_a), (got_b, want_b, pcm_b)):
        frames, final = got[:-1], got[-1]
        assert [o.token_ids for o in frames] == want
        for o, p in zip(frames, pcm, strict=True):
            assert o.modality == "audio" and o.array is not None and o.array.dtype == np.float32
            np.testing.assert_array_equal(o.array, p)
        assert final.finish_reason == "stop"
        assert (final.prompt_tokens, final.output_tokens) == (len(want), len(want))


async def test_real_time_ticks_give_the_same_frames(folder: Path) -> None:
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.pipelines.config import DuplexArgs

    audio = _audio("voice", 5)
    want, _, _ = _alone(folder, audio)
    eng = DuplexEngine(DuplexArgs(model=str(folder), device="cpu", tick_ms=80))
    info = await eng.start()
    try:
        assert (info.engine, info.capacity) == ("moshi_duplex", 8)
        got = await _collect(eng.generate(_request("rt"), _pcm_pieces(audio, [])))
    finally:
        await eng.close()
    assert [o.token_ids for o in got[:-1]] == want


async def test_a_tick_waits_for_no_one_once_every_session_has_its_frame_in(folder: Path) -> None:
    """``tick_ms`` paces ticks for sessions whose frames are not all in; a
    lone session's frame steps as it comes (not a period after an earlier
    tick, whatever its phase), and sessions whose frames are all in step
    back to back.  At ten minutes a period, any wait for it would show."""
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.pipelines.config import DuplexArgs

    eng = DuplexEngine(DuplexArgs(model=str(folder), device="cpu", max_sessions=2, tick_ms=600_000))
    await eng.start()
    try:
        async with asyncio.timeout(120):
            audio = _audio("voice", 4)
            want, _, _ = _alone(folder, audio)
            q: asyncio.Queue[InputPiece | None] = asyncio.Queue()
            stream = aiter(eng.generate(_request("lone"), _held(q)))
            got = []
            for k in range(4):  # each frame sent once the last one was answered
                q.put_nowait(InputPiece(modality="audio", array=audio[k * FRAME : (k + 1) * FRAME]))
                got.append(await anext(stream))
            q.put_nowait(None)
            rest = [o async for o in stream]
            assert [o.token_ids for o in got] == want and rest[-1].finish_reason == "stop"

            both = await asyncio.gather(
                *(
                    _collect(eng.generate(_request(rid), _pcm_pieces(_audio(kind, 3), [])))
                    for rid, kind in (("a", "voice"), ("b", "chirp"))
                )
            )
            assert [len(outs) for outs in both] == [4, 4]  # three frames and the end each
    finally:
        await eng.close()


async def test_codes_in_give_the_same_frames_as_the_audio_they_encode(engine, folder: Path) -> None:
    audio = _audio("voice", 6)
    want, _, user = _alone(folder, audio)

    async def pieces():
        yield InputPiece(modality="codec", token_ids=tuple(user[:, :2].T.reshape(-1).tolist()))
        yield InputPiece(modality="codec", token_ids=tuple(user[:, 2:].T.reshape(-1).tolist()))

    got = await _collect(engine.generate(_request("c"), pieces()))
    assert [o.token_ids for o in got[:-1]] == want


async def test_an_abort_frees_the_slot_for_a_waiting_session(engine, folder: Path) -> None:
    audio = _audio("chirp", 4)
    want, _, _ = _alone(folder, audio)
    endless: asyncio.Queue[InputPiece | None] = asyncio.Queue()

    # two sessions hold both slots, their inputs open
    q1: asyncio.Queue[InputPiece | None] = asyncio.Queue()
    s1 = engine.generate(_request("h1"), _held(q1))
    s2 = engine.generate(_request("h2"), _held(endless))
    q1.put_nowait(InputPiece(modality="audio", array=audio[:FRAME]))
    first = await anext(s1)
    assert len(first.token_ids) == 1 + K
    endless.put_nowait(InputPiece(modality="audio", array=audio[:FRAME]))
    await anext(s2)
    # a third waits for a slot
    third = asyncio.ensure_future(_collect(engine.generate(_request("w"), _pcm_pieces(audio, []))))
    await asyncio.sleep(0.3)
    assert not third.done()
    await engine.abort("h1")
    assert [o async for o in s1] == []
    got = await asyncio.wait_for(third, 30)
    assert [o.token_ids for o in got[:-1]] == want
    await engine.abort("h2")
    assert [o async for o in s2] == []
    for _ in range(200):  # the tick thread drops it at its next pass
        if not engine._batch.sessions:
            break
        await asyncio.sleep(0.05)
    assert engine._batch.sessions == []


async def test_a_bad_piece_fails_its_session_naming_it_and_others_go_on(
    engine, folder: Path
) -> None:
    audio = _audio("chirp", 3)
    want, _, _ = _alone(folder, audio)

    async def stereo():
        yield InputPiece(modality="audio", array=np.zeros((2, FRAME), np.float32))

    async def text():
        yield InputPiece(text="hello")

    async def codes():
        yield InputPiece(modality="codec", token_ids=(1, 2, 3))

    for pieces, match in (
        (stereo(), "mono float PCM at 24000 Hz"),
        (text(), "modality 'audio' or 'codec'"),
        (codes(), "whole frames of 8 Mimi codes"),
    ):
        with pytest.raises(ValueError, match=match):
            await _collect(engine.generate(_request("bad"), pieces))
    got = await _collect(engine.generate(_request("ok"), _pcm_pieces(audio, [])))
    assert [o.token_ids for o in got[:-1]] == want


async def test_sampled_sessions_with_one_seed_give_the_same_frames(engine) -> None:
    audio = _audio("voice", 5)
    runs = [
        await _collect(
            engine.generate(_request(f"t{i}", temperature=0.8, seed=7), _pcm_pieces(audio, []))
        )
        for i in range(2)
    ]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]


async def test_a_request_id_that_comes_again_starts_a_fresh_session(engine, folder: Path) -> None:
    """A retried stage runs its request again under the same id, perhaps
    before the tick thread has dropped the aborted session."""
    audio = _audio("voice", 4)
    want, _, _ = _alone(folder, audio)
    q: asyncio.Queue[InputPiece | None] = asyncio.Queue()
    first = engine.generate(_request("again"), _held(q))
    q.put_nowait(InputPiece(modality="audio", array=audio[:FRAME]))
    await anext(first)
    await engine.abort("again")
    got = await _collect(engine.generate(_request("again"), _pcm_pieces(audio, [])))
    assert [o.token_ids for o in got[:-1]] == want
    assert [o async for o in first] == []


async def test_a_session_with_no_whole_frame_ends_with_nothing_stepped(engine) -> None:
    async def short():
        yield InputPiece(modality="audio", array=np.zeros(FRAME - 1, np.float32))

    (final,) = await _collect(engine.generate(_request("short"), short()))
    assert (final.finish_reason, final.prompt_tokens, final.output_tokens) == ("stop", 0, 0)


async def test_a_continuation_gives_what_the_undisturbed_session_gave_after_the_delivered(
    engine,
) -> None:
    """A session moved to another replica (or a restarted server) gets every
    user frame again, after its opening piece: it gives the frames after
    the ones it had delivered, those of the undisturbed session, sampled
    with the first execution's seed though its own request's differs."""
    from omnix.transport.work import Resume

    audio = _audio("voice", 9)

    async def pieces():
        yield InputPiece()  # the admission of a session whose input streams
        async for p in _pcm_pieces(audio, [FRAME] * 9):
            yield p

    for temperature in (None, 0.8):
        whole = await _collect(
            engine.generate(_request("u", temperature, seed=7), _pcm_pieces(audio, []))
        )
        moved = GenerateRequest(
            request_id="m",
            stage="duplex",
            params=StageParams(temperature=temperature),
            seed=12345,  # a continuation's own seed (``continuation_seed``)
            resume=Resume(chunks=4, seed=7),
        )
        rest = await _collect(engine.generate(moved, pieces()))
        assert [o.token_ids for o in rest[:-1]] == [o.token_ids for o in whole[4:-1]]
        assert [o.text for o in rest[:-1]] == [o.text for o in whole[4:-1]]
        for a, b in zip(rest[:-1], whole[4:-1], strict=True):
            np.testing.assert_array_equal(a.array, b.array)
        final = rest[-1]
        assert (final.finish_reason, final.prompt_tokens, final.output_tokens) == ("stop", 9, 9)
