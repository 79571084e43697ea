"""``RuntimeOptions``: the stage runtime's knobs, typed, checked where built."""

from __future__ import annotations

import pytest

from omnix.api import Omni
from omnix.events.blobs import MemoryBlobStore
from omnix.pipelines.config import ScriptedArgs
from omnix.stages.errors import RuntimeConfigError
from omnix.stages.options import RuntimeOptions
from omnix.stages.runtime import StageRuntime
from omnix.testing.serving import InProcessRuntime

from .conftest import scripted_pipeline


def test_an_unknown_option_name_is_a_type_error():
    with pytest.raises(TypeError, match="nope"):
        RuntimeOptions(nope=1)  # type: ignore[call-arg]


def test_options_are_typed_not_a_dict():
    p = scripted_pipeline(s=(ScriptedArgs(), 1))
    with pytest.raises(TypeError, match="must be a RuntimeOptions"):
        Omni(p, runtime_options={"start_timeout_s": 1.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a RuntimeOptions"):
        StageRuntime(p, lambda ev: None, MemoryBlobStore(), {"spawn": False})  # type: ignore[arg-type]


def test_options_beside_another_runtime_are_refused_not_dropped():
    p = scripted_pipeline(s=(ScriptedArgs(), 1))
    with pytest.raises(ValueError, match="give them to runtime_factory"):
        Omni(p, runtime_factory=InProcessRuntime, runtime_options=RuntimeOptions())


def test_values_bad_on_their_own_fail_where_the_options_are_built():
    with pytest.raises(ValueError, match="at least twice heartbeat_interval_s"):
        RuntimeOptions(heartbeat_interval_s=1.0, lost_after_s=1.5)
    with pytest.raises(RuntimeConfigError, match="start_attempts=0"):
        RuntimeOptions(start_attempts=0)
    with pytest.raises(ValueError, match="shutdown_grace_s=-1"):
        RuntimeOptions(shutdown_grace_s=-1)
    with pytest.raises(RuntimeConfigError, match="placement must be 'spawn' or 'ray'"):
        RuntimeOptions(placement="k8s")  # type: ignore[arg-type]


def test_the_runtime_reads_its_options():
    p = scripted_pipeline(s=(ScriptedArgs(), 1))
    opts = RuntimeOptions(spawn=False, start_timeout_s=7.0, worker_env={"X": "1"})
    rt = StageRuntime(p, lambda ev: None, MemoryBlobStore(), opts)
    assert rt.options is opts
    assert rt.spawned_stages == frozenset()
    assert rt.load_timeout_s == 7.0  # None: start_timeout_s
    assert rt.worker_env == {"X": "1"}
