"""The playground when things go wrong, in Chromium, on scripted pipelines:
a server started with ``--api-key`` has the page ask for the key, say so
in words when the key is wrong, and work once the right one is given (over
the realtime WebSocket too, whose key goes as a subprotocol); a server that
goes away in the middle of an answer (``kill -9``) is said to be gone, and once it is
back a reload recovers (while it is down, a reload gets the browser's own
error page: no page of ours is there to speak)."""

from __future__ import annotations

import pytest

from omnix.http.options import HttpOptions
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.served import omnix_serve
from omnix.testing.serving import serve_scripted

from ..conftest import OMNI
from .conftest import open_page, shot

pytestmark = pytest.mark.asyncio(loop_scope="session")

KEY = "sk-playground"
ANSWERED = ".turn.answer:not([data-status='running'])"

# A text answer of ~3 s: long enough to stop the server in its middle.
SLOW_TEXT = """
name = "pg-text"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 150, delay_ms = 20 }
[outputs]
text = "thinker"
"""


async def test_a_wrong_key_is_said_and_the_right_one_works(browser):
    async with serve_scripted(parse_pipeline(OMNI), HttpOptions(api_key=KEY)) as server:
        page = await open_page(browser, server.url + "/playground")
        problem = page.locator("#problem")
        await page.locator("#key-input").wait_for()
        assert "needs an API key" in await problem.inner_text()

        await page.fill("#key-input", "sk-wrong")
        async with page.expect_navigation():
            await page.press("#key-input", "Enter")
        await page.locator("#key-input").wait_for()
        assert "API key was refused" in await problem.inner_text()
        await shot(page, "wrong-key")

        await page.fill("#key-input", KEY)
        async with page.expect_navigation():
            await page.press("#key-input", "Enter")
        await page.locator("#controls").wait_for()
        assert "http-omni" in await page.locator("#model").inner_text()
        await page.fill("#text", "hello")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=30_000)
        assert (await answer.locator(".text").inner_text()).strip()
        await answer.locator(".figures .kpis").wait_for(timeout=10_000)
        assert await problem.is_hidden()
        await page.context.close()


async def test_a_server_gone_mid_answer_is_said_and_a_reload_recovers(browser, tmp_path):
    pipeline = tmp_path / "pg-text.toml"
    pipeline.write_text(SLOW_TEXT)
    async with omnix_serve("--pipeline", str(pipeline)) as served:
        page = await open_page(browser, served.url + "/playground")
        await page.locator("#controls").wait_for(timeout=30_000)
        await page.fill("#text", "tell me a long story")
        await page.click("#send")
        answer = page.locator(".turn.answer").first
        await answer.locator(".timeline .lanes .lane").first.wait_for(timeout=10_000)
        await served.kill9()

        problem = page.locator("#problem")
        await problem.wait_for(timeout=10_000)
        assert "server went away" in await problem.inner_text()
        assert await answer.get_attribute("data-status") == "failed"
        await shot(page, "server-gone")
        port = served.url.rsplit(":", 1)[1]

    async with omnix_serve("--pipeline", str(pipeline), "--port", port):
        await page.reload()
        await page.locator("#controls").wait_for(timeout=30_000)
        assert await page.locator("#problem").is_hidden()
        await page.fill("#text", "again")
        await page.click("#send")
        answer = page.locator(ANSWERED).first
        await answer.wait_for(timeout=30_000)
        assert await answer.get_attribute("data-status") == "completed"
        await page.context.close()
