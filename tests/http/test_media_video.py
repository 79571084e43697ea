"""``video_url`` parts: checked and kept at admission, with their sound
track decoded, then referenced by the request's message; every bad part a
400 naming it before anything is admitted (decoder level, then through a
scripted server that takes video)."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import numpy as np
import pytest

from omnix.events.types import Admitted
from omnix.http.common.fields import VideoUrl, VideoUrlPart
from omnix.http.core.errors import ApiError
from omnix.http.media import MediaDecoder
from omnix.http.media.decoder import TRACK
from omnix.pipelines.config import MediaLimits
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.media import mp4_bytes, png_bytes, wav_bytes
from omnix.testing.serving import serve_scripted

P = "messages[0].content[0]"
LIMITS = MediaLimits(
    audio=True, image=True, video=True, max_video_seconds=3.0, video_fps=2.0, max_video_frames=4
)


def _part(data: bytes, media_type: str = "video/mp4") -> VideoUrlPart:
    url = f"data:{media_type};base64," + base64.b64encode(data).decode()
    return VideoUrlPart(video_url=VideoUrl(url=url))


def _decode(limits: MediaLimits, part: VideoUrlPart):
    dec = MediaDecoder(limits, pipeline="videos")
    try:
        return asyncio.run(dec.decode([(P, part)]))
    finally:
        dec.close()


def _refused(limits: MediaLimits, part: VideoUrlPart, code: str, *words: str) -> None:
    with pytest.raises(ApiError) as info:
        _decode(limits, part)
    err = info.value
    assert (err.status, err.param, err.code) == (400, P, code), err.message
    for w in words:
        assert w in err.message, err.message


def test_a_video_is_kept_as_sent_with_its_sound_track_decoded():
    data = mp4_bytes(2.0)
    video, track = _decode(LIMITS, _part(data))
    assert (video.param, video.kind, video.fps, video.frames) == (P, "video", 2.0, 4)
    assert video.array.dtype == np.uint8 and video.array.tobytes() == data
    assert (track.param, track.kind, track.rate, track.in_video) == (
        P + TRACK,
        "audio",
        16_000,
        True,
    )
    assert abs(track.array.size / 16_000 - 2.0) < 0.1


def test_a_silent_video_or_a_deaf_pipeline_has_no_track():
    assert [d.kind for d in _decode(LIMITS, _part(mp4_bytes(1.0, audio=False)))] == ["video"]
    deaf = MediaLimits(video=True, image=True)
    assert [d.kind for d in _decode(deaf, _part(mp4_bytes(1.0)))] == ["video"]
    muted = MediaLimits(audio=True, video=True, video_audio=False)
    assert [d.kind for d in _decode(muted, _part(mp4_bytes(1.0)))] == ["video"]


def test_bad_videos_are_refused_naming_the_part():
    _refused(LIMITS, _part(mp4_bytes(4.0)), "video_too_long", "4.0 s", "at most 3 s")
    big = MediaLimits(video=True, max_pixels=32 * 32)
    _refused(big, _part(mp4_bytes(1.0)), "image_too_large", "64x48")
    _refused(LIMITS, _part(b"not a video at all" * 10), "unsupported_media_format", "MP4")
    _refused(LIMITS, _part(wav_bytes(1.0), "video/wav"), "invalid_media", "no video stream")
    _refused(LIMITS, _part(png_bytes(8, 8), "image/png"), "unsupported_media_format", "video/*")
    _refused(MediaLimits(audio=True), _part(mp4_bytes(1.0)), "unsupported_input", "video input")
    small = MediaLimits(video=True, max_part_bytes=1000)
    _refused(small, _part(mp4_bytes(1.0)), "media_too_large")


VIDEO_PIPELINE = """
name = "video-chat"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 2 }
media = { audio = true, image = true, video = true, max_video_seconds = 3.0, max_video_frames = 4 }
[outputs]
text = "thinker"
"""


def _chat(*parts: dict) -> dict:
    content = [*parts, {"type": "text", "text": "what happens?"}]
    return {"messages": [{"role": "user", "content": content}]}


def _video(seconds: float = 1.0, audio: bool = True) -> dict:
    data = base64.b64encode(mp4_bytes(seconds, audio=audio)).decode()
    return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{data}"}}


@pytest.mark.asyncio(loop_scope="session")
async def test_a_video_chat_is_admitted_with_the_video_and_its_track():
    async with (
        serve_scripted(parse_pipeline(VIDEO_PIPELINE)) as server,
        aiohttp.ClientSession() as http,
    ):
        url = server.url + "/v1/chat/completions"
        async with http.post(url, json=_chat(_video())) as r:
            assert r.status == 200, await r.text()
            rid = r.headers["X-Request-Id"]
        (adm,) = [e for e in server.omni.log.events_for(rid) if isinstance(e, Admitted)]
        video, track = adm.spec.messages[0].media
        assert (video.kind, video.fps, video.frames, video.in_video) == ("video", 2.0, 4, False)
        assert (track.kind, track.rate, track.in_video) == ("audio", 16_000, True)
        assert video.at == track.at == 0
        assert server.omni.blobs.get_array(video.blob).tobytes()[4:8] == b"ftyp"
        # Nothing is admitted for a bad video, nor for a track beside audio.
        before = len(server.omni.log)
        audio = {
            "type": "input_audio",
            "input_audio": {"data": base64.b64encode(wav_bytes(0.5)).decode(), "format": "wav"},
        }
        cases = [
            (_chat(_video(4.0)), "messages[0].content[0]", "video_too_long"),
            (_chat(_video(), _video()), "messages[0].content[1]", "too_many_media_parts"),
            (_chat(_video(), audio), "messages", "unsupported_input"),
        ]
        for body, param, code in cases:
            async with http.post(url, json=body) as r:
                err = (await r.json())["error"]
                assert r.status == 400 and (err["param"], err["code"]) == (param, code), err
        assert len(server.omni.log) == before
        # A silent video beside an audio part is fine.
        async with http.post(url, json=_chat(_video(audio=False), audio)) as r:
            assert r.status == 200, await r.text()


@pytest.mark.asyncio(loop_scope="session")
async def test_a_video_of_an_allowed_host_is_fetched():
    from aiohttp import web

    data = mp4_bytes(1.0)

    async def video(request: web.Request) -> web.Response:
        return web.Response(body=data, content_type="video/mp4")

    app = web.Application()
    app.router.add_get("/clip.mp4", video)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    dec = MediaDecoder(LIMITS, allowed_domains=frozenset({"127.0.0.1"}))
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/clip.mp4"
        got = await dec.decode([(P, VideoUrlPart(video_url=VideoUrl(url=url)))])
        assert [g.kind for g in got] == ["video", "audio"]
        assert got[0].array.tobytes() == data
        elsewhere = VideoUrlPart(video_url=VideoUrl(url="https://example.com/a.mp4"))
        with pytest.raises(ApiError) as info:
            await dec.decode([(P, elsewhere)])
        assert info.value.code == "media_domain_not_allowed"
    finally:
        dec.close()
        await runner.cleanup()
