"""The scripted test engine, in-process: outputs, metadata, failures, journal."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from omnix.engines.scripted import JOURNAL_ENV, ScriptedEngine, ScriptedFailure
from omnix.events.types import StageParams
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.engine import Engine, load_engine
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece, Resume
from tests.waiting import wait_until


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _collect(
    engine: ScriptedEngine, *pieces: InputPiece, params: StageParams = StageParams(), rid: str = "r"
) -> list[EngineOutput]:
    return [o async for o in engine.generate(GenerateRequest(rid, "s", params), _feed(*pieces))]


def _payload(outs: list[EngineOutput]) -> list[EngineOutput]:
    return [
        o
        for o in outs
        if not o.is_progress and (o.text or o.token_ids or o.data or o.array is not None)
    ]


async def test_text_outputs_and_finish_metadata():
    eng = load_engine("scripted", ScriptedArgs(chunks_per_piece=3))
    assert isinstance(eng, Engine)
    info = await eng.start()
    assert (info.engine, info.capacity) == ("scripted", 8)
    outs = await _collect(eng, InputPiece(text="a"), InputPiece(text="b"))
    assert [o.text for o in _payload(outs)] == [f"t{n} " for n in range(6)]
    last = outs[-1]
    assert (last.finish_reason, last.prompt_tokens, last.output_tokens) == ("stop", 2, 6)
    assert not (last.text or last.token_ids or last.data) and last.array is None


async def test_modalities_echo_progress_and_max_tokens():
    codec = _payload(
        await _collect(
            ScriptedEngine(ScriptedArgs(chunks_per_piece=2, output_modality="codec")), InputPiece()
        )
    )
    assert [o.token_ids for o in codec] == [(0,), (1,)]
    audio = _payload(
        await _collect(
            ScriptedEngine(ScriptedArgs(chunks_per_piece=2, output_modality="audio")), InputPiece()
        )
    )
    assert audio[1].array.dtype == np.float32 and np.all(audio[1].array == 1.0)
    image = _payload(
        await _collect(
            ScriptedEngine(ScriptedArgs(chunks_per_piece=1, output_modality="image")), InputPiece()
        )
    )
    assert image[0].data and image[0].media_type
    echo = _payload(
        await _collect(
            ScriptedEngine(ScriptedArgs(echo=True)),
            InputPiece(text="hello"),
            InputPiece(token_ids=(5, 6)),
        )
    )
    assert [(o.text, o.token_ids) for o in echo] == [("hello", ()), ("", (5, 6))]
    prog = await _collect(
        ScriptedEngine(ScriptedArgs(chunks_per_piece=1)),
        InputPiece(),
        params=StageParams(num_inference_steps=3),
    )
    assert [(o.step, o.total) for o in prog if o.is_progress] == [(1, 3), (2, 3), (3, 3)]
    capped = await _collect(
        ScriptedEngine(ScriptedArgs(chunks_per_piece=10)),
        InputPiece(),
        params=StageParams(max_tokens=4),
    )
    assert len(_payload(capped)) == 4 and capped[-1].finish_reason == "length"


async def test_fail_at_raises_at_that_index():
    eng = ScriptedEngine(ScriptedArgs(chunks_per_piece=5, fail_at=2))
    got = []
    with pytest.raises(ScriptedFailure, match="output 2"):
        async for o in eng.generate(GenerateRequest("r", "s", StageParams()), _feed(InputPiece())):
            got.append(o.text)
    assert got == ["t0 ", "t1 "]


async def test_hang_at_stops_until_cancelled_and_journal_records_abort(tmp_path, monkeypatch):
    journal = tmp_path / "journal.jsonl"
    monkeypatch.setenv(JOURNAL_ENV, str(journal))
    eng = ScriptedEngine(ScriptedArgs(chunks_per_piece=5, hang_at=1))
    await eng.start()
    got = []

    async def consume():
        async for o in eng.generate(GenerateRequest("r1", "s", StageParams()), _feed(InputPiece())):
            got.append(o.text)

    task = asyncio.create_task(consume())
    # With no delay an engine that did not hang would have run on past t0 in
    # the same loop turn that delivered it: seeing t0 is seeing the hang.
    await wait_until(lambda: got, "the first output")
    assert got == ["t0 "] and not task.done()
    await eng.abort("r1")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert eng.aborted == ["r1"]
    lines = [json.loads(ln) for ln in journal.read_text().splitlines()]
    assert [(ln["event"], ln["request_id"]) for ln in lines] == [
        ("start", ""),
        ("generate", "r1"),
        ("abort", "r1"),
    ]


async def test_streaming_input_is_consumed_as_it_arrives():
    eng = ScriptedEngine(ScriptedArgs(chunks_per_piece=1, echo=True))
    q: asyncio.Queue[InputPiece | None] = asyncio.Queue()

    async def inputs():
        while (p := await q.get()) is not None:
            yield p

    outs: list[str] = []

    async def consume():
        async for o in eng.generate(GenerateRequest("r", "s", StageParams()), inputs()):
            if o.text:
                outs.append(o.text)

    task = asyncio.create_task(consume())
    await q.put(InputPiece(text="first"))
    await wait_until(lambda: outs, "the first output")
    assert outs == ["first"]  # output before the input is closed
    await q.put(InputPiece(text="second"))
    await q.put(None)
    await task
    assert outs == ["first", "second"]


async def test_a_continuation_skips_the_outputs_already_delivered():
    args = ScriptedArgs(chunks_per_piece=3, output_modality="codec")
    pieces = (InputPiece(text="a"), InputPiece(text="b"))
    whole = _payload(await _collect(ScriptedEngine(args), *pieces))
    req = GenerateRequest("r", "s", StageParams(), resume=Resume(chunks=4, token_ids=(0, 1, 2, 3)))
    outs = [o async for o in ScriptedEngine(args).generate(req, _feed(*pieces))]
    assert [o.token_ids for o in _payload(outs)] == [o.token_ids for o in whole[4:]]
    assert (outs[-1].prompt_tokens, outs[-1].output_tokens) == (2, 6)  # counts the whole stage
    # A fault past the resume point still fires; one before it was delivered already.
    crashing = ScriptedEngine(ScriptedArgs(chunks_per_piece=3, fail_at=1))
    assert len(_payload([o async for o in crashing.generate(req, _feed(*pieces))])) == 2
