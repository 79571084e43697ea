"""The playground on pipelines that do not talk, in Chromium, on scripted
pipelines: a speech pipeline speaks the typed text with a voice the server
lists, an image pipeline draws it with the steps as a progress bar; each
answer beside its request's timeline and figures."""

from __future__ import annotations

import pytest

from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.serving import serve_scripted

from .conftest import open_page, shot

pytestmark = pytest.mark.asyncio(loop_scope="session")

ANSWERED = ".turn.answer:not([data-status='running'])"

TTS = """
name = "pg-tts"
[[stages]]
name = "talker"
engine = { kind = "scripted", chunks_per_piece = 4, delay_ms = 5, output_modality = "codec" }
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, output_modality = "audio" }
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 1
[outputs]
audio = "code2wav"
"""

IMAGE = """
name = "pg-image"
[[stages]]
name = "image"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 50, output_modality = "image" }
sampling = { num_inference_steps = 8 }
[outputs]
image = "image"
"""


async def test_a_speech_pipeline_speaks_the_text_with_the_voices_the_server_lists(browser, http):
    async with serve_scripted(parse_pipeline(TTS), HttpOptions()) as server:
        page = await open_page(browser, server.url + "/playground")
        await page.locator("#controls").wait_for(timeout=30_000)
        async with http.get(server.url + "/v1/audio/voices") as r:
            listed = (await r.json())["voices"]
        assert await page.locator("#voice option").all_inner_texts() == listed
        assert await page.locator("#voice").is_visible() == bool(listed)
        await page.fill("#text", "Hello there.")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=30_000)
        assert await answer.get_attribute("data-status") == "completed"
        assert (await answer.locator("audio").get_attribute("src") or "").startswith("blob:")
        await answer.locator(".figures .kpis").wait_for(timeout=10_000)
        await shot(page, "speech")
        assert page.problems == []
        await page.context.close()


async def test_an_image_pipeline_draws_with_its_steps_as_a_progress_bar(browser):
    async with serve_scripted(parse_pipeline(IMAGE), HttpOptions()) as server:
        page = await open_page(browser, server.url + "/playground")
        await page.locator("#controls").wait_for(timeout=30_000)
        await page.fill("#text", "a red square")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=30_000)
        assert await answer.get_attribute("data-status") == "completed"
        assert (await answer.locator("img").get_attribute("src") or "").startswith("data:image/")
        bar = answer.locator("progress")
        assert await bar.get_attribute("max") == await bar.get_attribute("value")
        await answer.locator(".figures .kpis").wait_for(timeout=10_000)
        await shot(page, "image")
        assert page.problems == []
        await page.context.close()
