"""A realtime session in the log: recorded as it changes, taken up again from it.

Owns ``Recorder``: each change of a session (opened, its settings
updated, an item added after another, deleted, truncated) appended as a
``SessionChanged`` input, the decoded audio an item holds stored first;
and ``restore``: a session folded back from the log (``fold_session``,
a pure function of its events): its settings, its conversation (the
items it recorded, and each of its responses' assistant items where their
``Admitted`` placed them, holding what their chunks said), and its
response still in flight, if any, for a server restarted on its log
(``--log-dir``) to go on with when the client reconnects.

Does not own the session's behaviour (``session.py``) nor a response's
events (``render.py``, whose ``ResponseStream`` gives an assistant item
its content here too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from omnix.api import Omni
from omnix.events.blobs import BlobStore
from omnix.events.options import RealtimeOptions
from omnix.events.sessions import SessionOp, SessionSettings
from omnix.events.types import Admitted, Event, RequestEvent, SessionChanged
from omnix.http.realtime.conversation import Conversation, Entry
from omnix.http.realtime.items import as_event, from_event
from omnix.http.realtime.protocol import Item
from omnix.http.realtime.render import PCM_BYTES_PER_S, ResponseStream


class Recorder:
    """Appends one session's changes to the log."""

    def __init__(self, omni: Omni, session: str) -> None:
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


def _insert(conv: Conversation, entry: Entry, previous: str) -> None:
    """Where the log placed it: after ``previous`` ("" first)."""
    if conv.has(entry.id):
        return
    conv.insert(entry, previous or "root")


def fold_session(events: Iterable[Event], session: str, blobs: BlobStore) -> Folded:
    """The session ``session`` as ``events`` (the log, in order) leave it."""
    out = Folded()
    conv = out.conversation
    responses: dict[str, tuple[ResponseStream, Entry | None]] = {}
    for ev in events:
        if type(ev) is SessionChanged:
            if ev.session == session:
                _apply(out, ev)
        elif type(ev) is Admitted:
            opts = ev.spec.response
            if isinstance(opts, RealtimeOptions) and opts.session == session:
                stream = ResponseStream(blobs)
                stream.feed(ev)
                entry = None
                if opts.conversation:
                    entry = Entry(item=Item(id=opts.item, role="assistant", status="in_progress"))
                    _insert(conv, entry, opts.previous_item)
                responses[ev.request_id] = (stream, entry)
        elif isinstance(ev, RequestEvent) and ev.request_id in responses:
            stream, entry = responses[ev.request_id]
            stream.feed(ev)
            if stream.done and entry is not None:
                entry.item = stream.item(
                    "completed" if stream.status == "completed" else "incomplete"
                )
                if not entry.truncated:
                    entry.audio_ms = stream.audio_bytes * 1000 // PCM_BYTES_PER_S
    for rid, (stream, _) in responses.items():
        if not stream.done:
            out.running, out.running_item = rid, stream.opts.item
    conv.id = out.settings.conversation if out.settings is not None else ""
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


def restore(omni: Omni, session: str) -> Folded | None:
    """The session as the log holds it; None when the log has no such
    session (never opened here, or released with the log's prefix)."""
    log = omni.log
    events = log.read(0, log.next_pos)
    folded = fold_session(events, session, omni.blobs)
    return folded if folded.settings is not None else None
