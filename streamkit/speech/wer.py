"""Word error rate with a Whisper-like English normalisation (case, punctuation, numbers as digits)."""

from __future__ import annotations

import re

NUMBERS = {  # English number words as Whisper's normaliser writes them
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
}
_CONTRACTIONS = {"o'clock": "oclock", "i'm": "i am", "it's": "it is", "don't": "do not",
                 "can't": "cannot", "won't": "will not", "we're": "we are", "you're": "you are"}


def normalize(text: str) -> list[str]:
    """Lowercase, drop punctuation, spell small numbers as digits, split into words."""
    text = text.lower().replace("’", "'")
    for k, v in _CONTRACTIONS.items():
        text = re.sub(rf"\b{re.escape(k)}\b", v, text)
    text = re.sub(r"(\d),(\d)", r"\1\2", text)
    text = re.sub(r"[^a-z0-9' ]+", " ", text).replace("'", "")
    return [NUMBERS.get(w, w) for w in text.split()]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def wer(reference: str | list[str], hypothesis: str | list[str]) -> float:
    """Word error rate of one hypothesis (or the concatenation of a list of texts)."""
    ref = normalize(" ".join(reference) if isinstance(reference, list) else reference)
    hyp = normalize(" ".join(hypothesis) if isinstance(hypothesis, list) else hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(ref, hyp) / len(ref)


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    """Total edits over total reference words, pairing references and hypotheses in order."""
    edits = words = 0
    for r, h in zip(references, hypotheses):
        rw, hw = normalize(r), normalize(h)
        edits += edit_distance(rw, hw)
        words += len(rw)
    for r in references[len(hypotheses):]:
        n = len(normalize(r))
        edits += n
        words += n
    return edits / max(1, words)
