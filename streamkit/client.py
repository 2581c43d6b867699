"""A Python client for the websocket protocol, and `streamkit client PIPELINE FILE`.

    async with StreamClient("ws://127.0.0.1:8765/ws") as c:
        ready = await c.start("transcribe", sample_rate=16000)
        result = await c.stream_file("speech.wav", speed=1.0)   # real-time pace, then stop
        print(result.transcript)

`stream_file` sends the file at real-time pace (speed 1.0; 0 = as fast as the server takes it),
sends stop, and collects every event until the server's end and close.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import numpy as np
import websockets
from websockets.exceptions import ConnectionClosed

from streamkit.frames import float_to_s16le

KIND_AUDIO = b"\x01"
KIND_VIDEO = b"\x02"


@dataclass
class Result:
    ready: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # JSON events with "t" (recv time, s from start)
    audio: bytearray = field(default_factory=bytearray)  # s16le at ready.output_audio.sample_rate
    audio_chunks: int = 0
    first_audio_s: float | None = None  # first input sent -> first output audio received
    first_output_s: float | None = None  # first input sent -> first transcript/text/audio/detections
    audio_sent_s: float = 0.0
    messages_sent: int = 0
    close_code: int | None = None
    close_reason: str = ""
    ended: bool = False
    cut_short: bool = False  # the server closed or stopped reading before all input was sent (it shut down)

    @property
    def closed_normally(self) -> bool:
        """The session ended with the server's end event or a clean close (1000, or 1001 when the
        server shuts down after flushing), and no error event but the notice that a shutting-down
        server ignores further input."""
        return ((self.ended or self.close_code in (1000, 1001))
                and all(e.get("code") == "stopping" for e in self.errors))

    @property
    def transcript(self) -> str:
        return " ".join(e["text"].strip() for e in self.events
                        if e.get("type") == "transcript" and e.get("final") and e.get("text", "").strip())

    def texts(self, stage: str | None = None) -> str:
        return "".join(e["text"] for e in self.events
                       if e.get("type") == "text" and (stage is None or e.get("stage") == stage))

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == "error"]

    def last_metrics(self) -> dict[str, Any] | None:
        found = [e for e in self.events if e.get("type") == "metrics"]
        return found[-1] if found else None

    @property
    def output_rate(self) -> int:
        return int(((self.ready or {}).get("output_audio") or {}).get("sample_rate", 24000))


class StartRefused(RuntimeError):
    """The server answered start with an error (`event`, e.g. code too_many_sessions) or closed."""

    def __init__(self, pipeline: str, event: dict[str, Any] | None, close_code: int | None) -> None:
        self.pipeline, self.event, self.close_code = pipeline, event, close_code
        self.code = str(event.get("code")) if event else None
        super().__init__(f"server did not start {pipeline!r}: {event if event else f'no ready (closed {close_code})'}")


class StreamClient:
    def __init__(self, url: str = "ws://127.0.0.1:8765/ws", token: str | None = None,
                 origin: str | None = None, max_size: int | None = 16 << 20, **connect_kwargs: Any) -> None:
        if token:
            url += ("&" if "?" in url else "?") + f"token={token}"
        self.url = url
        self.origin = origin
        self.connect_kwargs = dict(connect_kwargs, max_size=max_size)
        self.ws = None
        self.result = Result()
        self._t0: float | None = None
        self._first_sent: float | None = None
        self._receiver: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._on_event: Callable[[dict[str, Any]], None] | None = None
        self.sample_rate = 16000
        self.channels = 1

    async def connect(self) -> "StreamClient":
        kw = dict(self.connect_kwargs)
        if self.origin:
            kw["origin"] = self.origin
        self.ws = await websockets.connect(self.url, compression=None, **kw)
        self._t0 = time.monotonic()
        return self

    async def __aenter__(self) -> "StreamClient":
        return await self.connect()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._receiver is not None:
            await asyncio.gather(self._receiver, return_exceptions=True)

    # ---------------------------------------------------------------- sending
    async def send_json(self, obj: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(obj))

    async def start(self, pipeline: str, params: dict[str, Any] | None = None, sample_rate: int = 16000,
                    channels: int = 1, on_event: Callable[[dict[str, Any]], None] | None = None,
                    timeout: float = 120.0) -> dict[str, Any]:
        """Send start and wait for ready (raises RuntimeError with the server's error otherwise)."""
        self.sample_rate, self.channels = sample_rate, channels
        self._on_event = on_event
        await self.send_json({"type": "start", "pipeline": pipeline, "params": params or {},
                              "audio": {"sample_rate": sample_rate, "format": "s16le", "channels": channels}})
        self._receiver = asyncio.create_task(self._receive())
        waiter = asyncio.create_task(self._ready.wait())
        await asyncio.wait({waiter, self._receiver}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.result.ready is None:
            errors = self.result.errors
            raise StartRefused(pipeline, errors[-1] if errors else None, self.result.close_code)
        return self.result.ready

    def _mark_sent(self) -> None:
        self.result.messages_sent += 1
        if self._first_sent is None:
            self._first_sent = time.monotonic()

    async def send_audio(self, audio: np.ndarray | bytes) -> None:
        if isinstance(audio, np.ndarray):
            self.result.audio_sent_s += audio.shape[0] / self.sample_rate
            audio = float_to_s16le(audio)
        else:
            self.result.audio_sent_s += len(audio) / (2 * self.channels * self.sample_rate)
        self._mark_sent()
        await self.ws.send(KIND_AUDIO + audio)

    async def send_jpeg(self, jpeg: bytes) -> None:
        self._mark_sent()
        await self.ws.send(KIND_VIDEO + jpeg)

    async def stop(self) -> None:
        await self.send_json({"type": "stop"})

    # ---------------------------------------------------------------- receiving
    def _elapsed_since_first(self, now: float) -> float | None:
        return None if self._first_sent is None else now - self._first_sent

    async def _receive(self) -> None:
        r = self.result
        try:
            async for message in self.ws:
                now = time.monotonic()
                if isinstance(message, bytes):
                    if message[:1] == KIND_AUDIO:
                        r.audio += message[1:]
                        r.audio_chunks += 1
                        if r.first_audio_s is None:
                            r.first_audio_s = self._elapsed_since_first(now)
                        if r.first_output_s is None:
                            r.first_output_s = self._elapsed_since_first(now)
                        if self._on_event:
                            self._on_event({"type": "audio", "bytes": len(message) - 1})
                    continue
                try:
                    event = json.loads(message)
                except ValueError:
                    continue
                event["t"] = round(now - (self._t0 or now), 3)
                r.events.append(event)
                kind = event.get("type")
                if kind == "ready":
                    r.ready = event
                    self._ready.set()
                elif kind in ("transcript", "text", "detections") and r.first_output_s is None:
                    r.first_output_s = self._elapsed_since_first(now)
                elif kind == "end":
                    r.ended = True
                elif kind == "error" and event.get("code") == "stopping":
                    r.cut_short = True  # the server is shutting down and ignores the rest of the input
                if self._on_event:
                    self._on_event(event)
        except ConnectionClosed:
            pass
        finally:
            if self.ws is not None:
                r.close_code = self.ws.close_code
                r.close_reason = self.ws.close_reason or ""

    async def wait_closed(self, timeout: float = 120.0) -> Result:
        if self._receiver is not None:
            await asyncio.wait_for(asyncio.shield(self._receiver), timeout)
        return self.result

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """JSON events as they arrive (polling the collected list)."""
        seen = 0
        while True:
            while seen < len(self.result.events):
                seen += 1
                yield self.result.events[seen - 1]
            if self._receiver is None or self._receiver.done():
                return
            await asyncio.sleep(0.01)

    # ---------------------------------------------------------------- whole files
    async def stream_audio(self, samples: np.ndarray, speed: float = 1.0, chunk_s: float = 0.1,
                           timeout: float = 300.0) -> Result:
        """Stream an array at the declared rate, paced, then stop and wait for the end."""
        async def send() -> None:
            chunk = max(1, int(self.sample_rate * chunk_s))
            started = time.monotonic()
            for i in range(0, samples.shape[0], chunk):
                piece = samples[i:i + chunk]
                await self.send_audio(piece)
                if speed > 0:
                    due = started + (i + piece.shape[0]) / self.sample_rate / speed
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)

        return await self._send_then_stop(send(), timeout)

    async def _send_then_stop(self, sending: Any, timeout: float) -> Result:
        """Run the sending coroutine, send stop, wait for the end. A server that closes first (it
        is shutting down: it has flushed the session and said end) is no error: what it sent is
        kept and `cut_short` says the input was not all sent."""
        try:
            await sending
            await self.stop()
        except ConnectionClosed:
            self.result.cut_short = True
        return await self.wait_closed(timeout)

    async def stream_file(self, path: str, speed: float = 1.0, chunk_s: float = 0.1,
                          timeout: float = 300.0) -> Result:
        from streamkit.media import iter_audio, paced

        async def send() -> None:
            frames = iter_audio(path, self.sample_rate, self.channels, chunk_s=chunk_s)
            async for frame in paced(frames, speed) if speed > 0 else _aiter(frames):
                await self.send_audio(frame.samples)

        return await self._send_then_stop(send(), timeout)

    async def stream_video_file(self, path: str, speed: float = 1.0, quality: int = 80,
                                timeout: float = 300.0) -> Result:
        import cv2

        from streamkit.media import iter_video, paced

        async def send() -> None:
            frames = iter_video(path)
            async for frame in paced(frames, speed) if speed > 0 else _aiter(frames):
                ok, jpeg = cv2.imencode(".jpg", frame.image, [cv2.IMWRITE_JPEG_QUALITY, quality])
                if ok:
                    await self.send_jpeg(jpeg.tobytes())

        return await self._send_then_stop(send(), timeout)


async def _aiter(items):
    for item in items:
        yield item


# ---------------------------------------------------------------------- CLI

def _printer(as_json: bool):
    audio_bytes = [0]

    def show(event: dict[str, Any]) -> None:
        kind = event.get("type")
        if as_json:
            if kind == "audio":
                audio_bytes[0] += event["bytes"]
            print(json.dumps(event), flush=True)
            return
        if kind == "transcript":
            mark = "final" if event.get("final") else "partial"
            print(f"[{mark} {event.get('start', 0):7.2f}-{event.get('end', 0):7.2f}] {event.get('text', '')}", flush=True)
        elif kind == "text":
            print(f"[{event.get('stage')}{'' if event.get('final') else '…'}] {event.get('text', '')}", flush=True)
        elif kind == "audio":
            audio_bytes[0] += event["bytes"]
        elif kind == "detections":
            labels = ", ".join(o.get("label", "?") for o in event.get("objects", []))
            print(f"[detections {event.get('pts', 0):7.2f}] {labels or '-'}", flush=True)
        elif kind in ("ready", "end", "error"):
            print(json.dumps(event), flush=True)
        elif kind == "event":
            print(f"[event {event.get('name')}] {json.dumps(event.get('data'))}", flush=True)
    return show


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="streamkit client", description="Stream a file to a streamkit server and print the events")
    p.add_argument("pipeline")
    p.add_argument("file")
    p.add_argument("--url", default="ws://127.0.0.1:8765/ws")
    p.add_argument("--token", default=None, help="shared token (default: $STREAMKIT_TOKEN)")
    p.add_argument("--speed", type=float, default=1.0, help="1.0 real time, 2.0 twice as fast, 0 as fast as possible")
    p.add_argument("--rate", type=int, default=16000, help="sample rate to declare and send")
    p.add_argument("--video", action="store_true", help="send the file's video as JPEG frames instead of audio")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.add_argument("--save-audio", default=None, metavar="WAV", help="write the returned audio to WAV")
    args = p.parse_args(argv)
    import os

    token = args.token or os.environ.get("STREAMKIT_TOKEN")

    async def run() -> Result:
        async with StreamClient(args.url, token=token) as client:
            await client.start(args.pipeline, sample_rate=args.rate, on_event=_printer(args.json))
            if args.video:
                return await client.stream_video_file(args.file, args.speed)
            return await client.stream_file(args.file, args.speed)

    try:
        result = asyncio.run(run())
    except (OSError, RuntimeError, websockets.InvalidHandshake, ConnectionClosed) as exc:
        print(f"streamkit client: {exc}", file=sys.stderr)
        return 1
    if args.save_audio and result.audio:
        from streamkit.media import write_wav

        pcm = np.frombuffer(bytes(result.audio), "<i2").astype(np.float32) / 32768.0
        write_wav(args.save_audio, pcm, result.output_rate)
    summary = {"type": "summary", "transcript": result.transcript, "audio_s": round(len(result.audio) / 2 / result.output_rate, 3),
               "first_audio_s": result.first_audio_s, "first_output_s": result.first_output_s,
               "errors": len(result.errors), "close_code": result.close_code, "ended": result.ended,
               "cut_short": result.cut_short}
    print(json.dumps(summary) if args.json else f"done: {json.dumps(summary)}", flush=True)
    if result.cut_short:
        print("streamkit client: the server closed the session before the whole file was sent "
              f"({result.close_code} {result.close_reason or ''})".rstrip(), file=sys.stderr)
    return 0 if result.closed_normally else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
