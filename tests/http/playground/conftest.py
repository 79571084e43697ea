"""A person's browser for the playground tests: Debian's Chromium, headless,
driven by Playwright (``executable_path``: no browser is downloaded), one
per test session, with a fake microphone that says one recorded sentence
(the server VAD tests' espeak-ng fixture) twice, two seconds apart, once:
the second time over the answer to the first.

Also where the tests keep their screenshots: ``$OMNIX_TEST_ARTIFACTS``, else
``build/test-artifacts`` at the project's root (``shot``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf

ROOT = Path(__file__).resolve().parents[3]
SPEECH = ROOT / "tests" / "http" / "realtime" / "fixtures" / "speech_24k.wav"


def chromium() -> str | None:
    """The system's Chromium (``scripts/test-deps.sh`` installs Debian's)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def artifacts() -> Path:
    out = Path(os.environ.get("OMNIX_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
    out = out / "playground"
    out.mkdir(parents=True, exist_ok=True)
    return out


async def shot(page: Any, name: str) -> Path:
    """A screenshot of the whole page, kept as a test artifact."""
    path = artifacts() / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture(scope="session")
def turn_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake microphone's input: half a second of silence, the sentence,
    two seconds of silence (the server's VAD ends the turn after half a
    second and the answer starts; tiny-omni's takes three to five seconds
    here), the sentence again (a barge-in), then four seconds of silence
    for the second turn to end."""
    pcm, rate = sf.read(SPEECH, dtype="int16")

    def quiet(seconds: float) -> np.ndarray:
        return np.zeros(int(rate * seconds), dtype="int16")

    path = tmp_path_factory.mktemp("mic") / "turn.wav"
    sf.write(path, np.concatenate([quiet(0.5), pcm, quiet(2.0), pcm, quiet(4.0)]), rate)
    return path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(turn_wav: Path) -> AsyncIterator[Any]:
    exe = chromium()
    if exe is None:
        pytest.skip(
            "no chromium: scripts/test-deps.sh installs Debian's (apt-get install chromium)"
        )
    playwright = pytest.importorskip("playwright.async_api", reason="pip install playwright")
    async with playwright.async_playwright() as p:
        # No --use-fake-ui-for-media-stream: the microphone is granted per
        # context (a context without the grant is a person who said no).
        b = await p.chromium.launch(
            executable_path=exe,
            args=[
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={turn_wav}%noloop",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        try:
            yield b
        finally:
            await b.close()


async def open_page(browser: Any, url: str, *, microphone: bool = False) -> Any:
    """A fresh context's page (its own session storage) at ``url``; the
    page's console errors and uncaught exceptions are kept on
    ``page.problems``."""
    ctx = await browser.new_context(
        permissions=["microphone"] if microphone else [],
        viewport={"width": 1280, "height": 900},
        accept_downloads=True,
    )
    page = await ctx.new_page()
    page.problems = []
    page.on("pageerror", lambda e: page.problems.append(str(e)))
    await page.goto(url)
    return page
