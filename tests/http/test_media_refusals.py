"""Bad media over HTTP: a 400 naming the part, nothing admitted, nothing
stored.  The decoder's own cases are in test_media.py; these pin what the
server promises around it (the log and the blob store are untouched)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from omnix.http.app import HttpServer
from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.media import image_part
from omnix.testing.serving import serve_scripted

from .media_samples import wav

pytestmark = pytest.mark.asyncio(loop_scope="session")

PIPELINE = """
name = "media-in"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 2 }
media = { audio = true, image = true }
[outputs]
text = "thinker"
"""
PART = "messages[0].content[1]"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server() -> AsyncIterator[HttpServer]:
    async with serve_scripted(parse_pipeline(PIPELINE), HttpOptions()) as server:
        yield server


def chat(part: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]
    }


def image_url(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def input_audio(data: str, fmt: str) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _ten_minute_wav() -> str:
    # 8 kHz unsigned 8-bit: 4.6 MiB, under the part limit, over 300 s.
    return b64(wav(np.zeros(600 * 8000, np.float32), 8000, "PCM_U8"))


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "truncated base64": (
        input_audio(b64(wav(np.zeros(1600, np.float32), 16_000))[:-3], "wav"),
        "invalid_media",
    ),
    "a png that is not a png": (
        image_url("data:image/png;base64," + b64(b"\x89PNG\r\n\x1a\n" + b"no")),
        "invalid_media",
    ),
    "a 20 MB image": (
        image_url("data:image/png;base64," + "A" * (20 * 2**20 * 4 // 3)),
        "media_too_large",
    ),
    "a 10-minute clip": (input_audio(_ten_minute_wav(), "wav"), "audio_too_long"),
    "an unsupported codec": (input_audio(b64(b"FORM0000AIFF"), "aiff"), "unsupported_media_format"),
    "a remote url when none is allowed": (
        image_url("https://example.com/cat.png"),
        "media_domain_not_allowed",
    ),
    "a file url": (image_url("file:///etc/passwd"), "invalid_media_url"),
    "a local path": (image_url("/etc/passwd"), "invalid_media_url"),
    "video": (
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
        "unsupported_input",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_media_is_400_naming_the_part_and_leaves_nothing(server, http, case):
    part, code = BAD[case]
    blobs, events = server.omni.blobs.digests(), len(server.omni.log)
    async with http.post(server.url + "/v1/chat/completions", json=chat(part)) as r:
        body = await r.json()
        assert r.status == 400, body
    err = body["error"]
    assert (err["param"], err["code"]) == (PART, code), err
    assert err["type"] == "invalid_request_error"
    assert PART in err["message"]
    assert len(server.omni.log) == events, "a refused request was admitted"
    assert server.omni.blobs.digests() == blobs, "a refused request left a blob"


async def test_good_media_is_admitted_and_stored_once(server, http):
    blobs = set(server.omni.blobs.digests())
    for _ in range(2):
        async with http.post(
            server.url + "/v1/chat/completions", json=chat(image_part(64, 48))
        ) as r:
            assert r.status == 200, await r.text()
    new = set(server.omni.blobs.digests()) - blobs
    assert len(new) == 1, "the same image sent twice is stored once"
