"""tts: text to speech: hibari for English (the packaged af_heart voice), Kokoro-82M for Spanish
and other espeak-ng languages (`language: es`, styles jm_kumo (default) ... see
streamkit.speech.kokoro). Nothing is downloaded.

Which text is spoken: with `speak: [stage, ...]` the text frames those stages produced; by
default, text without word timings, i.e. an LLM's output rather than an ASR transcript (ASR
frames carry `words`). Streamed LLM pieces (final=False, deltas) are cut into sentences as they
arrive (the first pieces of an answer may be cut at a clause mark or a word boundary, each up to
twice as long as the one before, so speech starts sooner and the next piece is ready before the
last one has been heard) and each piece is synthesised and emitted at once, before the rest of
the text exists; the final frame of an utterance speaks whatever is left (or the whole text, if
no pieces came before it).

Output: mono AudioFrames at the session's output rate (`context.output_audio_rate`, 24 kHz by
default; hibari's 24 kHz is resampled otherwise), at most `chunk_ms` per frame, pts on a running
clock of emitted audio. On INTERRUPT the runtime cancels the synthesis in flight and interrupt()
drops buffered text, so no more audio comes out for the interrupted answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit import cores
from streamkit.frames import AudioFrame, Frame, TextFrame, TextRole
from streamkit.stage import Stage, StageConfig, register_stage


@register_stage("tts")
class TTS(Stage):
    class Config(StageConfig):
        type: Literal["tts"] = "tts"
        engine: Literal["hibari", "kokoro", "auto"] = "auto"  # auto: hibari for en, Kokoro otherwise
        language: str = "en"  # the language spoken; session param target_language overrides it
        voice: str | None = None  # hibari: af_heart; Kokoro: a packaged style (default jm_kumo)
        model: str | None = None  # another hibari- or Kokoro-compatible ONNX file
        speed: float = Field(default=1.0, ge=0.5, le=2.0)
        speak: list[str] | None = None
        chunk_ms: int = Field(default=100, ge=10, le=1000)
        seed: int | None = 0
        first_min_chars: int = Field(default=24, ge=1, le=1000)
        max_chars: int = Field(default=200, ge=20, le=2000)
        # the first piece of each answer may be cut at a word boundary past this many characters
        # (0: only at clause/sentence marks) so speech starts before the first sentence is complete
        first_max_chars: int = Field(default=24, ge=0, le=2000)
        # ONNX Runtime threads of one synthesis (1 leaves the other core to ASR and the LLM)
        threads: int = Field(default=1, ge=1, le=64)
        # an answer's first piece is what the listener waits for: it is synthesised on this many
        # threads (0: every core) and the in-process engine pauses its steps meanwhile
        # (streamkit.cores); false: the first piece is synthesised like the others
        urgent_first: bool = True
        first_threads: int = Field(default=0, ge=0, le=64)
        # so are the answer's later pieces while less of its audio is left to play (counted from
        # its first audio, played back to back) than this, or than the piece would take on
        # `threads` at the pace measured so far: the listener would hear a gap (0: only the first)
        urgent_lead_s: float = Field(default=1.0, ge=0.0, le=60.0)

    interruptible = True  # long generation per frame: cancelled at once on INTERRUPT

    def wants(self, frame: Frame) -> bool:
        if not isinstance(frame, TextFrame):
            return False
        if self.config.speak is not None:
            return frame.source in self.config.speak
        return frame.role is not TextRole.TRANSCRIPT  # speak what stages wrote, not what was heard

    async def start(self) -> None:
        from streamkit.resources import shared_async
        from streamkit.speech.synth import HIBARI_RATE, SentenceSplitter, load_hibari, packaged_voice

        c = self.config
        self.language = str(self.context.params.get("target_language") or c.language)
        engine = c.engine if c.engine != "auto" else ("hibari" if self.language == "en" else "kokoro")
        self.engine = engine
        if engine == "hibari":
            if self.language != "en":
                raise ValueError(f"hibari speaks English only, not {self.language!r}; use engine: kokoro")
            voice = packaged_voice(c.voice or "af_heart")

            def load(threads: int) -> Any:
                return shared_async(("hibari", voice, c.model, threads), lambda: load_hibari(voice, c.model, threads))

            self.native_rate = HIBARI_RATE
        else:
            from streamkit.speech.kokoro import DEFAULT_STYLE, KOKORO_RATE, KokoroVoice, espeak_language

            espeak_language(self.language)  # a clear error for a language it cannot speak
            style, lang = c.voice or DEFAULT_STYLE, self.language

            def load(threads: int) -> Any:
                return shared_async(("kokoro", style, lang, c.model, threads),
                                    lambda: KokoroVoice(style, lang, c.model, threads))

            self.native_rate = KOKORO_RATE
        self.tts = await load(c.threads)
        self.first_threads = (c.first_threads or cores.count()) if c.urgent_first else c.threads
        self.tts_first = self.tts if self.first_threads == c.threads else await load(self.first_threads)
        self.rate = int(self.context.output_audio_rate or 24000)
        self._splitters: dict[tuple[str, int | None], SentenceSplitter] = {}
        # per answer: (monotonic time of its first audio, seconds of audio emitted since)
        self._played: dict[tuple[str, int | None], tuple[float, float]] = {}
        self._slow_s_per_char = 0.0  # a piece's synthesis on `threads`, seconds a character (moving average)
        self._new_splitter = lambda: SentenceSplitter(c.max_chars, c.first_min_chars, c.first_max_chars or None)
        self._clock = 0  # output samples emitted
        self.sentences_spoken = 0

    def _urgent(self, key: tuple[str, int | None], text: str) -> bool:
        """Whether the answer's next piece is urgent: its first, or one the listener would wait
        for (see Config.urgent_lead_s)."""
        c = self.config
        if not c.urgent_first:
            return False
        if key not in self._played:
            return True
        if not c.urgent_lead_s:
            return False
        first_audio, seconds = self._played[key]
        left = first_audio + seconds - time.monotonic()
        return left < max(c.urgent_lead_s, len(text) * self._slow_s_per_char)

    def _synthesize(self, text: str, urgent: bool) -> np.ndarray:
        from streamkit.speech.synth import synthesize_sentence

        c = self.config
        tts, threads = (self.tts_first, self.first_threads) if urgent else (self.tts, c.threads)
        t0 = time.monotonic()
        with cores.hold(threads, urgent=urgent):
            if self.engine == "kokoro":  # thread-safe, deterministic: no seed
                audio = tts(text, c.speed)
            else:
                audio = synthesize_sentence(tts, text, c.speed, c.seed)
        if not urgent:
            pace = (time.monotonic() - t0) / max(1, len(text))
            self._slow_s_per_char = pace if not self._slow_s_per_char else 0.7 * self._slow_s_per_char + 0.3 * pace
        return audio

    async def _speak(self, text: str, key: tuple[str, int | None]) -> AsyncIterator[AudioFrame]:
        """One piece of the answer `key` (source, utterance)."""
        from streamkit.audio import resample_array

        text = text.strip()
        if not any(ch.isalnum() for ch in text):
            return
        audio = await asyncio.to_thread(self._synthesize, text, self._urgent(key, text))
        if self.rate != self.native_rate:
            audio = resample_array(audio, self.native_rate, self.rate)
        first_audio, seconds = self._played.get(key, (time.monotonic(), 0.0))
        self._played[key] = (first_audio, seconds + len(audio) / self.rate)
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
            async for out in self._speak(sentence, key):
                yield out
        if frame.final:
            self._played.pop(key, None)

    async def flush(self) -> AsyncIterator[Frame]:
        splitters, self._splitters = self._splitters, {}
        for key, splitter in splitters.items():
            for sentence in splitter.flush():
                async for out in self._speak(sentence, key):
                    yield out
        self._played.clear()

    async def interrupt(self) -> None:
        self._splitters.clear()
        self._played.clear()
