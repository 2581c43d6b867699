"""streamkit bench asr --real: recorded human speech (Debian's Asterisk en_US prompts, 8 kHz
telephone audio with transcripts) streamed at each file's own rate and real-time pace through the
websocket server (vad + asr, the transcribe pipeline's stages), one session per file.

Peer, same run: faster-whisper's offline `transcribe` (its defaults: beam 5, 30 s windows) on the
same files resampled to 16 kHz by the same resampler, with the same model. Both sides are scored
with the same normalisation (streamkit.speech.wer: case, punctuation, small numbers as digits).
Latency: from the end of the file's voiced audio (as sent) to the arrival of its last final.
"""

from __future__ import annotations

import asyncio
import gzip
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

SOUNDS = Path("/usr/share/asterisk/sounds/en_US")
TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")
PIPELINE = """name: real
input: {{audio: {{sample_rate: 16000}}}}
stages:
  - {{name: vad, type: vad, min_silence_ms: {silence}, speech_pad_ms: 160}}
  - {{name: asr, type: asr, model: {model}, language: en, cpu_threads: {threads}, final_beam_size: {beam},
      final_full_context: {full}, encoder: {encoder}}}
output: [asr]
"""


def read_transcripts(path: Path = TRANSCRIPTS) -> dict[str, str]:
    """Prompt name -> its words, from an asterisk-core-sounds-<lang> transcript file (comments
    and bracketed descriptions of tones skipped); names in subfolders keep their folder."""
    out = {}
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            name, sep, text = line.partition(":")
            text = text.strip()
            if sep and not line.startswith(";") and not text.startswith("["):
                out[name.strip()] = text
    return out


def prompts(limit: int, min_words: int = 4, sounds: Path = SOUNDS, transcripts: Path = TRANSCRIPTS,
            missing: str = "bench asr --real needs Debian's asterisk-core-sounds-en and asterisk-core-sounds-en-wav",
            ) -> list[tuple[Path, str]]:
    """(wav, transcript) for top-level Asterisk prompts (of the language whose `sounds` and
    `transcripts` are given) with at least `min_words` words, by name; tones are skipped."""
    if not transcripts.exists() or not sounds.exists():
        raise SystemExit(missing)
    found = []
    for name, text in read_transcripts(transcripts).items():
        wav = sounds / f"{name}.wav"
        if "/" not in name and wav.exists() and len(text.split()) >= min_words:
            found.append((wav, text))
    if not found:  # the transcripts without the -wav package: its prompts are other encodings
        raise SystemExit(f"{missing} (no .wav prompts in {sounds})")
    found.sort(key=lambda p: p[0].name)
    return found[:limit]


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        return pcm.astype(np.float32) / 32768, w.getframerate()


FINAL_CONTEXT = {"auto": "null", "full": "true", "short": "false"}


async def run(files: int, model: str, threads: int, silence_ms: int, peer: bool, final_beam: int = 5,
              final_context: str = "auto", encoder: str = "auto") -> dict:
    from streamkit.audio import resample_array
    from streamkit.bench._speech import log, percentile
    from streamkit.client import StreamClient
    from streamkit.server.testing import running_server
    from streamkit.speech import corpus, whisper
    from streamkit.speech.wer import wer

    items = prompts(files)
    whisper.get_whisper(None if model == "tiny.en" else model, threads, "int8")
    refs, hyps, latencies, audio_s = [], [], [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = PIPELINE.format(silence=silence_ms, model=model, threads=threads, beam=final_beam,
                                   full=FINAL_CONTEXT[final_context], encoder=encoder)
        Path(tmp, "real.yaml").write_text(pipeline)  # noqa: ASYNC240 (before the server starts)
        async with running_server(tmp) as server:
            for wav, text in items:
                audio, rate = read_wav(wav)
                voiced_end = corpus.voiced_span(audio, rate)[1]
                audio = np.concatenate([audio, np.zeros(rate, np.float32)])  # a second of line silence
                audio_s += len(audio) / rate
                async with StreamClient(server.url) as c:
                    await c.start("real", sample_rate=rate)
                    result = await c.stream_audio(audio, speed=1.0, chunk_s=0.02)
                finals = [e for e in result.events if e.get("type") == "transcript" and e.get("final")]
                refs.append(text)
                hyps.append(result.transcript)
                if finals and finals[-1].get("t") is not None:
                    latencies.append((finals[-1]["t"] - voiced_end) * 1000)
                if wer(text, result.transcript) > 0:
                    log(f"  {wav.name}\n    ref: {text}\n    hyp: {result.transcript}")
    torch_encoder = whisper.get_encoder(None if model == "tiny.en" else model, encoder) is not None
    out = {
        "real_encoder": "torch-bf16" if torch_encoder else "ctranslate2",
        "real_final_context": final_context if final_context != "auto" else ("full" if torch_encoder else "short"),
        "real_files": len(items), "real_audio_s": round(audio_s, 1),
        "real_wer": round(wer(" ".join(refs), " ".join(hyps)), 4),
        "real_final_latency_ms_p50": round(percentile(latencies, 50), 1),
        "real_final_latency_ms_p95": round(percentile(latencies, 95), 1),
    }
    if peer:
        m = whisper.get_whisper(None if model == "tiny.en" else model, threads, "int8")
        peer_hyps = []
        t0 = time.perf_counter()
        for wav, _ in items:
            audio, rate = read_wav(wav)
            segments, _ = m.transcribe(resample_array(audio, rate, 16000), language="en")
            peer_hyps.append(" ".join(s.text.strip() for s in segments))
        out["real_peer_wer"] = round(wer(" ".join(refs), " ".join(peer_hyps)), 4)
        out["real_peer_rtf"] = round((time.perf_counter() - t0) / audio_s, 4)
    return out


def main_real(files: int, model: str, threads: int, silence_ms: int, peer: bool, final_beam: int = 5,
              final_context: str = "auto", encoder: str = "auto") -> dict:
    return asyncio.run(run(files, model, threads, silence_ms, peer, final_beam, final_context, encoder))
