"""streamkit bench dubbing: English hibari speech through vad -> asr -> llm (translate) -> tts at
real-time pace; latency from the end of each utterance's voiced audio to the first byte of its
dubbed audio (p50/p95), plus the ASR final and the first translated piece on the way, and the
silences inside each utterance's dubbed speech (its audio played back to back as it arrives)."""

from __future__ import annotations

import argparse
import asyncio
from itertools import pairwise

import numpy as np

from streamkit.bench import print_result
from streamkit.shipped import shipped_dir


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="streamkit bench dubbing", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    ap.add_argument("--sentences", type=int, default=8, help="how many of the fixed sentences")
    ap.add_argument("--gap", type=float, default=2.5, help="silence between sentences (s)")
    ap.add_argument("--pipeline", default=None, help="default: dubbing.yaml (dubbing_es_en.yaml with --spanish)")
    ap.add_argument("--spanish", action="store_true",
                    help="es -> en: real Spanish speech (Asterisk es_MX prompts) into dubbing_es_en")
    args = ap.parse_args(argv)
    if args.pipeline is None:
        args.pipeline = str(shipped_dir("pipelines") / ("dubbing_es_en.yaml" if args.spanish else "dubbing.yaml"))
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from streamkit.bench._speech import log, match_finals, percentile, run_paced
    from streamkit.bench.dub_quality import (
        chrf,
        intelligibility,
        load_references,
        spanish_prompts,
    )
    from streamkit.frames import AudioFrame, TextFrame
    from streamkit.pipeline import load_pipeline
    from streamkit.speech import corpus

    spec = load_pipeline(args.pipeline)
    if args.spanish:  # no English references exist for the prompts: chrF is left out
        references: dict[str, str] = {}
        audio, spans, texts = spanish_prompts(args.sentences, args.gap)
    else:
        references = load_references()  # bench translate's English -> Spanish references, when present
        texts = list(references)[: args.sentences] if references else corpus.sentences()[: args.sentences]
        log(f"bench dubbing: synthesising {len(texts)} sentences")
        audio, spans = corpus.speech_stream(texts, gap_s=args.gap)

    log("bench dubbing: loading models (whisper, hibari, engine)")
    from streamkit.engine import SamplingParams, get_engine
    from streamkit.speech import whisper
    from streamkit.speech.synth import get_hibari, synthesize_sentence

    llm_cfg = next(s for s in spec.stages if s.type == "llm")
    asr_cfg = next(s for s in spec.stages if s.type == "asr")
    engine = get_engine(model_path=getattr(llm_cfg, "model", None))
    await engine.complete("Hello", SamplingParams(max_tokens=4))
    model = whisper.get_whisper(asr_cfg.model, asr_cfg.cpu_threads, asr_cfg.compute_type)
    whisper.WindowDecoder(model).decode(audio[:32000])
    synthesize_sentence(get_hibari("heart"), "Warm up.")

    log(f"bench dubbing: streaming {len(audio) / 16000:.1f} s at real-time pace")
    out, _wall = await run_paced(spec, audio)
    asr_name, llm_name = asr_cfg.name, llm_cfg.name
    tts_name = next(s.name for s in spec.stages if s.type == "tts")
    finals = [(c, f) for c, f in out if isinstance(f, TextFrame) and f.final and f.source == asr_name]
    per = match_finals(finals, spans)
    first_audio, first_text, final_lat = [], [], []
    translations, starts = [], []
    for (_start, voiced_end, _end), items in zip(spans, per):
        if not items:
            continue
        utts = {f.utterance for _, f in items}
        final_lat.append((max(c for c, _ in items) - voiced_end) * 1000)
        pieces = [c for c, f in out if isinstance(f, TextFrame) and f.source == llm_name and not f.final
                  and f.utterance in utts]
        text = " ".join(f.text for c, f in out if isinstance(f, TextFrame) and f.source == llm_name and f.final
                        and f.utterance in utts)
        translations.append(text)
        starts.append(min(pieces) if pieces else None)
        if not pieces:
            continue
        first_text.append((min(pieces) - voiced_end) * 1000)
        audio_after = [c for c, f in out if isinstance(f, AudioFrame) and f.source == tts_name and c >= min(pieces)]
        if audio_after:
            first_audio.append((min(audio_after) - voiced_end) * 1000)
    result = {
        "utterances": len(texts),
        "first_audio_ms_p50": round(percentile(first_audio, 50), 1),
        "first_audio_ms_p95": round(percentile(first_audio, 95), 1),
        "asr_final_ms_p50": round(percentile(final_lat, 50), 1),
        "first_text_ms_p50": round(percentile(first_text, 50), 1),
        "dubbed_utterances": len(first_audio),
    }
    tts_frames = [(c, f) for c, f in out if isinstance(f, AudioFrame) and f.source == tts_name]
    bounds = [t for t in starts if t is not None] + [float("inf")]
    windows = [[(c, f) for c, f in tts_frames if a <= c < b] for a, b in pairwise(bounds)]
    dubbed = [np.concatenate([f.samples for _, f in w] or [np.zeros(0, np.float32)]) for w in windows]
    stalls = [_stall_s(w) * 1000 for w in windows]
    result["dubbed_stall_ms_p50"] = round(percentile(stalls, 50), 1)
    result["dubbed_stall_ms_max"] = round(max(stalls, default=0.0), 1)
    spoken = [t for t, s0 in zip(translations, starts) if s0 is not None]
    language = getattr(llm_cfg, "target_language", "es")
    rate = spec.output_audio.sample_rate
    log("bench dubbing: dubbed speech transcribed back by Whisper base")
    quality = intelligibility(dubbed, spoken, rate, language)
    result["dubbed_cer"] = quality["dubbed_cer"]
    if references:
        result["translation_chrf"] = round(chrf(translations, [references[t] for t in texts]), 2)
    else:
        result["translation_chrf"] = None
        result["translation_chrf_note"] = ("no English references for the es_MX prompts" if args.spanish else
                                           "no tests/data/translate_en_es.tsv (bench translate's references)")
    if args.spanish:
        from streamkit.speech.cer import cer

        heard = [" ".join(f.text for _, f in items) for items in per]
        result["asr_cer"] = round(cer(" ".join(texts), " ".join(heard), "es"), 4)
    for t, tr, heard in zip(texts, translations, quality["dubbed_heard"]):
        log(f"  {t}\n   -> {tr}\n   heard: {heard}")
    log(f"bench dubbing: first audio p50 {result['first_audio_ms_p50']} ms, p95 {result['first_audio_ms_p95']} ms "
        f"(asr final p50 {result['asr_final_ms_p50']} ms, first translated piece p50 {result['first_text_ms_p50']} ms); "
        f"silence inside an utterance's dubbed speech p50 {result['dubbed_stall_ms_p50']} ms, "
        f"max {result['dubbed_stall_ms_max']} ms")
    print_result(result, args.json)
    return 0


def _stall_s(frames: list) -> float:
    """The silence a listener hears inside one utterance's dubbed audio: its frames [(arrival s,
    AudioFrame)] played back to back from the first, each as soon as it has arrived and the one
    before it has played."""
    stall, played_to = 0.0, None
    for arrival, frame in frames:
        if played_to is not None and arrival > played_to:
            stall += arrival - played_to
        start = arrival if played_to is None else max(arrival, played_to)
        played_to = start + len(frame.samples) / frame.sample_rate
    return stall
