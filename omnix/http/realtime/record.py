"""A realtime session in the log: recorded as it changes, taken up again from it.

Owns ``Recorder``: each change of a session (opened, its settings
updated, an item added after another, deleted, truncated) appended as a
``SessionChanged`` input, the decoded audio an item holds stored first;
and ``restore``: a session folded back from the log (``fold_session``,
a pure function of its events): its settings, its conversation (the
items it recorded, each of its responses' assistant items where their
``Admitted`` placed them, holding what their chunks said (its message,
its function calls), and each
completed input transcription's text as its item's transcript), and its
response and transcriptions still in flight, if any, for a server
restarted on its log (``--log-dir``) to go on with when the client
reconnects.

Does not own the session's behaviour (``session.py``) nor a response's
events (``render.py``, whose ``ResponseStream`` gives an assistant item
its content here too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from omnix.events.blobs import BlobStore
from omnix.events.options import API_TRANSCRIPTION, RealtimeOptions
from omnix.events.sessions import SessionOp, SessionSettings
from omnix.events.types import Admitted, Event, RequestEvent, SessionChanged
from omnix.front import OmniProtocol
from omnix.http.realtime.conversation import Conversation, Entry
from omnix.http.realtime.items import as_event, from_event
from omnix.http.realtime.protocol import Item
from omnix.http.realtime.render import PCM_BYTES_PER_S, ResponseStream, item_status
from omnix.http.realtime.transcript import TranscriptStream


class Recorder:
    """Appends one session's changes to the log."""

    def __init__(self, omni: OmniProtocol, session: str) -> None:
        self.omni = omni
        self.session = session

    def _record(self, op: SessionOp, **fields: object) -> None:
        self.omni.record(SessionChanged(session=self.session, op=op, **fields))  # type: ignore[arg-type]

    def settings(self, settings: SessionSettings, opened: bool = False) -> None:
        self._record("opened" if opened else "configured", settings=settings)

    def added(self, entry: Entry, previous: str) -> None:
        for b in entry.blobs:  # the audio the event refers to, stored first
            self.omni.blobs.put_array(b.array, b.ref.media_type)
        item, media = as_event(entry)
        self._record("item_added", item=item, media=media, previous=previous)

    def deleted(self, item_id: str) -> None:
        self._record("item_deleted", item_id=item_id)

    def truncated(self, item_id: str, audio_end_ms: int) -> None:
        self._record("item_truncated", item_id=item_id, audio_end_ms=audio_end_ms)


@dataclass(slots=True)
class Folded:
    """A session as its events leave it."""

    settings: SessionSettings | None = None
    conversation: Conversation = field(default_factory=lambda: Conversation(id=""))
    #: its response still in flight ("" none)
    running: str = ""
    running_item: str = ""
    #: its transcriptions still in flight: request id -> the item's id
    transcribing: dict[str, str] = field(default_factory=dict)


def _insert(conv: Conversation, entry: Entry, previous: str) -> None:
    """Where the log placed it: after ``previous`` ("" first)."""
    if conv.has(entry.id):
        return
    conv.insert(entry, previous or "root")


class _Requests:
    """A session's requests as their events leave them: each response's
    assistant item, each transcription's transcript on its item."""

    def __init__(self, out: Folded, blobs: BlobStore) -> None:
        self.out = out
        self.blobs = blobs
        self.responses: dict[str, tuple[ResponseStream, Entry | None]] = {}
        self.transcripts: dict[str, TranscriptStream] = {}

    def admitted(self, ev: Admitted, opts: RealtimeOptions) -> None:
        if ev.spec.api == API_TRANSCRIPTION:
            tx = self.transcripts[ev.request_id] = TranscriptStream(self.blobs)
            tx.feed(ev)
            return
        stream = ResponseStream(self.blobs)
        stream.feed(ev)
        entry = None
        if opts.conversation:
            entry = Entry(item=Item(id=opts.item, role="assistant", status="in_progress"))
            _insert(self.out.conversation, entry, opts.previous_item)
        self.responses[ev.request_id] = (stream, entry)

    def event(self, ev: Event, rid: str) -> None:
        conv = self.out.conversation
        tx = self.transcripts.get(rid)
        if tx is not None:
            tx.feed(ev)
            if tx.done and tx.completed and conv.has(tx.opts.item):
                conv.find(tx.opts.item).transcribed(tx.text)
            return
        if rid not in self.responses:
            return
        stream, entry = self.responses[rid]
        stream.feed(ev)
        if stream.done and entry is not None:
            conv.replace(entry.id, made(stream, entry))

    def in_flight(self) -> None:
        out = self.out
        for rid, (stream, _) in self.responses.items():
            if not stream.done:
                out.running, out.running_item = rid, stream.opts.item
        out.transcribing = {rid: t.opts.item for rid, t in self.transcripts.items() if not t.done}


def made(stream: ResponseStream, entry: Entry) -> list[Entry]:
    """The entries a finished response's stream made: its message item
    (``entry``, admitted in its place; its audio's length unless truncated)
    and its function calls."""
    out: list[Entry] = []
    for item in stream.items(item_status(stream.status)):
        if item.id != entry.id:
            out.append(Entry(item=item))
            continue
        entry.item = item
        if not entry.truncated:
            entry.audio_ms = stream.audio_bytes * 1000 // PCM_BYTES_PER_S
        out.append(entry)
    return out


def fold_session(events: Iterable[Event], session: str, blobs: BlobStore) -> Folded:
    """The session ``session`` as ``events`` (the log, in order) leave it."""
    out = Folded()
    requests = _Requests(out, blobs)
    for ev in events:
        if type(ev) is SessionChanged:
            if ev.session == session:
                _apply(out, ev)
        elif type(ev) is Admitted:
            opts = ev.spec.response
            if isinstance(opts, RealtimeOptions) and opts.session == session:
                requests.admitted(ev, opts)
        elif isinstance(ev, RequestEvent):
            requests.event(ev, ev.request_id)
    requests.in_flight()
    out.conversation.id = out.settings.conversation if out.settings is not None else ""
    return out


def _apply(out: Folded, ev: SessionChanged) -> None:
    conv = out.conversation
    match ev.op:
        case "opened" | "configured":
            out.settings = ev.settings
        case "item_added":
            if ev.item is not None:
                _insert(conv, from_event(ev.item, ev.media), ev.previous)
        case "item_deleted":
            if conv.has(ev.item_id):
                conv.delete(ev.item_id)
        case "item_truncated":
            if conv.has(ev.item_id):
                entry = conv.find(ev.item_id)
                entry.truncated = True
                entry.audio_ms = ev.audio_end_ms


def restore(omni: OmniProtocol, session: str) -> Folded | None:
    """The session as the log holds it; None when the log has no such
    session (never opened here, or released with the log's prefix)."""
    log = omni.log
    events = log.read(0, log.next_pos)
    folded = fold_session(events, session, omni.blobs)
    return folded if folded.settings is not None else None
