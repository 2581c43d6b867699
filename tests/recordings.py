"""Recorded human speech for tests: Asterisk's English telephone prompts (Debian
`asterisk-core-sounds-en-wav`, 8 kHz), with their transcripts (`asterisk-core-sounds-en`).

    from recordings import prompt_stream          # tests/ is on sys.path
    audio, texts = prompt_stream(["all-circuits-busy-now", "vm-goodbye"])   # float32 at 8 kHz
"""
from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

SOUNDS = Path("/usr/share/asterisk/sounds/en")
TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
RATE = 8000


def available() -> bool:
    return SOUNDS.is_dir() and TRANSCRIPTS.exists()


def require() -> None:
    if not available():
        pytest.skip("asterisk-core-sounds-en(-wav) is not installed (./dev test installs it)")


def transcripts() -> dict[str, str]:
    from streamkit.bench.asr_real import read_transcripts

    return read_transcripts(TRANSCRIPTS)


def load(name: str) -> np.ndarray:
    with wave.open(str(SOUNDS / f"{name}.wav")) as w:
        assert w.getframerate() == RATE and w.getsampwidth() == 2 and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0


def prompt_stream(names: list[str], gap_s: float = 1.0, lead_s: float = 0.5) -> tuple[np.ndarray, list[str]]:
    """The prompts one after another with `gap_s` of silence between them, and their texts."""
    texts = transcripts()
    parts = [np.zeros(int(lead_s * RATE), np.float32)]
    for name in names:
        parts += [load(name), np.zeros(int(gap_s * RATE), np.float32)]
    return np.concatenate(parts), [texts[n] for n in names]
