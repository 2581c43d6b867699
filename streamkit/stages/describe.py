"""describe: one sentence about the last seconds of detections, from the shared decode engine."""

from __future__ import annotations

import collections
from contextlib import aclosing
from typing import Any, AsyncIterator, Literal

from pydantic import Field

from streamkit.frames import EventFrame, Frame, TextFrame
from streamkit.stage import Stage, StageConfig, register_stage
from streamkit.stages.engine_client import make_engine
from streamkit.video.describe_text import (
    DEFAULT_PROMPT,
    DEFAULT_SYSTEM,
    first_sentence,
    summarize,
)


@register_stage("describe")
class Describe(Stage):
    """Turns the last `window_s` seconds of detections into one short sentence with the
    shared LLM engine, at most once per `interval_s` of stream time. Streams TextFrames
    (final=False pieces as tokens arrive, then one final=True sentence)."""

    class Config(StageConfig):
        type: Literal["describe"] = "describe"
        interval_s: float = Field(default=5.0, gt=0)
        window_s: float = Field(default=5.0, gt=0)
        max_tokens: int = Field(default=32, ge=1, le=512)
        temperature: float = Field(default=0.0, ge=0, le=2)
        prompt: str = DEFAULT_PROMPT
        system: str = DEFAULT_SYSTEM
        model: str | None = None  # GGUF path; default: the shared engine's model
        device: str | None = None
        engine: str = "local"  # local | redis://host:port/db (engine workers), as for the llm stage
        engine_prefix: str | None = None
        stream: bool = True
        skip_unchanged: bool = True  # no new sentence while the summary stays the same

    interruptible = True  # long generation per frame: cancelled at once on INTERRUPT

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, EventFrame) and frame.name in ("detections", "scene_change")

    async def start(self) -> None:
        from streamkit.engine import SamplingParams

        c = self.config
        self._engine = make_engine(c.engine, c.model, c.device, c.engine_prefix)
        self._params = SamplingParams(max_tokens=self.config.max_tokens, temperature=self.config.temperature,
                                      stop=["\n"])
        self._window: collections.deque[dict[str, Any]] = collections.deque()
        self._cuts: collections.deque[float] = collections.deque()
        self._last_time: float | None = None
        self._last_summary: str | None = None
        self.sentences: list[str] = []

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, EventFrame)
        pts = float(frame.data.get("pts", frame.pts))
        if frame.name == "scene_change":
            self._cuts.append(pts)
            return
        self._window.append(frame.data)
        horizon = pts - self.config.window_s
        while self._window and self._window[0]["pts"] < horizon:
            self._window.popleft()
        while self._cuts and self._cuts[0] < horizon:
            self._cuts.popleft()
        if self._last_time is not None and pts - self._last_time < self.config.interval_s:
            return
        if self._last_time is None and pts - self._window[0]["pts"] < min(self.config.interval_s, self.config.window_s) - 1e-6:
            return  # the first sentence waits for a full window
        async for out in self._describe(pts):
            yield out

    async def _describe(self, pts: float) -> AsyncIterator[Frame]:
        events = list(self._window)
        if not events:
            return
        self._last_time = pts
        summary = summarize(events, len(self._cuts))
        if self.config.skip_unchanged and summary == self._last_summary:
            return
        self._last_summary = summary
        start = events[0]["pts"]
        messages = [
            {"role": "system", "content": self.config.system},
            {"role": "user", "content": self.config.prompt.format(summary=summary, window=self.config.window_s)},
        ]
        pieces: list[str] = []
        # aclosing: an interrupt closes the stream at once, which frees the engine's sequence
        async with aclosing(self._engine.generate(messages, self._params)) as stream:
            async for piece in stream:
                pieces.append(piece)
                if self.config.stream and piece:
                    yield TextFrame(piece, final=False, start=start, end=pts, pts=pts)
        sentence = first_sentence("".join(pieces)) or summary
        self.sentences.append(sentence)
        yield TextFrame(sentence, final=True, start=start, end=pts, pts=pts)

    async def flush(self) -> AsyncIterator[Frame]:
        # the tail is described too, but never sooner than interval_s after the last sentence
        if self._window and (self._last_time is None
                             or self._window[-1]["pts"] - self._last_time >= self.config.interval_s):
            async for out in self._describe(self._window[-1]["pts"]):
                yield out
