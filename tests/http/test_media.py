"""omnix.http.media: chat media parts decoded once, checked against MediaLimits."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import numpy as np
import pytest
from aiohttp import web
from PIL import Image

from omnix.http import media
from omnix.http.common.fields import InputAudio, InputAudioPart, MediaContentPart
from omnix.http.core.errors import ApiError
from omnix.http.media import DecodedMedia, MediaDecoder, sound
from omnix.http.media import decoder as decoder_module
from omnix.http.media import image as image_module
from omnix.pipelines.config import MediaLimits
from omnix.testing.media import tone

from .media_samples import (
    audio_part,
    audio_url,
    b64,
    data_url,
    encoded,
    flac,
    gradient,
    image,
    image_url,
    mp3,
    pcm16,
    png_header,
    png_part,
    video_url,
    wav,
)

P = "messages[0].content[1]"
OMNI = MediaLimits(audio=True, image=True, max_audio_parts=2, max_image_parts=2)


@pytest.fixture
def decoder() -> Iterator[MediaDecoder]:
    d = MediaDecoder(OMNI, pipeline="tiny-omni")
    yield d
    d.close()


def refused(
    dec: MediaDecoder, part: MediaContentPart, code: str, param: str = P, *words: str
) -> ApiError:
    with pytest.raises(ApiError) as info:
        dec.decode_sync(param, part)
    err = info.value
    assert (err.status, err.param, err.code) == (400, param, code), err.message
    assert err.message.startswith(param), err.message
    for word in words:
        assert word in err.message, err.message
    return err


async def refused_async(
    dec: MediaDecoder, parts: Sequence[tuple[str, MediaContentPart]], code: str, param: str
) -> ApiError:
    with pytest.raises(ApiError) as info:
        await dec.decode(parts)
    err = info.value
    assert (err.status, err.param, err.code) == (400, param, code), err.message
    return err


def audio(dec: MediaDecoder, part: MediaContentPart) -> np.ndarray:
    out = dec.decode_sync(P, part)
    assert (out.kind, out.rate, out.param) == ("audio", 16_000, P)
    assert out.array.dtype == np.float32 and out.array.ndim == 1
    assert not out.array.flags.writeable
    return out.array


# -- audio that decodes -----------------------------------------------------------


def test_wav_at_16k_keeps_its_samples(decoder: MediaDecoder) -> None:
    x = tone(1.0, 16_000)
    y = audio(decoder, audio_part(wav(x, 16_000), "wav"))
    assert y.size == 16_000
    assert np.abs(y - x).max() < 2 / 32768


@pytest.mark.parametrize(
    ("fmt", "rate", "encode", "tolerance"),
    [
        ("wav", 24_000, wav, 0.01),
        ("wav", 44_100, wav, 0.01),
        ("flac", 48_000, flac, 0.01),
        ("flac", 16_000, flac, 0.01),
        ("mp3", 16_000, mp3, 0.1),
        ("mp3", 44_100, mp3, 0.1),
    ],
)
def test_clips_resample_to_16k(
    decoder: MediaDecoder, fmt: str, rate: int, encode: object, tolerance: float
) -> None:
    assert callable(encode)
    data = encode(tone(1.5, rate), rate)
    y = audio(decoder, audio_part(data, fmt))
    assert abs(y.size - 24_000) <= 2
    # The resampled tone is the tone at 16 kHz (edges aside: filter ramps).
    ref = tone(1.5, 16_000)[: y.size]
    assert np.abs(y - ref)[400:-400].max() < tolerance


def test_pcm16_is_24k_mono_by_default(decoder: MediaDecoder) -> None:
    assert media.PCM16_RATE == 24_000
    y = audio(decoder, audio_part(pcm16(tone(2.0, 24_000)), "pcm16"))
    assert abs(y.size - 32_000) <= 2
    assert np.abs(y - tone(2.0, 16_000)[: y.size])[400:-400].max() < 0.01


def test_pcm16_data_url_may_name_its_rate(decoder: MediaDecoder) -> None:
    x = tone(1.0, 16_000)
    y = audio(decoder, audio_url(data_url("audio/pcm;rate=16000", pcm16(x))))
    assert y.size == 16_000
    assert np.abs(y - x).max() < 2 / 32768


def test_stereo_44k_becomes_the_mean_of_its_channels(decoder: MediaDecoder) -> None:
    left = tone(1.0, 44_100)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    y = audio(decoder, audio_part(wav(stereo, 44_100), "wav"))
    assert abs(y.size - 16_000) <= 2
    assert np.abs(y - 0.5 * tone(1.0, 16_000)[: y.size])[400:-400].max() < 0.01


@pytest.mark.parametrize(
    ("fmt", "container", "codec"),
    [
        ("opus", "ogg", "libopus"),
        ("aac", "adts", "aac"),
        ("m4a", "mp4", "aac"),
        ("webm", "webm", "libopus"),
    ],
)
def test_compressed_formats_decode(
    decoder: MediaDecoder, fmt: str, container: str, codec: str
) -> None:
    y = audio(
        decoder, audio_part(encoded(tone(1.0, 48_000, amp=0.5), 48_000, container, codec), fmt)
    )
    assert abs(y.size - 16_000) < 0.1 * 16_000  # encoders pad a frame or so
    rms = float(np.sqrt(np.mean(y[2000:-2000] ** 2)))
    assert abs(rms - 0.5 / np.sqrt(2)) < 0.05


def test_audio_url_data_and_input_audio_data_url(decoder: MediaDecoder) -> None:
    clip = wav(tone(0.5, 16_000), 16_000)
    assert audio(decoder, audio_url(data_url("audio/wav", clip))).size == 8_000
    # Some clients put a data: URL in input_audio.data.
    part = InputAudioPart(input_audio=InputAudio(data=data_url("audio/wav", clip), format="wav"))
    assert audio(decoder, part).size == 8_000


def test_declared_format_loses_to_the_bytes(decoder: MediaDecoder) -> None:
    """A wav sent as "mp3" (or as pcm16) is read as the wav it is."""
    clip = wav(tone(0.5, 16_000), 16_000)
    assert audio(decoder, audio_part(clip, "mp3")).size == 8_000
    assert audio(decoder, audio_part(clip, "pcm16")).size == 8_000


def test_line_wrapped_base64_is_accepted(decoder: MediaDecoder) -> None:
    text = b64(wav(tone(0.5, 16_000), 16_000))
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    part = InputAudioPart(input_audio=InputAudio(data=wrapped, format="wav"))
    assert audio(decoder, part).size == 8_000


# -- images that decode -----------------------------------------------------------


def test_png_decodes_exactly(decoder: MediaDecoder) -> None:
    pixels = gradient(48, 64)
    out = decoder.decode_sync(P, png_part(pixels))
    assert (out.kind, out.rate, out.param) == ("image", 0, P)
    assert out.array.dtype == np.uint8 and out.array.shape == (48, 64, 3)
    assert np.array_equal(out.array, pixels)
    assert not out.array.flags.writeable
    assert out.source_bytes == len(image(pixels))


def test_large_png_decodes_exactly_band_by_band(decoder: MediaDecoder) -> None:
    pixels = gradient(700, 600)  # more than one band of rows
    assert np.array_equal(decoder.decode_sync(P, png_part(pixels)).array, pixels)


def test_jpeg_decodes_close(decoder: MediaDecoder) -> None:
    pixels = gradient(64, 80)
    url = data_url("image/jpeg", image(pixels, "JPEG", quality=95))
    out = decoder.decode_sync(P, image_url(url)).array
    assert out.shape == (64, 80, 3)
    assert np.abs(out.astype(int) - pixels).mean() < 3


def test_rgb_images_decode_straight_into_numpy(
    decoder: MediaDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RGB PNGs and JPEGs (baseline and progressive) are decoded into numpy
    memory, not Pillow's (which is zeroed holding the GIL): the same pixels
    as Pillow's own decoding, without its pixel copy."""

    def no_copy(*args: object) -> np.ndarray:
        raise AssertionError("an RGB image took the copying path")

    monkeypatch.setattr(image_module, "_pixels", no_copy)
    pixels = gradient(300, 200)
    assert np.array_equal(decoder.decode_sync(P, png_part(pixels)).array, pixels)
    for options in ({"quality": 90}, {"quality": 90, "progressive": 1}):
        jpeg = image(pixels, "JPEG", **options)
        out = decoder.decode_sync(P, image_url(data_url("image/jpeg", jpeg))).array
        with Image.open(io.BytesIO(jpeg)) as img:
            assert np.array_equal(out, np.asarray(img.convert("RGB")))


def test_exif_orientation_is_applied(decoder: MediaDecoder) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: shown turned 90 degrees clockwise
    buf = io.BytesIO()
    Image.fromarray(gradient(20, 40)).save(buf, "JPEG", quality=95, exif=exif)
    out = decoder.decode_sync(P, image_url(data_url("image/jpeg", buf.getvalue()))).array
    assert out.shape == (40, 20, 3)


def test_other_modes_become_rgb(decoder: MediaDecoder) -> None:
    gray = np.arange(256, dtype=np.uint8).reshape(16, 16)
    out = decoder.decode_sync(P, png_part(gray)).array
    assert np.array_equal(out, np.repeat(gray[..., None], 3, axis=2))
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[0, 0] = (10, 20, 30, 255)  # opaque; the rest transparent
    out = decoder.decode_sync(P, png_part(rgba)).array
    assert tuple(out[0, 0]) == (10, 20, 30) and tuple(out[1, 1]) == (255, 255, 255)
    gif = image_url(data_url("image/gif", image(gradient(8, 8), "GIF")))
    assert decoder.decode_sync(P, gif).array.shape == (8, 8, 3)


# -- bad data ---------------------------------------------------------------------


def test_bad_base64_is_refused(decoder: MediaDecoder) -> None:
    text = b64(wav(tone(0.1, 16_000), 16_000))
    for bad in (text[:-1], text[:-2] + "!!", "not base64 at all", text + "é"):
        part = InputAudioPart(input_audio=InputAudio(data=bad, format="wav"))
        refused(decoder, part, "invalid_media", P, "base64")
    # Large payloads take another decoder: the same checks.
    big = b64(b"\0" * 600_000)
    for bad in (big[:-1], big[:1000] + "*" + big[1001:], big[:1000] + "====" + big[1004:]):
        refused(decoder, image_url("data:image/png;base64," + bad), "invalid_media", P, "base64")


def test_data_that_is_no_image_is_refused(decoder: MediaDecoder) -> None:
    refused(decoder, image_url(data_url("image/png", b"hello, not a png" * 8)), "invalid_media")
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    truncated = image(noise)[:6000]
    refused(decoder, image_url(data_url("image/png", truncated)), "invalid_media")
    tiff = image(gradient(8, 8), "TIFF")
    refused(decoder, image_url(data_url("image/tiff", tiff)), "invalid_media", P, "PNG, JPEG")


def test_zero_size_image_is_refused(decoder: MediaDecoder) -> None:
    refused(decoder, image_url(data_url("image/png", png_header(0, 10))), "invalid_media")
    refused(decoder, image_url("data:image/png;base64,"), "invalid_media", P, "no data")


def test_audio_that_does_not_decode_is_refused(decoder: MediaDecoder) -> None:
    noise = np.random.default_rng(0).bytes(4000)
    err = refused(decoder, audio_part(noise, "wav"), "invalid_media", P, "as wav")
    assert "Errno" not in err.message and "<none>" not in err.message
    refused(decoder, audio_part(noise, "flac"), "invalid_media")
    clip = wav(tone(1.0, 16_000), 16_000)
    refused(decoder, audio_part(clip[:30], "wav"), "invalid_media")
    refused(decoder, audio_part(b"\x01\x02\x03", "pcm16"), "invalid_media", P, "odd number")


def test_empty_audio_is_refused(decoder: MediaDecoder) -> None:
    empty = wav(np.zeros(0, np.float32), 16_000)
    refused(decoder, audio_part(empty, "wav"), "invalid_media", P, "no samples")
    part = InputAudioPart(input_audio=InputAudio(data="", format="wav"))
    refused(decoder, part, "invalid_media", P, "no data")


def test_nan_audio_is_refused(decoder: MediaDecoder) -> None:
    x = tone(0.1, 16_000)
    x[10] = np.nan
    refused(decoder, audio_part(wav(x, 16_000, "FLOAT"), "wav"), "invalid_media", P, "NaN")


def test_unsupported_formats_are_refused(decoder: MediaDecoder) -> None:
    part = InputAudioPart(input_audio=InputAudio(data=b64(b"FORM0000AIFF"), format="aiff"))
    refused(decoder, part, "unsupported_media_format", P, "aiff", "wav")
    refused(decoder, audio_url(data_url("audio/x-aiff", b"x")), "unsupported_media_format")
    clip = wav(tone(0.1, 16_000), 16_000)
    err = refused(decoder, image_url(data_url("audio/wav", clip)), "unsupported_media_format")
    assert "input_audio" in err.message


def test_data_urls_must_be_base64(decoder: MediaDecoder) -> None:
    refused(decoder, image_url("data:image/svg+xml,<svg/>"), "invalid_media_url", P, "base64")
    refused(decoder, image_url("data:image/png;base64"), "invalid_media_url", P, "','")


# -- limits -----------------------------------------------------------------------


def test_a_20mb_image_is_refused_before_decoding(
    decoder: MediaDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_decoding(*args: object) -> bytes:
        raise AssertionError("decoded a part over the limit")

    monkeypatch.setattr(decoder_module, "b64decode", no_decoding)
    url = "data:image/png;base64," + "A" * (20 * 2**20 * 4 // 3)
    refused(decoder, image_url(url), "media_too_large", P, "20.0 MiB", "10.0 MiB")


def test_an_image_of_too_many_pixels_is_refused_from_its_header(
    decoder: MediaDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pixels(*args: object) -> np.ndarray:
        raise AssertionError("decoded the pixels of an image over the limit")

    monkeypatch.setattr(image_module, "_pixels", no_pixels)
    bomb = image_url(data_url("image/png", png_header(5000, 5000)))
    refused(decoder, bomb, "image_too_large", P, "5000x5000", str(OMNI.max_pixels))
    # Past PIL's own decompression-bomb bound, too.
    huge = image_url(data_url("image/png", png_header(30_000, 30_000)))
    refused(decoder, huge, "image_too_large", P, str(OMNI.max_pixels))
    small = MediaDecoder(MediaLimits(image=True, max_pixels=100))
    refused(small, png_part(gradient(10, 11)), "image_too_large", P, "11x10")
    small.close()


def test_a_10_minute_clip_is_refused_from_its_header(
    decoder: MediaDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_resampling(*args: object, **kw: object) -> None:
        raise AssertionError("decoded a clip whose header says it is too long")

    clip = wav(np.zeros(600 * 8000, np.float32), 8000, "PCM_U8")  # 4.6 MiB
    monkeypatch.setattr(sound.av, "AudioResampler", no_resampling)
    refused(decoder, audio_part(clip, "wav"), "audio_too_long", P, "600.0 s", "300 s")


def test_long_clips_are_refused_on_their_samples() -> None:
    dec = MediaDecoder(MediaLimits(audio=True, max_audio_seconds=2.0))
    try:
        # No header to read a duration from: raw pcm16, mp3 (its header's
        # duration is an estimate).
        refused(dec, audio_part(pcm16(tone(2.5, 24_000)), "pcm16"), "audio_too_long", P, "2 s")
        refused(dec, audio_part(mp3(tone(3.0, 16_000), 16_000), "mp3"), "audio_too_long")
        assert dec.decode_sync(P, audio_part(pcm16(tone(2.0, 24_000)), "pcm16")).array.size
    finally:
        dec.close()


async def test_parts_per_kind_are_counted() -> None:
    dec = MediaDecoder(MediaLimits(audio=True, image=True), pipeline="tiny-omni")
    clip = audio_part(wav(tone(0.1, 16_000), 16_000), "wav")
    img = png_part(gradient(4, 4))
    try:
        got = await dec.decode([("messages[0].content[0]", clip), ("messages[1].content[0]", img)])
        assert [(g.param, g.kind) for g in got] == [
            ("messages[0].content[0]", "audio"),
            ("messages[1].content[0]", "image"),
        ]
        parts = [("messages[0].content[0]", clip), ("messages[2].content[3]", clip)]
        err = await refused_async(dec, parts, "too_many_media_parts", "messages[2].content[3]")
        assert "at most 1 audio part" in err.message
    finally:
        dec.close()


async def test_the_first_bad_part_in_order_is_named(decoder: MediaDecoder) -> None:
    good = audio_part(wav(tone(0.1, 16_000), 16_000), "wav")
    bad = image_url(data_url("image/png", b"not a png"))
    parts: list[tuple[str, MediaContentPart]] = [
        ("messages[0].content[0]", good),
        ("messages[0].content[1]", bad),
    ]
    await refused_async(decoder, parts, "invalid_media", "messages[0].content[1]")
    assert await decoder.decode([]) == []


def test_kinds_the_pipeline_does_not_take_are_refused() -> None:
    audio_only = MediaDecoder(MediaLimits(audio=True), pipeline="speechy")
    err = refused(audio_only, png_part(gradient(4, 4)), "unsupported_input", P, "'speechy'")
    assert "does not take image input" in err.message
    audio_only.close()
    text_only = MediaDecoder(None, pipeline="tiny-text")
    clip = audio_part(wav(tone(0.1, 16_000), 16_000), "wav")
    refused(text_only, clip, "unsupported_input", P, "text input only", "tiny-omni", "tiny-text")
    text_only.close()


def test_video_is_refused_where_the_pipeline_takes_none(decoder: MediaDecoder) -> None:
    # (Video input itself is supported: test_media_video.py.)
    part = video_url("data:video/mp4;base64,AAAA")
    err = refused(decoder, part, "unsupported_input", P, "does not take video input")
    assert "takes text and audio and image" in err.message


# -- URLs ---------------------------------------------------------------------------


def test_local_files_and_other_schemes_are_refused(decoder: MediaDecoder) -> None:
    for url in ("file:///etc/passwd", "FILE:///tmp/x.png", "/etc/passwd", "cat.png", "C:\\x.png"):
        refused(decoder, image_url(url), "invalid_media_url", P, "never reads local files")
    for url in ("ftp://example.com/x.png", "gopher://example.com/x"):
        refused(decoder, image_url(url), "invalid_media_url", P, "not fetched")


def test_remote_hosts_are_refused_unless_allowed(decoder: MediaDecoder) -> None:
    refused(
        decoder,
        image_url("https://example.com/cat.png"),
        "media_domain_not_allowed",
        P,
        "no allowed media domains",
        "data:",
    )
    dec = MediaDecoder(OMNI, allowed_domains=frozenset({"media.example.org"}))
    for url in ("https://example.com/cat.png", "http://media.example.org.evil.com/x.png"):
        refused(dec, image_url(url), "media_domain_not_allowed", P, "media.example.org")
    dec.close()


@contextlib.asynccontextmanager
async def media_server() -> AsyncIterator[str]:
    """A local server on 127.0.0.1 with media, errors and redirects."""
    clip = wav(tone(0.5, 16_000), 16_000)
    png = image(gradient(8, 8))

    async def stream_big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no Content-Length to refuse early
        await resp.prepare(request)
        for _ in range(64):
            await resp.write(b"\0" * 65536)
        return resp

    done = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await done.wait()  # past the client's timeout; released at the end
        return web.Response(body=png)

    app = web.Application()
    app.router.add_get("/cat.png", _serve(png, "image/png"))
    app.router.add_get("/clip.wav", _serve(clip, "audio/wav"))
    app.router.add_get("/clip", _serve(clip, "application/octet-stream"))
    app.router.add_get("/big.png", _serve(b"\0" * (2 * 2**20), "image/png"))
    app.router.add_get("/stream.png", stream_big)
    app.router.add_get("/slow.png", slow)
    app.router.add_get("/to-cat", _redirect("/cat.png"))
    app.router.add_get("/to-elsewhere", _redirect("http://localhost:1/cat.png"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        done.set()
        await runner.cleanup()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _serve(body: bytes, content_type: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type=content_type)

    return handler


def _redirect(location: str) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location)

    return handler


async def test_an_allowed_host_is_fetched() -> None:
    limits = MediaLimits(
        audio=True, image=True, max_part_bytes=2**20, max_audio_parts=2, max_image_parts=2
    )
    dec = MediaDecoder(limits, allowed_domains=frozenset({"127.0.0.1"}), fetch_timeout_s=0.3)
    try:
        async with media_server() as base:
            got = await dec.decode(
                [
                    ("messages[0].content[0]", image_url(f"{base}/cat.png")),
                    ("messages[0].content[1]", audio_url(f"{base}/clip.wav")),
                    ("messages[0].content[2]", audio_url(f"{base}/clip")),  # sniffed
                    ("messages[0].content[3]", image_url(f"{base}/to-cat")),
                ]
            )
            assert isinstance(got[0], DecodedMedia)
            assert np.array_equal(got[0].array, gradient(8, 8))
            assert got[1].array.size == got[2].array.size == 8000
            assert np.array_equal(got[3].array, got[0].array)

            async def fails(path: str, code: str, *words: str) -> None:
                err = await refused_async(dec, [(P, image_url(base + path))], code, P)
                for word in words:
                    assert word in err.message, err.message

            await fails("/missing.png", "media_fetch_failed", "404")
            await fails("/big.png", "media_too_large", "1.0 MiB")
            await fails("/stream.png", "media_too_large", "more than 1.0 MiB")
            await fails("/slow.png", "media_fetch_failed", "longer than 0.3 s")
            await fails("/to-elsewhere", "media_domain_not_allowed", "localhost")
    finally:
        dec.close()


def test_decode_sync_does_not_fetch() -> None:
    dec = MediaDecoder(OMNI, allowed_domains=frozenset({"127.0.0.1"}))
    with pytest.raises(ValueError, match="decode"):
        dec.decode_sync(P, image_url("http://127.0.0.1:9/cat.png"))
    dec.close()
