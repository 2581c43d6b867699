"""Character error rate for any language: lowercase, accents folded, punctuation dropped, and for
English and Spanish the numbers zero to twelve written as digits (Whisper writes "press 1" as
often as "press one"), the same normalisation on both sides."""

from __future__ import annotations

import re
import unicodedata

from streamkit.speech.wer import NUMBERS as _ENGLISH
from streamkit.speech.wer import edit_distance

_SPANISH = ("cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve", "diez", "once", "doce")
_NUMBERS = {"en": dict(_ENGLISH), "es": {w: str(i) for i, w in enumerate(_SPANISH)} | {"una": "1", "un": "1"}}


def normalize_chars(text: str, language: str | None = None) -> str:
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = re.sub(r"[^\w ]+", " ", text).replace("_", " ")
    numbers = _NUMBERS.get(language or "", {})
    return " ".join(numbers.get(w, w) for w in text.split())


def cer(reference: str, hypothesis: str, language: str | None = None) -> float:
    """Character edits over reference characters; `language` (en, es) writes small numbers as digits."""
    ref, hyp = normalize_chars(reference, language), normalize_chars(hypothesis, language)
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(list(ref), list(hyp)) / len(ref)
