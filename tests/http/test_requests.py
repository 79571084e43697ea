"""omnix's own routes and the behaviour around a request's life: the event
stream (positions as ids, resuming with Last-Event-ID), disconnect ->
Cancelled(disconnect), cancel, overload -> 429, traces, metrics, OpenAPI."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from omnix.events.types import (
    TERMINAL_TYPES,
    Cancelled,
    CancelRequested,
    Chunk,
    Event,
    Rejected,
    StageFinished,
)
from omnix.http.render import render_response

from ..waiting import wait_until
from .conftest import parse_sse

pytestmark = pytest.mark.asyncio(loop_scope="session")

USER = [{"role": "user", "content": "hi"}]


async def terminal(server, rid: str) -> list[Event]:
    """The request's events once it has ended."""
    async with asyncio.timeout(15):
        events = [ev async for ev in server.omni.events(rid)]
    assert isinstance(events[-1], TERMINAL_TYPES)
    return events


async def read_frames(resp, n: int) -> tuple[list[bytes], bytes]:
    """The first ``n`` SSE frames of a streaming response, and the bytes
    read beyond them."""
    frames: list[bytes] = []
    buf = b""
    async for piece in resp.content.iter_any():
        buf += piece
        while b"\n\n" in buf and len(frames) < n:
            frame, buf = buf.split(b"\n\n", 1)
            frames.append(frame + b"\n\n")
        if len(frames) >= n:
            break
    return frames, buf


async def test_disconnect_mid_stream_cancels_the_request(slow_server, http):
    url = slow_server.url + "/v1/chat/completions"
    req = {"messages": USER, "stream": True, "modalities": ["text", "audio"]}
    async with http.post(url, json=req) as r:
        rid = r.headers["X-Request-Id"]
        frames, _ = await read_frames(r, 3)
        assert len(frames) == 3
        r.close()  # drop the connection mid-stream
    events = await terminal(slow_server, rid)
    end = events[-1]
    assert isinstance(end, Cancelled) and end.reason == "disconnect"
    asked = [e for e in events if isinstance(e, CancelRequested)]
    assert len(asked) == 1 and asked[0].reason == "disconnect" and end.cause == asked[0].pos
    # Every stage that was running acknowledged an abort.
    finished = {e.stage: e.finish_reason for e in events if isinstance(e, StageFinished)}
    assert finished.get("thinker") == "aborted"
    assert slow_server.omni.state(rid).status == "cancelled"


async def test_disconnect_while_waiting_for_a_whole_response_cancels_too(slow_server, http):
    task = asyncio.create_task(
        http.post(slow_server.url + "/v1/chat/completions", json={"messages": USER})
    )
    live = await wait_until(lambda: slow_server.omni.orchestrator.live_requests, "the admission")
    (rid,) = live
    await wait_until(
        lambda: any(isinstance(e, Chunk) for e in slow_server.omni.log.events_for(rid)),
        "the response under way",
    )
    task.cancel()  # the client gives up: its connection closes
    with pytest.raises(asyncio.CancelledError):
        await task
    events = await terminal(slow_server, rid)
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "disconnect"


async def test_overload_is_429_with_retry_after_and_cancel_ends_the_stream(slow_server, http):
    url = slow_server.url + "/v1/chat/completions"
    omni = slow_server.omni
    async with http.post(url, json={"messages": USER, "stream": True}) as first:
        rid = first.headers["X-Request-Id"]
        head, extra = await read_frames(first, 2)
        before = len(omni.log)
        async with http.post(url, json={"messages": USER}) as second:
            assert second.status == 429
            assert second.headers["Retry-After"] == "1"
            refused = second.headers["X-Request-Id"]
            err = (await second.json())["error"]
            assert err["type"] == "rate_limit_error" and err["code"] == "overloaded"
            assert refused in err["message"]
        # The refusal is recorded (one Rejected event), never a hang; all
        # else appended meanwhile is the running request's.
        (rej,) = omni.log.events_for(refused)
        assert isinstance(rej, Rejected) and rej.reason == "overloaded"
        others = [
            e for e in omni.log.read(before) if getattr(e, "request_id", rid) not in (rid, refused)
        ]
        assert others == []
        async with http.post(f"{slow_server.url}/v1/requests/{rid}/cancel") as c:
            assert c.status == 200
            assert await c.json() == {
                "request_id": rid,
                "cancel_requested": True,
                "status": "cancelling",
            }
        rest = await first.read()
    body = b"".join(head) + extra + rest
    frames = parse_sse(body)
    assert frames[-1] == {"data": "[DONE]"}
    err = json.loads(frames[-2]["data"])["error"]
    assert err["code"] == "cancelled" and rid in err["message"]
    events = await terminal(slow_server, rid)
    assert isinstance(events[-1], Cancelled) and events[-1].reason == "client"
    assert render_response(events, omni.blobs).body == body
    async with http.post(f"{slow_server.url}/v1/requests/{rid}/cancel") as c:
        assert (await c.json())["cancel_requested"] is False


async def test_event_stream_ids_are_log_positions_and_data_decodes(omni_server, http):
    async with http.post(omni_server.url + "/v1/chat/completions", json={"messages": USER}) as r:
        rid = r.headers["X-Request-Id"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/events") as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        frames = parse_sse(await r.read())
    log_events = omni_server.omni.log.events_for(rid)
    assert [int(f["id"]) for f in frames] == [e.pos for e in log_events]
    assert [f["event"] for f in frames] == [e.__struct_config__.tag for e in log_events]
    assert [msgspec.json.decode(f["data"], type=Event) for f in frames] == log_events
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/events?format=object") as r:
        objects = [json.loads(f["data"]) for f in parse_sse(await r.read())]
    assert objects[0]["type"] == "admitted" and objects[0]["spec"]["api"] == "chat.completions"
    assert [o["pos"] for o in objects] == [e.pos for e in log_events]


async def test_resuming_an_event_stream_has_no_gap_and_no_duplicate(slow_server, http):
    url = slow_server.url
    chat = asyncio.create_task(http.post(url + "/v1/chat/completions", json={"messages": USER}))
    live = await wait_until(lambda: slow_server.omni.orchestrator.live_requests, "the admission")
    (rid,) = live
    # Read part of the live stream, drop it, reconnect with Last-Event-ID.
    async with http.get(f"{url}/v1/requests/{rid}/events") as r:
        first, _ = await read_frames(r, 12)
        r.close()
    last_id = parse_sse(first[-1])[0]["id"]
    assert slow_server.omni.state(rid).terminal is False  # resumed mid-request
    async with http.get(f"{url}/v1/requests/{rid}/events", headers={"Last-Event-ID": last_id}) as r:
        rest = await r.read()
    resumed = parse_sse(b"".join(first) + rest)
    (await chat).close()
    async with http.get(f"{url}/v1/requests/{rid}/events") as r:
        whole = parse_sse(await r.read())
    assert resumed == whole
    ids = [int(f["id"]) for f in whole]
    assert ids == sorted(set(ids))
    assert whole[-1]["event"] == "finished"
    # After the terminal event there is nothing more to send.
    async with http.get(
        f"{url}/v1/requests/{rid}/events", headers={"Last-Event-ID": str(ids[-1])}
    ) as r:
        assert await r.read() == b""
    async with http.get(f"{url}/v1/requests/{rid}/events", headers={"Last-Event-ID": "soon"}) as r:
        assert r.status == 400


async def test_trace_download(omni_server, http):
    from omnix.trace import read_trace

    async with http.post(omni_server.url + "/v1/chat/completions", json={"messages": USER}) as r:
        rid = r.headers["X-Request-Id"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/trace") as r:
        assert r.status == 200
        assert rid in r.headers["Content-Disposition"]
        data = await r.read()
    trace = read_trace(data)
    assert rid in trace.request_ids
    assert [e.__struct_config__.tag for e in trace.events_for(rid)] == [
        e.__struct_config__.tag for e in omni_server.omni.log.events_for(rid)
    ]


async def test_trace_html_is_the_page_omnix_replay_writes(omni_server, http):
    from omnix.trace import read_trace
    from omnix.traceview.html import render_html

    async with http.post(omni_server.url + "/v1/chat/completions", json={"messages": USER}) as r:
        rid = r.headers["X-Request-Id"]
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/trace") as r:
        trace = read_trace(await r.read())
    async with http.get(f"{omni_server.url}/v1/requests/{rid}/trace.html") as r:
        assert r.status == 200 and r.content_type == "text/html"
        assert "script-src" not in r.headers["Content-Security-Policy"]
        assert await r.text() == render_html(trace, requests=[rid])


async def test_trace_of_a_running_request_is_refused(slow_server, http):
    async with http.post(
        slow_server.url + "/v1/chat/completions", json={"messages": USER, "stream": True}
    ) as r:
        rid = r.headers["X-Request-Id"]
        await read_frames(r, 1)
        async with http.get(f"{slow_server.url}/v1/requests/{rid}/trace") as t:
            assert t.status == 409
            assert (await t.json())["error"]["code"] == "request_running"
        async with http.post(f"{slow_server.url}/v1/requests/{rid}/cancel") as c:
            assert c.status == 200
        await r.read()
    await terminal(slow_server, rid)


async def test_health_ready_models_metrics(omni_server, http):
    url = omni_server.url
    async with http.get(url + "/health") as r:
        assert await r.json() == {"status": "ok"}
    async with http.get(url + "/ready") as r:
        assert r.status == 200
        assert await r.json() == {
            "ready": True,
            "accepting": True,
            "stages": {"thinker": 1, "talker": 1, "code2wav": 1},
        }
    async with http.get(url + "/v1/models") as r:
        card = (await r.json())["data"][0]
    assert card["id"] == "http-omni" and card["object"] == "model"
    assert card["modalities"] == ["text", "audio"] and card["stages"] == [
        "thinker",
        "talker",
        "code2wav",
    ]

    async def ended() -> float:  # requests the projection has seen end, by /metrics
        async with http.get(url + "/metrics") as r:
            lines = (await r.text()).splitlines()
        count = "gen_ai_server_request_duration_seconds_count{"
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(count))

    async def recorded() -> bool:
        return await ended() > before

    before = await ended()
    async with http.post(url + "/v1/chat/completions", json={"messages": USER}) as r:
        assert r.status == 200
    # The projection follows the log on an interval: until it has seen this one end.
    await wait_until(recorded, "the projection to record the request")
    async with http.get(url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    assert "omnix" in text or "gen_ai" in text


async def test_metrics_hook_without_telemetry(image_server, http):
    async with http.get(image_server.url + "/metrics") as r:
        assert r.status == 501
        assert (await r.json())["error"]["code"] == "metrics_unavailable"


async def test_openapi_lists_every_route(omni_server, http):
    async with http.get(omni_server.url + "/openapi.json") as r:
        doc = await r.json()
    assert doc["openapi"].startswith("3.")
    routes = {res.canonical for res in omni_server.app.router.resources()}
    # Every route the pipeline can answer is published; no other.
    published = {p for p in routes if omni_server.state.openapi.published(p)}
    assert published == set(doc["paths"])
    assert {"/v1/chat/completions", "/v1/audio/speech", "/version"} <= published
    assert "/v1/images/generations" not in published  # http-omni makes no images
    schemas = doc["components"]["schemas"]
    assert {
        "ChatCompletionRequest",
        "ChatCompletionChunk",
        "SpeechRequest",
        "ImageRequest",
        "ErrorBody",
    } <= set(schemas)
    assert "sampling_params_list" in schemas["ChatCompletionRequest"]["properties"]
