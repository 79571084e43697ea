"""Fold-and-show: a trace as a readable timeline in the terminal.

Owns: ``describe`` (one event as one line, used by every replay report),
``request_timing`` (TTFT / TTFP / E2EL and per-stage times from a
``RequestState``), the text waterfall and ``render_timeline``, the default
output of ``omnix replay TRACE``.

Does not own reading or verifying traces (``trace.py``), the HTML page
(``html.py``, which reuses ``request_timing``) or any replay that runs the
orchestrator (``drive.py``, ``faults.py``).  Everything here is a pure
function of the trace's events and their fold.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import assert_never

from omnix.events.reducer import RequestState, StageState
from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Rejected,
    Released,
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
    event_tag,
)
from omnix.trace import Trace, is_decision

MS = 1_000_000

# -- one event, one line ------------------------------------------------------


def _ms(ns: int) -> str:
    return f"{ns / MS:.3f}ms"


def _short(text: str, n: int = 32) -> str:
    text = text.replace("\n", "\\n")
    return repr(text if len(text) <= n else text[: n - 1] + "…")


def _refs(ps: tuple[int, ...]) -> str:
    if len(ps) > 6:
        return "[" + " ".join(f"#{p}" for p in ps[:3]) + f" … #{ps[-1]}] ({len(ps)})"
    return "[" + " ".join(f"#{p}" for p in ps) + "]"


def _cause(c: int) -> str:
    return f" cause=#{c}" if c >= 0 else ""


def describe(ev: Event, t0: int | None = None) -> str:
    """``#pos +t  tag  who  details``: one event on one line."""
    when = f" +{_ms(ev.ts_ns - t0)}" if t0 is not None and ev.ts_ns else ""
    head = f"#{ev.pos}{when} {event_tag(ev)}"
    match ev:
        case Admitted(spec=s):
            extra = f" deadline={s.deadline_ms}ms" if s.deadline_ms else ""
            prompt = s.prompt or (s.messages[-1].content if s.messages else "")
            return f"{head} {ev.request_id} outputs={'+'.join(s.outputs)} prompt={_short(prompt)}{extra}"
        case Rejected():
            return f"{head} {ev.request_id} {ev.reason}: {ev.message}"
        case Routed():
            last = " last" if ev.last else ""
            # A continuation: the stage moved here after ``resume`` chunks.
            cont = f" CONTINUES after chunk {ev.resume - 1}" if ev.resume else ""
            return (
                f"{head} {ev.request_id} -> {ev.stage}/{ev.replica} seq={ev.seq} "
                f"sources={_refs(ev.sources)}{last}{cont}{_cause(ev.cause)}"
            )
        case StageStarted():
            return f"{head} {ev.request_id} {ev.stage}/{ev.replica}"
        case Progress():
            return f"{head} {ev.request_id} {ev.stage}/{ev.replica} {ev.step}/{ev.total}"
        case Chunk():
            if ev.blob is not None:
                b = ev.blob
                shape = "x".join(map(str, b.shape)) or f"{b.nbytes}B"
                body = f"blob {b.digest[:8]} {shape} {b.dtype}"
            elif ev.text:
                body = _short(ev.text)
            else:
                body = f"ids={list(ev.token_ids)}"
            return (
                f"{head} {ev.request_id} {ev.stage}/{ev.replica} [{ev.index}] {ev.modality} {body}"
            )
        case StageFinished():
            return (
                f"{head} {ev.request_id} {ev.stage}/{ev.replica} chunks={ev.chunks} "
                f"{ev.finish_reason}"
            )
        case StageFailed():
            return f"{head} {ev.request_id} {ev.stage}/{ev.replica} {_short(ev.message, 60)}"
        case CancelRequested() | Cancelled():
            return f"{head} {ev.request_id} {ev.reason}{_cause(ev.cause)}"
        case DeadlineExpired():
            return f"{head} {ev.request_id} scope={ev.scope}"
        case InputAppended():
            last = " last" if ev.last else ""
            return f"{head} {ev.request_id} {_short(ev.text, 60)!r}{last}"
        case Failed():
            stage = f" stage={ev.stage}" if ev.stage else ""
            return f"{head} {ev.request_id} {ev.reason}{stage} {_short(ev.message, 60)}{_cause(ev.cause)}"
        case Finished():
            return f"{head} {ev.request_id}{_cause(ev.cause)}"
        case WorkerJoined():
            return f"{head} {ev.worker_id} engine={ev.engine} capacity={ev.capacity}"
        case WorkerLost():
            return f"{head} {ev.worker_id} {ev.reason}"
        case Released():
            return f"{head} {len(ev.request_ids)} ended request(s) released ({ev.reason})"
        case SessionChanged():
            what = ev.item.id if ev.item is not None else ev.item_id
            return f"{head} {ev.session} {ev.op}{' ' + what if what else ''}"
        case Scaled():
            return (
                f"{head} {ev.stage}/{ev.replica} {ev.op} ({ev.reason}) "
                f"replicas={ev.replicas}{_cause(ev.cause)}"
            )
        case _:
            assert_never(ev)


# -- timings ------------------------------------------------------------------------


@dataclass(frozen=True)
class StageTiming:
    """One stage of one request, times in ns relative to admission."""

    name: str
    replica: int
    status: str
    finish_reason: str
    chunks: int
    attempt: int
    routed: int | None
    started: int | None
    first_chunk: int | None
    last_chunk: int | None
    ended: int | None

    @property
    def wait_ns(self) -> int:
        """Routed -> started (queued in the worker, loading)."""
        if self.routed is None or self.started is None:
            return 0
        return max(0, self.started - self.routed)

    @property
    def busy_ns(self) -> int:
        """Started -> end (or last output when it never ended)."""
        if self.started is None:
            return 0
        end = self.ended if self.ended is not None else self.last_chunk
        return max(0, (end or self.started) - self.started)


@dataclass(frozen=True)
class RequestTiming:
    request_id: str
    status: str
    reason: str
    admitted_ts: int
    ttft: int | None
    ttfp: int | None
    e2el: int | None
    stages: tuple[StageTiming, ...]
    events: int


def _rel(ts: int, t0: int) -> int | None:
    return ts - t0 if ts else None


def request_timing(rs: RequestState) -> RequestTiming:
    """TTFT (first text chunk), TTFP (first audio chunk) and E2EL (admission
    to terminal event) from the fold's timestamps, ns from admission."""
    t0 = rs.admitted_ts

    def stage(st: StageState) -> StageTiming:
        return StageTiming(
            name=st.name,
            replica=st.replica,
            status=st.status,
            finish_reason=st.finish_reason,
            chunks=st.chunks,
            attempt=st.attempt,
            routed=_rel(st.routed_ts, t0),
            started=_rel(st.started_ts, t0),
            first_chunk=_rel(st.first_chunk_ts, t0),
            last_chunk=_rel(st.last_chunk_ts, t0),
            ended=_rel(st.finished_ts, t0),
        )

    return RequestTiming(
        request_id=rs.request_id,
        status=rs.status,
        reason=rs.reason,
        admitted_ts=t0,
        ttft=_rel(rs.first_token_ts, t0),
        ttfp=_rel(rs.first_audio_ts, t0),
        e2el=_rel(rs.terminal_ts, t0) if rs.terminal else None,
        stages=tuple(stage(st) for st in rs.stages),
        events=rs.events,
    )


def _n(k: int, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "s")


def _opt(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / MS:.3f}"


# -- the waterfall ------------------------------------------------------------------

WAIT, IDLE, BUSY = "░", "▒", "█"


def waterfall(timing: RequestTiming, end_ns: int, width: int = 56) -> list[str]:
    """One text bar per stage over [admission, end_ns]: ``░`` routed, not yet
    started; ``▒`` started, no output yet; ``█`` producing output."""
    span = max(end_ns, 1)
    scale = width / span

    def col(ns: int) -> int:
        return min(width, max(0, round(ns * scale)))

    label_w = max([len(f"{s.name}/{s.replica}") for s in timing.stages] + [8])
    lines: list[str] = []
    for s in timing.stages:
        row = [" "] * width
        routed = s.routed or 0
        started = s.started if s.started is not None else None
        first = s.first_chunk
        end = (
            s.ended
            if s.ended is not None
            else (s.last_chunk if s.last_chunk is not None else end_ns)
        )
        a = col(routed)
        b = col(started) if started is not None else col(end)
        c = col(first) if first is not None else col(end)
        d = max(col(end), a + 1)
        for i in range(a, min(b, width)):
            row[i] = WAIT
        for i in range(b, min(c, width)):
            row[i] = IDLE
        for i in range(c, min(d, width)):
            row[i] = BUSY
        if d <= width and a < width and all(ch == " " for ch in row[a:d]):
            row[min(a, width - 1)] = BUSY
        dur = (end - routed) / MS
        status = s.status if s.status == "finished" else s.status.upper()
        lines.append(
            f"  {f'{s.name}/{s.replica}':<{label_w}} |{''.join(row)}| {dur:9.3f} ms  {status}"
        )
    marks = [" "] * (width + 1)
    if timing.ttft is not None:
        marks[col(timing.ttft)] = "T"
    if timing.ttfp is not None:
        marks[col(timing.ttfp)] = "P" if marks[col(timing.ttfp)] == " " else "*"
    if timing.e2el is not None:
        c = min(col(timing.e2el), width)
        marks[c] = "E" if marks[c] == " " else "*"  # *: two marks in one column
    if any(m != " " for m in marks):
        lines.append(f"  {'':<{label_w}}  {''.join(marks).rstrip()}")
    axis = f"0 ms{'':<{max(0, width - 14)}}{end_ns / MS:.3f} ms"
    lines.append(f"  {'':<{label_w}}  {axis}")
    return lines


# -- the whole timeline -------------------------------------------------------------


def render_timeline(
    trace: Trace,
    *,
    requests: list[str] | None = None,
    events: bool = False,
    width: int = 56,
) -> str:
    """The default ``omnix replay`` output: header, digest check, and per
    request the timings, a stage table and a waterfall."""
    f = trace.fold()
    out: list[str] = []
    t0 = trace.events[0].ts_ns if trace.events else 0
    kinds = Counter(event_tag(ev) for ev in trace.events)
    stages = " -> ".join(st.name for st in trace.pipeline.stages)
    out.append(f"trace {trace.source}")
    out.append(
        f"  format v{trace.format_version} · omnix {trace.omnix_version} · event schema "
        f"v{trace.schema_version} · rules v{trace.rules_version} · pipeline "
        f"{trace.pipeline.name} ({stages})"
    )
    targets = ", ".join(trace.targets) if trace.targets else "whole log"
    out.append(
        f"  {_n(len(trace.events), 'event')} ({_n(trace.decisions, 'decision')}) · "
        f"{_n(len(f.requests), 'request')} (target: {targets}) · {_n(len(f.workers), 'worker')} · "
        f"{_n(len(trace.blobs.digests()), 'blob')}"
    )
    got = f.digest()
    check = "re-folded, matches" if got == trace.digest else f"DOES NOT MATCH (re-folded: {got})"
    out.append(f"  state digest {trace.digest}: {check}")
    out.append(f"  events: {', '.join(f'{k} {v}' for k, v in kinds.most_common())}")
    if trace.cut is not None:
        out.append(f"  cut: {trace.cut.describe()}")
    out.append("")
    rids = requests or trace.request_ids
    for rid in rids:
        rs = f.requests.get(rid)
        if rs is None:
            out.append(f"request {rid}: not in this trace (it has: {', '.join(trace.request_ids)})")
            continue
        out.extend(_request_block(trace, rs, width))
        out.append("")
    if events:
        out.append("events")
        wanted = set(rids)
        for ev in trace.events:
            if not isinstance(ev, RequestEvent) or ev.request_id in wanted:
                mark = "  " if not is_decision(ev) else " >"
                out.append(f"{mark} {describe(ev, t0)}")
    return "\n".join(out).rstrip() + "\n"


def _request_block(trace: Trace, rs: RequestState, width: int) -> list[str]:
    tm = request_timing(rs)
    target = " (target)" if rs.request_id in trace.targets else ""
    how = rs.status + (f" ({rs.reason})" if rs.reason else "")
    if not rs.terminal:
        how += ": still live where the trace ends (came in by closure)"
    out = [f"request {rs.request_id}{target}: {how}"]
    if rs.admitted_pos >= 0:
        where = f"admitted at #{rs.admitted_pos}" + (
            f" · ended at #{rs.terminal_pos} ({rs.terminal_type})" if rs.terminal else ""
        )
    else:
        where = f"refused at admission, #{rs.terminal_pos}"
    out.append(f"  outputs {'+'.join(rs.outputs)} · {_n(rs.events, 'event')} · {where}")
    out.append(f"  TTFT {_opt(tm.ttft)} ms · TTFP {_opt(tm.ttfp)} ms · E2EL {_opt(tm.e2el)} ms")
    if not tm.stages:
        return out
    out.append("  stage         routed   started  1st out  last out     ended  chunks  status")
    for s in tm.stages:
        retry = f" attempt {s.attempt}" if s.attempt > 1 else ""
        reason = f" ({s.finish_reason})" if s.finish_reason else ""
        out.append(
            f"  {f'{s.name}/{s.replica}':<12}{_opt(s.routed):>8}{_opt(s.started):>10}"
            f"{_opt(s.first_chunk):>9}{_opt(s.last_chunk):>10}{_opt(s.ended):>10}"
            f"{s.chunks:>8}  {s.status}{reason}{retry}"
        )
    for ev in trace.events:
        if type(ev) is Routed and ev.resume and ev.request_id == rs.request_id:
            out.append(
                f"  continuation: {ev.stage} moved to {ev.stage}/{ev.replica} at #{ev.pos}, "
                f"after its {_n(ev.resume, 'chunk')} (from chunk {ev.resume} on){_cause(ev.cause)}"
            )
    end = tm.e2el
    if end is None:
        last = max((s.ended or s.last_chunk or s.started or s.routed or 0) for s in tm.stages)
        end = last
    out.append(
        f"  where time went (ms from admission; {WAIT} routed, waiting  {IDLE} started, "
        f"no output yet  {BUSY} producing; T TTFT, P TTFP, E E2EL)"
    )
    out.extend(waterfall(tm, end, width))
    busiest = max(tm.stages, key=lambda s: s.busy_ns + s.wait_ns)
    out.append(
        f"  longest stage: {busiest.name} ({(busiest.busy_ns + busiest.wait_ns) / MS:.3f} ms"
        f", {busiest.wait_ns / MS:.3f} ms of it waiting to start)"
    )
    return out
