"""Streaming voice activity detection with the Silero VAD model that faster-whisper ships.

`SileroStream` runs the ONNX model on 512-sample windows at 16 kHz, carrying the LSTM state and
the 64-sample context from window to window (this gives exactly the probabilities faster-whisper's
batch `get_speech_timestamps` computes). `Segmenter` turns probabilities into speech segments with
hysteresis (start at >= threshold, stay in speech while >= neg_threshold), a minimum speech
duration before speech_start is confirmed, a minimum silence before speech_end, and padding on
both sides.

A segment ends only after `min_silence` of consecutive windows below neg_threshold. Silero's
batch code resets its silence timer only at >= threshold, so soft speech between the two
thresholds (a speaker trailing off) counted as silence: the segment ended while words were
still being said, and a final decoded at speech_pause (the ASR's speculative final) lost them.
Here any window at or above neg_threshold is speech: it emits `resume` and restarts the timer,
so the audio after a `pause` that is followed by `end` without `resume` is all below
neg_threshold, and a decode of the segment up to the pause holds every word.

Events a segmenter returns, in stream order, as (kind, payload) tuples:
    ("start", {"start": s})            speech confirmed; `start` includes the leading pad
    ("audio", (sample_index, ndarray)) 16 kHz samples that belong to the current segment
    ("pause", {"at": s})               probability fell below neg_threshold (speech may be over)
    ("resume", {"at": s})              probability back at or above neg_threshold before min_silence
    ("end", {"start": s, "end": s})    min_silence of silence: the segment is over (end includes pad)
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

WINDOW = 512
CONTEXT = 64
RATE = 16000
STATS = {"vad_s": 0.0}


def _vad_model() -> Any:
    from faster_whisper.vad import get_vad_model

    return get_vad_model()


def get_vad_model() -> Any:
    from streamkit.resources import shared

    return shared(("silero-vad", "faster-whisper"), _vad_model)


class SileroStream:
    """Per-stream state over a shared Silero ONNX session."""

    def __init__(self, model: Any | None = None) -> None:
        self.model = model or get_vad_model()
        self.reset()

    def reset(self) -> None:
        self._h = np.zeros((1, 1, 128), np.float32)
        self._c = np.zeros((1, 1, 128), np.float32)
        self._ctx = np.zeros((1, CONTEXT), np.float32)

    def __call__(self, window: np.ndarray) -> float:
        w = np.asarray(window, np.float32).reshape(1, WINDOW)
        x = np.concatenate([self._ctx, w], axis=1)
        p, self._h, self._c = self.model.session.run(None, {"input": x, "h": self._h, "c": self._c})
        self._ctx = w[:, -CONTEXT:]
        return float(np.asarray(p).ravel()[0])


class Segmenter:
    def __init__(
        self,
        threshold: float = 0.5,
        neg_threshold: float | None = None,
        min_speech_ms: int = 96,
        min_silence_ms: int = 300,
        speech_pad_ms: int = 160,
        max_speech_s: float = 60.0,
        model: Any | None = None,
        lead_pad_ms: int | None = None,
    ) -> None:
        self.vad = SileroStream(model)
        self.threshold = threshold
        self.neg_threshold = neg_threshold if neg_threshold is not None else max(threshold - 0.15, 0.01)
        self.min_speech = int(min_speech_ms * RATE / 1000)
        self.min_silence = int(min_silence_ms * RATE / 1000)
        self.pad = int(speech_pad_ms * RATE / 1000)
        # audio kept before speech is confirmed: Silero scores a soft onset ("p" and "s" of
        # "Password" on a telephone line) low for a few hundred ms, and Whisper needs it
        self.lead = self.pad if lead_pad_ms is None else int(lead_pad_ms * RATE / 1000)
        self.max_speech = int(max_speech_s * RATE)
        self._pending = np.zeros(0, np.float32)
        self.samples = 0  # samples consumed (window-aligned)
        self._pre: deque[np.ndarray] = deque()  # recent non-speech windows, for the leading pad
        self._pre_len = 0
        self.state = "silence"  # silence | candidate | speech
        self._seg_start = 0
        self._trigger = 0
        self._candidate: list[np.ndarray] = []
        self._silence_at: int | None = None
        self._tail: deque[tuple[int, np.ndarray]] = deque()  # (position, window): the segment's last `lead` samples
        self._tail_len = 0
        self.probabilities: list[float] = []  # kept short; for debugging
        self.busy_s = 0.0

    @property
    def in_speech(self) -> bool:
        return self.state == "speech"

    def process(self, samples: np.ndarray) -> list[tuple[str, Any]]:
        import time

        t0 = time.perf_counter()
        data = np.concatenate([self._pending, np.asarray(samples, np.float32)])
        n = len(data) // WINDOW * WINDOW
        self._pending = data[n:]
        events: list[tuple[str, Any]] = []
        for i in range(0, n, WINDOW):
            self._window(data[i:i + WINDOW], events)
        dt = time.perf_counter() - t0
        self.busy_s += dt
        STATS["vad_s"] += dt
        return events

    def _window(self, w: np.ndarray, events: list[tuple[str, Any]]) -> None:
        p = self.vad(w)
        self.probabilities.append(p)
        del self.probabilities[:-64]
        pos = self.samples
        self.samples += WINDOW
        if self.state == "silence":
            if p >= self.threshold:
                self.state = "candidate"
                self._seg_start = max(0, pos - self._pre_len)
                self._trigger = pos
                self._candidate = list(self._pre) + [w]
                self._silence_at = None
                self._pre.clear()
                self._pre_len = 0
                self._maybe_confirm(p, events)
            else:
                self._pre.append(w)
                self._pre_len += WINDOW
                while self._pre and self._pre_len - len(self._pre[0]) >= self.lead:
                    self._pre_len -= len(self._pre.popleft())
            return
        if self.state == "candidate":
            self._candidate.append(w)
            if p < self.neg_threshold:
                self._silence_at = self._silence_at if self._silence_at is not None else pos
                if self.samples - self._silence_at >= self.min_silence:
                    self._back_to_silence()
                return
            self._silence_at = None
            self._maybe_confirm(p, events)
            return
        # speech
        events.append(("audio", (pos, w)))
        self._keep_tail(pos, w)
        if p >= self.neg_threshold:
            if self._silence_at is not None:
                events.append(("resume", {"at": self.samples / RATE}))
                self._silence_at = None
        elif self._silence_at is None:
            self._silence_at = pos
            events.append(("pause", {"at": pos / RATE}))
        if self._silence_at is not None and self.samples - self._silence_at >= self.min_silence:
            self._end(events, self._silence_at)
        elif self.samples - self._seg_start >= self.max_speech:
            self._end(events, self.samples)

    def _keep_tail(self, pos: int, w: np.ndarray) -> None:
        self._tail.append((pos, w))
        self._tail_len += len(w)
        while self._tail and self._tail_len - len(self._tail[0][1]) >= self.lead:
            self._tail_len -= len(self._tail.popleft()[1])

    def _maybe_confirm(self, p: float, events: list[tuple[str, Any]]) -> None:
        if self.samples - self._trigger >= self.min_speech and p >= self.neg_threshold:
            self.state = "speech"
            events.append(("start", {"start": self._seg_start / RATE}))
            audio = np.concatenate(self._candidate)
            events.append(("audio", (self.samples - len(audio), audio)))
            self._candidate = []

    def _back_to_silence(self) -> None:
        self.state = "silence"
        keep = np.concatenate(self._candidate)[-self.lead:] if self.lead else np.zeros(0, np.float32)
        self._pre = deque([keep]) if len(keep) else deque()
        self._pre_len = len(keep)
        self._candidate = []
        self._silence_at = None

    def _end(self, events: list[tuple[str, Any]], silence_at: int) -> None:
        end = min(self.samples, silence_at + self.pad)
        events.append(("end", {"start": self._seg_start / RATE, "end": end / RATE}))
        self.state = "silence"
        self._silence_at = None
        # the quiet end of the segment (below neg_threshold, at most `lead`) is also the next
        # segment's leading pad, so a word that starts right after an end keeps its onset
        self._pre = deque(w for at, w in self._tail if at >= silence_at)
        self._pre_len = sum(len(w) for w in self._pre)
        self._tail, self._tail_len = deque(), 0

    def flush(self) -> list[tuple[str, Any]]:
        """End of stream: close an open segment."""
        events: list[tuple[str, Any]] = []
        if self.state == "speech":
            if len(self._pending):
                events.append(("audio", (self.samples, self._pending)))
                self.samples += len(self._pending)
            self._pending = np.zeros(0, np.float32)
            self._end(events, self._silence_at if self._silence_at is not None else self.samples)
        elif self.state == "candidate":
            self._back_to_silence()
        return events
