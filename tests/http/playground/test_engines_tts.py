"""The playground on Qwen3-TTS folders (the tiny CustomVoice, VoiceDesign
and Base checkpoints) with real engines, in Chromium, as a person uses
it: the speech form offers the fields the model card says the speech
route takes and no other (the voices the server lists, how to say it or
the voice described, the languages; on Base, a voice to clone from a WAV
the person chooses, and its transcript); what it speaks plays beside its
request's timeline, and the log holds what the person chose.  A file
that is not audio is refused by the server before
admission and said in words, its field marked; a VoiceDesign request
without its description is held back by the page, which the card told
that it is required.

Each folder is served as ``omnix serve PATH`` derives it, with one change:
its talker speaks at most ``FRAMES`` frames, as random weights never end
an answer by themselves (the derived bound is minutes of audio)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from omnix.events.types import Admitted
from omnix.http.app import HttpServer
from omnix.pipelines.folder import derive_pipeline
from tests.model_fixtures import session_models

from ..conftest import real_engine_marks, serve_engines, with_long_answers
from .conftest import SPEECH, open_page, shot

pytestmark = [*real_engine_marks(), pytest.mark.timeout(900)]

FRAMES = 24
ANSWERED = ".turn.answer[data-status=completed]"
TERMINAL = {"finished", "cancelled", "failed", "rejected"}


@contextlib.asynccontextmanager
async def serve_folder(tmp_path_factory: Any, name: str) -> AsyncIterator[HttpServer]:
    folder = getattr(session_models(tmp_path_factory), name)
    pipeline = with_long_answers(derive_pipeline(folder, gpu=False), frames=FRAMES)
    async with serve_engines(pipeline) as server:
        yield server


async def card(http: Any, server: HttpServer) -> dict[str, Any]:
    async with http.get(server.url + "/v1/models") as r:
        (only,) = (await r.json())["data"]
        return only  # type: ignore[no-any-return]


async def offered(page: Any) -> dict[str, bool]:
    """Which speech fields the page shows."""
    ids = ("voice", "instructions", "language", "ref-audio", "ref-text")
    return {i: await page.locator(f"#{i}").is_visible() for i in ids}


async def spoken(server: HttpServer, page: Any, answer: Any) -> Admitted:
    """The answer plays (the player decoded its audio) and its timeline is
    the request's events from the log, admitted to finished; returns its
    admission."""
    audio = answer.locator("audio")
    assert (await audio.get_attribute("src") or "").startswith("blob:")
    await page.wait_for_function(
        "a => a.readyState >= 1 && a.duration > 0", arg=await audio.element_handle()
    )
    rid = await answer.get_attribute("data-request-id")
    timeline = answer.locator(".timeline")
    await timeline.locator(".figures .kpis").wait_for(timeout=30_000)
    shown = [
        (int(await li.get_attribute("data-pos")), await li.get_attribute("data-type"))
        for li in await timeline.locator("ol.events li").all()
    ]
    log = {ev.pos: ev async for ev in server.omni.events(rid or "")}
    assert [type(log[pos]).__struct_config__.tag for pos, _ in shown] == [k for _, k in shown]
    kinds = [k for _, k in shown]
    assert kinds[0] == "admitted" and kinds[-1] == "finished"
    assert [log[p].stage for p, k in shown if k == "stage_started"] == ["talker", "code2wav"]  # type: ignore[attr-defined]
    admitted = log[shown[0][0]]
    assert isinstance(admitted, Admitted)
    return admitted


async def test_custom_voice_speaks_a_listed_voice_as_instructed(browser, http, tmp_path_factory):
    async with serve_folder(tmp_path_factory, "qwen3_tts_custom_voice") as server:
        speech = (await card(http, server))["speech"]
        assert speech["task_type"] == "CustomVoice" and speech["instructions"] == "optional"
        async with http.get(server.url + "/v1/audio/voices") as r:
            voices = (await r.json())["voices"]
        page = await open_page(browser, server.url + "/playground")
        await page.locator("#speech").wait_for(timeout=60_000)
        assert "Qwen3-TTS CustomVoice" in await page.locator("#model").inner_text()
        assert await offered(page) == {
            "voice": True, "instructions": True, "language": True,
            "ref-audio": False, "ref-text": False,
        }  # fmt: skip
        assert await page.locator("#voice option").all_inner_texts() == voices
        assert await page.locator("#language option").all_inner_texts() == speech["languages"]
        assert not await page.locator("#instructions").evaluate("e => e.required")

        how = "Very happy, and a little fast."
        await page.select_option("#voice", voices[-1])
        await page.fill("#instructions", how)
        await page.select_option("#language", "english")
        await page.fill("#text", "Hello there, how are you today?")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=180_000)
        admitted = await spoken(server, page, answer)
        talker = admitted.spec.stage_params["talker"]
        assert (talker.voice, talker.instructions, talker.language) == (voices[-1], how, "english")
        said = await page.locator(".turn.user .asked").inner_text()
        assert voices[-1] in said and how in said
        await shot(page, "tts-custom-voice")
        assert await page.locator("#problem").is_hidden()
        assert page.problems == []
        await page.context.close()


async def test_voice_design_needs_the_voice_described_then_speaks_it(
    browser, http, tmp_path_factory
):
    async with serve_folder(tmp_path_factory, "qwen3_tts_voice_design") as server:
        assert (await card(http, server))["speech"]["instructions"] == "required"
        page = await open_page(browser, server.url + "/playground")
        await page.locator("#speech").wait_for(timeout=60_000)
        assert await offered(page) == {
            "voice": False, "instructions": True, "language": True,
            "ref-audio": False, "ref-text": False,
        }  # fmt: skip
        before = len(server.omni.log)
        await page.fill("#text", "The quick brown fox.")
        await page.click("#send")
        # The page held it back (the card says the description is required):
        # the browser asks for the field, nothing was sent.
        assert await page.locator("#instructions").evaluate("e => !e.validity.valid")
        assert await page.locator(".turn").count() == 0 and len(server.omni.log) == before

        voice = "A warm, low female voice, speaking slowly."
        await page.fill("#instructions", voice)
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=180_000)
        admitted = await spoken(server, page, answer)
        assert admitted.spec.stage_params["talker"].instructions == voice
        await shot(page, "tts-voice-design")
        assert page.problems == []
        await page.context.close()


async def test_base_clones_the_voice_of_a_chosen_wav_and_says_a_refusal_in_words(
    browser, http, tmp_path_factory, tmp_path: Path
):
    samples, rate = sf.read(SPEECH, dtype="float32")
    broken = tmp_path / "voice.wav"
    broken.write_bytes(b"RIFF....WAVEfmt this is no audio")  # a .wav that is not audio
    said = "A recorded sentence."
    async with serve_folder(tmp_path_factory, "qwen3_tts_base") as server:
        speech = (await card(http, server))["speech"]
        assert (speech["ref_audio"], speech["ref_audio_rate"]) == ("required", rate)
        page = await open_page(browser, server.url + "/playground")
        await page.locator("#speech").wait_for(timeout=60_000)
        assert "Qwen3-TTS Base" in await page.locator("#model").inner_text()
        assert await offered(page) == {
            "voice": False, "instructions": False, "language": True,
            "ref-audio": True, "ref-text": True,
        }  # fmt: skip
        assert f"{rate} Hz" in await page.locator("#ref-audio-field").inner_text()

        before = len(server.omni.log)
        await page.set_input_files("#ref-audio", str(broken))
        await page.fill("#ref-text", said)
        await page.fill("#text", "Clone this voice, please.")
        await page.click("#send")
        refused = page.locator(".turn.answer[data-status=refused]").first
        await refused.wait_for(timeout=30_000)
        problem = await page.locator("#problem").inner_text()
        assert "ref_audio" in problem and "could not be decoded" in problem, problem
        assert await page.get_attribute("#ref-audio", "aria-invalid") == "true"
        # its timeline stops asking the log for it, and says why
        await refused.locator(".timeline .state", has_text="not admitted").wait_for(timeout=10_000)
        assert len(server.omni.log) == before
        await shot(page, "tts-base-refused")

        await page.set_input_files("#ref-audio", str(SPEECH))
        await page.select_option("#language", "english")
        await page.fill("#text", "Clone this voice, please.")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=180_000)
        assert await page.locator("#problem").is_hidden()
        admitted = await spoken(server, page, answer)
        (message,) = admitted.spec.messages
        # the clip, and the speaker vector the talker clones with (recorded beside it)
        part, vector = message.media
        assert message.content == said and part.kind == "audio" and part.rate == rate
        assert vector.kind == "speaker"
        heard = server.omni.blobs.get_array(part.blob)
        assert np.abs(heard - samples).max() < 1e-6  # the file the person chose
        assert admitted.spec.stage_params["talker"].language == "english"
        await shot(page, "tts-base")
        assert page.problems == []
        await page.context.close()
