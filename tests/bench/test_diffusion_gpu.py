"""The published-size diffusion table's code path, on a CPU at test sizes.

``scripts/gpu-diffusion-bench.sh`` runs ``omnix bench diffusion --device
cuda --sizes real`` on a GPU machine that has torch and little else.  Here
the same script runs ``--device cpu --sizes tiny``: the same builders
(``omnix.models.diffusion_real``), engines and table, at test sizes, in a
Python where the modules such a machine lacks cannot be imported (PyAV,
pyzmq, vLLM, nats: ``BLOCKED``), so a run there can fail only on what CUDA
itself brings.  The figures are not judged; the rows, their keys and the
one-line refusals are.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-diffusion-bench.sh"
#: importable here, absent on the GPU machine (docs/bench.md)
BLOCKED = ("av", "zmq", "vllm", "nats", "openai", "soundfile")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None, reason="real engines unavailable: no diffusers"
)

MEASURED = (
    "steps_per_s", "steps_per_s_min", "steps_per_s_c4", "steps_per_s_c4_min", "repeats_equal",
    "batched_c4", "runs", "start_s", "warm_s",
)  # fmt: skip
AGAINST_OFF = ("speedup_steps", "speedup_steps_c4", "psnr_db_min", "max_pixel_diff")


def _script(tmp_path: Path, *argv: str) -> dict[str, Any]:
    """The script's last line, after it exited 0, run with no wheels to
    install and the ``BLOCKED`` modules unimportable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # import fails; find_spec says absent\n"
    )
    env = {
        **os.environ,
        "WHEELS": str(tmp_path / "no-wheels"),
        "SITE": str(site),
        "PYTHON": sys.executable,
    }
    done = subprocess.run(
        [str(SCRIPT), "--device", "cpu", "--sizes", "tiny", "--compile", "off", "--json",
         "--build-dir", str(tmp_path / "models"), *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_rows(out: dict[str, Any], unit: str, runs: int) -> None:
    rows = out["rows"]
    for label, row in rows.items():
        if "skipped" in row:
            continue
        missing = [k for k in (*MEASURED, f"{unit}_c1", f"{unit}_c4") if k not in row]
        missing += [k for k in AGAINST_OFF if label != "off" and k not in row]
        assert not missing, (label, missing, row)
        assert row["runs"] == runs and row["batched_c4"] is True, (label, row)
        assert label == "off" or 0 <= row["max_pixel_diff"] <= 255
    assert out["errors"] == 0 and out["card"] == "cpu" and out["sizes"] == "tiny"


def test_the_gpu_script_runs_wans_table_without_the_modules_a_gpu_machine_lacks(tmp_path):
    """Wan 2.1's classes at test sizes in bfloat16 (as on the GPU), loaded
    together: off, the caches Wan runs, taylorseer skipped with why, and
    guidance unbatched; each seed's pixels the same in every run."""
    out = _script(tmp_path, "--runs", "2", "--dtype", "bfloat16")
    rows = out["rows"]
    assert list(rows) == [
        "off", "first_block,threshold=0.32", "pyramid_attention_broadcast", "cfg_batch=off",
        "taylorseer",
    ]  # fmt: skip
    assert "does not run on WanPipeline" in rows["taylorseer"]["skipped"]
    _assert_rows(out, "video_s_per_s", runs=2)
    assert all(row.get("repeats_equal", True) for row in rows.values())
    assert out["order"] == "together" and out["dtype"] == "bfloat16"
    assert (out["model"], out["frames"], out["fps"], out["steps"]) == ("wan2.1-t2v-1.3b", 5, 16, 8)
    assert set(out["target_met_by"]) <= {
        "first_block,threshold=0.32",
        "pyramid_attention_broadcast",
    }


def test_fluxs_table_one_side_after_another_within_the_budget(tmp_path):
    """FLUX.1-dev's classes at test sizes, each side loaded alone in turn
    (as its 12 B parameters are on the GPU), every cache kind running and
    no guidance row; a budget already spent leaves each side its one run."""
    out = _script(
        tmp_path, "--model", "flux.1-dev", "--order", "one-by-one", "--runs", "3",
        "--budget-s", "1", "--steps", "4",
    )  # fmt: skip
    assert list(out["rows"]) == [
        "off", "first_block,threshold=0.32", "taylorseer", "pyramid_attention_broadcast",
    ]  # fmt: skip
    _assert_rows(out, "images_per_s", runs=1)
    assert out["order"] == "one after another" and "frames" not in out


def test_a_side_that_cannot_start_is_a_row_with_its_error_and_the_rest_still_run(tmp_path):
    """A compiled side on a CPU with no C++ compiler on PATH: refused when
    its engine starts; off and the cache are measured; exit status 1."""
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    done = subprocess.run(
        [sys.executable, "-m", "omnix.cli", "bench", "diffusion", "--sizes", "tiny",
         "--cache", "pyramid_attention_broadcast", "--compile", "blocks", "--runs", "1",
         "--json", "--build-dir", str(tmp_path / "models")],
        cwd=ROOT, env={**env, "PATH": str(tmp_path)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "sides that failed: 1 (their rows say why)"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["errors"] == 1 and out["rows"]["compile=blocks"] == {
        "error": "ValueError: engine.compile = 'blocks': torch.compile on the CPU needs a C++ "
        "compiler (g++, clang++ or $CXX) on PATH; set compile = 'off' (or --compile off)"
    }
    assert out["rows"]["off"]["runs"] == out["rows"]["pyramid_attention_broadcast"]["runs"] == 1
