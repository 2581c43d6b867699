"""Decode a file or URL with PyAV in a background thread, with an explicit drop policy.

    source = VideoSource("clip.mp4", drop="none")       # files: every frame, decoder waits
    source = VideoSource("rtsp://cam/1", drop="latest") # live: the consumer gets the newest frame
    source.start()
    while (frame := source.get()) is not None: ...      # or `await source.aget()`
    source.stats() -> {"decoded": n, "delivered": n, "dropped": n, "policy": ...}
    source.close()

Decoding runs in its own thread with FFmpeg's frame/slice threads (thread_type AUTO), and
PyAV releases the GIL while it decodes and converts to BGR, so the detectors and the event
loop run alongside it. With policy `none` the BGR conversion runs on two more threads, in
order: converting on the decoding thread capped it at ~305 fps of 720p on 2 cores (decoding
alone runs at ~540), with the conversions beside it at ~440. pts are the stream's own
timestamps in seconds, counted from the first frame's pts; `index` is the decode order (so a
gap in index marks dropped frames).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlparse

from streamkit.frames import VideoFrame

DropPolicy = Literal["none", "latest"]


def is_live_source(url: str) -> bool:
    """Network streams and devices are live; local files (and file: URLs) are not."""
    parsed = urlparse(str(url))
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # "C:\..." on Windows
        return False
    return parsed.scheme not in ("file",)


def resolve_policy(policy: str, url: str | None = None, live: bool | None = None) -> DropPolicy:
    if policy in ("none", "latest"):
        return policy  # type: ignore[return-value]
    if policy != "auto":
        raise ValueError(f"drop policy must be auto, none or latest, got {policy!r}")
    if live is None:
        live = bool(url) and is_live_source(url)
    return "latest" if live else "none"


@dataclass
class _Queued:
    """A decoded frame on its way to the consumer: its BGR image, or the conversion making it."""

    pts: float
    index: int
    nbytes: int
    image: Any = None
    pending: Future | None = None

    def frame(self) -> VideoFrame:
        return VideoFrame(self.image if self.pending is None else self.pending.result(), pts=self.pts,
                          index=self.index)


def _to_bgr(av_frame: Any) -> Any:
    return av_frame.to_ndarray(format="bgr24")


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class VideoSource:
    def __init__(
        self,
        url: str,
        drop: str = "auto",
        threads: bool = True,
        buffer_mb: float = 160.0,
        realtime: bool = False,
        options: dict[str, str] | None = None,
    ) -> None:
        self.url = str(url)
        self.policy = resolve_policy(drop, self.url)
        self.threads = threads
        # policy none: how far decoding may run ahead of the consumer, in bytes of decoded frames
        # (58 frames of 720p BGR, 6 of 4K); at least one frame is always let through. A deep
        # buffer lets the decoder keep both cores busy while a detector works through a burst
        # (a whole-frame face search is ~30 ms): 8 frames measured ratio 0.64-0.77, 64 frames
        # 0.70-0.78 in `streamkit bench video` on 2 cores
        self.buffer_bytes = max(0, int(buffer_mb * 2**20))
        self._held_bytes = 0
        self.realtime = realtime  # pace a file at its frame rate (simulates a live camera)
        self.options = dict(options or {})
        self.decoded = 0
        self.delivered = 0
        self.dropped = 0
        self.fps: float | None = None
        self.width: int | None = None
        self.height: int | None = None
        self.error: BaseException | None = None
        self._items: collections.deque[_Queued] = collections.deque()
        self._cond = threading.Condition()
        self._done = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._opened = threading.Event()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None  # an aget() waiting

    # ------------------------------------------------------------ producer
    def start(self) -> "VideoSource":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"video-capture:{self.url}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        import av

        try:
            if not is_live_source(self.url) and not os.path.exists(self.url) and not self.url.startswith("file:"):
                raise FileNotFoundError(f"video source not found: {self.url}")
            container = av.open(self.url, mode="r", options=self.options, timeout=10.0)
        except Exception as exc:  # noqa: BLE001 - reported to the consumer
            self._finish(ValueError(f"cannot open video source {self.url}: {exc}"))
            return
        converter: ThreadPoolExecutor | None = None
        try:
            stream = next((s for s in container.streams if s.type == "video"), None)
            if stream is None:
                raise ValueError(f"{self.url} has no video stream")
            if self.threads:
                stream.thread_type = "AUTO"
            rate = stream.average_rate or stream.guessed_rate
            self.fps = float(rate) if rate else None
            self.width, self.height = stream.codec_context.width, stream.codec_context.height
            self._opened.set()
            if self.policy == "none":
                converter = ThreadPoolExecutor(max(1, min(2, os.cpu_count() or 1)), thread_name_prefix="video-bgr")
            first_pts: float | None = None
            started = time.monotonic()
            for index, av_frame in enumerate(container.decode(stream)):
                if self._closed:
                    break
                if av_frame.pts is not None and av_frame.time_base is not None:
                    pts = float(av_frame.pts * av_frame.time_base)
                else:
                    pts = index / (self.fps or 30.0)
                if first_pts is None:
                    first_pts = pts
                pts -= first_pts
                if self.realtime:
                    delay = started + pts - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                nbytes = av_frame.width * av_frame.height * 3
                if converter is None:
                    self._put(_Queued(pts, index, nbytes, image=_to_bgr(av_frame)))
                else:
                    self._put(_Queued(pts, index, nbytes, pending=converter.submit(_to_bgr, av_frame)))
        except Exception as exc:  # noqa: BLE001
            self._finish(ValueError(f"cannot decode video of {self.url}: {exc}"))
            return
        finally:
            container.close()
            if converter is not None:  # queued conversions finish; the consumer may still want them
                converter.shutdown(wait=False, cancel_futures=self._closed)
        self._finish(None)

    def _put(self, item: _Queued) -> None:
        with self._cond:
            self.decoded += 1
            if self.policy == "latest":
                while self._items:  # latest frame wins: what the consumer did not take is dropped
                    self._held_bytes -= self._items.popleft().nbytes
                    self.dropped += 1
            else:
                self._cond.wait_for(lambda: not self._items or self._held_bytes + item.nbytes <= self.buffer_bytes
                                    or self._closed)
                if self._closed:
                    return
            self._items.append(item)
            self._held_bytes += item.nbytes
            self._cond.notify_all()
            self._wake()

    def _finish(self, error: BaseException | None) -> None:
        with self._cond:
            self.error = error
            self._done = True
            self._opened.set()
            self._cond.notify_all()
            self._wake()

    def _wake(self) -> None:
        """Under the lock: resolve a waiting aget()'s future on its event loop."""
        if self._waiter is not None:
            loop, fut = self._waiter
            self._waiter = None
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed
                pass

    # ------------------------------------------------------------ consumer
    def _take(self) -> _Queued:
        """Under the lock: the oldest frame, and room for the decoder."""
        item = self._items.popleft()
        self._held_bytes -= item.nbytes
        self.delivered += 1
        self._cond.notify_all()
        return item

    def _converted(self, item: _Queued) -> VideoFrame:
        try:
            return item.frame()
        except Exception as exc:  # noqa: BLE001 - a conversion that failed is the source's error
            raise ValueError(f"cannot decode video of {self.url}: {exc}") from exc

    def get(self, timeout: float | None = None) -> VideoFrame | None:
        """The next frame; None at the end of the source. Raises the decode error, if any."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._done, timeout):
                raise TimeoutError(f"no frame from {self.url} within {timeout}s")
            item = self._take() if self._items else None
            if item is None and self.error is not None:
                raise self.error
        return None if item is None else self._converted(item)

    async def aget(self) -> VideoFrame | None:
        """get() without blocking the event loop: the decode thread wakes the waiting
        coroutine through the loop (no thread hop per frame)."""
        while True:
            with self._cond:
                item = self._take() if self._items else None
                if item is None:
                    if self._done:
                        if self.error is not None:
                            raise self.error
                        return None
                    loop = asyncio.get_running_loop()
                    fut = loop.create_future()
                    self._waiter = (loop, fut)
            if item is not None:
                if item.pending is not None and not item.pending.done():
                    await asyncio.wait([asyncio.wrap_future(item.pending)])  # its error is raised below
                return self._converted(item)
            try:
                await fut
            finally:
                with self._cond:
                    if self._waiter is not None and self._waiter[1] is fut:
                        self._waiter = None

    def stats(self) -> dict:
        return {"url": self.url, "policy": self.policy, "decoded": self.decoded,
                "delivered": self.delivered, "dropped": self.dropped}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __iter__(self):
        self.start()
        try:
            while (frame := self.get()) is not None:
                yield frame
        finally:
            self.close()
