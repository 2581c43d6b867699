"""Whether a step drafts: speculative decoding only where it has measured faster than plain decoding.

A draft pays when the tokens a verify step accepts outweigh what the draft's forwards and the
verify's extra rows cost. That depends on the machine, the batch and the text: on 2 cores of a
Zen 5 the 1.5B's 0.5B draft gains 10-20 % over free text and a few percent in one-sentence
translations; n-gram lookup on chat prompts, which rarely finds anything to propose, costs 30-50 %;
at large batches the steps are compute-bound and a draft only adds rows. So the engine measures
both ways, per batch size, and takes the cheaper one.

Per bucket of batch sizes (1, 2, 3-4, 5-8, ...), and per way (drafting or plain), the policy keeps
an exponentially weighted sum of the seconds of the steps taken that way and of the tokens they
produced: their ratio is what a token has cost lately (summed, not per-step ratios averaged). The
engine does not report a draft model's catch-up steps (over a new prompt, or over what was decoded
plainly before a drafting burst): a burst that starts in mid-answer pays a catch-up that steady
drafting would not, and counted, it kept the policy from drafting where drafting always was the
faster (the 1.5B with its 0.5B draft over 64 tokens: 32.7 tok/s drafting always, 26.9 plain,
25.6 adaptive while those steps counted). So the policy compares steady rounds with plain steps,
and leaves a new prompt's catch-up, a fixed cost a sequence, out of the choice. It starts with a
burst of drafting steps and a burst of plain ones, then takes the cheaper way, and every
`explore_every` steps runs a burst the other way, so a change in the load or the text is noticed.
Each burst that leaves the choice as it was doubles that interval (up to `max_backoff` times),
since a way that keeps losing costs its whole burst each time; a burst that changes the choice
resets it.
Greedy output is the same whichever way a step goes (speculative.py); only the speed differs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DRAFT, PLAIN = True, False


@dataclass
class _Cost:
    seconds: float = 0.0
    tokens: float = 0.0
    steps: int = 0

    def add(self, seconds: float, tokens: int, decay: float) -> None:
        self.seconds = self.seconds * (1.0 - decay) + seconds * decay
        self.tokens = self.tokens * (1.0 - decay) + tokens * decay
        self.steps += 1

    @property
    def per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens > 0 else None


@dataclass
class _Bucket:
    cost: dict[bool, _Cost] = field(default_factory=lambda: {DRAFT: _Cost(), PLAIN: _Cost()})
    burst_way: bool = DRAFT
    burst_left: int = 0
    since_explore: int = 0
    interval: int = 0  # steps between exploring bursts now
    exploring_from: bool | None = None  # the choice before the exploring burst under way

    def best(self) -> bool:
        d, p = self.cost[DRAFT].per_token, self.cost[PLAIN].per_token
        return DRAFT if d is None or p is None or d < p else PLAIN


class SpeculationPolicy:
    """Chooses, step by step, whether the running sequences draft. Not thread-safe: the engine
    thread alone calls it."""

    def __init__(self, burst: int = 8, explore_every: int = 96, decay: float = 0.125,
                 max_backoff: int = 8) -> None:
        if burst < 1 or explore_every < 1 or max_backoff < 1 or not 0.0 < decay <= 1.0:
            raise ValueError(f"burst >= 1, explore_every >= 1, max_backoff >= 1 and 0 < decay <= 1, got "
                             f"{burst}, {explore_every}, {max_backoff}, {decay}")
        self.burst = burst
        self.explore_every = explore_every
        self.max_backoff = max_backoff
        self.decay = decay
        self._buckets: dict[int, _Bucket] = {}

    @staticmethod
    def bucket_of(batch: int) -> int:
        """1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, ...: one estimate per power of two of the batch."""
        return max(batch - 1, 0).bit_length()

    def _bucket(self, batch: int) -> _Bucket:
        return self._buckets.setdefault(self.bucket_of(batch), _Bucket(interval=self.explore_every))

    def choose(self, batch: int) -> bool:
        """True when this step's `batch` decoding sequences should draft."""
        b = self._bucket(batch)
        if b.burst_left == 0:
            if b.exploring_from is not None:  # an exploring burst has ended, its steps observed
                same = b.best() == b.exploring_from
                b.interval = min(2 * b.interval, self.max_backoff * self.explore_every) if same else self.explore_every
                b.exploring_from = None
            unmeasured = [w for w in (DRAFT, PLAIN) if b.cost[w].steps == 0]
            if unmeasured:
                b.burst_way, b.burst_left = unmeasured[0], self.burst
            elif b.since_explore >= b.interval:
                b.exploring_from = b.best()
                b.burst_way, b.burst_left = not b.exploring_from, self.burst
                b.since_explore = 0
        if b.burst_left > 0:
            b.burst_left -= 1
            return b.burst_way
        b.since_explore += 1
        return b.best()

    def plain_ahead(self, batch: int) -> int:
        """How many of the next steps choose(batch) would run plain in a row, the choice as it stands:
        the rest of a plain burst, or the steps before the next exploring burst while plain decoding is
        the cheaper; 0 where the next step drafts or begins a burst. The engine runs that many as one
        decode burst and reports them with skip_plain."""
        b = self._bucket(batch)
        if b.burst_left > 0:
            return b.burst_left if b.burst_way == PLAIN else 0
        if any(b.cost[w].steps == 0 for w in (DRAFT, PLAIN)) or b.since_explore >= b.interval:
            return 0
        return b.interval - b.since_explore if b.best() == PLAIN else 0

    def skip_plain(self, batch: int, steps: int) -> None:
        """`steps` plain steps run without choose(batch) (at most plain_ahead(batch) of them)."""
        b = self._bucket(batch)
        if b.burst_left > 0:
            b.burst_left -= min(steps, b.burst_left)
        else:
            b.since_explore += steps

    def observe(self, batch: int, drafted: bool, seconds: float, produced: float) -> None:
        """A decode step's wall time (the draft's forwards included) and the tokens it produced;
        `spec_drafted_steps` / `spec_plain_steps` count these measured steps."""
        self._bucket(batch).cost[drafted].add(seconds, produced, self.decay)

    def stats(self) -> dict:
        def ms(c: _Cost) -> float | None:
            v = c.per_token
            return round(1000 * v, 2) if v is not None else None

        return {
            "spec_drafted_steps": sum(b.cost[DRAFT].steps for b in self._buckets.values()),
            "spec_plain_steps": sum(b.cost[PLAIN].steps for b in self._buckets.values()),
            # per batch bucket (its largest batch size): ms a token lately, each way, and the way taken
            "spec_policy": {str(1 << k): {"draft_ms_per_token": ms(b.cost[DRAFT]),
                                                "plain_ms_per_token": ms(b.cost[PLAIN]),
                                                "drafting": b.best()}
                            for k, b in sorted(self._buckets.items())},
        }
