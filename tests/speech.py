"""Speech test helpers: hibari-made English speech, cached on disk so tests synthesize once.

    from speech import synthesize, speech_wav, speech_audio, sentences   # tests/ is on sys.path
    audio = synthesize("Hello there.", rate=16000)        # float32 mono
    path = speech_wav(tmp_path, sentences()[:3])         # WAV with 0.8 s of silence between them

The cache (STREAMKIT_SPEECH_CACHE, default $TMPDIR/streamkit-speech-cache) is shared with the
speech benchmarks (streamkit.speech.corpus).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from streamkit.speech import corpus

DATA = Path(__file__).parent / "data"


def sentences() -> list[str]:
    return corpus.sentences(DATA / "sentences.txt")


def synthesize(text: str, rate: int = 16000) -> np.ndarray:
    """hibari speech of `text` (voice heart / af_heart, fixed seed) at `rate`."""
    return corpus.synthesize(text, rate)


def speech_audio(sentences_: list[str], rate: int = 16000, gap_s: float = 0.8, lead_s: float = 0.5):
    """(audio, spans): the sentences separated by `gap_s` of silence; spans are
    (start_s, voiced_end_s, end_s) per sentence."""
    return corpus.speech_stream(sentences_, rate, gap_s, lead_s)


def speech_wav(tmp_path: Path, sentences_: list[str], rate: int = 16000, gap_s: float = 0.8) -> Path:
    """Write a WAV of the sentences separated by silence into tmp_path; returns its path."""
    from streamkit.media import write_wav

    audio, _ = speech_audio(sentences_, rate, gap_s)
    key = hashlib.sha1(("|".join(sentences_) + f"|{rate}|{gap_s}").encode()).hexdigest()[:10]
    path = Path(tmp_path) / f"speech-{key}.wav"
    write_wav(path, audio, rate)
    return path
