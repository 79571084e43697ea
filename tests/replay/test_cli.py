"""``omnix replay`` and ``omnix trace`` from the command line: every mode,
its output and its exit status."""

from __future__ import annotations

import json
import re

import pytest

from omnix.cli import main
from omnix.events.types import Chunk
from omnix.trace import export_trace, write_trace

from .conftest import busy_two_talkers


@pytest.fixture
async def trace_file(tmp_path):
    omni = await busy_two_talkers()
    path = tmp_path / "r3.trace"
    write_trace(path, export_trace(omni.log, omni.blobs, omni.pipeline, ["r3"]))
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_show_is_the_default(trace_file, capsys):
    code, out, _ = run(capsys, "replay", str(trace_file))
    assert code == 0
    assert "re-folded, matches" in out
    assert re.search(r"request r3 \(target\): finished", out)
    assert re.search(r"TTFT \d+\.\d{3} ms · TTFP \d+\.\d{3} ms · E2EL \d+\.\d{3} ms", out)
    assert "thinker/0" in out and "█" in out and "where time went" in out
    code, out, _ = run(capsys, "replay", str(trace_file), "--request", "r3", "--events")
    assert code == 0 and "request r0" not in out and " > #" in out


async def test_html_page_is_self_contained(trace_file, tmp_path, capsys):
    page = tmp_path / "t.html"
    code, _, err = run(capsys, "replay", str(trace_file), "--html", str(page))
    assert code == 0 and "wrote" in err
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "<svg" in html and "<style>" in html
    assert "TTFT" in html and "r3" in html
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html


async def test_drive_exit_status(trace_file, capsys):
    code, out, _ = run(capsys, "replay", str(trace_file), "--drive")
    assert code == 0 and "every decision matches the recording byte for byte" in out
    code, out, _ = run(capsys, "replay", str(trace_file), "--drive", "--set", "edges.1.every=1")
    assert code == 1
    assert "divergence at position" in out and "expected (recorded)" in out


async def test_counterfactual_by_set_and_by_config(trace_file, tmp_path, capsys):
    code, out, _ = run(capsys, "replay", str(trace_file), "--set", "edges.1.every=1")
    assert code == 0 and "counterfactual replay" in out and re.search(r"\d+ differ", out)
    code, out, _ = run(
        capsys, "replay", str(trace_file), "--set", "stages.talker.timeout_s=0.001", "--timers"
    )
    assert code == 0 and "failed (stage_timeout)" in out
    code, _, err = run(capsys, "replay", str(trace_file), "--set", "edges.9.every=1")
    assert code == 2 and "no item '9'" in err
    code, _, err = run(capsys, "replay", str(trace_file), "--set", "edges.1.every=0")
    assert code == 2 and "not a valid pipeline" in err
    code, _, err = run(capsys, "replay", str(trace_file), "--config", str(tmp_path / "none.toml"))
    assert code == 2


async def test_inject_prints_what_happened_and_the_invariants(trace_file, capsys):
    from omnix.trace import read_trace

    t = read_trace(trace_file)
    p = next(
        e.pos
        for e in t.events
        if isinstance(e, Chunk) and e.request_id == "r3" and e.stage == "talker"
    )
    code, out, _ = run(capsys, "replay", str(trace_file), "--inject", f"worker-lost@{p}")
    assert code == 0 and "all invariants hold" in out and "injected" in out
    code, _, err = run(capsys, "replay", str(trace_file), "--inject", "meteor@3")
    assert code == 2 and "cannot read fault" in err


def test_show_and_inject_mark_a_continuation(capsys):
    from pathlib import Path

    corpus = Path(__file__).resolve().parents[2] / "replay" / "sim-omni-worker-lost.trace"
    code, out, _ = run(capsys, "replay", str(corpus), "--events")
    assert code == 0
    assert "continuation: talker moved to talker/1 at #17, after its 3 chunks" in out
    assert "attempt 2" in out
    assert re.search(r" > #17 .* -> talker/1 seq=0 .* CONTINUES after chunk 2 cause=#16", out)
    code, out, _ = run(capsys, "replay", str(corpus), "--inject", "worker-lost@14")
    assert code == 0 and "all invariants hold" in out
    assert "worker-lost-1: finished (as recorded)" in out
    assert re.search(r"migrated +#16 .* -> talker/1 seq=0 .* CONTINUES after chunk 1", out)


async def test_bad_trace_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.trace"
    bad.write_bytes(b"not a trace")
    code, _, err = run(capsys, "replay", str(bad))
    assert code == 2 and "not an omnix trace" in err


async def test_trace_info(trace_file, capsys):
    code, out, _ = run(capsys, "trace", "info", str(trace_file))
    assert code == 0 and "targets       r3" in out and "(verified)" in out


def test_bench_replay_prints_json_last(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code = main(["bench", "replay", "--events", "3000", "--repeat", "1", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    figures = json.loads(out[-1])
    assert figures["fold_events_per_s"] > 0 and figures["drive_events_per_s"] > 0
    assert figures["events"] >= 3000
