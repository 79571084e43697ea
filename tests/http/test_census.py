"""A server that runs for months: 20,000 requests through a scripted-pipeline
server with a short retention window, and a heap census of everything in it.

After a warm-up (2,000 requests) and again after 20,000, with the server
quiet between (the window passed, the sweep ran):

* retention's own counts (requests, events, blob bytes, tombstones) are
  within the policy's bounds;
* a census of every container reachable from the server's objects (the
  ``Omni`` with its log, blob store, retention, orchestrator, sequencer,
  dispatcher, timer and runtime; the HTTP ``Routes`` with its maps; the
  telemetry projection; the aiohttp app), found by walking their
  attributes, not by naming them: none grew with the 18,000 requests in
  between (a per-request map would hold thousands more entries);
* a census of the whole heap by type (``gc.get_objects()``): no type has
  thousands more objects.

Sizes are asserted, never timings.  The requests mix plain chat, chat with
audio output (blobs) and streamed chat (the HTTP layer's reader maps).  The
stages run in process for the 20,000 (the server's own structures are
what is counted); a shorter run (5,000) puts them in worker processes, so
``StageRuntime``'s per-request maps are in the census too.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import types
from typing import Any

import aiohttp
import pytest

from omnix.events.blobs import MemoryBlobStore
from omnix.events.log import MemoryLog
from omnix.events.retention import RetentionPolicy
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.serving import serve_scripted

PIPELINE = scripted_omni_toml(
    "census-omni",
    thinker='engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 0 }',
    talker='engine = { kind = "scripted", chunks_per_piece = 2, delay_ms = 0, output_modality = "codec" }',
)
USER = [{"role": "user", "content": "hello"}]
TOTAL = 20_000
WARMUP = 2_000
CONCURRENCY = 32
KEEP = 50
WINDOW_S = 0.5
POLICY = RetentionPolicy(window_s=WINDOW_S, max_requests=KEEP, tombstones=1_000)
#: A per-request structure gains an entry per request between the two
#: censuses (18,000 in process, 4,000 with workers).
GROWTH = 2_000

_LEAVES = (
    str,
    bytes,
    int,
    float,
    bool,
    type,
    types.FunctionType,
    types.ModuleType,
    types.BuiltinFunctionType,
)
_CONTAINERS = (dict, list, set, frozenset, tuple, collections.deque, bytearray)


def container_census(roots: dict[str, object], depth: int = 8) -> dict[str, int]:
    """``path -> len`` for every container reachable from ``roots`` through
    attributes (``__dict__`` and ``__slots__``) and container items (all of
    a small container's, the first few of a large one: a map of per-request
    entries shows as the map's own size)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    stack: list[tuple[str, object, int]] = [(name, obj, 0) for name, obj in roots.items()]
    while stack:
        path, obj, d = stack.pop()
        if id(obj) in seen or d > depth or isinstance(obj, _LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            out[path] = max(out.get(path, 0), len(obj))
            items: list[Any]
            if isinstance(obj, dict):
                items = list(obj.values())
            elif isinstance(obj, bytearray):
                items = []
            else:
                items = list(obj)
            for v in items if len(items) <= 64 else items[:8]:
                stack.append((path + "[]", v, d + 1))
            continue
        attrs: dict[str, object] = {}
        try:
            attrs.update(vars(obj))
        except TypeError:
            pass
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and slot not in attrs and hasattr(obj, slot):
                    attrs[slot] = getattr(obj, slot)
        for k, v in attrs.items():
            if isinstance(v, types.MethodType):
                v = v.__self__
            stack.append((f"{path}.{k}", v, d + 1))
    return out


def heap_census() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


async def _load(http: aiohttp.ClientSession, url: str, first: int, last: int) -> None:
    """Requests ``first..last-1``, ``CONCURRENCY`` at a time; every 4th asks
    for audio (blobs), every 8th streams."""
    nxt = first

    async def client() -> None:
        nonlocal nxt
        while nxt < last:
            k = nxt
            nxt += 1
            body: dict[str, Any] = {"messages": USER}
            if k % 4 == 0:
                body["modalities"] = ["text", "audio"]
                body["audio"] = {"format": "wav", "voice": "x"}
            if k % 8 == 1:
                body["stream"] = True
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("runtime", "total", "warmup"), [("inproc", TOTAL, WARMUP), ("workers", 5_000, 1_000)]
)
async def test_twenty_thousand_requests_leave_nothing_behind(
    runtime: str, total: int, warmup: int
) -> None:
    cfg = parse_pipeline(PIPELINE, "toml")
    async with (
        serve_scripted(
            cfg,
            processes=runtime == "workers",
            telemetry=True,
            omni_options={"retention": POLICY},
        ) as server,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as http,
    ):
        omni = server.omni
        ret = omni.retention
        tel = server.state.telemetry
        assert ret is not None and tel is not None
        log = omni.log
        blobs = omni.blobs
        assert isinstance(log, MemoryLog) and isinstance(blobs, MemoryBlobStore)
        roots: dict[str, object] = {
            "omni": omni,
            "routes": server.state,
            "telemetry": tel,
            "app": server.app,
        }
        url = server.url + "/v1/chat/completions"

        async def quiet() -> None:
            # The window passes and the sweep (once a second) releases.
            for _ in range(50):
                await asyncio.sleep(0.1)
                if not omni.orchestrator.live_requests and ret.requests_retained == 0:
                    break
            tel.catch_up(log)

        await _load(http, url, 0, warmup)
        await quiet()
        early = container_census(roots)
        early_heap = heap_census()

        await _load(http, url, warmup, total)
        await quiet()
        late = container_census(roots)
        late_heap = heap_census()

        # Retention's counts: everything ended and the window passed.
        assert ret.released_total >= total - KEEP
        assert ret.requests_retained <= KEEP
        assert ret.retained_events <= KEEP * 64
        assert ret.blobs_retained_bytes <= KEEP * 64 * 1024
        assert ret.tombstones <= POLICY.tombstones
        assert len(blobs._blobs) <= KEEP * 8
        assert log.held_slots <= 4 * 1024 + KEEP * 64
        # Telemetry saw every request end, none missed, and counts on.
        assert tel.projection.requests_ended == total
        assert tel.projection.ended_missed == 0
        assert omni.orchestrator.live_requests == ()

        # No container anywhere in the server grew with the requests.
        grown = {
            path: (early.get(path, 0), n)
            for path, n in late.items()
            if n - early.get(path, 0) >= GROWTH or n >= (total - warmup) * 3 // 4
        }
        assert not grown, f"per-request structures that grew: {grown}"
        # The named ones, for whoever reads a failure.
        named = {
            "orchestrator plans": len(omni.orchestrator._live),
            "timer armed": omni.timer.armed,
            "dispatcher specs": len(omni.dispatcher._specs),
            "sequencer backlog": len(omni.sequencer._backlog),
            "fold requests": len(log.state.requests),
            "fold ended": len(log.state.ended),
            "fold audio": len(log.state.audio_samples),
            "log index": len(log._index),
            "log request waiters": len(log._req_waiters),
            "routes readers": len(server.state.readers._readers),
            "routes grace timers": len(server.state.readers._grace),
            "telemetry live state": tel.projection.live_state_size(),
        }
        assert all(n <= KEEP for n in named.values()), named
        # Entries of ended requests are dropped in bulk past 1,024 of them.
        assert len(omni.timer._heap) <= 2 * omni.timer.armed + 1025

        # And the heap as a whole: no type gained an object per request.
        heap_grown = {
            name: (early_heap.get(name, 0), n)
            for name, n in late_heap.items()
            if n - early_heap.get(name, 0) >= GROWTH
        }
        assert not heap_grown, f"object types that grew with the requests: {heap_grown}"
