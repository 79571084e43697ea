"""The playground on ``tiny-omni`` with real engines, in Chromium, as a person
uses it: a typed turn and spoken ones (the fake microphone says a
sentence twice; the server's VAD ends each turn, and the second, said over
the first answer, interrupts it) are answered in text and in
audio the page plays, in the voice picked from those the server lists;
beside each answer the timeline lists the request's
events as the log holds them, in order, with the log's figures; the trace
it downloads is one ``omnix replay`` reads, and the replay view opens.  A
person who refuses the microphone is told so in words."""

from __future__ import annotations

import asyncio
from typing import Any

from omnix.cli import main
from omnix.events.types import Event
from omnix.http.app import HttpServer
from omnix.trace import read_trace

from ..conftest import real_engine_marks
from .conftest import open_page, shot

PIPELINE = "tiny-omni"
# Answers long enough to be still in the making when the second sentence
# comes over them, however quickly this machine makes them.
SERVER = "tiny-omni+long"
pytestmark = real_engine_marks()

ANSWERED = ".turn.answer:not([data-status='running'])"
TERMINAL = {"finished", "cancelled", "failed", "rejected"}


async def log_events(server: HttpServer, rid: str) -> dict[int, Event]:
    return {ev.pos: ev async for ev in server.omni.events(rid)}


async def check_timeline(server: HttpServer, answer: Any) -> str:
    """The answer's timeline against the log: its events, in the log's
    order, each the log's event at that position; its TTFT the log's.
    Returns the request id."""
    rid = await answer.get_attribute("data-request-id")
    assert rid
    timeline = answer.locator(".timeline")
    await timeline.locator(".figures .kpis").wait_for(timeout=30_000)
    shown = [
        (int(await li.get_attribute("data-pos")), await li.get_attribute("data-type"))
        for li in await timeline.locator("ol.events li").all()
    ]
    log = await log_events(server, rid)
    assert [pos for pos, _ in shown] == sorted(pos for pos, _ in shown)
    for pos, kind in shown:
        assert type(log[pos]).__struct_config__.tag == kind
    kinds = [kind for _, kind in shown]
    assert kinds[0] == "admitted" and kinds[-1] in TERMINAL
    started = [log[pos].stage for pos, kind in shown if kind == "stage_started"]  # type: ignore[attr-defined]
    assert started == ["thinker", "talker", "code2wav"]
    rs = server.omni.state(rid)
    assert rs is not None and rs.first_token_ts
    ttft = (rs.first_token_ts - rs.admitted_ts) / 1e6
    assert await timeline.locator("[data-figure=ttft] b").inner_text() == f"{ttft:.1f} ms"
    return rid


async def test_a_typed_turn_is_answered_in_text_and_audio_beside_its_timeline(
    server, browser, http, tmp_path
):
    page = await open_page(browser, server.url + "/")
    assert page.url.endswith("/playground")
    await page.locator("#mic").wait_for(timeout=60_000)
    async with http.get(server.url + "/v1/audio/voices") as r:
        voices = (await r.json())["voices"]
    assert len(voices) > 1
    assert await page.locator("#voice option").all_inner_texts() == voices
    await page.select_option("#voice", voices[-1])
    await page.fill("#text", "Say something short.")
    await page.click("#send")
    answer = page.locator(ANSWERED).first
    await answer.wait_for(timeout=120_000)
    assert await page.locator(".turn.user .text").first.inner_text() == "Say something short."
    assert (await answer.locator(".text").inner_text()).strip()
    assert int(await answer.get_attribute("data-audio-samples") or 0) > 0
    rid = await check_timeline(server, answer)
    admitted = next(iter((await log_events(server, rid)).values()))
    assert admitted.spec.stage_params["talker"].voice == voices[-1]  # type: ignore[attr-defined]
    await shot(page, "typed-turn")

    async with page.expect_download() as dl:
        await answer.locator("button.trace").click()
    download = await dl.value
    assert download.suggested_filename == f"{rid}.omnixtrace"
    path = tmp_path / download.suggested_filename
    await download.save_as(path)
    assert rid in read_trace(path).targets
    assert await asyncio.to_thread(main, ["replay", str(path)]) == 0

    async with page.context.expect_page() as opened:
        await answer.locator("button.replay").click()
    view = await opened.value
    await view.wait_for_load_state()
    assert rid in await view.title()
    assert page.problems == []
    await page.context.close()


async def test_spoken_turns_are_transcribed_answered_aloud_and_interrupted(server, browser):
    page = await open_page(browser, server.url + "/playground", microphone=True)
    await page.locator("#mic").wait_for(timeout=60_000)
    await page.click("#mic")
    answers = page.locator(ANSWERED)
    await answers.nth(1).wait_for(timeout=180_000)
    # The second sentence came over the first answer: the server cancelled
    # it through the log (the page dropped what it had not played yet).
    first, second = answers.nth(0), answers.nth(1)
    assert await first.get_attribute("data-status") == "cancelled"
    assert "interrupted" in (await first.get_attribute("class") or "")
    cut = await first.get_attribute("data-request-id")
    rs = server.omni.state(cut or "")
    assert rs is not None and rs.status == "cancelled" and rs.cancel_reason == "interrupted"
    await first.locator(".timeline li[data-type=cancelled]").wait_for(state="attached")

    assert int(await second.get_attribute("data-audio-samples") or 0) > 0
    said = page.locator(".turn.user .text")
    for _ in range(300):  # each transcription is a request of its own, beside the answer
        texts = [t.strip() for t in await said.all_inner_texts()]
        if len(texts) == 2 and all(t not in ("", "…") for t in texts):
            break
        await asyncio.sleep(0.1)
    assert len(texts) == 2 and all(t not in ("", "…") for t in texts), texts
    await check_timeline(server, second)
    await shot(page, "spoken-turns")
    assert await page.locator("#problem").is_hidden()
    assert page.problems == []
    await page.context.close()


async def test_a_refused_microphone_is_said_in_words(server, browser):
    page = await open_page(browser, server.url + "/playground", microphone=False)
    await page.locator("#mic").wait_for(timeout=60_000)
    await page.click("#mic")
    problem = page.locator("#problem")
    await problem.wait_for()
    assert "microphone is not allowed" in await problem.inner_text()
    await shot(page, "microphone-refused")
    await page.context.close()
