"""``omnix telemetry`` and ``omnix bench telemetry`` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnix.cli import main

ROOT = Path(__file__).parents[2]
TRACE = ROOT / "replay" / "tiny-omni-cancel.trace"


@pytest.fixture(autouse=True)
def _keep_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    # omnix.cli.main(argv) rewrites sys.argv; give it back afterwards.
    monkeypatch.setattr(sys, "argv", list(sys.argv))


@pytest.fixture
def trace() -> Path:
    if not TRACE.exists():
        pytest.skip(f"{TRACE} not in this checkout")
    return TRACE


def test_prints_the_exposition_of_a_trace(trace: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["telemetry", "--trace", str(trace)]) == 0
    out, err = capsys.readouterr()
    assert "gen_ai_server_request_duration_seconds_count" in out
    assert 'omnix_requests_cancelled_total{pipeline="tiny-omni",reason="client"} 1.0' in out
    assert "1 requests ended" in err


def test_prints_spans_as_json_lines(trace: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["telemetry", "--trace", str(trace), "--spans"]) == 0
    lines = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    names = {s["name"] for s in lines}
    assert "chat tiny-omni" in names and "stage thinker" in names
    root = next(s for s in lines if s["name"] == "chat tiny-omni")
    assert any(e["name"] == "cancel_requested" for e in root["events"])


def test_a_missing_trace_is_a_clear_error(capsys: pytest.CaptureFixture) -> None:
    assert main(["telemetry", "--trace", "/nonexistent/x.trace"]) == 2
    assert "no such trace file" in capsys.readouterr().err


def test_bench_prints_the_ratio_last() -> None:
    cmd = [
        sys.executable, "-m", "omnix.cli", "bench", "telemetry",
        "--requests", "12", "--rounds", "1", "--json",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < figures["telemetry_throughput_ratio"] < 2
    assert 0 < figures["telemetry_traces_throughput_ratio"] < 2
    assert figures["events_per_request"] > 100
