"""Voices people upload to a served Qwen3-TTS Base folder (``omnix serve
PATH --log-dir DIR``, real workers): ``POST /v1/audio/voices`` keeps the
clip (any rate: resampled to 24 kHz) and its speaker vector, made once at
upload (the in-process cloner's, to the bit), and ``voice: NAME`` clones
from them with the greedy audio omnix's in-process cloner, talker and
decoder give for the same clip; the clip, its speaker vector and its
transcript are recorded with the request, so its trace replays (the
client's bytes, the decisions, the audio from the recorded vector) after
the voice is deleted; voices outlive a restart, and one kept without a
vector gets it on first use; ``ref_audio`` may be an http(s) URL of an
allowed host; a batch's items clone as they do alone; and each bad field
is one 4xx naming it."""

from __future__ import annotations

import base64
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from omnix.cli import main
from omnix.events.types import Admitted
from omnix.testing.served import ServeProcess
from omnix.trace import read_trace

from .conftest import engines_missing
from .tts_serving import (
    GREEDY,
    REF_TEXT,
    assert_heard,
    clip_samples,
    data_url,
    expected_clone,
    reference_wav,
    serve,
    speaker_vector,
    voices,
)

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(engines_missing() is not None, reason=f"{engines_missing()}"),
    pytest.mark.timeout(900),
]


async def _upload(
    http: aiohttp.ClientSession,
    served: ServeProcess,
    fields: dict[str, str],
    audio: bytes | None,
    filename: str = "voice.wav",
) -> tuple[int, dict]:
    form = aiohttp.FormData(fields, default_to_multipart=True)
    if audio is not None:
        form.add_field("audio_sample", audio, filename=filename, content_type="audio/wav")
    async with http.post(served.url + "/v1/audio/voices", data=form) as r:
        return r.status, await r.json()


async def _speak(http: aiohttp.ClientSession, served: ServeProcess, **body) -> tuple[str, bytes]:
    body = {"input": "Say it in my voice.", "response_format": "pcm", **GREEDY, **body}
    async with http.post(served.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200, await r.text()
        return r.headers["X-Request-Id"], await r.read()


async def _speech_refused(
    http: aiohttp.ClientSession, served: ServeProcess, param: str, *needles: str, **body
) -> None:
    body = {"input": "Hello.", "response_format": "pcm", **body}
    async with http.post(served.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 400, await r.text()
        err = (await r.json())["error"]
    assert err["param"] == param, err
    for needle in needles:
        assert needle in err["message"], err


def _refusal(got: tuple[int, dict], status: int, param: str, *needles: str) -> None:
    code, body = got
    assert code == status, body
    err = body["error"]
    assert err["param"] == param, err
    for needle in needles:
        assert needle in err["message"], err


async def test_an_uploaded_voice_clones_replays_without_the_store_and_outlives_a_restart(
    tiny_models, tmp_path: Path
):
    folder = tiny_models.qwen3_tts_base
    log_dir = tmp_path / "log"
    args = ("--log-dir", str(log_dir), "--allowed-media-domains", "127.0.0.1")
    text = "Say it in my voice."
    wav16 = reference_wav(16000)  # resampled to 24 kHz, on upload as in ref_audio
    samples = clip_samples(wav16)
    assert samples.size == int(1.3 * 24000)
    want = expected_clone(tiny_models.qwen3_tts_base, samples, REF_TEXT, text=text)
    vector = speaker_vector(folder, samples)

    # ref_audio by URL: a host the server is allowed to fetch media from.
    async def clip(_: web.Request) -> web.Response:
        return web.Response(body=wav16)

    files = web.Application()
    files.router.add_get("/voice.wav", clip)
    runner = web.AppRunner(files)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    served, client = await serve(folder, "tts-base", *args)
    try:
        async with aiohttp.ClientSession() as http:
            status, up = await _upload(
                http, served, {"name": "Alice", "consent": "rec-1", "ref_text": REF_TEXT}, wav16
            )
            assert status == 200, up
            voice = up["voice"]
            assert up["success"] is True
            assert {k: voice[k] for k in ("name", "consent", "ref_text", "mime_type")} == {
                "name": "Alice", "consent": "rec-1", "ref_text": REF_TEXT, "mime_type": "audio/wav"
            }  # fmt: skip
            assert voice["file_size"] == len(wav16) and voice["seconds"] == 1.3
            listed = await voices(served)
            assert listed["voices"] == ["Alice"] and listed["uploaded_voices"] == [voice]
            # Its speaker vector was made at upload and is kept with it.
            kept = np.load(log_dir / "voices" / "alice" / "speaker.npy")
            assert kept.dtype == np.float32 and np.array_equal(kept, vector)

            rid, cloned = await _speak(http, served, voice="alice")  # names: any case
            assert_heard(cloned, want)
            # The same clip sent inline, or fetched by URL, clones the same voice.
            _, inline = await _speak(http, served, ref_audio=data_url(wav16), ref_text=REF_TEXT)
            assert inline == cloned
            url = f"http://127.0.0.1:{port}/voice.wav"
            _, fetched = await _speak(http, served, ref_audio=url, ref_text=REF_TEXT)
            assert fetched == cloned

            # In a batch too, beside an item cloning from ref_audio.
            batch = {
                "response_format": "pcm",
                "items": [
                    {"input": text, "voice": "Alice"},
                    {"input": text, "ref_audio": data_url(wav16), "ref_text": REF_TEXT},
                ],
                **GREEDY,
            }
            async with http.post(served.url + "/v1/audio/speech/batch", json=batch) as r:
                assert r.status == 200, await r.text()
                results = (await r.json())["results"]
            assert [base64.b64decode(x["audio_data"]) for x in results] == [cloned, cloned]

            async with http.get(f"{served.url}/v1/requests/{rid}/trace") as r:
                assert r.status == 200
                trace_bytes = await r.read()
            async with http.delete(served.url + "/v1/audio/voices/ALICE") as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["success"] is True
            assert (await voices(served))["uploaded_voices"] == []
            await _speech_refused(http, served, "voice", "no voice is uploaded", voice="alice")

            # Bob: no transcript (the speaker vector alone); kept for the restart.
            status, up = await _upload(http, served, {"name": "bob", "consent": "rec-2"}, wav16)
            assert status == 200 and "ref_text" not in up["voice"], up
    finally:
        await client.close()
        await served.stop()
        await runner.cleanup()

    # The trace replays without the voice store: the clip, its speaker
    # vector and its transcript are the request's own message (blobs), as
    # cloned; the audio is the talker's from the recorded vector.
    trace = read_trace(trace_bytes)
    (admitted,) = [e for e in trace.events_for(rid) if isinstance(e, Admitted)]
    (message,) = admitted.spec.messages
    assert message.content == REF_TEXT
    assert [p.kind for p in message.media] == ["audio", "speaker"]
    recorded = trace.blobs.get_array(message.media[0].blob)
    assert np.array_equal(recorded, samples)
    recorded_vector = trace.blobs.get_array(message.media[1].blob)
    assert np.array_equal(recorded_vector, vector)
    assert_heard(
        cloned, expected_clone(folder, recorded, message.content, recorded_vector, text=text)
    )
    path = tmp_path / "clone.trace"
    path.write_bytes(trace_bytes)
    body = tmp_path / "clone.pcm"
    assert main(["replay", str(path), "--client-bytes", "-o", str(body)]) == 0
    assert body.read_bytes() == cloned
    assert main(["replay", str(path), "--drive"]) == 0

    # Voices are files under --log-dir: a restarted server still has Bob,
    # even as an older omnix kept him (no speaker vector: made on first use).
    assert (log_dir / "voices" / "bob" / "audio.wav").is_file()
    (log_dir / "voices" / "bob" / "speaker.npy").unlink()
    served, client = await serve(folder, "tts-base", *args)
    try:
        listed = await voices(served)
        assert listed["voices"] == ["bob"], listed
        async with aiohttp.ClientSession() as http:
            _, heard = await _speak(http, served, voice="Bob", language="english")
        assert_heard(heard, expected_clone(folder, samples, None, text=text, language="english"))
        assert np.array_equal(np.load(log_dir / "voices" / "bob" / "speaker.npy"), vector)
    finally:
        await client.close()
        await served.close()


async def test_bad_uploads_and_clones_are_refused_naming_the_field(tiny_models, tmp_path: Path):
    served, client = await serve(tiny_models.qwen3_tts_base, "tts-base")
    wav = reference_wav()
    ok = {"name": "carol", "consent": "rec-3"}
    try:
        async with aiohttp.ClientSession() as http:
            assert (await _upload(http, served, ok, wav))[0] == 200
            _refusal(await _upload(http, served, {"name": "dave"}, wav), 400, "consent", "consent")
            _refusal(await _upload(http, served, {"consent": "x"}, wav), 400, "name", "required")
            _refusal(await _upload(http, served, ok, None), 400, "audio_sample", "required")
            _refusal(await _upload(http, served, ok, wav), 409, "name", "already uploaded")
            _refusal(await _upload(http, served, {**ok, "name": "CAROL"}, wav), 409, "name", "case")
            for name in ("../evil", "a b", "-x", "x" * 65):
                got = await _upload(http, served, {**ok, "name": name}, wav)
                _refusal(got, 400, "name", "not a voice name")
            _refusal(
                await _upload(http, served, {**ok, "name": "default"}, wav), 400, "name", "reserved"
            )
            _refusal(
                await _upload(http, served, {**ok, "name": "e"}, b"not audio at all", "a.txt"),
                400,
                "audio_sample",
                "audio",
            )
            long = reference_wav(8000, seconds=61.0)
            got = await _upload(http, served, {**ok, "name": "f"}, long)
            _refusal(got, 400, "audio_sample", "61.0 s long", "at most 60 s")
            huge = b"RIFF" + bytes(10 * 2**20)
            got = await _upload(http, served, {**ok, "name": "g"}, huge)
            _refusal(got, 400, "audio_sample", "at most 10.0 MiB")
            got = await _upload(http, served, {**ok, "name": "h", "speaker_embedding": "[0]"}, wav)
            _refusal(got, 400, "speaker_embedding", "upload audio_sample")
            # Nothing refused was kept.
            assert (await voices(served))["voices"] == ["carol"]

            await _speech_refused(
                http, served, "ref_audio", "send one of them",
                voice="carol", ref_audio=data_url(wav),
            )  # fmt: skip
            await _speech_refused(http, served, "ref_text", "omit ref_text", voice="carol",
                                  ref_text="Hi.")  # fmt: skip
            await _speech_refused(
                http, served, "instructions", "no instructions", voice="carol", instructions="Hi"
            )
            await _speech_refused(
                http, served, "ref_audio", "ftp:// URLs are not fetched",
                ref_audio="ftp://example.com/voice.wav",
            )  # fmt: skip
            async with http.delete(served.url + "/v1/audio/voices/nobody") as r:
                assert r.status == 404
                assert (await r.json())["error"]["param"] == "name"
    finally:
        await client.close()
        await served.close()
