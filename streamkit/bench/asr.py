"""streamkit bench asr: streaming vad+asr on hibari speech of the fixed sentences, at real-time pace.

Reports WER against the sentences, the real-time factor (decode + VAD compute seconds per second of
audio), and the latency from the end of each utterance's voiced audio to the arrival of its final
transcript (p50/p95). The peer, in the same run: faster-whisper's own offline `transcribe` (its
defaults: beam 5, 30 s windows) on the same audio, WER and RTF.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from streamkit.bench import print_result

PIPELINE = """
name: bench_asr
input: {{audio: {{sample_rate: 16000}}}}
stages:
  - {{name: vad, type: vad, min_silence_ms: {silence}, speech_pad_ms: 160}}
  - {{name: asr, type: asr, cpu_threads: {threads}}}
output: [asr]
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="streamkit bench asr", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 sentences instead of all")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    ap.add_argument("--sentences", type=int, default=0, help="use the first N sentences")
    ap.add_argument("--gap", type=float, default=1.0, help="silence between sentences (s)")
    ap.add_argument("--chunk", type=float, default=0.02, help="input chunk size (s)")
    ap.add_argument("--silence-ms", type=int, default=300, help="vad min_silence_ms")
    ap.add_argument("--threads", type=int, default=0, help="CTranslate2 threads (0: min(4, cores))")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--real", type=int, default=0, metavar="N",
                    help="also N recorded human prompts (Asterisk en_US, 8 kHz) through the websocket server")
    ap.add_argument("--real-only", action="store_true", help="only the recorded prompts (with --real)")
    ap.add_argument("--model", default="tiny.en", help="ASR model for --real (tiny.en, base or a path)")
    ap.add_argument("--final-beam", type=int, default=5, help="asr final_beam_size for --real")
    ap.add_argument("--final-context", choices=("auto", "full", "short"), default="auto",
                    help="asr final_full_context for --real: the final decoded in Whisper's 30 s context (full), "
                         "in the utterance's own (short), or the stage's default (auto: full where the encoder is torch-bf16)")
    ap.add_argument("--encoder", choices=("auto", "ctranslate2", "torch-bf16"), default="auto",
                    help="asr encoder for --real")
    args = ap.parse_args(argv)
    if args.real_only:
        from streamkit.bench.asr_real import main_real

        print_result(main_real(args.real, args.model, args.threads, args.silence_ms, not args.no_peer,
                               args.final_beam, args.final_context, args.encoder), args.json)
        return 0
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from streamkit.bench._speech import log, match_finals, percentile, run_paced
    from streamkit.frames import TextFrame
    from streamkit.pipeline import parse_pipeline
    from streamkit.speech import corpus, whisper
    from streamkit.speech import vad as vadmod
    from streamkit.speech.wer import wer

    texts = corpus.sentences()
    n = args.sentences or (6 if args.quick else len(texts))
    texts = texts[:n]
    log(f"bench asr: synthesising {len(texts)} sentences with hibari")
    audio, spans = corpus.speech_stream(texts, gap_s=args.gap)
    duration = len(audio) / 16000
    spec = parse_pipeline(PIPELINE.format(silence=args.silence_ms, threads=args.threads))

    log("bench asr: loading models")
    model = whisper.get_whisper(None, args.threads, "int8")
    whisper.WindowDecoder(model).decode(audio[:32000])  # warm up
    vadmod.get_vad_model()

    before = dict(whisper.STATS), dict(vadmod.STATS)
    log(f"bench asr: streaming {duration:.1f} s of audio at real-time pace")
    out, wall = await run_paced(spec, audio, chunk_s=args.chunk)
    decode_s = whisper.STATS["decode_s"] - before[0]["decode_s"]
    vad_s = vadmod.STATS["vad_s"] - before[1]["vad_s"]
    finals = [(c, f) for c, f in out if isinstance(f, TextFrame) and f.final]
    partials = [(c, f) for c, f in out if isinstance(f, TextFrame) and not f.final]
    per = match_finals(finals, spans)
    latencies = []
    hyps = []
    for (_start, voiced_end, _end), items in zip(spans, per):
        hyps.append(" ".join(f.text for _, f in items))
        if items:
            latencies.append((max(c for c, _ in items) - voiced_end) * 1000)
    stream_text = " ".join(f.text for _, f in finals)
    result = {
        "sentences": len(texts),
        "audio_s": round(duration, 2),
        "wer": round(wer(" ".join(texts), stream_text), 4),
        "wer_per_sentence_mean": round(sum(wer(t, h) for t, h in zip(texts, hyps)) / len(texts), 4),
        "rtf": round((decode_s + vad_s) / duration, 4),
        "decodes": whisper.STATS["decodes"] - before[0]["decodes"],
        "final_latency_ms_p50": round(percentile(latencies, 50), 1),
        "final_latency_ms_p95": round(percentile(latencies, 95), 1),
        "finals": len(finals),
        "partials": len(partials),
    }
    for t, h in zip(texts, hyps):
        if wer(t, h) > 0:
            log(f"  ref: {t}\n  hyp: {h}")
    if not args.no_peer:
        log("bench asr: peer = faster-whisper transcribe() offline on the same audio")
        t0 = time.perf_counter()
        segments, _info = model.transcribe(audio, language="en")
        peer_text = " ".join(s.text.strip() for s in segments)
        peer_wall = time.perf_counter() - t0
        result["peer_wer"] = round(wer(" ".join(texts), peer_text), 4)
        result["peer_rtf"] = round(peer_wall / duration, 4)
    if args.real:
        from streamkit.bench.asr_real import run as run_real

        log(f"bench asr: {args.real} recorded prompts through the websocket server")
        result.update(await run_real(args.real, args.model, args.threads, args.silence_ms, not args.no_peer))
    log(f"bench asr: wer {result['wer']} (peer {result.get('peer_wer')}), rtf {result['rtf']} "
        f"(peer {result.get('peer_rtf')}), final latency p50 {result['final_latency_ms_p50']} ms "
        f"p95 {result['final_latency_ms_p95']} ms, {len(partials)} partials, {len(finals)} finals")
    print_result(result, args.json)
    return 0
