"""The words of the describe stage: detections summarised as facts, the prompt around them,
and the first sentence of what the model answers."""

from __future__ import annotations

import collections
from typing import Any

DEFAULT_SYSTEM = "You describe what a video camera sees. Answer with one short, plain sentence."
DEFAULT_PROMPT = (
    "Detections from a camera over the last {window:g} seconds: {summary}\n"
    "In one short sentence, describe what is happening."
)


def _where(box: list[int], width: int) -> str:
    cx = box[0] + box[2] / 2
    return "left" if cx < width / 3 else ("right" if cx > 2 * width / 3 else "center")


def summarize(events: list[dict[str, Any]], cuts: int = 0) -> str:
    """Plain-language facts from detections events (what the LLM turns into a sentence)."""
    if not events:
        return "nothing was analysed."
    most: dict[str, int] = {}
    places: dict[str, collections.Counter] = {}
    frames_with: collections.Counter = collections.Counter()
    for ev in events:
        counts = collections.Counter(o["label"] for o in ev["objects"])
        for label, n in counts.items():
            most[label] = max(most.get(label, 0), n)
            frames_with[label] += 1
        for o in ev["objects"]:
            places.setdefault(o["label"], collections.Counter())[_where(o["box"], ev.get("width") or 1)] += 1
    parts = []
    for label in sorted(most, key=lambda k: (k == "motion", -frames_with[k])):
        where = ", ".join(p for p, _ in places[label].most_common(2))
        share = frames_with[label] / len(events)
        how_often = "all the time" if share > 0.8 else ("often" if share > 0.4 else "briefly")
        if label == "motion":
            parts.append(f"movement on the {where} side, {how_often}")
        else:
            noun = label if most[label] == 1 else (label + "s" if not label.endswith("s") else label)
            if label == "person" and most[label] > 1:
                noun = "people"
            parts.append(f"up to {most[label]} {noun} ({where}), seen {how_often}")
    text = "; ".join(parts) if parts else "no faces, people or movement"
    if cuts:
        text += f"; {cuts} scene cut{'s' if cuts > 1 else ''}"
    return text + "."


def first_sentence(text: str, limit: int = 200) -> str:
    text = " ".join(text.replace("\n", " ").split()).strip().strip('"').strip()
    for end in (". ", "! ", "? "):
        i = text.find(end)
        if 0 < i < limit:
            return text[: i + 1]
    return text[:limit].rstrip()
