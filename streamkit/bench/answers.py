"""streamkit bench answers: which model the voice assistant and the video descriptions should use.
Each model on our engine gets the assistant's answer prompt (pipelines/assistant.yaml: `mode:
answer`) on spoken-style questions with known answers (tests/data/assistant_questions.tsv; right
when the answer holds an accepted word) and the describe stage's prompt on detection summaries
(right when it names every kind of object detected, no kind that was not, and does not make one
of a kind many). Latency per answer:
first token, the first piece the tts stage would speak (cut as its defaults cut), the whole answer."""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from pathlib import Path

from streamkit.bench import print_result

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "assistant_questions.tsv"
MODELS = ("smollm2-135m", "qwen2.5-coder-1.5b")

# (what the detector saw, the words that name each kind of it); summaries come from describe_text.summarize
_PERSON = ("person", "people", "man", "woman", "men", "women", "someone", "individual", "figure", "they")
SCENES: list[tuple[list[tuple[str, str, float]], dict[str, tuple[str, ...]]]] = [
    ([("person", "center", 1.0)], {"person": _PERSON}),
    ([("person", "left", 1.0), ("person", "right", 0.6)], {"person": _PERSON}),
    ([("face", "center", 1.0), ("motion", "center", 0.3)], {"face": ("face", "person", "someone"),
                                                         "motion": ("mov", "motion", "moving")}),
    ([("car", "left", 1.0), ("car", "center", 0.9), ("person", "right", 0.3)],
     {"car": ("car", "vehicle"), "person": _PERSON}),
    ([("dog", "center", 0.9), ("person", "center", 1.0)], {"dog": ("dog",), "person": _PERSON}),
    ([("motion", "left", 0.5)], {"motion": ("mov", "motion", "moving", "activity")}),
    ([("bicycle", "right", 0.8), ("person", "right", 0.8)], {"bicycle": ("bicycle", "bike", "cycl"),
                                                             "person": _PERSON}),
    ([("cat", "left", 1.0)], {"cat": ("cat", "kitten")}),
]
# kinds a description may name that were not detected (COCO's, which the ONNX detector reports)
_OTHER_KINDS = ("car", "dog", "cat", "bicycle", "bus", "truck", "bird", "horse", "chair", "table", "phone",
                "laptop", "ball", "bottle", "tree", "book")


def log(msg: str) -> None:
    print(f"[bench answers] {msg}", file=sys.stderr, flush=True)


def load_questions(path: str | Path = DATA) -> list[tuple[str, list[str]]]:
    if not Path(path).is_file():
        raise SystemExit(f"streamkit bench answers: no question file at {path} (it is in the source "
                         "checkout's tests/data, not in the wheel)")
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            q, accepted = line.split("\t")
            out.append((q.strip(), [a.strip().lower() for a in accepted.split("|")]))
    return out


def _words(text: str) -> str:
    return " " + " ".join(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)?", text.lower())) + " "


def answer_is_right(answer: str, accepted: list[str]) -> bool:
    words = _words(answer)
    return any(f" {a} " in words for a in accepted)


def scene_events(scene: list[tuple[str, str, float]], frames: int = 10, width: int = 1280) -> list[dict]:
    """Detections events in which each (label, side, share of frames) is seen as described."""
    x = {"left": 100, "center": 600, "right": 1100}
    events = []
    for i in range(frames):
        objects = [{"label": label, "box": [x[side], 200, 80, 160], "score": 0.9}
                   for label, side, share in scene if i < round(share * frames)]
        events.append({"pts": i * 0.5, "objects": objects, "width": width, "height": 720})
    return events


_MANY = (" multiple ", " several ", " many ", " group ", " crowd ", " two ", " 2 ", " three ", " 3 ", " some ")
_PLURAL = {"person": (" people ", " persons ", " individuals ", " men ", " women "), "face": (" faces ",)}


def description_is_faithful(sentence: str, names: dict[str, tuple[str, ...]],
                            counts: dict[str, int] | None = None) -> bool:
    """Every kind detected is named, no kind that was not, and a kind seen once is not made many."""
    words = _words(sentence)
    named = all(any(f" {n}" in words for n in alts) for alts in names.values())
    invented = any(f" {k} " in words or f" {k}s " in words for k in _OTHER_KINDS if k not in names)
    multiplied = False
    if counts and all(n == 1 for label, n in counts.items() if label != "motion"):
        singles = [k for k, n in counts.items() if n == 1 and k != "motion"]
        multiplied = any(m in words for m in _MANY) or any(
            p in words for k in singles for p in _PLURAL.get(k, (f" {k}s ",)))
    return named and not invented and not multiplied


async def _timed(eng, messages, params) -> tuple[str, float, float | None, float]:
    """(text, first token s, first spoken piece s or None, whole answer s)."""
    from streamkit.speech.synth import SentenceSplitter
    from streamkit.stages.tts import TTS

    tts = TTS.Config(name="tts")
    splitter = SentenceSplitter(tts.max_chars, tts.first_min_chars, tts.first_max_chars or None)
    t0 = time.perf_counter()
    first = piece = None
    parts = []
    async for text in eng.generate(messages, params):
        now = time.perf_counter() - t0
        first = now if first is None else first
        parts.append(text)
        if piece is None and splitter.feed(text):
            piece = now
    whole = time.perf_counter() - t0
    return "".join(parts).strip(), first or whole, piece if piece is not None else whole, whole


def run_model(name: str, questions, with_describe: bool = True) -> dict:
    from streamkit.engine import SamplingParams, get_engine
    from streamkit.stage import StageContext
    from streamkit.stages.describe import Describe
    from streamkit.stages.llm import LLM, chat_messages
    from streamkit.video.describe_text import DEFAULT_PROMPT, DEFAULT_SYSTEM, first_sentence, summarize

    eng = get_engine(model_path=name)
    mine = not eng.loaded  # an engine this process already uses stays loaded
    # pipelines/assistant.yaml's stage, sampling as it does
    answer_params = LLM(LLM.Config(name="answer", mode="answer", max_tokens=96), StageContext("bench", "answers")
                        ).sampling_params()
    describe_cfg = Describe.Config(name="describe", max_tokens=32)  # pipelines/video_analysis.yaml's stage
    describe_params = SamplingParams(max_tokens=describe_cfg.max_tokens, temperature=describe_cfg.temperature,
                                     stop=["\n"])

    async def go() -> dict:
        t0 = time.perf_counter()
        await eng.complete("Hello", SamplingParams(max_tokens=2))
        load_s = time.perf_counter() - t0
        await _timed(eng, chat_messages("answer", "English", "Hello there."), answer_params)  # system prompt cached
        answers, firsts, pieces, wholes, right = [], [], [], [], 0
        for q, accepted in questions:
            text, first, piece, whole = await _timed(eng, chat_messages("answer", "English", q), answer_params)
            ok = answer_is_right(text, accepted)
            right += ok
            answers.append({"question": q, "answer": text, "right": ok})
            firsts.append(first)
            pieces.append(piece)
            wholes.append(whole)
        out = {"model": name, "load_s": round(load_s, 1), "answer_accuracy": round(right / len(questions), 3),
               "answer_first_token_ms_p50": round(1000 * statistics.median(firsts), 1),
               "answer_first_piece_ms_p50": round(1000 * statistics.median(pieces), 1),
               "answer_whole_ms_p50": round(1000 * statistics.median(wholes), 1)}
        if with_describe:
            faithful, d_first, d_whole, sentences = 0, [], [], []
            for scene, names in SCENES:
                summary = summarize(scene_events(scene))
                messages = [{"role": "system", "content": DEFAULT_SYSTEM},
                            {"role": "user", "content": DEFAULT_PROMPT.format(summary=summary, window=5)}]
                text, first, _piece, whole = await _timed(eng, messages, describe_params)
                sentence = first_sentence(text) or summary
                ok = description_is_faithful(sentence, names, {label: sum(1 for lb, _, _ in scene if lb == label)
                                                               for label, _, _ in scene})
                faithful += ok
                sentences.append({"summary": summary, "sentence": sentence, "faithful": ok})
                d_first.append(first)
                d_whole.append(whole)
            out.update({"describe_faithful": round(faithful / len(SCENES), 3),
                        "describe_first_token_ms_p50": round(1000 * statistics.median(d_first), 1),
                        "describe_whole_ms_p50": round(1000 * statistics.median(d_whole), 1),
                        "descriptions": sentences})
        out["answers"] = answers
        return out

    try:
        return asyncio.run(go())
    finally:
        if mine:
            eng.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="streamkit bench answers", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated model names or GGUF paths")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N questions")
    ap.add_argument("--no-describe", action="store_true", help="skip the describe prompts")
    args = ap.parse_args(argv)
    questions = load_questions()[: args.limit or None]
    runs = []
    for name in args.models.split(","):
        log(f"{name}: {len(questions)} questions" + ("" if args.no_describe else f", {len(SCENES)} scenes"))
        run = run_model(name, questions, not args.no_describe)
        log(f"{name}: accuracy {run['answer_accuracy']}, first piece p50 {run['answer_first_piece_ms_p50']} ms"
            + ("" if args.no_describe else f", describe faithful {run['describe_faithful']}"))
        runs.append(run)
    print_result({"questions": len(questions), "scenes": 0 if args.no_describe else len(SCENES), "runs": runs},
                 args.json)
    return 0
