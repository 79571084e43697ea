"""The runtime's default placement of vLLM stage workers on CPU."""

from __future__ import annotations

import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.pipelines.config import CodecArgs, PipelineConfig, ScriptedArgs, StageConfig, VllmArgs
from omnix.stages.placement import BIND_ENV, VllmPlace, vllm_placement
from omnix.stages.runtime import StageRuntime
from omnix.stages.worker_cli import CPUS_ENV


def omni(talker_replicas: int = 1) -> PipelineConfig:
    return PipelineConfig(
        name="p",
        stages=(
            StageConfig(name="thinker", engine=VllmArgs(model="thinker")),
            StageConfig(name="talker", engine=VllmArgs(model="talker"), replicas=talker_replicas),
            StageConfig(name="code2wav", engine=CodecArgs(model="code2wav")),
        ),
    )


def shares(places: dict[str, VllmPlace]) -> dict[str, str]:
    return {w: p.cpus for w, p in places.items()}


def test_each_vllm_worker_gets_its_own_cpus_and_all_but_the_first_are_pinned():
    places = vllm_placement(omni(), [0, 1])
    assert places == {"thinker/0": VllmPlace("0", pin=False), "talker/0": VllmPlace("1", pin=True)}
    assert shares(vllm_placement(omni(), [0, 1, 2, 3, 4])) == {"thinker/0": "0,1", "talker/0": "2,3,4"}
    # More vLLM workers than CPUs: one CPU each, round robin.
    assert shares(vllm_placement(omni(talker_replicas=2), [2, 3])) == {
        "thinker/0": "2", "talker/0": "3", "talker/1": "2"}


def test_a_single_vllm_worker_keeps_vllms_choice():
    one = PipelineConfig(name="t", stages=(
        StageConfig(name="thinker", engine=VllmArgs(model="thinker")),
        StageConfig(name="s", engine=ScriptedArgs()),
    ))
    assert vllm_placement(one, [0, 1]) == {}
    assert vllm_placement(omni(), [0]) == {}  # one CPU: nothing to spread over


def test_workers_the_operator_pinned_take_no_share():
    assert vllm_placement(omni(), [0, 1], {"talker"}) == {}
    assert shares(vllm_placement(omni(talker_replicas=2), [0, 1], {"talker/1"})) == {
        "thinker/0": "0", "talker/0": "1"}


def test_spawned_vllm_workers_get_their_place_unless_the_operator_placed_them(monkeypatch):
    monkeypatch.delenv(BIND_ENV, raising=False)
    monkeypatch.delenv(CPUS_ENV, raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    blobs = MemoryBlobStore()

    def env(stage: str, **kw) -> dict[str, str]:
        e = StageRuntime(omni(), lambda ev: None, blobs, **kw).spawn_env(stage, 0)
        return {k: v for k, v in e.items() if k in (BIND_ENV, CPUS_ENV)}

    assert env("thinker") == {BIND_ENV: "0"}  # model threads bound, process free
    assert env("talker") == {CPUS_ENV: "1"}  # the whole worker pinned
    assert env("code2wav") == {}
    assert env("talker", vllm_cpu_placement="vllm") == {}
    # The operator's pin wins, and the pinned worker takes no share.
    assert env("talker", worker_cpus={"talker": "0-1"}) == {CPUS_ENV: "0-1"}
    assert env("thinker", worker_cpus={"talker": "0-1"}) == {}
    # An explicit vLLM thread binding (worker_env or the server's env): no placement.
    assert env("talker", worker_env={BIND_ENV: "nobind"}) == {BIND_ENV: "nobind"}
    monkeypatch.setenv(BIND_ENV, "0")
    assert env("talker") == {BIND_ENV: "0"}
    with pytest.raises(ValueError, match="vllm_cpu_placement"):
        env("talker", vllm_cpu_placement="auto")
