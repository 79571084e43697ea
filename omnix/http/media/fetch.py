"""Fetching remote media parts, on the event loop.

Owns ``fetch_all``: the ``http(s)`` parts of a request fetched with
aiohttp, concurrently, under a timeout and each part's byte limit (from
``Content-Length`` when given, and while reading), redirects followed only
to allowed hosts (``Locator.check_host``) and at most a few times; each
failure a 400 naming the part.

Does not own which URLs may be fetched (``locate.py``) nor decoding.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Final

import aiohttp

from omnix.http.media.common import Source, bad, shown, too_big
from omnix.http.media.locate import Locator

_MAX_REDIRECTS: Final = 3
_FETCH_CHUNK: Final = 1 << 16


async def fetch_all(
    locator: Locator, sources: list[Source], timeout_s: float
) -> list[tuple[bytes, str]]:
    """Each remote source's bytes and Content-Type, fetched concurrently
    under ``timeout_s`` and the part's byte limit, redirects followed only
    to allowed hosts; 400 naming the part for the first that fails."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        got = await asyncio.gather(
            *(_fetch(locator, session, s, timeout_s) for s in sources), return_exceptions=True
        )
    out: list[tuple[bytes, str]] = []
    for g in got:
        if isinstance(g, BaseException):
            raise g
        out.append(g)
    return out


async def _fetch(
    locator: Locator, session: aiohttp.ClientSession, source: Source, timeout_s: float
) -> tuple[bytes, str]:
    assert locator.limits is not None
    cap = locator.limits.max_part_bytes
    param, url = source.param, source.url
    inline = "send the bytes inline as a data: URL instead"
    try:
        for _ in range(_MAX_REDIRECTS + 1):
            async with session.get(
                url, allow_redirects=False, headers={"Accept-Encoding": "identity"}
            ) as resp:
                if resp.status in (301, 302, 303, 307, 308):
                    location = resp.headers.get("Location", "")
                    url = urllib.parse.urljoin(url, location)
                    # A redirect may not lead off the allowed hosts.
                    locator.check_host(param, url, inline)
                    continue
                if resp.status != 200:
                    raise bad(
                        param,
                        f"{param}: fetching {shown(source.url)} answered HTTP "
                        f"{resp.status} {resp.reason or ''}".rstrip()
                        + "; check the URL, or send the bytes inline as a data: URL.",
                        "media_fetch_failed",
                    )
                if resp.content_length is not None and resp.content_length > cap:
                    raise too_big(param, resp.content_length, cap)
                buf = bytearray()
                async for chunk in resp.content.iter_chunked(_FETCH_CHUNK):
                    buf += chunk
                    if len(buf) > cap:
                        raise too_big(param, len(buf), cap, at_least=True)
                if not buf:
                    raise bad(param, f"{param}: {shown(source.url)} answered no data.")
                return bytes(buf), resp.headers.get("Content-Type", "")
    except (aiohttp.ClientError, TimeoutError) as exc:
        what = (
            f"took longer than {timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else f"failed ({type(exc).__name__}: {exc})"
        )
        raise bad(
            param,
            f"{param}: fetching {shown(source.url)} {what}; check the URL, or {inline}.",
            "media_fetch_failed",
        ) from None
    raise bad(
        param,
        f"{param}: {shown(source.url)} redirected more than {_MAX_REDIRECTS} times; "
        "send the final URL.",
        "media_fetch_failed",
    )
