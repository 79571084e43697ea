"""The runtime's default CPU placement: vLLM engine cores on CPUs of their
own, the server and the vLLM workers on the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.pipelines.config import CodecArgs, PipelineConfig, ScriptedArgs, StageConfig, VllmArgs
from omnix.stages.options import RuntimeOptions
from omnix.stages.placement import BIND_ENV, ENGINE_CPUS_ENV, CpuPlan, cpu_plan, engine_affinity
from omnix.stages.runtime import StageRuntime
from omnix.stages.worker_cli import CPUS_ENV


def omni(talker_replicas: int = 1, talker_executor: str = "uni") -> PipelineConfig:
    return PipelineConfig(
        name="p",
        stages=(
            StageConfig(name="thinker", engine=VllmArgs(model="thinker")),
            StageConfig(
                name="talker",
                engine=VllmArgs(model="talker", cpu_executor=talker_executor),
                replicas=talker_replicas,
            ),
            StageConfig(name="code2wav", engine=CodecArgs(model="code2wav")),
        ),
    )


def text_only() -> PipelineConfig:
    return PipelineConfig(
        name="t",
        stages=(
            StageConfig(name="thinker", engine=VllmArgs(model="thinker")),
            StageConfig(name="s", engine=ScriptedArgs()),
        ),
    )


def test_engine_cores_get_the_last_cpus_and_the_frontend_keeps_the_first():
    assert cpu_plan(text_only(), [0, 1]) == CpuPlan("0", {"thinker/0": "1"})
    assert cpu_plan(text_only(), list(range(8))) == CpuPlan("0,1,2,3", {"thinker/0": "4,5,6,7"})
    # Two engine cores on 2 CPUs share the one that is not the frontend's.
    assert cpu_plan(omni(), [0, 1]) == CpuPlan("0", {"thinker/0": "1", "talker/0": "1"})
    assert cpu_plan(omni(), [0, 1, 2, 3, 4, 5]) == CpuPlan(
        "0,1", {"thinker/0": "2,3", "talker/0": "4,5"}
    )
    # More engine cores than CPUs left: one CPU each, round robin.
    assert cpu_plan(omni(talker_replicas=2), [4, 5, 6]) == CpuPlan(
        "4", {"thinker/0": "5", "talker/0": "6", "talker/1": "5"}
    )


def test_nothing_to_place_without_a_uni_vllm_stage_or_a_second_cpu():
    scripted = PipelineConfig(name="s", stages=(StageConfig(name="s", engine=ScriptedArgs()),))
    assert cpu_plan(scripted, [0, 1]) is None
    assert cpu_plan(text_only(), [0]) is None
    # vLLM's own layout binds its model process itself: not placed.
    assert cpu_plan(omni(talker_executor="mp"), [0, 1]) == CpuPlan("0", {"thinker/0": "1"})


def test_workers_the_operator_pinned_take_no_share():
    assert cpu_plan(omni(), [0, 1], {"talker"}) == CpuPlan("0", {"thinker/0": "1"})
    assert cpu_plan(omni(talker_replicas=2), [0, 1, 2], {"talker/1"}) == CpuPlan(
        "0", {"thinker/0": "1", "talker/0": "2"}
    )


def test_spawned_vllm_workers_get_the_frontend_and_their_engine_cpus(monkeypatch):
    monkeypatch.delenv(BIND_ENV, raising=False)
    monkeypatch.delenv(CPUS_ENV, raising=False)
    monkeypatch.setenv(ENGINE_CPUS_ENV, "7")  # the server's own: never inherited
    monkeypatch.setattr("omnix.stages.placement.available_cpus", lambda: [0, 1])
    blobs = MemoryBlobStore()

    def env(stage: str, **kw) -> dict[str, str]:
        e = StageRuntime(omni(), lambda ev: None, blobs, RuntimeOptions(**kw)).spawn_env(stage, 0)
        return {k: v for k, v in e.items() if k in (BIND_ENV, CPUS_ENV, ENGINE_CPUS_ENV)}

    assert env("thinker") == {CPUS_ENV: "0", ENGINE_CPUS_ENV: "1"}
    assert env("talker") == {CPUS_ENV: "0", ENGINE_CPUS_ENV: "1"}
    assert env("code2wav") == {}
    assert env("talker", vllm_cpu_placement="vllm") == {}
    # The operator's pin wins, and the pinned worker takes no share.
    assert env("talker", worker_cpus={"talker": "0-1"}) == {CPUS_ENV: "0-1"}
    assert env("thinker", worker_cpus={"talker": "0-1"}) == {CPUS_ENV: "0", ENGINE_CPUS_ENV: "1"}
    # An explicit vLLM thread binding (worker_env or the server's env): no placement.
    assert env("talker", worker_env={BIND_ENV: "nobind"}) == {BIND_ENV: "nobind"}
    monkeypatch.setenv(BIND_ENV, "0")
    assert env("talker") == {BIND_ENV: "0"}
    with pytest.raises(ValueError, match="vllm_cpu_placement"):
        env("talker", vllm_cpu_placement="auto")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.may_skip("a machine with one CPU has nothing to pin apart; no dependency is missing")
def test_a_process_started_under_engine_affinity_keeps_it_and_threads_get_the_frontend_back():
    cpus = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    probe = "import os; print(sorted(os.sched_getaffinity(0)))"
    go, seen = threading.Event(), []
    helper = threading.Thread(target=lambda: (go.wait(), seen.append(os.sched_getaffinity(0))))
    with engine_affinity(str(cpus[-1])):
        child = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
        helper.start()  # like AsyncLLM's client threads, started while it spawns its engine
    go.set()
    helper.join()
    assert child.stdout.strip() == str([cpus[-1]])
    assert os.sched_getaffinity(0) == before
    assert seen == [before]
    with engine_affinity(None):
        assert os.sched_getaffinity(0) == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.may_skip("a machine with one CPU has nothing to pin apart; no dependency is missing")
def test_pin_process_pins_every_thread_and_plans_still_see_the_whole_machine():
    # In a child: pinning the test process would confine the rest of the suite.
    code = textwrap.dedent("""
        import os, threading
        from omnix.stages.placement import available_cpus, pin_process
        whole = sorted(os.sched_getaffinity(0))
        ev = threading.Event(); seen = []
        t = threading.Thread(target=lambda: (ev.wait(), seen.append(sorted(os.sched_getaffinity(0)))))
        t.start()
        pin_process(str(whole[0]))
        ev.set(); t.join()
        print(seen[0] == [whole[0]], sorted(os.sched_getaffinity(0)) == [whole[0]],
              available_cpus() == whole)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]
