"""Process-wide metrics with Prometheus text rendering (no client library needed for this much)."""

from __future__ import annotations

import bisect
import threading
from typing import Callable, Iterable

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Labels = tuple[tuple[str, str], ...]


def _labels(labels: dict[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


def _fmt(labels: Labels, extra: Iterable[tuple[str, str]] = ()) -> str:
    items = list(labels) + list(extra)
    if not items:
        return ""
    body = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in items)
    return "{" + body + "}"


class Counter:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self._values: dict[Labels, float] = {}
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0, /, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(_labels(labels), 0.0)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            lines += [f"{self.name}{_fmt(k)} {v:g}" for k, v in sorted(self._values.items())]
        return lines


class Gauge:
    """A gauge whose value is read from a callback at render time, or set directly."""

    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self._values: dict[Labels, float] = {}
        self._callbacks: list[Callable[[], dict[Labels, float]]] = []

    def set(self, value: float, **labels: str) -> None:
        self._values[_labels(labels)] = value

    def add_callback(self, fn: Callable[[], dict[Labels, float]]) -> None:
        self._callbacks.append(fn)

    def render(self) -> list[str]:
        values = dict(self._values)
        for fn in self._callbacks:
            values.update(fn())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        lines += [f"{self.name}{_fmt(k)} {v:g}" for k, v in sorted(values.items())]
        return lines


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help, buckets
        self._data: dict[Labels, list[float]] = {}  # bucket counts..., sum, count
        self._lock = threading.Lock()

    def observe(self, value: float, **labels: str) -> None:
        key = _labels(labels)
        with self._lock:
            data = self._data.setdefault(key, [0.0] * (len(self.buckets) + 2))
            index = bisect.bisect_left(self.buckets, value)
            if index < len(self.buckets):  # above the last bound counts only towards +Inf
                data[index] += 1
            data[-2] += value
            data[-1] += 1

    def count(self, **labels: str) -> int:
        data = self._data.get(_labels(labels))
        return int(data[-1]) if data else 0

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            for key, data in sorted(self._data.items()):
                cumulative = 0.0
                for bound, n in zip(self.buckets, data):
                    cumulative += n
                    lines.append(f"{self.name}_bucket{_fmt(key, [('le', f'{bound:g}')])} {cumulative:g}")
                lines.append(f"{self.name}_bucket{_fmt(key, [('le', '+Inf')])} {data[-1]:g}")
                lines.append(f"{self.name}_sum{_fmt(key)} {data[-2]:g}")
                lines.append(f"{self.name}_count{_fmt(key)} {data[-1]:g}")
        return lines


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def _get(self, cls, name: str, help: str, **kw):
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = cls(name, help, **kw)
        return metric

    def counter(self, name: str, help: str) -> Counter:
        return self._get(Counter, name, help)

    def gauge(self, name: str, help: str) -> Gauge:
        return self._get(Gauge, name, help)

    def histogram(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        return self._get(Histogram, name, help, buckets=buckets)

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines += metric.render()
        return "\n".join(lines) + "\n"


REGISTRY = Registry()
FRAMES_IN = REGISTRY.counter("streamkit_stage_frames_in_total", "Frames a stage received")
FRAMES_OUT = REGISTRY.counter("streamkit_stage_frames_out_total", "Frames a stage emitted")
FRAMES_DROPPED = REGISTRY.counter("streamkit_frames_dropped_total", "Frames dropped by an explicit overflow policy")
STAGE_LATENCY = REGISTRY.histogram("streamkit_stage_latency_seconds", "Time a stage spent on one input frame")
STAGE_ERRORS = REGISTRY.counter("streamkit_stage_errors_total", "Exceptions raised by a stage")
