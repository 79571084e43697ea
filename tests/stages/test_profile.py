"""Profiling workers on request: PROFILE to every ready replica of the
stages asked for, a Chrome trace per replica on stop (real processes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from omnix.events.types import StageFinished
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.runtime import RuntimeConfigError

from .conftest import scripted_pipeline


async def test_start_and_stop_write_a_trace_per_replica_of_the_stages_asked(
    harness_factory, tmp_path
):
    h = harness_factory(
        scripted_pipeline(
            text=(ScriptedArgs(chunks_per_piece=3), 2),
            audio=(ScriptedArgs(output_modality="audio"), 1),
        ),
        profile_dir=tmp_path,
    )
    await h.rt.start()
    started = await h.rt.profile("start", ["text"])
    assert sorted((r.stage, r.replica, r.ok) for r in started) == [
        ("text", 0, True),
        ("text", 1, True),
    ]
    assert {r.detail for r in started} == {
        str(tmp_path / "text" / "0"),
        str(tmp_path / "text" / "1"),
    }
    h.send("a", "text", 0)
    await h.wait_for(lambda: h.of(StageFinished, "a"), what="a finished")
    again = await h.rt.profile("start", ["text"])
    assert not any(r.ok for r in again) and "already profiling" in again[0].detail
    stopped = await h.rt.profile("stop", ["text"])
    assert all(r.ok for r in stopped)
    for r in stopped:
        trace = json.loads(await asyncio.to_thread(Path(r.detail).read_text))
        assert trace["traceEvents"], "an empty trace"
        assert r.detail.startswith(str(tmp_path / r.stage / str(r.replica)))
    assert not (tmp_path / "audio").exists(), "a stage not asked for was profiled"
    never = await h.rt.profile("stop", ["audio"])
    assert [(r.ok, "not profiling" in r.detail) for r in never] == [(False, True)]


async def test_profiling_is_off_unless_the_runtime_has_a_directory(harness_factory):
    h = harness_factory(scripted_pipeline(text=(ScriptedArgs(), 1)))
    await h.rt.start()
    with pytest.raises(RuntimeConfigError, match="--profile-dir"):
        await h.rt.profile("start", ["text"])


async def test_an_unknown_stage_is_named(harness_factory, tmp_path):
    h = harness_factory(scripted_pipeline(text=(ScriptedArgs(), 1)), profile_dir=tmp_path)
    await h.rt.start()
    with pytest.raises(RuntimeConfigError, match="no stage 'talker'"):
        await h.rt.profile("start", ["talker"])
