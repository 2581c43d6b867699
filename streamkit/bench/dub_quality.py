"""Quality of dubbed output for `streamkit bench dubbing`: the translation's chrF against reference
translations, and the dubbed speech's intelligibility (transcribed back by multilingual Whisper
base, character error rate against the text that was spoken)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

REFERENCES = Path(__file__).resolve().parents[2] / "tests" / "data" / "translate_en_es.tsv"


def load_references(path: Path = REFERENCES) -> dict[str, str]:
    """English -> reference Spanish from `bench translate`'s TSV; empty when it is absent."""
    if not path.exists():
        return {}
    pairs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or "\t" not in line:
            continue
        en, es = line.split("\t", 1)
        pairs[en.strip()] = es.strip()
    return pairs


def chrf(hypotheses: list[str], references: list[str], n: int = 6, beta: float = 2.0) -> float:
    """Corpus chrF (character n-grams up to 6, beta 2, spaces removed, as sacrebleu's default), 0-100."""
    precision, recall = [], []
    for order in range(1, n + 1):
        match = hyp_total = ref_total = 0
        for hyp, ref in zip(hypotheses, references):
            h, r = hyp.replace(" ", ""), ref.replace(" ", "")
            hg = Counter(h[i:i + order] for i in range(len(h) - order + 1))
            rg = Counter(r[i:i + order] for i in range(len(r) - order + 1))
            match += sum((hg & rg).values())
            hyp_total += sum(hg.values())
            ref_total += sum(rg.values())
        if hyp_total and ref_total:
            precision.append(match / hyp_total)
            recall.append(match / ref_total)
    if not precision:
        return 0.0
    p, r = sum(precision) / len(precision), sum(recall) / len(recall)
    return 0.0 if p + r == 0 else 100 * (1 + beta ** 2) * p * r / (beta ** 2 * p + r)


def intelligibility(utterance_audio: list[np.ndarray], spoken: list[str], rate: int, language: str) -> dict:
    """Transcribe the dubbed audio with Whisper base; CER against the text that was spoken.

    The CER is of the whole stream (every utterance's audio in order against every spoken text in
    order): where synthesis falls behind, an utterance's audio arrives after the next one's text
    and a split by arrival time would count one utterance's words as missing and the next one's as
    extra. How late the audio comes is the latency's measure, not this one. `dubbed_heard` is what
    Whisper heard per utterance (by arrival time), for the log."""
    from streamkit.audio import resample_array
    from streamkit.speech.cer import cer
    from streamkit.speech.whisper import get_whisper

    model = get_whisper("base")

    def hear(audio: np.ndarray) -> str:
        segments, _ = model.transcribe(resample_array(audio, rate, 16000), language=language, beam_size=5)
        return " ".join(s.text.strip() for s in segments)

    pairs = [(audio, text) for audio, text in zip(utterance_audio, spoken) if text.strip() and len(audio)]
    if not pairs:
        return {"dubbed_cer": None, "dubbed_heard": []}
    heard = [hear(audio) for audio, _ in pairs]
    whole = hear(np.concatenate([audio for audio, _ in pairs]))
    return {"dubbed_cer": round(cer(" ".join(text for _, text in pairs), whole, language), 4), "dubbed_heard": heard}


def spanish_prompts(count: int, gap_s: float, min_words: int = 4):
    """Real Spanish input: Debian's es_MX Asterisk prompts (8 kHz) at 16 kHz, `gap_s` apart.
    Returns (audio, spans as (start, voiced_end, end), transcripts)."""
    from streamkit.audio import resample_array
    from streamkit.bench.asr_real import prompts, read_wav
    from streamkit.speech.corpus import voiced_span

    found = prompts(count, min_words, Path("/usr/share/asterisk/sounds/es_MX"),
                    Path("/usr/share/doc/asterisk-core-sounds-es/core-sounds-es.txt.gz"),
                    "bench dubbing --spanish needs Debian's asterisk-core-sounds-es and -es-wav")
    parts = [np.zeros(8000, np.float32)]
    spans, t = [], 0.5
    for wav, _ in found:
        audio, rate = read_wav(wav)
        audio = resample_array(audio, rate, 16000)
        v0, v1 = voiced_span(audio, 16000)
        spans.append((t + v0, t + v1, t + len(audio) / 16000))
        parts += [audio, np.zeros(int(gap_s * 16000), np.float32)]
        t += len(audio) / 16000 + gap_s
    return np.concatenate(parts).astype(np.float32), spans, [text for _, text in found]
