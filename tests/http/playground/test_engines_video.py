"""The playground on ``tiny-video`` with real engines (a diffusers Wan 2.2
pipeline), in Chromium, as a person uses it: a described video is made as
a job, its denoising steps fill a progress bar as the log records them,
then the page's player holds the MP4 the job made (Chromium reads its
size and duration and plays it to its end), beside the request's timeline."""

from __future__ import annotations

from omnix.events.types import Progress

from ..conftest import real_engine_marks
from .conftest import open_page, shot

PIPELINE = "tiny-video"
pytestmark = real_engine_marks()

ANSWERED = ".turn.answer:not([data-status='running'])"


async def test_a_video_job_shows_its_steps_then_plays_in_the_player(server, browser):
    page = await open_page(browser, server.url + "/playground")
    await page.locator("#controls").wait_for(timeout=60_000)
    assert await page.get_attribute("#text", "placeholder") == "Describe the video…"
    await page.fill("#text", "a cat walks")
    await page.click("#send")
    answer = page.locator(ANSWERED).first
    await answer.wait_for(timeout=180_000)
    assert await answer.get_attribute("data-status") == "completed"
    rid = await answer.get_attribute("data-request-id")
    steps = [
        (e.step, e.total) for e in server.omni.log.events_for(rid or "") if isinstance(e, Progress)
    ]
    assert steps and steps[-1][0] == steps[-1][1]
    bar = answer.locator("progress")
    assert (await bar.get_attribute("value"), await bar.get_attribute("max")) == (
        str(steps[-1][0]),
        str(steps[-1][1]),
    )

    video = answer.locator("video")
    assert (await video.get_attribute("src") or "").startswith("blob:")
    # As a person sees it: the player has the whole file, knows its size
    # and how long it runs, and plays it to its end.
    player = await video.element_handle()
    await page.wait_for_function(
        "v => v.readyState === 4 && v.duration > 0", arg=player, timeout=30_000
    )
    shape = await video.evaluate("v => [v.videoWidth, v.videoHeight, v.duration, v.error]")
    assert shape[:2] == [32, 32] and shape[2] > 0 and shape[3] is None
    await video.evaluate("v => v.play()")
    await page.wait_for_function("v => v.ended && v.currentTime > 0", arg=player, timeout=30_000)
    await answer.locator(".figures .kpis").wait_for(timeout=30_000)
    shown = await answer.locator(".timeline ol.events li[data-type=progress]").count()
    assert shown == len(steps)
    await shot(page, "video")
    assert await page.locator("#problem").is_hidden()
    assert page.problems == []
    await page.context.close()
