"""LocalAgreement-2 over a growing window, as whisper_streaming does it.

Each decode of the window gives a hypothesis: words with absolute times. Words already
committed are removed from it (by time, then by matching the last committed n-gram, so a word
that straddles a window cut is neither repeated nor lost); the longest common prefix of this
hypothesis and the previous one is committed. Committed words never change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass
class TimedWord:
    text: str  # as Whisper writes it, with its leading space
    start: float
    end: float
    probability: float = 1.0

    @property
    def key(self) -> str:
        return re.sub(r"[^\w']+", "", self.text.lower())


def join_words(words: list[TimedWord]) -> str:
    return "".join(w.text for w in words).strip()


class HypothesisBuffer:
    def __init__(self) -> None:
        self.committed: list[TimedWord] = []
        self.pending: list[TimedWord] = []  # the previous hypothesis, minus what got committed

    @property
    def last_committed_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    def _fresh(self, words: list[TimedWord]) -> list[TimedWord]:
        """The part of a hypothesis that lies after what is committed."""
        if not self.committed:
            return list(words)
        last = self.last_committed_end
        new = [w for w in words if w.start > last - 0.1]
        if new and abs(new[0].start - last) < 1.0:
            # the decode may have re-transcribed the last committed words: drop the longest
            # n-gram (n <= 5) at the start of `new` that equals the committed tail
            tail = [w.key for w in self.committed]
            for n in range(min(5, len(tail), len(new)), 0, -1):
                if [w.key for w in new[:n]] == tail[-n:]:
                    new = new[n:]
                    break
        return new

    def insert(self, words: list[TimedWord]) -> list[TimedWord]:
        """Add a hypothesis; returns the words newly committed (agreed with the previous one)."""
        new = self._fresh(words)
        agreed: list[TimedWord] = []
        for a, b in zip(self.pending, new):
            if a.key != b.key or not a.key:
                break
            agreed.append(b)
        self.committed.extend(agreed)
        self.pending = new[len(agreed):]
        return agreed

    def finish(self, words: list[TimedWord]) -> list[TimedWord]:
        """The last hypothesis of an utterance: everything after the committed words is final."""
        new = self._fresh(words)
        self.committed.extend(new)
        self.pending = []
        return new

    def force_commit(self, before: float) -> list[TimedWord]:
        """Commit pending words ending before `before` (a window must be trimmed and nothing agrees)."""
        take = [w for w in self.pending if w.end <= before]
        self.committed.extend(take)
        self.pending = self.pending[len(take):]
        return take
