"""Incremental stop-string detection over streamed text."""
from __future__ import annotations


class StopChecker:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in (stops or []) if s]
        self.buf = ""

    def push(self, piece: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        if not self.stops:
            return piece, False
        self.buf += piece
        best = -1
        for s in self.stops:
            i = self.buf.find(s)
            if i >= 0 and (best < 0 or i < best):
                best = i
        if best >= 0:
            out, self.buf = self.buf[:best], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.buf[:len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out
