"""The web page in a real headless Chromium: fake microphone fed with hibari speech.

Needs Debian's chromium (/usr/bin/chromium) and the Playwright Python package; marked `browser`.
The dubbing test takes a screenshot of the page in use; with STREAMKIT_SCREENSHOT=docs/screenshot.png
it refreshes the README's picture, otherwise it goes to the test's tmp_path.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
CHROMIUM = os.environ.get("STREAMKIT_CHROMIUM", "/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium is not installed"),
]


def chromium_args(wav: Path) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            "--autoplay-policy=no-user-gesture-required",
            f"--use-file-for-fake-audio-capture={wav}"]


def _need(path: str) -> None:
    if not (ROOT / "pipelines" / f"{path}.yaml").exists():
        pytest.skip(f"pipelines/{path}.yaml has not landed yet")


@pytest.fixture(scope="module")
def speech_wav_48k(tmp_path_factory):
    from speech import sentences, speech_wav

    return speech_wav(tmp_path_factory.mktemp("wav"), sentences()[:2], rate=48000, gap_s=1.2)


async def _wait_for(page, js: str, timeout_s: float) -> None:
    """Poll with page.evaluate (CDP, not subject to the page's CSP, unlike wait_for_function)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await page.evaluate(js):
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(js)


async def _run_page(server, wav: Path, pipeline: str, until_js: str, timeout_s: float, shot: Path | None = None,
                    source: str = "mic"):
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=chromium_args(wav))
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            await page.goto(f"http://127.0.0.1:{server.port}/?pipeline={pipeline}&source={source}")
            await _wait_for(page, "document.querySelectorAll('#pipeline option').length > 0", 10)
            await page.click("#start")
            try:
                await _wait_for(page, until_js, timeout_s)
            except Exception:
                log = await page.inner_text("#log")
                raise AssertionError(f"page never got there; log:\n{log}\nconsole: {console}") from None
            if shot is not None:
                await page.wait_for_timeout(1500)
                await page.screenshot(path=str(shot), full_page=True)
            state = await page.evaluate(
                "({transcripts: window.streamkit.transcripts.map(t => t.text), audio: window.streamkit.audioBytes,"
                " errors: window.streamkit.errors, text: document.querySelector('#texts').innerText,"
                " detections: window.streamkit.detections})")
            await page.click("#stop")
            await _wait_for(page, "document.querySelector('#status').textContent.startsWith('ended')", 60)
            return state
        finally:
            await browser.close()


async def test_transcript_appears(speech_wav_48k):
    _need("transcribe")
    from streamkit.server.testing import running_server

    async with running_server(ROOT / "pipelines") as server:
        state = await _run_page(
            server, speech_wav_48k, "transcribe",
            "document.querySelectorAll('#transcript p.final').length >= 1", timeout_s=90)
    words = " ".join(state["transcripts"]).lower()
    assert "fox" in words or "quick" in words or "window" in words, state
    assert not state["errors"], state


async def test_dubbing_audio_arrives(speech_wav_48k, tmp_path):
    _need("dubbing")
    from streamkit.server.testing import running_server

    shot = Path(os.environ.get("STREAMKIT_SCREENSHOT") or tmp_path / "screenshot.png").resolve()
    shot.parent.mkdir(exist_ok=True)
    async with running_server(ROOT / "pipelines") as server:
        state = await _run_page(
            server, speech_wav_48k, "dubbing",
            "window.streamkit.audioBytes > 48000 && window.streamkit.transcripts.length >= 1", timeout_s=180,
            shot=shot)
    assert state["audio"] > 48000  # more than a second of 24 kHz speech came back
    assert state["transcripts"], state
    assert shot.exists() and shot.stat().st_size > 10_000


async def test_camera_boxes_drawn(speech_wav_48k):
    """Chromium's fake camera (a moving test pattern) -> JPEG frames -> detections drawn."""
    _need("video_analysis")
    from streamkit.server.testing import running_server

    async with running_server(ROOT / "pipelines") as server:
        state = await _run_page(server, speech_wav_48k, "video_analysis", "window.streamkit.detections >= 3",
                                timeout_s=60, source="camera")
    assert state["detections"] >= 3
    assert not state["errors"], state
