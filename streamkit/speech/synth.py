"""hibari text-to-speech: the shared model, and the sentence splitter for streamed text.

hibari ships its default voice ("heart", Kokoro's af_heart) inside the package: nothing is
downloaded. Other voice names would make hibari download a file, so only packaged voices are
accepted (see `packaged_voice`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import numpy as np

HIBARI_RATE = 24000
_ALIASES = {"af_heart": "heart"}
_lock = threading.Lock()


def packaged_voice(voice: str) -> str:
    """Map a voice name (hibari's or Kokoro's, e.g. af_heart) to a hibari voice available
    without a download: the packaged "heart", or another voice already in hibari's cache."""
    import os

    from hibari.voices import VOICES, cache_dir

    name = _ALIASES.get(voice, voice)
    if name not in VOICES:
        name = {v.get("kokoro"): k for k, v in VOICES.items()}.get(voice, name)
    if name not in VOICES:
        raise ValueError(f"unknown hibari voice {voice!r}; the packaged voice is heart (af_heart)")
    if name != "heart" and not os.path.exists(os.path.join(cache_dir(), VOICES[name]["file"])):
        raise ValueError(f"hibari voice {voice!r} is not packaged or cached, and nothing is downloaded; use heart")
    return name


def load_hibari(voice: str = "heart", model: str | None = None, threads: int = 1) -> Any:
    from hibari import Hibari

    return Hibari(voice=packaged_voice(voice), model=model, threads=threads)


def get_hibari(voice: str = "heart", model: str | None = None) -> Any:
    from streamkit.resources import shared

    return shared(("hibari", packaged_voice(voice), model), lambda: load_hibari(voice, model))


def synthesize_sentence(tts: Any, text: str, speed: float = 1.0, seed: int | None = 0) -> np.ndarray:
    """One sentence (or clause) -> float32 24 kHz audio. hibari's G2P is not thread-safe, so
    calls are serialised."""
    with _lock:
        return np.asarray(tts(text, speed=speed, seed=seed), dtype=np.float32)


# --------------------------------------------------------------- streaming sentence split
_END = re.compile(r"[.!?…。！？]+[\"'”’)\]]*(?=\s)|\n+")
_CLAUSE = re.compile(r"[,;:—]+(?=\s)")
_TITLES = {"mr", "mrs", "ms", "dr", "st", "prof", "sr", "jr", "vs", "etc", "e.g", "i.e", "sra"}


class SentenceSplitter:
    """Cuts streamed text into speakable pieces as soon as each is complete.

    feed(piece) returns the sentences completed so far; flush() returns the rest. A sentence ends
    at . ! ? (followed by whitespace, not after a title or a single initial) or a newline; a
    piece longer than `max_chars` is cut at a clause mark or a space so speech starts early even
    when the text has no full stops. The first piece may be cut at a clause mark once it has
    `first_min_chars`, or at a word boundary once it passes `first_max_chars`: that gets the
    first audio out sooner, at the cost of a prosody break inside the first sentence. Each later
    piece may be cut the same way at twice the limits of the one before (until they pass
    `max_chars`), so it takes about twice as long to hear as the piece before and can be
    synthesised while that one plays: after a one-word first piece, the rest of a sentence
    in one piece left a listener 1.5-1.9 s of silence (bench dubbing, Kokoro)."""

    def __init__(self, max_chars: int = 220, first_min_chars: int = 40, first_max_chars: int | None = None) -> None:
        self.buffer = ""
        self.max_chars = max_chars
        self.first_min_chars = first_min_chars
        self.first_max_chars = first_max_chars
        self._emitted = 0

    def feed(self, piece: str) -> list[str]:
        self.buffer += piece
        out: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                break
            sentence, self.buffer = self.buffer[:cut].strip(), self.buffer[cut:].lstrip()
            if sentence:
                out.append(sentence)
                self._emitted += 1
        return out

    def _find_cut(self) -> int | None:
        for m in _END.finditer(self.buffer):
            before = self.buffer[: m.start()].rsplit(None, 1)
            word = before[-1].lower().strip("(\"'") if before else ""
            if m.group().startswith(".") and (word in _TITLES or (len(word) == 1 and word.isalpha())):
                continue
            return m.end()
        grow = 1 << min(self._emitted, 16)  # the early pieces' limits double from piece to piece
        min_chars = self.first_min_chars * grow
        if min_chars < self.max_chars and len(self.buffer) >= min_chars:
            for m in _CLAUSE.finditer(self.buffer):
                if m.start() >= min_chars // 2:
                    return m.end()
        max_chars = self.first_max_chars * grow if self.first_max_chars else 0
        if 0 < max_chars < self.max_chars and len(self.buffer) > max_chars:
            # no clause mark yet: cut at a word boundary so speech can start (or go on)
            space = self.buffer.rfind(" ", 0, max_chars + 1)
            if space > max_chars // 3:
                return space
        if len(self.buffer) > self.max_chars:
            window = self.buffer[: self.max_chars]
            marks = list(_CLAUSE.finditer(window))
            if marks:
                return marks[-1].end()
            space = window.rfind(" ")
            return space if space > 0 else self.max_chars
        return None

    def flush(self) -> list[str]:
        rest, self.buffer = self.buffer.strip(), ""
        self._emitted = 0
        return [rest] if rest else []

    def reset(self) -> None:
        self.buffer = ""
        self._emitted = 0
