"""tts: text to speech with hibari (the packaged af_heart voice; nothing is downloaded).

Which text is spoken: with `speak: [stage, ...]` the text frames those stages produced; by
default, text without word timings, i.e. an LLM's output rather than an ASR transcript (ASR
frames carry `words`). Streamed LLM pieces (final=False, deltas) are cut into sentences as they
arrive (the first may be cut at a clause mark, so speech starts sooner) and each sentence is
synthesised and emitted at once, before the rest of the text exists; the final frame of an
utterance speaks whatever is left (or the whole text, if no pieces came before it).

Output: mono AudioFrames at the session's output rate (`context.output_audio_rate`, 24 kHz by
default; hibari's 24 kHz is resampled otherwise), at most `chunk_ms` per frame, pts on a running
clock of emitted audio. On INTERRUPT the runtime cancels the synthesis in flight and interrupt()
drops buffered text, so no more audio comes out for the interrupted answer.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit.frames import AudioFrame, Frame, TextFrame
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("tts")
class TTS(Stage):
    class Config(StageConfig):
        type: Literal["tts"] = "tts"
        engine: Literal["hibari"] = "hibari"
        voice: str = "af_heart"
        model: str | None = None  # another hibari-compatible ONNX file
        speed: float = Field(default=1.0, ge=0.5, le=2.0)
        speak: list[str] | None = None
        chunk_ms: int = Field(default=100, ge=10, le=1000)
        seed: int | None = 0
        first_min_chars: int = Field(default=24, ge=1, le=1000)
        max_chars: int = Field(default=200, ge=20, le=2000)
        # the first piece of each answer may be cut at a word boundary past this many characters
        # (0: only at clause/sentence marks) so speech starts before the first sentence is complete
        first_max_chars: int = Field(default=24, ge=0, le=2000)

    interruptible = True  # long generation per frame: cancelled at once on INTERRUPT

    def wants(self, frame: Frame) -> bool:
        if not isinstance(frame, TextFrame):
            return False
        if self.config.speak is not None:
            return frame.source in self.config.speak
        return not frame.words

    async def start(self) -> None:
        from streamkit.resources import shared_async
        from streamkit.speech.synth import SentenceSplitter, load_hibari, packaged_voice

        c = self.config
        voice = packaged_voice(c.voice)
        self.tts = await shared_async(("hibari", voice, c.model), lambda: load_hibari(voice, c.model))
        self.rate = int(self.context.output_audio_rate or 24000)
        self._splitters: dict[tuple[str, int | None], SentenceSplitter] = {}
        self._new_splitter = lambda: SentenceSplitter(c.max_chars, c.first_min_chars, c.first_max_chars or None)
        self._clock = 0  # output samples emitted
        self.sentences_spoken = 0

    async def _speak(self, text: str) -> AsyncIterator[AudioFrame]:
        from streamkit.audio import resample_array
        from streamkit.speech.synth import HIBARI_RATE, synthesize_sentence

        text = text.strip()
        if not any(ch.isalnum() for ch in text):
            return
        audio = await asyncio.to_thread(synthesize_sentence, self.tts, text, self.config.speed, self.config.seed)
        if self.rate != HIBARI_RATE:
            audio = resample_array(audio, HIBARI_RATE, self.rate)
        self.sentences_spoken += 1
        step = max(1, self.rate * self.config.chunk_ms // 1000)
        for i in range(0, len(audio), step):
            piece = np.ascontiguousarray(audio[i:i + step], dtype=np.float32)
            yield AudioFrame(piece, self.rate, pts=self._clock / self.rate)
            self._clock += len(piece)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, TextFrame)
        key = (frame.source, frame.utterance)
        if not frame.final:
            splitter = self._splitters.setdefault(key, self._new_splitter())
            sentences = splitter.feed(frame.text)
        else:
            splitter = self._splitters.pop(key, None)
            if splitter is None:  # nothing streamed before: speak the whole text
                splitter = self._new_splitter()
                sentences = splitter.feed(frame.text) + splitter.flush()
            else:
                sentences = splitter.flush()
        for sentence in sentences:
            async for out in self._speak(sentence):
                yield out

    async def flush(self) -> AsyncIterator[Frame]:
        splitters, self._splitters = self._splitters, {}
        for splitter in splitters.values():
            for sentence in splitter.flush():
                async for out in self._speak(sentence):
                    yield out

    async def interrupt(self) -> None:
        self._splitters.clear()
