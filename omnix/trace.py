"""Trace files: a self-contained, versioned capture of one or more requests.

Owns: the trace file format (``TraceFile``), ``export_trace`` (cut a
dependency-closed window out of a log, renumber it, attach blobs, pipeline
and versions), ``read_trace``/``write_trace`` and ``Trace``, the decoded,
verified in-memory form every replay mode works on.  Also
``export_from_dir`` for logs on disk (``omnix trace export``).

Does not own replaying (``omnix.replay``: drive, faults), presentation
(``omnix.traceview.show``, ``html``) or the log itself (``omnix.events``).
It sits below the HTTP layer and telemetry, which export and read traces,
and above the orchestrator, whose rules version every trace records.

File layout::

    b"OMNIXTRC"  u16 LE trace format version   msgpack(TraceFile)

``TraceFile.events`` is ``codec.encode_events`` of the renumbered events
(it carries its own event schema version byte), ``pipeline`` the msgpack
encoding of the ``PipelineConfig``, ``blobs`` the referenced payloads by
digest (sorted).  No wall clock, host name or path enters the file: the
same log and request ids give the same bytes, whoever exports them.

Why a window and not just the request's events: the orchestrator's
decisions are cross-request (least-loaded replica choice, per-stage FIFO
queues, admission refusal), so replaying one request's events alone would
not reproduce them.  A trace holds the log segment from the last *idle
point* before the first target's admission (a position no earlier request
is still live across) to the end of the cascade that holds the last
target's terminal event, plus every worker event before that segment.
Every request live at any point of the segment is in it from its
admission on, and transitively so for the requests those overlapped; see
``docs/replay.md`` ("What a trace contains").

The window is bounded (a server that is never idle has no idle point to
start from, and exporting must not pin its whole history): it starts at
most ``max_window`` positions before the first target's admission, and on
a server with retention the requests released before export are gone from
the log anyway.  What that leaves out is said in the trace
(``TraceFile.cut``, ``Trace.cut``): where the window was cut, the requests
left out because they were live across the cut, how many positions inside
the window retention had released, and how many references (a ``cause``)
pointed at what was left out (set to -1).  Such a trace folds and shows
exactly; driving it may diverge where a left-out request's load or queue
place mattered.
"""

from __future__ import annotations

import itertools
import os
import struct
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

import omnix
from omnix.events.blobs import BlobMissing, BlobStore, MemoryBlobStore, blob_digest
from omnix.events.codec import SchemaError, decode_events, encode_events
from omnix.events.log import EventLog
from omnix.events.options import RealtimeOptions
from omnix.events.reducer import Fold, IllegalTransition, RequestState, state_bytes
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DecisionEvent,
    Event,
    Failed,
    Finished,
    InputAppended,
    Progress,
    Released,
    RequestEvent,
    Routed,
    Scaled,
    SessionChanged,
    is_decision,
)
from omnix.orchestrator.decide import RULES_VERSION
from omnix.pipelines.config import PipelineConfig

__all__ = [
    "TRACE_FORMAT_VERSION",
    "TRACE_MAGIC",
    "Trace",
    "TraceCorrupt",
    "TraceCut",
    "TraceError",
    "TraceFile",
    "DecisionEvent",
    "export_from_dir",
    "export_trace",
    "is_decision",
    "read_trace",
    "request_digest",
    "write_trace",
]

TRACE_MAGIC = b"OMNIXTRC"
#: 2: ``TraceFile.cut`` (what a bounded window left out).
TRACE_FORMAT_VERSION = 2
#: The most log positions a trace's window reaches back before its first
#: target's admission (``export_trace(max_window=...)``).
MAX_WINDOW = 250_000
_PREFIX = struct.Struct("<8sH")
_INF = 1 << 62

#: Events carrying a ``cause`` that may point anywhere in the log.
_CAUSED = (CancelRequested, Cancelled, Failed, Finished, Scaled)


class TraceError(ValueError):
    """A trace cannot be exported or read as asked (wrong request, missing
    blob, not a trace file, newer format)."""


class TraceCorrupt(TraceError):
    """A trace whose contents do not agree with themselves: an event that
    does not fold, a state digest or blob digest that does not match."""


class TraceCut(msgspec.Struct, frozen=True, kw_only=True):
    """What a trace's window left out (``None`` on a trace that is whole)."""

    #: source log position the window was cut at (-1: not cut; the gaps
    #: are retention's)
    start: int = -1
    #: requests live across the cut, left out whole (sorted)
    requests: tuple[str, ...] = ()
    #: positions inside the window whose events retention had released
    released_positions: int = 0
    #: references (``cause``) to left-out events, written as -1
    references: int = 0

    def describe(self) -> str:
        parts = []
        if self.start >= 0:
            parts.append(
                f"window cut at log position {self.start}; {len(self.requests)} request(s) live "
                "across it left out"
            )
        if self.released_positions:
            parts.append(
                f"{self.released_positions} position(s) in the window released by retention"
            )
        if self.references:
            parts.append(f"{self.references} reference(s) to left-out events set to -1")
        return "; ".join(parts) + " (drive may diverge where those requests mattered)"


class TraceFile(msgspec.Struct, frozen=True, kw_only=True):
    """The msgpack body of a trace file.  Fields are only ever appended,
    with defaults; ``TRACE_FORMAT_VERSION`` is bumped when one is."""

    format_version: int
    omnix_version: str
    schema_version: int  # event schema of the writer (also byte 0 of ``events``)
    rules_version: int  # orchestrator decision rules the log was recorded under
    targets: tuple[str, ...]  # the requests asked for (sorted); others came by closure
    digest: str  # Fold.digest() of the (renumbered) events
    request_digests: dict[str, str]  # per request (sorted): names what a tamper touched
    pipeline: bytes  # msgspec msgpack of the PipelineConfig
    events: bytes  # codec.encode_events(renumbered events)
    # Source log position of each trace event as runs (first source pos, count).
    origin: tuple[tuple[int, int], ...]
    blobs: dict[str, bytes]  # digest -> bytes, sorted by digest
    cut: TraceCut | None = None  # v2: what a bounded window left out


_file_encoder = msgspec.msgpack.Encoder()
_file_decoder = msgspec.msgpack.Decoder(TraceFile)
_state_encoder = msgspec.msgpack.Encoder()


def request_digest(rs: RequestState) -> str:
    return blob_digest(state_bytes(rs))


@dataclass
class Trace:
    """A decoded trace.  ``events`` are renumbered ``0..n-1``."""

    events: list[Event]
    blobs: MemoryBlobStore
    pipeline: PipelineConfig
    format_version: int
    omnix_version: str
    schema_version: int
    rules_version: int
    targets: tuple[str, ...]
    digest: str
    request_digests: dict[str, str]
    origin: tuple[tuple[int, int], ...] = ()
    source: str = "<bytes>"
    #: what the export's bounded window left out (``None``: nothing)
    cut: TraceCut | None = None
    _fold: Fold | None = field(default=None, repr=False)

    @property
    def request_ids(self) -> list[str]:
        """Every request in the trace, in order of first appearance."""
        seen: dict[str, None] = {}
        for ev in self.events:
            if isinstance(ev, RequestEvent) and ev.request_id not in seen:
                seen[ev.request_id] = None
        return list(seen)

    def events_for(self, request_id: str) -> list[Event]:
        return [
            ev for ev in self.events if isinstance(ev, RequestEvent) and ev.request_id == request_id
        ]

    def fold(self) -> Fold:
        """The fold of the trace's events (cached; validated on read)."""
        if self._fold is None:
            self._fold = _fold_checked(self.events, self.source)
        return self._fold

    def source_pos(self, pos: int) -> int:
        """Where trace event ``pos`` was in the log it was exported from."""
        k = pos
        for first, count in self.origin:
            if k < count:
                return first + k
            k -= count
        raise IndexError(f"no event at trace position {pos} (trace has {len(self.events)})")

    @property
    def decisions(self) -> int:
        return sum(1 for ev in self.events if is_decision(ev))


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------


def export_trace(
    log: EventLog,
    blobs: BlobStore,
    pipeline: PipelineConfig,
    request_ids: Sequence[str] | None,
    *,
    rules_version: int = RULES_VERSION,
    max_window: int = MAX_WINDOW,
    span: tuple[int, int] | None = None,
) -> bytes:
    """The trace of ``request_ids`` (``None``: the whole log) as bytes.
    ``span``: log positions the window must cover besides the requests'
    (a realtime session's own events: ``session_span``).

    Deterministic: the same log, pipeline and request ids (in any order,
    duplicates ignored) give the same bytes.  Raises ``TraceError`` for an
    unknown request id or a referenced blob missing from ``blobs``.
    ``rules_version`` is the orchestrator's rules the log was recorded
    under (``Orchestrator.rules`` of the server; by default this omnix's).
    ``max_window``: how far (log positions) the window may reach back
    before the first target's admission; past it the window is cut and the
    trace says so (``TraceCut``).
    """
    n = log.next_pos
    cut_at = -1
    left_out: set[str] = set()
    if request_ids is None:
        targets: tuple[str, ...] = ()
        first, last = 0, n - 1
        prefix: list[int] = []
    else:
        targets = tuple(sorted(set(request_ids)))
        if not targets and span is None:
            raise TraceError("no request ids given: name at least one request to export")
        first, last, t_start = _closure_window(log, targets, span)
        if t_start - first > max_window:
            # Never idle for too long: start later, and leave out whole the
            # requests live across the new start (their admission is before it).
            cut_at = first = t_start - max(0, max_window)
            for rid, rs in log.state.requests.items():
                s, e = _interval(rs)
                if s < first <= e:
                    left_out.add(rid)
        prefix = log.worker_positions_before(first)
    events: list[Event] = [log.get(p) for p in prefix]
    if last >= first:
        events.extend(log.read(first, last + 1))
    held = len(events)
    if (
        left_out
        or any(type(ev) is Released for ev in events)
        or held != len(prefix) + last + 1 - first
    ):
        # Retention's bookkeeping is about no request of the trace, and a
        # released request's events are gone from the log: number what is
        # left densely, every reference through the map (a reference to
        # what is not in the trace becomes -1, counted).
        released = len(prefix) + last + 1 - first - held
        events = [
            ev
            for ev in events
            if type(ev) is not Released
            and not (left_out and isinstance(ev, RequestEvent) and ev.request_id in left_out)
        ]
        kept = [ev.pos for ev in events]
        missing: list[int] = []
        renumbered = _renumber(events, kept, last + 1, missing)
        origin = _runs(kept)
        cut: TraceCut | None = None
        if cut_at >= 0 or released or missing:
            cut = TraceCut(
                start=cut_at,
                requests=tuple(sorted(left_out)),
                released_positions=released,
                references=len(missing),
            )
    else:
        renumbered = _renumber(events, prefix, first)
        origin = _runs([*prefix, *range(first, last + 1)])
        cut = None
    return _encode(renumbered, blobs, pipeline, targets, origin, rules_version, cut)


def _closure_window(
    log: EventLog, targets: tuple[str, ...], span: tuple[int, int] | None = None
) -> tuple[int, int, int]:
    """``(first, last)`` log positions of the dependency-closed window, and
    the first target's admission (or ``span``'s start, when earlier)."""
    state = log.state
    starts: list[int] = [span[0]] if span is not None else []
    ends: list[int] = [span[1]] if span is not None else []
    for rid in targets:
        rs = state.requests.get(rid)
        if rs is None:
            known = len(state.requests)
            raise TraceError(
                f"request {rid!r} is not in this log ({known} requests are); "
                "check the id (it is the one the API returned, e.g. in the response's id)"
            )
        s, e = _interval(rs)
        starts.append(s)
        ends.append(e)
    t_start = min(starts)
    t_end = max(ends)
    if t_end >= _INF:
        last = log.next_pos - 1  # a target still running: everything so far
    else:
        last = _cascade_end(log, t_end)
    # The idle point: the latest request start s <= t_start such that every
    # request that started before s had ended before s.  Everything from s
    # on is then independent of what came before (bar the workers).
    intervals = sorted(_interval(rs) for rs in state.requests.values())
    first = t_start
    max_end = -1
    for s, e in intervals:
        if s > t_start:
            break
        if max_end < s:
            first = s
        if e > max_end:
            max_end = e
    return first, last, t_start


def _interval(rs: RequestState) -> tuple[int, int]:
    start = rs.admitted_pos if rs.admitted_pos >= 0 else rs.terminal_pos
    end = rs.terminal_pos if rs.terminal else _INF
    return start, end


def _cascade_end(log: EventLog, pos: int) -> int:
    """The last position of the cascade holding ``pos``: the decisions that
    followed it before the next input (a terminal event frees capacity, and
    the Routed events that gives to queued requests come right after it)."""
    n = log.next_pos
    last = pos
    p = pos + 1
    while p < n:
        batch = list(log.read(p, min(n, p + 64)))
        for ev in batch:
            if not is_decision(ev):
                return last
            last = ev.pos
        p += len(batch)
    return last


def _renumber(
    events: list[Event], prefix: list[int], first: int, missing: list[int] | None = None
) -> list[Event]:
    """Positions ``0..n-1``; a reference to a position in ``prefix`` or at
    ``first`` or after is mapped; any other is a closure bug, unless
    ``missing`` is given (a cut window): then it becomes -1 and is listed."""
    base = len(prefix)
    head = {p: i for i, p in enumerate(prefix)}
    replace = msgspec.structs.replace

    def remap(p: int, ev: Event) -> int:
        if p < 0:
            return p
        if p >= first:
            return base + p - first
        try:
            return head[p]
        except KeyError:
            if missing is not None:
                missing.append(p)
                return -1
            raise TraceError(
                f"event at log position {ev.pos} ({type(ev).__name__}) refers to position {p}, "
                f"which is outside the exported window (starting at {first}); this is a bug "
                "in the trace closure, please report it with the log"
            ) from None

    out: list[Event] = []
    shift = base - first
    for i, ev in enumerate(events):
        new_pos = head[ev.pos] if i < base else ev.pos + shift
        if i < base and type(ev) is Scaled and ev.cause >= 0 and ev.cause not in head:
            # A scale decision before the window: its cause is not in the
            # trace, which shows it as an input (the state it leaves).
            ev = replace(ev, pos=new_pos, cause=-1)
        elif type(ev) is Routed:
            ev = replace(
                ev,
                pos=new_pos,
                cause=remap(ev.cause, ev),
                sources=tuple(remap(s, ev) for s in ev.sources),
            )
        elif isinstance(ev, _CAUSED):
            ev = replace(ev, pos=new_pos, cause=remap(ev.cause, ev))
        elif ev.pos != new_pos:
            ev = replace(ev, pos=new_pos)
        out.append(ev)
    return out


def _runs(positions: Iterable[int]) -> tuple[tuple[int, int], ...]:
    runs: list[list[int]] = []
    for p in positions:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, 1])
    return tuple((a, b) for a, b in runs)


def _encode(
    events: list[Event],
    blobs: BlobStore,
    pipeline: PipelineConfig,
    targets: tuple[str, ...],
    origin: tuple[tuple[int, int], ...],
    rules_version: int,
    cut: TraceCut | None = None,
) -> bytes:
    f = _fold_checked(events, "<export>")
    digests: set[str] = set()
    for ev in events:
        if (
            type(ev) is Chunk or type(ev) is Progress or type(ev) is InputAppended
        ) and ev.blob is not None:
            digests.add(ev.blob.digest)
        elif type(ev) is Admitted:
            digests.update(p.blob.digest for m in ev.spec.messages for p in m.media)
        elif type(ev) is SessionChanged:
            digests.update(p.blob.digest for p in ev.media)
    payloads: dict[str, bytes] = {}
    for d in sorted(digests):
        try:
            payloads[d] = blobs.get(d)
        except BlobMissing:
            raise TraceError(
                f"blob {d} referenced by the log is not in the blob store; export from the "
                "server's log directory (DIR/blobs holds them) or pass the server's BlobStore"
            ) from None
    body = TraceFile(
        format_version=TRACE_FORMAT_VERSION,
        omnix_version=omnix.__version__,
        schema_version=SCHEMA_VERSION,
        rules_version=rules_version,
        targets=targets,
        digest=f.digest(),
        request_digests={rid: request_digest(f.requests[rid]) for rid in sorted(f.requests)},
        pipeline=msgspec.msgpack.encode(pipeline),
        events=encode_events(events),
        origin=origin,
        blobs=payloads,
        cut=cut,
    )
    return _PREFIX.pack(TRACE_MAGIC, TRACE_FORMAT_VERSION) + _file_encoder.encode(body)


def session_span(log: EventLog, session: str) -> tuple[list[str], tuple[int, int]]:
    """A realtime session in ``log``: its responses' request ids, and the
    first and last positions of its own events (``SessionChanged``).
    Raises ``TraceError`` when the log holds none of it."""
    rids: list[str] = []
    first = last = -1
    for ev in log.read(0, log.next_pos):
        if type(ev) is SessionChanged and ev.session == session:
            first = ev.pos if first < 0 else first
            last = ev.pos
        elif type(ev) is Admitted:
            opts = ev.spec.response
            if isinstance(opts, RealtimeOptions) and opts.session == session:
                rids.append(ev.request_id)
    if first < 0:
        raise TraceError(
            f"session {session!r} is not in this log (its id is the one session.created "
            "returned, sess_...)"
        )
    return rids, (first, last)


def export_from_dir(
    log_dir: str | os.PathLike[str],
    request_ids: Sequence[str] | None,
    *,
    rules_version: int | None = None,
    session: str = "",
) -> bytes:
    """``export_trace`` for a server's ``--log-dir`` (``DIR/events``,
    ``DIR/blobs``, ``DIR/pipeline.json``, ``DIR/server.json``).  Reads the
    log offline without locking it, so it works beside a running server.
    The rules version is the one the server recorded in ``server.json``
    unless given.  ``session``: a realtime session's trace (its events and
    its responses), with ``request_ids`` added."""
    from omnix.events.blobs import DiskBlobStore
    from omnix.events.disklog import iter_log
    from omnix.events.log import MemoryLog

    root = Path(log_dir)
    cfg_path = root / "pipeline.json"
    if not (root / "events").is_dir() or not cfg_path.is_file():
        raise TraceError(
            f"{root} is not an omnix log directory (expected {root}/events and "
            f"{root}/pipeline.json, as `omnix serve --log-dir DIR` writes)"
        )
    try:
        pipeline = msgspec.json.decode(cfg_path.read_bytes(), type=PipelineConfig)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise TraceError(f"{cfg_path} is not a pipeline config omnix can read ({exc})") from None
    if rules_version is None:
        server = root / "server.json"
        try:
            rules_version = (
                int(msgspec.json.decode(server.read_bytes()).get("rules_version", RULES_VERSION))
                if server.is_file()
                else RULES_VERSION
            )
        except (msgspec.DecodeError, AttributeError, TypeError, ValueError) as exc:
            raise TraceError(
                f"{server} does not say which rules the server ran ({exc}); "
                "give them with --rules N"
            ) from None
    events = iter_log(root / "events")
    first = next(events, None)
    if first is not None and first.pos != 0:
        raise TraceError(
            f"{root}/events starts at position {first.pos}: retention deleted the segments "
            "before it; export from the running server within the retention window, or keep "
            "the history with an archive (DIR/events/archive)"
        )
    # An archive holds the whole history: released requests are exported too.
    log = MemoryLog(
        events=itertools.chain(() if first is None else (first,), events), keep_released=True
    )
    span = None
    if session:
        rids, span = session_span(log, session)
        request_ids = [*rids, *(request_ids or ())]
    return export_trace(
        log,
        DiskBlobStore(root / "blobs"),
        pipeline,
        request_ids,
        rules_version=rules_version,
        span=span,
    )


# --------------------------------------------------------------------------
# Reading and writing
# --------------------------------------------------------------------------


def write_trace(path: str | os.PathLike[str], data: bytes | Trace) -> Path:
    """Write trace bytes atomically (temp file + rename)."""
    if isinstance(data, Trace):
        raise TraceError("write_trace takes the bytes export_trace returned, not a decoded Trace")
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-trace-")
    try:
        # mkstemp makes the file private; a trace is a plain shareable file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def read_trace(source: str | os.PathLike[str] | bytes, *, verify: bool = True) -> Trace:
    """Decode a trace file (a path or its bytes).

    With ``verify`` (the default) every event is re-folded and the state
    digest, each request's digest and each blob's digest are checked;
    ``TraceCorrupt`` says what does not match.  ``TraceError`` for a file
    that is not a trace or was written by a newer omnix.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), "<bytes>"
    else:
        where = str(source)
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError:
            raise TraceError(f"{where}: no such trace file") from None
        except OSError as exc:  # a directory, no permission
            raise TraceError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if len(data) < _PREFIX.size or data[:8] != TRACE_MAGIC:
        raise TraceError(
            f"{where}: not an omnix trace (no {TRACE_MAGIC.decode()} header); traces come from "
            "`omnix trace export` or GET /v1/requests/ID/trace"
        )
    _, version = _PREFIX.unpack_from(data)
    if version > TRACE_FORMAT_VERSION or version == 0:
        raise TraceError(
            f"{where}: trace format v{version} is not readable by omnix {omnix.__version__} "
            f"(reads v1..v{TRACE_FORMAT_VERSION}); upgrade omnix to replay it"
        )
    try:
        body = _file_decoder.decode(memoryview(data)[_PREFIX.size :])
    except msgspec.DecodeError as exc:
        raise TraceCorrupt(
            f"{where}: the trace body does not decode ({exc}); the file is damaged"
        ) from exc
    try:
        events = decode_events(body.events)
    except SchemaError as exc:
        raise TraceError(f"{where}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise TraceCorrupt(
            f"{where}: the events do not decode ({exc}); the file is damaged"
        ) from exc
    try:
        pipeline = msgspec.msgpack.decode(body.pipeline, type=PipelineConfig)
    except msgspec.DecodeError as exc:
        raise TraceError(
            f"{where}: the recorded pipeline config does not decode with this omnix ({exc})"
        ) from exc
    store = MemoryBlobStore()
    for digest, payload in body.blobs.items():
        if verify and blob_digest(payload) != digest:
            raise TraceCorrupt(
                f"{where}: blob {digest} does not hash to its digest: the file was modified "
                "after export; re-export it from the log"
            )
        store._blobs[digest] = payload  # already verified: skip re-hashing in put()
    trace = Trace(
        events=events,
        blobs=store,
        pipeline=pipeline,
        format_version=body.format_version,
        omnix_version=body.omnix_version,
        schema_version=body.schema_version,
        rules_version=body.rules_version,
        targets=body.targets,
        digest=body.digest,
        request_digests=body.request_digests,
        origin=body.origin,
        source=where,
        cut=body.cut,
    )
    if verify:
        verify_trace(trace)
    return trace


def verify_trace(trace: Trace) -> None:
    """Re-fold ``trace`` and compare with its recorded digests."""
    for i, ev in enumerate(trace.events):
        if ev.pos != i:
            raise TraceCorrupt(
                f"{trace.source}: event {i} carries position {ev.pos}; traces are numbered 0..n-1"
            )
    f = trace.fold()
    got = f.digest()
    if got == trace.digest:
        return
    changed = [
        rid
        for rid in sorted(set(f.requests) | set(trace.request_digests))
        if rid not in f.requests
        or trace.request_digests.get(rid) != request_digest(f.requests[rid])
    ]
    what = (
        f"the state of request(s) {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''} differs"
        if changed
        else "the worker states differ"
    )
    if changed and len(changed) == len(f.requests) > 1:
        what += (
            " (every request: more likely a change of the reducer's state layout than an edit; "
            "`omnix replay --no-verify` still replays it)"
        )
    raise TraceCorrupt(
        f"{trace.source}: state digest mismatch: the events fold to {got}, the trace recorded "
        f"{trace.digest}; {what}.  Either the file was modified after export, or this omnix's "
        f"reducer folds differently from omnix {trace.omnix_version} that wrote it (a reducer "
        "change must keep old logs folding the same)"
    )


def _fold_checked(events: Iterable[Event], where: str) -> Fold:
    f = Fold()
    try:
        f.apply_all(events)
    except IllegalTransition as exc:
        raise TraceCorrupt(
            f"{where}: event {exc.event.pos} does not fold: {exc}; the trace is damaged or was "
            "edited"
        ) from None
    return f
