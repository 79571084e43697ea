"""``POST /v1/audio/speech/batch``: many texts spoken in one call.

Owns the route, in vLLM-Omni's shape (``SpeechBatchRequest``: ``items``,
each an ``input`` and overrides of the batch's fields; the answer
``SpeechBatchResponse``: per item its file as base64 or its error), and
its plan: each item is the ``POST /v1/audio/speech`` body of the batch's
fields with the item's over them (``item_request``), checked and planned
as that route plans one (``speech.speech_plan``, the clip a Base item
clones from decoded first, ``cloning.py``), under the id ``ID-i`` (``ID``:
the call's ``X-Request-Id`` or a fresh one; the answer's ``id``).  The
items are admitted together, all or none, as separate requests, so the
talker batches them as it batches any concurrent requests; each item's
log is that of the same body sent to ``/v1/audio/speech`` alone, so each
replays alone.  A bad item is one 400 naming its index
(``items[2].voice``) and nothing is admitted; past ``--max-batch`` items,
400 naming ``items``.  An item that fails once admitted is an ``error``
result beside the others; a client that goes away cancels them all.

Does not own the per-body checks (``speech.py``, ``speech_tts.py``),
admission (``core.submit``) nor the answer's bytes
(``speech_render.batch``, a pure function of the items' events).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from omnix.events.types import Event, RequestSpec
from omnix.http.audio.protocol import (
    SpeechBatchItem,
    SpeechBatchRequest,
    SpeechBatchResponse,
    SpeechBatchResult,
    SpeechRequest,
)
from omnix.http.audio.router import narrow_speech
from omnix.http.audio.speech import speech_plan
from omnix.http.audio.speech_render import batch
from omnix.http.common import doc
from omnix.http.common.plan import DecodedBlob, Plan, group_ids
from omnix.http.common.summary import RequestSummary
from omnix.http.core.body import read_body, traceparent
from omnix.http.core.errors import ApiError
from omnix.http.core.respond import durable, json_response, whole_response
from omnix.http.core.route import DocContext, Route, Schemas
from omnix.http.core.server import Server
from omnix.http.core.submit import admit
from omnix.http.render import render_response

#: The fields an item may override (all of the batch's but ``items`` and ``model``).
_OVERRIDES = tuple(f for f in SpeechBatchItem.__struct_fields__ if f != "input")


def item_request(body: SpeechBatchRequest, item: SpeechBatchItem) -> SpeechRequest:
    """The ``/v1/audio/speech`` body ``item`` stands for: the batch's
    fields, the item's where it gives them."""
    fields: dict[str, Any] = {}
    for name in _OVERRIDES:
        mine = getattr(item, name)
        fields[name] = mine if mine is not None else getattr(body, name)
    return SpeechRequest(input=item.input, model=body.model, **fields)


def _at(i: int, err: ApiError) -> ApiError:
    """``err`` of item ``i``, naming the item."""
    param = f"items[{i}].{err.param}" if err.param else f"items[{i}]"
    return ApiError(
        err.status,
        f"items[{i}]: {err.message}",
        param=param,
        code=err.code,
        type=err.type,
        headers=err.headers,
    )


async def batch_plan(server: Server, body: SpeechBatchRequest, tp: str) -> tuple[str, Plan]:
    """The batch's id and its items' requests, each checked (and a Base
    item's clip decoded) as ``/v1/audio/speech`` does its body."""
    served = server.served
    served.check_model(body.model)
    most = server.options.max_batch
    if len(body.items) > most:
        raise ApiError(
            400,
            f"This call would speak {len(body.items)} items; this server takes at most {most} "
            "in one call (omnix serve --max-batch). Split the batch.",
            param="items",
            code="batch_too_large",
        )
    gid, rids = group_ids(served, len(body.items))
    specs: list[tuple[str, RequestSpec]] = []
    blobs: dict[str, DecodedBlob] = {}
    for i, item in enumerate(body.items):
        request = item_request(body, item)
        try:
            reference = await server.cloning.reference(request)
            plan = speech_plan(
                request, served, reference=reference, traceparent=tp, request_id=rids[i]
            )
        except ApiError as err:
            raise _at(i, err) from None
        specs += plan.specs
        for blob in plan.blobs:
            blobs.setdefault(blob.ref.digest, blob)
    return gid, Plan(specs=tuple(specs), blobs=tuple(blobs.values()))


async def speech_batch(server: Server, request: web.Request) -> web.StreamResponse:
    body = await read_body(request, SpeechBatchRequest)
    gid, plan = await batch_plan(server, body, traceparent(request))
    rejected = await admit(server, plan)
    omni = server.omni
    if rejected is not None:  # every item or none: the call's refusal
        return whole_response(render_response(rejected[:1], omni.blobs))
    rids = plan.request_ids
    events: dict[str, list[Event]] = {rid: [] for rid in rids}
    try:
        for rid in rids:
            async for ev in omni.events(rid):
                events[rid].append(ev)
    except (asyncio.CancelledError, ConnectionResetError):
        server.readers.disconnected(rids)
        raise
    states = [omni.state(rid) for rid in rids]
    if not all(rs is not None and rs.terminal for rs in states):
        raise server.not_accepting()  # the log closed under us: shutdown
    # An answer given must outlive a crash: what it says is acknowledged first.
    await durable(omni, max(ev.pos for evs in events.values() for ev in evs))
    answer = await asyncio.to_thread(_render, gid, events, server)
    return json_response(answer, headers={"X-Request-Id": ",".join(rids)})


def _render(gid: str, events: dict[str, list[Event]], server: Server) -> SpeechBatchResponse:
    items = []
    for evs in events.values():
        s = RequestSummary(server.omni.blobs)
        for ev in evs:
            s.feed(ev)
        items.append(s)
    return batch(gid, items)


def _operation(ctx: DocContext) -> dict[str, Any] | None:
    if "audio" not in ctx.pipeline.outputs:
        return None
    return doc.post(
        "Many texts to speech in one call (vLLM-Omni's batch)",
        SpeechBatchRequest,
        doc.json_body(SpeechBatchResponse, "Each item's audio file (base64) or error, in order"),
    )


def _shape(schemas: Schemas, ctx: DocContext) -> None:
    props = schemas["SpeechBatchRequest"]["properties"]
    narrow_speech(props, ctx)
    props["items"]["maxItems"] = ctx.max_batch
    narrow_speech(schemas["SpeechBatchItem"]["properties"], ctx, optional=True)


SPEECH_BATCH = Route(
    "POST",
    "/v1/audio/speech/batch",
    speech_batch,
    _operation,
    submits="json",
    types=(SpeechBatchRequest, SpeechBatchItem, SpeechBatchResponse, SpeechBatchResult),
    shape=_shape,
)
