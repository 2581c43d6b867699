"""The fixed English sentences of tests/data/sentences.txt as hibari speech, for the speech
benchmarks (cached on disk: synthesis is deterministic with a fixed seed)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SENTENCES = REPO / "tests" / "data" / "sentences.txt"
CACHE = Path(os.environ.get("STREAMKIT_SPEECH_CACHE", Path(tempfile.gettempdir()) / "streamkit-speech-cache"))


def sentences(path: Path = SENTENCES) -> list[str]:
    return [s.strip() for s in path.read_text().splitlines() if s.strip()]


def synthesize(text: str, rate: int = 16000) -> np.ndarray:
    key = hashlib.sha1(f"{text}|{rate}|heart|0".encode()).hexdigest()[:16]
    path = CACHE / f"{key}.npy"
    if path.exists():
        return np.load(path)
    from streamkit.audio import resample_array
    from streamkit.speech.synth import get_hibari, synthesize_sentence

    audio = resample_array(synthesize_sentence(get_hibari("heart"), text, seed=0), 24000, rate)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, audio)
    os.replace(tmp, path)
    return audio


def voiced_span(audio: np.ndarray, rate: int = 16000) -> tuple[float, float]:
    """Start and end (s) of the voiced part: 10 ms frames above -35 dB of the loudest frame."""
    hop = rate // 100
    n = len(audio) // hop
    if n == 0:
        return 0.0, len(audio) / rate
    rms = np.sqrt((audio[: n * hop].reshape(n, hop) ** 2).mean(axis=1) + 1e-12)
    on = np.nonzero(rms > rms.max() * 10 ** (-35 / 20))[0]
    return float(on[0] * hop / rate), float((on[-1] + 1) * hop / rate)


def speech_stream(texts: list[str], rate: int = 16000, gap_s: float = 1.0, lead_s: float = 0.5):
    """(audio, spans): the sentences separated by silence; spans are (start, voiced_end, end) in s."""
    parts = [np.zeros(int(lead_s * rate), np.float32)]
    spans = []
    t = lead_s
    for text in texts:
        a = synthesize(text, rate)
        v0, v1 = voiced_span(a, rate)
        spans.append((t + v0, t + v1, t + len(a) / rate))
        parts += [a, np.zeros(int(gap_s * rate), np.float32)]
        t += len(a) / rate + gap_s
    return np.concatenate(parts).astype(np.float32), spans
