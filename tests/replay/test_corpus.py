"""The corpus: every trace in replay/ is replayed on every run.

A change that alters what the orchestrator decides on a recorded case
fails here with the divergence report; a change to the HTTP renderer that
alters a client's bytes fails on the ``.body`` beside the trace.  If the
change is intended, version it and recapture (docs/replay.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omnix.replay.drive import drive
from omnix.replay.faults import check_invariants
from omnix.testing.sse import parse_sse
from omnix.trace import read_trace
from omnix.traceview.show import render_timeline

CORPUS = Path(__file__).resolve().parents[2] / "replay"
TRACES = sorted(CORPUS.glob("*.trace"))
CASES = ("normal", "cancel", "worker-lost", "deadline", "rejected")
#: Chat with audio and image input: over HTTP only (not on the simulator).
HTTP_CASES = ("media",)


def test_the_corpus_has_every_case():
    names = {p.stem for p in TRACES}
    for prefix in ("sim-omni", "scripted-omni", "tiny-omni"):
        cases = CASES if prefix.startswith("sim") else CASES + HTTP_CASES
        missing = [c for c in cases if f"{prefix}-{c}" not in names]
        assert not missing, (
            f"replay/ lacks {prefix} traces for {missing}; recapture (docs/replay.md)"
        )


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_corpus_trace_replays(path: Path):
    trace = read_trace(path)  # re-folds and checks every digest
    res = drive(trace, raise_on_divergence=False)
    if res.divergence is not None:
        pytest.fail(
            f"{path.name} no longer replays: a recorded decision changed.\n"
            f"{res.divergence.report()}",
            pytrace=False,
        )
    assert res.digest == trace.digest
    assert check_invariants(trace.events, require_terminal=False) == []
    f = trace.fold()
    for rid in trace.targets:
        assert f.requests[rid].terminal, f"{path.name}: target {rid} has no terminal event"
    assert "re-folded, matches" in render_timeline(trace)
    body = path.with_suffix(".body")
    if body.exists():
        from omnix.replay.client import client_bytes

        again = client_bytes(trace)
        assert again == body.read_bytes(), (
            f"{path.name}: rendering the recorded events no longer gives the bytes the client "
            f"received ({len(again)} vs {body.stat().st_size} bytes); the HTTP renderer changed"
        )


def _response(body: Path) -> tuple[str, str, object]:
    """A streamed chat body's text, audio and usage (ids and times differ
    between captures)."""
    import json

    text: list[str] = []
    audio: list[str] = []
    usage: object = None
    for event in parse_sse(body.read_bytes()):
        if not event.data.startswith("{"):
            continue
        data = json.loads(event.data)
        for choice in data.get("choices", []):
            delta = choice.get("delta", {})
            text.append(delta.get("content") or "")
            audio.append((delta.get("audio") or {}).get("data") or "")
        usage = data.get("usage") or usage
    return "".join(text), "".join(audio), usage


def test_a_migrated_request_answers_the_client_as_an_undisturbed_one():
    # Captured through real worker processes: the talker was killed with
    # SIGKILL mid-stream and its stage continued on the other talker.
    lost = read_trace(CORPUS / "scripted-omni-worker-lost.trace")
    assert lost.rules_version >= 2
    assert any(getattr(ev, "resume", 0) for ev in lost.events)
    normal = _response(CORPUS / "scripted-omni-normal.body")
    assert normal[0] and normal[1] and normal[2]
    assert _response(CORPUS / "scripted-omni-worker-lost.body") == normal
