"""``placement="ray"`` on real engines: ``tiny-tts`` (a vLLM talker, the
codec decoder), each stage pinned to its own node of the session's loopback
Ray cluster (``conftest.ray_cluster``).  The codec worker killed with
SIGKILL mid-speech: Ray restarts it, the request is continued there and its
waveform equals the undisturbed one sample for sample (greedy talker; the
decoder is exact whatever its pieces, tests/engines/test_codec.py)."""

from __future__ import annotations

import os
import signal

import msgspec
import numpy as np
import pytest

from omnix.api import Omni
from omnix.events.types import RequestSpec, Routed, StageParams, WorkerLost
from omnix.pipelines.config import Placement
from omnix.pipelines.validate import load_pipeline, validate_pipeline
from omnix.stages.options import RuntimeOptions

from .test_ray_placement import node_resources, running_on, until_ready

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

SPEC = RequestSpec(
    prompt="Tell me a story about a cat.",
    outputs=("audio",),
    # Long enough that the kill lands while the decoder still has codes to
    # turn into audio (20 pieces of 8 codes).
    stage_params={"talker": StageParams(temperature=0.0, max_tokens=160)},
)


def _pipeline():
    base = load_pipeline("tiny-tts")
    node = {"talker": "thinker_node", "code2wav": "decoder_node"}
    cfg = msgspec.structs.replace(
        base,
        stages=tuple(
            msgspec.structs.replace(
                st, placement=Placement(num_cpus=0.5, resources={node[st.name]: 1})
            )
            for st in base.stages
        ),
    )
    validate_pipeline(cfg)
    return cfg


async def test_a_codec_worker_killed_mid_speech_on_ray_is_continued_sample_for_sample(
    ray_cluster, tmp_path_factory
):
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    omni = Omni(
        _pipeline(),
        runtime_options=RuntimeOptions(
            placement="ray",
            ray_address=ray_cluster.address,
            start_timeout_s=600.0,
            # vLLM's load can starve heartbeats on 2 cores; a SIGKILL is seen
            # at once (the actor reports its worker's end).
            lost_after_s=20.0,
            forward_worker_output=False,
        ),
    )
    async with omni:
        await omni.wait_ready(600)
        launcher = omni.runtime._ray
        for stage, label in (("talker", "thinker_node"), ("code2wav", "decoder_node")):
            assert label in node_resources(str((await launcher.where(stage, 0))["node_id"]))
        undisturbed = await omni.generate(SPEC)
        assert undisturbed.status == "finished" and undisturbed.audio is not None
        before = await launcher.where("code2wav", 0)
        omni.submit(SPEC, request_id="r-kill")
        await running_on(omni, "r-kill", "code2wav", chunks=1, timeout=300)
        os.kill(int(before["worker_pid"]), signal.SIGKILL)
        got = await omni.collect("r-kill")
        assert got.status == "finished" and got.audio is not None
        assert np.array_equal(got.audio, undisturbed.audio)  # sample for sample
        assert any(
            isinstance(e, WorkerLost) and e.worker_id == "code2wav/0" for e in omni.log.read()
        )
        resumed = [e for e in omni.log.events_for("r-kill") if isinstance(e, Routed) and e.resume]
        # Continued, not redone (none: code2wav ended before the kill reached it).
        assert [e.stage for e in resumed] == ["code2wav"], resumed
        await until_ready(omni, 300)
        after = await launcher.where("code2wav", 0)
        assert after["actor_pid"] != before["actor_pid"]  # Ray restarted the actor
        assert "decoder_node" in node_resources(str(after["node_id"]))
