"""One realtime session: what each client event does.

Owns ``Session``: its configuration, conversation, input audio buffer and
the one response that may run at a time, and the handling of every client
event (``handle``): ``session.update``; ``input_audio_buffer.append`` /
``.commit`` (with input transcription on, the committed audio transcribed
by a request of its own: ``transcription.py``) / ``.clear``;
``conversation.item.create`` / ``.delete`` /
``.retrieve`` / ``.truncate``; ``response.create`` (one request admitted
through the log, its conversation as input; ``running.py`` streams it)
and ``response.cancel`` (the request cancelled through the log).  A client
event that cannot be done raises ``ApiError``; the connection answers it
with an ``error`` event and the session goes on as it was.

Does not own the socket nor parsing messages (``connection.py``), nor the
events a response renders (``render.py``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from omnix.events.types import CancelReason
from omnix.http.common.plan import DecodedBlob
from omnix.http.core.errors import ApiError
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.realtime.audio_in import InputBuffer, audio_entry, input_audio_item
from omnix.http.realtime.config import SessionConfig
from omnix.http.realtime.conversation import Conversation, Entry
from omnix.http.realtime.items import entry_from, retrieved
from omnix.http.realtime.protocol import (
    AppendEvent,
    ClearEvent,
    ClientEvent,
    CommitEvent,
    FunctionCallItem,
    Item,
    ItemCreateEvent,
    ItemDeleteEvent,
    ItemIn,
    ItemRetrieveEvent,
    ItemTruncateEvent,
    ResponseCancelEvent,
    ResponseCreateEvent,
    ResponseParams,
    SessionUpdateEvent,
    server_event,
)
from omnix.http.realtime.record import Folded, Recorder, made
from omnix.http.realtime.respond import new_id, response_plan
from omnix.http.realtime.running import RunningResponse
from omnix.http.realtime.transcription import Transcriptions
from omnix.http.realtime.turns import Turns

Send = Callable[[list[bytes]], Awaitable[None]]
#: Answers an error no client event is waiting on (the connection's).
OnError = Callable[[ApiError, str | None], Awaitable[None]]

#: A session's configuration is said to expire this long after it starts
#: (informational: omnix closes no session for its age).
SESSION_EXPIRES_S = 3600


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True, slots=True)
class Resumed:
    """A session taken up again from the log (``record.restore``)."""

    id: str
    folded: Folded


class Session:
    """One session (see the module's docstring).  ``send`` writes server
    events to the client, in order."""

    def __init__(
        self, server: Server, send: Send, on_error: OnError, resumed: Resumed | None = None
    ) -> None:
        self.server = server
        self.on_error = on_error
        self.closed = False
        self.served = server.served
        self.send = send
        self.created = int(time.time())
        self.config = SessionConfig.for_pipeline(self.served)
        media = server.omni.pipeline.input_media
        self.buffer = InputBuffer(media)
        #: the audio clips one prompt may hold (None: no audio input)
        self._max_audio = media.max_audio_parts if media is not None and media.audio else None
        self.running: RunningResponse | None = None
        # Session events' ids: unique to this connection (a resumed
        # session's earlier connections used others).
        self._tag = secrets.token_hex(2)
        self._n = 0
        if resumed is None:
            self.id = new_id("sess")
            self.conversation = Conversation(id=new_id("conv"))
            self.recorder = Recorder(server.omni, self.id)
            self.recorder.settings(self.config.settings(self.conversation.id), opened=True)
        else:
            self.id = resumed.id
            self.conversation = resumed.folded.conversation
            settings = resumed.folded.settings
            assert settings is not None
            self.config = self.config.recorded(settings)
            self.recorder = Recorder(server.omni, self.id)
        self._resumed = resumed.folded if resumed is not None else None
        self.turns = Turns(self)
        self.transcriptions = Transcriptions(server, self.id, self.send, self.event)

    def event(self, type_: str, **fields: Any) -> bytes:
        """A session event (ids ``event_s<tag>_<n>``; a response's come
        from the log)."""
        self._n += 1
        return server_event(type_, f"event_s{self._tag}_{self._n}", **fields)

    def session_event(self, type_: str) -> bytes:
        shown = self.config.shown(self.id, self.created + SESSION_EXPIRES_S)
        return self.event(type_, session=shown)

    async def handle(self, ev: ClientEvent) -> None:
        match ev:
            case SessionUpdateEvent():
                self.config = self.config.update(self.served, ev.session)
                self.turns.configure(self.config.turn_detection)
                self.recorder.settings(self.config.settings(self.conversation.id))
                await self.send([self.session_event("session.updated")])
            case AppendEvent():
                await self.turns.append(ev.audio)
            case CommitEvent():
                await self.commit()
            case ClearEvent():
                self.buffer.clear()
                await self.send([self.event("input_audio_buffer.cleared")])
            case ItemCreateEvent():
                await self.create_item(ev)
            case ItemDeleteEvent():
                self.conversation.delete(ev.item_id)
                self.recorder.deleted(ev.item_id)
                await self.send([self.event("conversation.item.deleted", item_id=ev.item_id)])
            case ItemRetrieveEvent():
                entry = self.conversation.find(ev.item_id)
                await self.send([self.event("conversation.item.retrieved", item=retrieved(entry))])
            case ItemTruncateEvent():
                await self.truncate(ev)
            case ResponseCreateEvent():
                await self.respond(ev)
            case ResponseCancelEvent():
                self.cancel_response(ev.response_id, "client")

    # -- input ------------------------------------------------------------------

    async def commit(self, upto_ms: int | None = None, item_id: str = "") -> None:
        """The buffer (up to ``upto_ms`` on the session's audio clock) made
        a user audio item."""
        pcm = self.buffer.take(upto_ms)
        item_id = item_id or new_id("item")
        entry = await audio_entry(self.server.media, input_audio_item(item_id), pcm)
        prev = self._add(entry)
        await self.send(
            [
                self.event("input_audio_buffer.committed", item_id=item_id, previous_item_id=prev),
                self.event("conversation.item.added", item=entry.item, previous_item_id=prev),
                self.event("conversation.item.done", item=entry.item, previous_item_id=prev),
            ]
        )
        if self.config.transcription is not None:
            self.transcriptions.start(self.config.transcription, entry)

    def _add(self, entry: Entry, previous: str | None = None) -> str | None:
        """Put ``entry`` in the conversation and the log; the item before it."""
        before = self.conversation.insert(entry, previous)
        self.recorder.added(entry, before)
        return before or None

    def _call_ids(self) -> set[str]:
        """The calls a function_call_output may answer: those the
        conversation holds, and those of the response running."""
        ids = self.conversation.call_ids()
        if self.running is not None:
            ids |= self.running.stream.call_ids()
        return ids

    async def create_item(self, ev: ItemCreateEvent) -> None:
        entry = await entry_from(self.server.media, ev.item, "item", self._call_ids())
        prev = self._add(entry, ev.previous_item_id)
        await self.send(
            [
                self.event("conversation.item.added", item=entry.item, previous_item_id=prev),
                self.event("conversation.item.done", item=entry.item, previous_item_id=prev),
            ]
        )

    async def truncate(self, ev: ItemTruncateEvent) -> None:
        entry = self.conversation.find(ev.item_id)
        running = self.running
        item = entry.item
        if not isinstance(item, Item) or item.role != "assistant" or not entry.audio_ms:
            if running is None or running.item != ev.item_id:
                raise bad("item_id", "only an assistant item with audio can be truncated.")
        if ev.content_index != 0:
            raise bad("content_index", "an assistant item has one content part (index 0).")
        heard = running.audio_ms if running is not None and running.item == ev.item_id else 0
        if not 0 <= ev.audio_end_ms <= max(entry.audio_ms, heard):
            raise bad(
                "audio_end_ms",
                f"audio_end_ms {ev.audio_end_ms} is past the item's audio "
                f"({max(entry.audio_ms, heard)} ms).",
            )
        entry.truncated = True
        entry.audio_ms = ev.audio_end_ms
        self.recorder.truncated(ev.item_id, ev.audio_end_ms)
        for c in item.content if isinstance(item, Item) else ():
            if c.type == "output_audio":
                c.transcript = ""
        await self.send(
            [
                self.event(
                    "conversation.item.truncated",
                    item_id=ev.item_id,
                    content_index=0,
                    audio_end_ms=ev.audio_end_ms,
                )
            ]
        )

    # -- responses -----------------------------------------------------------------

    async def respond(self, ev: ResponseCreateEvent) -> None:
        if self.running is not None:
            raise bad(
                None,
                f"a response ({self.running.rid}) is already running: wait for its "
                "response.done, or cancel it (response.cancel).",
                "conversation_already_has_active_response",
            )
        await self.start_response(ev.response)

    async def start_response(self, params: ResponseParams | None = None) -> None:
        server = self.server
        cfg = self.config.for_response(self.served, params)
        conv = self.conversation
        entries: list[Entry] | None = None
        if params is not None and params.input is not UNSET:
            calls = self._call_ids()
            entries = []
            for i, it in enumerate(params.input):
                entries.append(await self._input_entry(it, i, calls))
                if isinstance(entries[-1].item, FunctionCallItem):
                    calls.add(entries[-1].item.call_id)
        context = list(conv) if entries is None else entries
        blobs: tuple[DecodedBlob, ...] = tuple(b for e in context for b in e.blobs)
        item_id = new_id("item")
        plan = response_plan(
            self.served,
            cfg,
            conv.messages(cfg.instructions, entries, self._max_audio),
            blobs,
            session=self.id,
            conversation=conv.id,
            item=item_id,
            previous_item=conv.last_id if cfg.conversation else "",
        )
        rejected = await admit(server, plan)
        rid = plan.request_ids[0]
        entry = Entry(item=Item(id=item_id, role="assistant", status="in_progress"))
        if cfg.conversation and rejected is None:
            conv.insert(entry)
        self.running = RunningResponse(server, rid, item_id, self.send, self._ended(entry))
        self.running.start()

    async def _input_entry(self, given: ItemIn, i: int, calls: set[str]) -> Entry:
        if given.type == "item_reference":
            if given.id is None:
                raise bad(f"response.input[{i}].id", "an item_reference needs the item's id.")
            return self.conversation.find(given.id, f"response.input[{i}].id")
        return await entry_from(self.server.media, given, f"response.input[{i}]", calls)

    def _ended(self, entry: Entry) -> Callable[[RunningResponse], None]:
        def ended(r: RunningResponse) -> None:
            """The response ended: its items hold what it said."""
            if r.stream.done:
                self.conversation.replace(entry.id, made(r.stream, entry))
            else:
                entry.item = r.stream.item(entry.item.status)
            if self.running is r:
                self.running = None
            self.turns.response_ended(r)

        return ended

    def resume(self, after: str) -> None:
        """A resumed session's requests still in flight (a server restarted
        on its log continues them): its response and its transcriptions,
        followed from after ``after``."""
        folded = self._resumed
        if folded is None:
            return
        conv = self.conversation
        for rid, item_id in folded.transcribing.items():
            entry = conv.find(item_id) if conv.has(item_id) else Entry(input_audio_item(item_id))
            self.transcriptions.follow(rid, entry, after)
        if not folded.running:
            return
        item = folded.running_item
        entry = conv.find(item) if conv.has(item) else Entry(item=Item(id=item, role="assistant"))
        self.running = RunningResponse(
            self.server, folded.running, item, self.send, self._ended(entry), after
        )
        self.running.start()

    def cancel_response(self, response_id: str | None, reason: CancelReason) -> bool:
        running = self.running
        if running is None:
            if reason != "client":
                return False
            raise bad(None, "no response is running to cancel.", "response_cancel_not_active")
        if response_id and response_id != running.rid:
            raise bad(
                "response_id",
                f"response {response_id!r} is not the one running ({running.rid}).",
                "response_not_found",
            )
        return running.cancel(reason)

    def close(self) -> None:
        """The client went away: its running response and transcriptions
        are cancelled."""
        self.closed = True
        self.transcriptions.close()
        if self.running is not None:
            self.running.cancel("disconnect")
            self.running.close()
