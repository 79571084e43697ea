"""Calls that submit several requests: their members, rendered as one response.

Owns: splitting events by request (``split``), telling a batch member
(``batched``: its response needs every member's events), ordering a
call's members by their ``Group`` index (``members_in_order``: a member
refused at admission ended the call there, and is answered alone), the
log order of a group stream's events (``in_log_order``), and
``GroupStream``: the one SSE response of ``n`` > 1 samples of one prompt,
whose members' events, fed in log order, render as one chunk stream whose
choices carry the members' indexes; once every member finished, the
usage chunk (the prompt counted once, completions summed) and ``[DONE]``;
a member that fails or is cancelled ends the stream with its error.

Admitting a call's members whole or not at all is ``Omni.submit_group``'s.
Does not own any API's chunks: a ``GroupStream`` is handed the factory of
its members' streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import assert_never

from omnix.events.blobs import BlobStore
from omnix.events.options import group_of
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
)
from omnix.http.common.rendering import SSE_DONE, Head, StreamTail, sse_head, totals
from omnix.http.common.summary import RequestSummary


def split(events: Iterable[Event]) -> dict[str, list[Event]]:
    """One list of events per request, in the order given."""
    by_rid: dict[str, list[Event]] = {}
    for ev in events:
        if isinstance(ev, RequestEvent):
            by_rid.setdefault(ev.request_id, []).append(ev)
    if not by_rid:
        raise ValueError("no request events to render")
    return by_rid


def _first_spec_group(by_rid: dict[str, list[Event]]) -> tuple[bool, bool]:
    """(a member of a group, a group streamed as one response), from the
    first request's admission."""
    first = next(iter(by_rid.values()))[0]
    if not isinstance(first, (Admitted, Rejected)):
        return False, False
    group = group_of(first.spec.response)
    if group is None:
        return False, False
    return group.size > 1, isinstance(first, Admitted) and group.streamed


def batched(by_rid: dict[str, list[Event]]) -> bool:
    """One member of a batch (whose response needs all of them)."""
    return _first_spec_group(by_rid)[0]


def group_streamed(by_rid: dict[str, list[Event]]) -> bool:
    return _first_spec_group(by_rid)[1]


def group_refused(by_rid: dict[str, list[Event]]) -> bool:
    return any(isinstance(evs[0], Rejected) for evs in by_rid.values())


def in_log_order(by_rid: dict[str, list[Event]]) -> list[Event]:
    return sorted((ev for evs in by_rid.values() for ev in evs), key=lambda ev: ev.pos)


def members_in_order(by_rid: dict[str, list[Event]], blobs: BlobStore) -> list[RequestSummary]:
    """The call's members, folded, in choice order; the refused one alone
    when admission refused one."""
    members = []
    groups = set()
    for rid, evs in by_rid.items():
        s = RequestSummary(blobs)
        for ev in evs:
            s.feed(ev)
        if s.spec is None:
            raise ValueError(f"request {rid}: its Admitted/Rejected event is missing")
        group = group_of(s.response)
        groups.add((group.id if group is not None else "") or s.request_id)
        members.append(s)
    if len(groups) > 1:
        raise ValueError(
            f"events of {len(groups)} unrelated requests given; render one response at a time"
        )
    members.sort(key=lambda s: _index(s))
    # A member refused at admission ended the batch there: its siblings
    # already admitted were cancelled, later ones never submitted, and the
    # client was sent the refusal alone.
    for s in members:
        if isinstance(s.terminal, Rejected):
            return [s]
    first = group_of(members[0].response)
    size = first.size if first is not None else 1
    if len(members) != size:
        raise ValueError(f"batched response needs all {size} members' events, got {len(members)}")
    return members


def _index(s: RequestSummary) -> int:
    group = group_of(s.response)
    return group.index if group is not None else 0


class GroupStream:
    """The one SSE response of an n > 1 group; ``member_stream`` makes the
    stream of a member's choice (chat's or completions')."""

    def __init__(
        self, blobs: BlobStore, member_stream: Callable[[RequestSummary], StreamTail]
    ) -> None:
        self.blobs = blobs
        self.member_stream = member_stream
        self.members: dict[str, tuple[RequestSummary, StreamTail]] = {}
        self.size = 0
        self.ended = 0
        self.head: Head | None = None
        self.done = False
        self.first: RequestSummary | None = None

    def feed(self, ev: Event) -> list[bytes]:
        if self.done:
            return []
        # Chunks are most of the events: one exact-type test first (a
        # ``match`` class pattern costs an isinstance check per case).
        if type(ev) is Chunk:
            member = self.members.get(ev.request_id)
            if member is None:
                return []
            member[0].chunk(ev)
            return member[1].chunk(ev)
        match ev:
            case Admitted():
                return self._admitted(ev)
            case StageFinished():
                member = self.members.get(ev.request_id)
                if member is not None:
                    member[0].feed(ev)
                return []
            case Finished():
                return self._finished(ev)
            case Failed() | Cancelled():
                member = self.members.get(ev.request_id)
                if member is None:
                    return []
                member[0].feed(ev)
                self.done = True
                return member[1].ended(ev)
            case (
                Chunk()
                | Rejected()
                | Routed()
                | StageStarted()
                | Progress()
                | StageFailed()
                | CancelRequested()
                | DeadlineExpired()
                | WorkerJoined()
                | WorkerLost()
                | Released()
                | SessionChanged()
                | Scaled()
                | InputAppended()
            ):
                return []
            case _:
                assert_never(ev)

    def _admitted(self, ev: Admitted) -> list[bytes]:
        s = RequestSummary(self.blobs, collect_media=False)
        s.admitted(ev)
        stream = self.member_stream(s)
        self.members[ev.request_id] = (s, stream)
        if self.first is None:
            self.first = s
            group = group_of(ev.spec.response)
            self.size = group.size if group is not None else 1
            gid = group.id if group is not None else ev.request_id
            self.head = sse_head(gid)
        return stream.admitted(ev)

    def _finished(self, ev: Finished) -> list[bytes]:
        member = self.members.get(ev.request_id)
        if member is None:
            return []
        s, stream = member
        s.feed(ev)
        out = stream.finished(ev)
        self.ended += 1
        if self.ended == self.size:
            self.done = True
            if stream.usage and self.first is not None:
                p = self.first.usage()[0]
                c = sum(m[0].usage()[1] for m in self.members.values())
                out.append(stream.usage_chunk(totals(p, c), self.first.created))
            out.append(SSE_DONE)
        return out
