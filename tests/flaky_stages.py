"""A stage for the takeover test, imported by workers with --plugin: how many partial outputs it
emits per input is random (like ASR partials that depend on decode timing), while each final
depends only on the inputs."""

from __future__ import annotations

import asyncio
import random
from typing import AsyncIterator, Literal

from streamkit.frames import EventFrame, Frame, TextFrame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("test_flaky_partials")
class FlakyPartials(Stage):
    class Config(StageConfig):
        type: Literal["test_flaky_partials"] = "test_flaky_partials"

    accepts = (TextFrame, EventFrame)
    stateful = True

    async def start(self) -> None:
        self.words: list[str] = []
        self.utterance = 0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        await asyncio.sleep(0.003)
        if isinstance(frame, TextFrame):
            self.words.append(frame.text)
            for _ in range(random.randint(0, 2)):
                yield TextFrame(" ".join(self.words), final=False, utterance=self.utterance)
            return
        if frame.name == "end_utterance":
            yield TextFrame(" ".join(self.words), final=True, utterance=self.utterance)
            self.words, self.utterance = [], self.utterance + 1
            self.checkpoint()

    def snapshot(self) -> dict:
        return {"utterance": self.utterance}

    def restore(self, snapshot: dict) -> None:
        self.utterance = snapshot["utterance"]
