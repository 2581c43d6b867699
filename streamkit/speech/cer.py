"""Character error rate for any language: lowercase, accents folded, punctuation dropped, digits
spelled as they are written (the same normalisation on both sides)."""

from __future__ import annotations

import re
import unicodedata

from streamkit.speech.wer import edit_distance


def normalize_chars(text: str) -> str:
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = re.sub(r"[^\w ]+", " ", text).replace("_", " ")
    return " ".join(text.split())


def cer(reference: str, hypothesis: str) -> float:
    ref, hyp = normalize_chars(reference), normalize_chars(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(list(ref), list(hyp)) / len(ref)
