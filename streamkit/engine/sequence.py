"""Per-request state held by the scheduler thread."""
from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from streamkit.engine.params import SamplingParams
from streamkit.engine.stop import StopChecker
from streamkit.engine.tokenizer import IncrementalDecoder

_ids = itertools.count(1)


class State(enum.Enum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    # emit(kind, payload): kind in {"text", "token", "done", "error"}; called from the engine thread
    emit: Callable[[str, object], None]
    want_tokens: bool = False
    ignore_eos: bool = False
    id: int = field(default_factory=lambda: next(_ids))
    tokens: list[int] = field(default_factory=list)  # prompt + generated
    num_computed: int = 0  # tokens whose K/V are in the cache
    blocks: list[int] = field(default_factory=list)
    block_keys: list[bytes] = field(default_factory=list)  # prefix-cache keys of its first full blocks
    state: State = State.WAITING
    generator: object = None
    sample_seed: int = 0  # the native sampler's (streamkit.engine.native.sampling): the params' seed, else random
    decoder: IncrementalDecoder | None = None
    stopper: StopChecker | None = None
    finish_reason: str | None = None
    t_submit: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    n_generated: int = 0
    draft: list[int] = field(default_factory=list)  # speculative tokens at the end of `tokens`, unverified
    draft_q: list | None = None  # a sampled draft's distributions, one [V] tensor per draft token

    def drop_draft(self) -> None:
        if self.draft:
            del self.tokens[-len(self.draft):]
            self.draft = []
        self.draft_q = None

    def __post_init__(self):
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def n_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt_ids):]
