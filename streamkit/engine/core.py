"""EngineCore: model + paged cache + scheduler, driven by one background thread.

Requests and cancellations arrive on a thread-safe queue; results go out through each
sequence's `emit` callback (the async API turns that into loop.call_soon_threadsafe).
"""
from __future__ import annotations

import logging
import queue
import random
import threading
import time
import traceback
from collections import deque

import torch

from streamkit import cores
from streamkit.engine.batch import build_step
from streamkit.engine.chat_template import ChatTemplate
from streamkit.engine.gguf_loader import load_gguf
from streamkit.engine.kv_cache import PagedKVCache, kv_bytes_per_token
from streamkit.engine.linear import resolve_weights
from streamkit.engine.model import LlamaModel, StepBatch
from streamkit.engine.native.model import MODES as NATIVE_MODES
from streamkit.engine.native.model import NativeLlamaModel, StopFlag
from streamkit.engine.options import resolve_options
from streamkit.engine.output import OutputProcessor
from streamkit.engine.sampling import make_generator, plain_greedy, sample_batch
from streamkit.engine.scheduler import Scheduler
from streamkit.engine.sequence import Sequence, State
from streamkit.engine.spec_policy import PLAIN, SpeculationPolicy
from streamkit.engine.speculative import propose_ngram
from streamkit.engine.stop import StopChecker
from streamkit.engine.tokenizer import IncrementalDecoder, Tokenizer
from streamkit.engine.wakeups import BatchedWakeups

log = logging.getLogger("streamkit.engine")

# The longest decode burst (EngineCore._burst_steps), in steps and in seconds at the measured step
# time. A burst hands its tokens to the streams every decode_burst_ms and ends at once for a new
# request, a cancellation or another stage taking cores, so these only bound the KV blocks it
# reserves ahead and how long the thread tuner waits to explore; beyond ~64 steps the native
# call's start (~0.3-0.5 ms) no longer shows.
BURST_MAX_STEPS = 64
BURST_MAX_S = 0.5


class EngineCore:
    def __init__(self, model_path: str, device: str = "cpu", **options) -> None:
        """`options`: see engine/options.resolve_options (weights, kv_cache_tokens, max_num_seqs, ...)."""
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.options = opts = resolve_options(self.device, **options)
        if opts.threads > 0:
            torch.set_num_threads(opts.threads)
        self._tuner = None
        if not cuda and opts.threads <= 0 and torch.get_num_threads() > 1:
            from streamkit.engine.threads import ThreadTuner

            self._tuner = ThreadTuner(torch.get_num_threads())
        t0 = time.perf_counter()
        mode = resolve_weights(opts.weights, cuda, native_isa=opts.native_isa)
        native_mode = mode in NATIVE_MODES
        if native_mode and cuda:
            raise ValueError(f"weights={mode!r} runs on the CPU only")
        gm = load_gguf(model_path, raw=native_mode)
        self.model_path = model_path
        self.config = gm.config
        self.metadata = gm.metadata
        self.tokenizer = Tokenizer(gm.metadata)
        self.chat_template = ChatTemplate.from_metadata(gm.metadata, self.tokenizer.tokens)
        if native_mode:
            self.model = NativeLlamaModel(gm, mode, isa=opts.native_isa)
            self.model.reuse_logits = True  # step() samples from the logits before the next forward
        else:
            self.model = LlamaModel(gm, self.device, weights=mode, attn_backend=opts.attn_backend)
        del gm
        cfg = self.config
        self.max_model_len = min(opts.max_model_len, cfg.context_length)
        # kv_dtype="bf16" on CPU: 11-15 % faster steps at 16-64 streams (decode attention is bound by
        # gathering K/V) but greedy agreement with fp32 fell from 16/20 to 12/20 prompts: opt-in
        # kv_dtype="int8" (native kernels only): half float16's K/V bytes, which attention at many
        # streams or long contexts waits on (docs/engine.md, *An int8 K/V cache*)
        kv_dtype = opts.kv_dtype or getattr(self.model, "kv_dtype", self.model.act_dtype)
        if kv_dtype == torch.int8 and not native_mode:
            raise ValueError("kv_dtype 'int8' needs the native CPU kernels (x86 with AVX2 or AVX-512, weights "
                             f"'native'); this engine runs the torch path on {self.device} with weights {mode!r}")
        per_tok = kv_bytes_per_token(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
        kv_cache_tokens = opts.kv_cache_tokens
        if kv_cache_tokens is None:
            if cuda:
                free, _total = torch.cuda.mem_get_info(self.device)
                kv_cache_tokens = int(free * 0.5 / per_tok)
            else:
                kv_cache_tokens = max(8192, min(65536, int(1.5e9 / per_tok)))
        num_blocks = max(2, kv_cache_tokens // opts.block_size + 1)
        self.cache = PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, num_blocks, opts.block_size, kv_dtype,
                                  self.device, prefix_caching=opts.prefix_caching)
        self.model.kv_cache = self.cache
        self.max_num_seqs = opts.max_num_seqs
        self.scheduler = Scheduler(self.cache, self.max_num_seqs, opts.max_batched_tokens, self.max_model_len)
        self.graphs = None
        emulate = opts.cuda_graphs == "emulate"  # CPU test mode for the graph runner's buffers/padding
        if emulate or (cuda and opts.cuda_graphs):
            from streamkit.engine.cuda_graphs import CUDAGraphRunner

            # the torch fallback attention gathers max_blocks per row inside the graph: keep it small
            gmax = self.max_num_seqs if self.model.attn_backend == "triton" else min(self.max_num_seqs, 32)
            self.graphs = CUDAGraphRunner(self.model, gmax, self.cache.blocks_needed(self.max_model_len),
                                          emulate=emulate)
            self.graphs.capture()
        # speculative decoding (speculative.py): up to spec_k tokens per step proposed by prompt lookup
        # ("ngram") or by a draft model with its own paged KV cache ("draft", draft.py)
        self.speculative = opts.speculative
        self.spec_k = opts.spec_k
        self.spec_policy = SpeculationPolicy() if opts.speculative and opts.spec_adaptive else None
        self.drafter = None
        if opts.speculative == "draft":
            from streamkit.engine.draft import DraftRunner
            from streamkit.engine.model_store import resolve_model

            self.drafter = DraftRunner(resolve_model(opts.draft_model), self.metadata, cfg.vocab_size, mode,
                                       self.device, num_blocks, opts.block_size, opts.prefix_caching,
                                       opts.max_batched_tokens, opts.attn_backend,
                                       narrow=opts.draft_q4, stop_p=opts.draft_stop_p, isa=opts.native_isa)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.delivery = BatchedWakeups()  # what the sequences' emit() posts to asyncio loops, flushed per step
        self._seqs: dict[int, Sequence] = {}
        self.output = OutputProcessor(self.tokenizer.stop_ids, self.max_model_len, self.scheduler, self._seqs)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # stats
        self.tokens_generated = 0
        self.steps = 0
        self.urgent_pauses = 0  # steps that waited for urgent compute (streamkit.cores)
        self.urgent_paused_s = 0.0
        self._urgent_owed_until = 0.0  # monotonic time before which the engine does not wait again
        self.last_batch_size = 0
        self._recent: deque = deque(maxlen=256)
        # decode bursts (_burst_steps): the native model, no drafts to verify between steps (a
        # speculative engine's adaptive policy bursts while it decodes plainly)
        self._bursts = (isinstance(self.model, NativeLlamaModel) and opts.decode_burst_ms > 0
                        and (not self.speculative or self.spec_policy is not None))
        self._burst_stop = StopFlag()  # set: end the burst under way after its step (something to schedule)
        if self._bursts:
            cores.on_change(self._burst_stop.set)
        self._decode_step_s: float | None = None  # moving average of a decode step's seconds
        # the native model: steps whose rows all decode greedily ask it for the argmax alone
        # (forward_argmax), and its kernels draw sampled rows (sk_sample.h), in single steps and bursts alike
        self._native_steps = isinstance(self.model, NativeLlamaModel)
        self.burst_steps = 0  # decode steps run inside bursts of 2 or more
        if native_mode:
            self._warm_up()
        self.load_seconds = time.perf_counter() - t0
        log.info("engine: ready on %s in %.1fs (weights %s, kv cache %d tokens = %.0f MB, block %d, cuda graphs %s)",
                 self.device, self.load_seconds, self.model.weights, num_blocks * opts.block_size,
                 self.cache.bytes / 1e6, opts.block_size, bool(self.graphs))

    def _warm_up(self) -> None:
        """A 128-token prefill and two decode steps of 1 and of 8 rows on blocks freed after, before any
        request: the native kernels build the head's 4-bit copy and greedy tables and their threads'
        scratch buffers on first use, which made the first request's first token take 194 ms instead
        of 12-17 and the first 8 at once 81 ms instead of 26 (SmolLM2, Intel Xeon with AMX)."""
        bs = self.cache.block_size
        rows = min(8, self.cache.allocator.num_free)
        blocks = [self.cache.allocator.allocate() for _ in range(rows)]
        try:
            T = rows * bs
            slots = torch.tensor([blocks[t // bs] * bs + t % bs for t in range(T)])
            self.model.forward_argmax(StepBatch(torch.zeros(T, dtype=torch.long), torch.arange(T), slots,
                                                prefills=[(0, T, 0, None)], logit_rows=torch.tensor([T - 1])))
            for n in sorted({1, rows}):
                self.model.decode_greedy([0] * n, [0] * n, [[b] for b in blocks[:n]], 2, [], [False] * n)
        finally:
            self.cache.allocator.free(blocks)

    # ---------------------------------------------------------------- threading
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="streamkit-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._post("wake", None)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _post(self, kind: str, payload: object) -> None:
        """A message for the engine thread; a decode burst under way ends after its step to take it."""
        self._inbox.put((kind, payload))
        self._burst_stop.set()

    def submit(self, seq: Sequence) -> None:
        self._post("add", seq)

    def cancel(self, seq_id: int) -> None:
        self._post("cancel", seq_id)

    def drop_prefix_cache(self) -> None:
        """Forget the cached prefix blocks nobody holds, before the requests submitted after this
        call (benchmarks measure each run from a cold cache)."""
        self._post("drop_prefix_cache", None)

    # ---------------------------------------------------------------- stats
    def stats(self) -> dict:
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t < 5.0]
        tps = 0.0
        if len(recent) >= 2:
            span = max(now - recent[0][0], 1e-3)
            tps = sum(n for _, n in recent[1:]) / span
        return {
            "tokens_generated": self.tokens_generated,
            "tokens_per_s": round(tps, 2),
            "batch_size": self.last_batch_size if recent else 0,
            "requests_running": len(self.scheduler.running),
            "requests_waiting": len(self.scheduler.waiting) + self._inbox.qsize(),
            "steps": self.steps,
            "burst_steps": self.burst_steps,
            "kv_blocks_free": self.cache.allocator.num_free,
            "kv_blocks_cached": self.cache.allocator.num_cached,
            "prefix_cache_hit_tokens": self.scheduler.prefix_hit_tokens,
            "admissions_deferred": self.scheduler.deferred,
            "preemptions": self.scheduler.preemptions,
            "spec_proposed_tokens": self.output.spec_proposed,
            "spec_accepted_tokens": self.output.spec_accepted,
            "spec_acceptance": (round(self.output.spec_accepted / self.output.spec_proposed, 4)
                                if self.output.spec_proposed else None),
            "speculative": self.speculative,
            "spec_k": self.spec_k if self.speculative else None,
            "spec_adaptive": self.spec_policy is not None,
            **(self.drafter.stats() if self.drafter is not None else {}),
            **(self.spec_policy.stats() if self.spec_policy is not None else {}),
            "kv_blocks_total": self.cache.num_blocks - 1,
            "device": str(self.device),
            "weights": self.model.weights,
            "threads": self._tuner.current if self._tuner is not None else torch.get_num_threads(),
            "urgent_pauses": self.urgent_pauses,
            "urgent_paused_s": round(self.urgent_paused_s, 3),
        }

    # ---------------------------------------------------------------- loop
    def _handle(self, kind, payload) -> None:
        if kind == "add":
            seq: Sequence = payload
            if not seq.prompt_ids:
                seq.emit("error", "empty prompt")
                return
            bad = next((t for t in seq.prompt_ids if not 0 <= t < self.config.vocab_size), None)
            if bad is not None:
                seq.emit("error", f"prompt token id {bad} is out of range for a vocabulary of {self.config.vocab_size}")
                return
            if len(seq.prompt_ids) >= self.max_model_len:
                seq.emit("error", f"prompt has {len(seq.prompt_ids)} tokens; max_model_len is {self.max_model_len}")
                return
            seq.generator = make_generator(seq.params.seed, self.device)
            seq.sample_seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(64)
            seq.decoder = IncrementalDecoder(self.tokenizer)
            seq.stopper = StopChecker(seq.params.stop)
            if seq.params.max_tokens <= 0:
                self.output.finish(seq, "length")
                return
            self._seqs[seq.id] = seq
            self.scheduler.add(seq)
        elif kind == "drop_prefix_cache":
            self.cache.allocator.drop_cached()
        elif kind == "cancel":
            seq = self._seqs.pop(payload, None)
            if seq is not None:
                self.scheduler.free(seq)
                if self.drafter is not None:
                    self.drafter.gc()
                seq.finish_reason = "cancelled"
                seq.emit("done", {"finish_reason": "cancelled"})

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            try:
                if not self.scheduler.has_work():
                    kind, payload = self._inbox.get()
                    self._handle(kind, payload)
                while True:
                    try:
                        kind, payload = self._inbox.get_nowait()
                    except queue.Empty:
                        break
                    self._handle(kind, payload)
                if self.scheduler.has_work():
                    self._yield_to_urgent()
                    self.step()
            except Exception as e:  # never let the thread die
                log.error("engine: step failed: %s\n%s", e, traceback.format_exc())
                for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                    self._seqs.pop(seq.id, None)
                    self.scheduler.free(seq)
                    seq.emit("error", f"engine error: {e}")
            finally:
                self.delivery.flush()

    def _yield_to_urgent(self) -> None:
        """Wait while urgent compute holds the cores (streamkit.cores), at most urgent_pause_s; after
        a wait, run at least as long before waiting again. Many sessions' urgent work can overlap
        without a gap: the engine keeps half of the time for their translations."""
        if self._urgent_due():
            waited = cores.wait_urgent(self.options.urgent_pause_s)
            self.urgent_pauses += 1
            self.urgent_paused_s += waited
            self._urgent_owed_until = time.monotonic() + waited

    def _urgent_due(self) -> bool:
        """Whether the engine waits for urgent compute before its next step (_yield_to_urgent)."""
        return (self.options.urgent_pause_s > 0 and cores.urgent() > 0
                and time.monotonic() >= self._urgent_owed_until)

    # ---------------------------------------------------------------- one step
    def _propose(self) -> tuple[int, bool, bool]:
        """Append a draft to every running sequence about to decode one token (n-gram lookup or
        the draft model, batched over the sequences), unless the policy says plain decoding is
        cheaper now. Returns (how many sequences decode this step, whether they drafted, whether
        the step is a steady one the policy should count: not a draft model's catch-up over a new
        prompt or over tokens decoded plainly, a one-off cost that would hide what a round costs)."""
        work = []
        for seq in self.scheduler.running:
            if seq.n_uncomputed != 1 or seq.draft:
                continue
            room = min(self.spec_k, seq.params.max_tokens - seq.n_generated - 1,
                       self.max_model_len - len(seq.tokens) - 1)
            if room > 0:
                work.append((seq, room))
        if not work:
            return 0, False, False
        if self.spec_policy is not None and not self.spec_policy.choose(len(work)):
            return len(work), False, True
        if self.drafter is not None:
            self.drafter.propose(work)
            return len(work), True, self.drafter.last_catch_up <= self.spec_k + 1
        for seq, room in work:
            draft = propose_ngram(seq.tokens, room)
            if draft:
                seq.draft = draft
                seq.tokens.extend(draft)
        return len(work), True, True

    def _burst_steps(self) -> int:
        """How many decode steps the next step runs in one native call: more than 1 only while every
        scheduled sequence decodes one token a step (greedy, or sampled: the kernels draw its tokens,
        sk_decode_sample) with nothing else to schedule or handle, up to BURST_MAX_STEPS and
        BURST_MAX_S at the measured step time, and none past a sequence's max_tokens or the model's
        length (a stop token ends the run in the native loop; a stop string or a finish before the
        run's end ends it at the next hand-over); 1 while the thread tuner explores."""
        if not self._bursts or self._decode_step_s is None:
            return 1
        self._burst_stop.clear()  # before the checks: whatever arrives after them ends the burst
        if self.scheduler.waiting or not self._inbox.empty() or self._urgent_due():
            return 1
        if self._tuner is not None and self._tuner.explores_next(len(self.scheduler.running)):
            return 1  # a step of the other thread count is all an exploration needs
        n = min(BURST_MAX_STEPS, int(BURST_MAX_S / self._decode_step_s))
        if self.spec_policy is not None:  # as many steps as the policy would run plain in a row
            n = min(n, self.spec_policy.plain_ahead(len(self.scheduler.running)))
        for seq in self.scheduler.running:
            if seq.n_uncomputed != 1:
                return 1
            n = min(n, seq.params.max_tokens - seq.n_generated, self.max_model_len - len(seq.tokens))
        return max(n, 1)

    def _observe_decode_step(self, seconds: float) -> None:
        old = self._decode_step_s
        self._decode_step_s = seconds if old is None else 0.7 * old + 0.3 * seconds

    def _decode_burst(self, n: int) -> bool:
        """Up to n decode steps of every running sequence in one native call, their tokens handed to
        the streams every decode_burst_ms as it runs (fewer steps when a stop token, a finished
        sequence or a message for the engine thread ends it); False, having run nothing, when the
        cache cannot hold the steps of one hand-over for all."""
        seqs = list(self.scheduler.running)
        every = max(1, int(self.options.decode_burst_ms / 1e3 / self._decode_step_s))
        if not all(self.cache.ensure_capacity(s.blocks, s.num_computed + n) for s in seqs):
            n = min(n, every)  # the pool is short: reserve no more than one hand-over's blocks
            if n < 2 or not all(self.cache.ensure_capacity(s.blocks, s.num_computed + n) for s in seqs):
                return False
        if self._tuner is not None:
            self._tuner.before(len(seqs))
        handed = 0
        handing_s = 0.0  # spent in hand-overs, not in steps

        def hand_over(toks) -> bool:  # between two steps of the native loop, on this thread
            nonlocal handed, handing_s
            t = time.perf_counter()
            self._accept_burst(seqs, toks[handed:])
            handed = len(toks)
            self.delivery.flush()
            handing_s += time.perf_counter() - t
            return any(s.state is not State.RUNNING for s in seqs)  # a stop string, say: schedule again

        t0 = time.perf_counter()
        tokens_before = self.tokens_generated
        args = ([s.tokens[s.num_computed] for s in seqs], [s.num_computed for s in seqs], [s.blocks for s in seqs], n,
                self.tokenizer.stop_ids, [not s.ignore_eos for s in seqs])
        run = dict(stop=self._burst_stop, deliver_every=every, on_tokens=hand_over)
        if all(plain_greedy(s.params) for s in seqs):
            toks = self.model.decode_greedy(*args, **run)
        else:
            toks = self.model.decode_sample(*args, [s.params for s in seqs], [s.sample_seed for s in seqs],
                                            [s.tokens for s in seqs], **run)
        per_step = (time.perf_counter() - t0 - handing_s) / len(toks)
        if self._tuner is not None:
            self._tuner.observe(per_step, len(seqs))
        self._observe_decode_step(per_step)
        self._accept_burst(seqs, toks[handed:])
        self.burst_steps += len(toks)
        self.last_batch_size = len(seqs)
        if self.spec_policy is not None:  # plain steps it chose, measured as step() measures them
            self.spec_policy.skip_plain(len(seqs), len(toks))
            seconds, produced = (time.perf_counter() - t0) / len(toks), (self.tokens_generated - tokens_before) / len(toks)
            for _ in range(len(toks)):
                self.spec_policy.observe(len(seqs), PLAIN, seconds, produced)
        if self.drafter is not None:
            self.drafter.gc()  # the draft KV of sequences that finished in the burst
        return True

    def _accept_burst(self, seqs: list[Sequence], toks) -> None:
        """A burst's tokens [steps, sequences] to their sequences: the K/V of each step's input is in
        the cache; a sequence finished earlier in the burst discards the rest."""
        if not len(toks):
            return
        now = time.perf_counter()
        produced = 0
        for row in toks.tolist():
            for seq, tok in zip(seqs, row):
                if seq.state is not State.RUNNING:
                    continue
                seq.num_computed += 1
                self.cache.register_computed(seq.tokens, seq.blocks, seq.block_keys, seq.num_computed)
                self.output.accept(seq, tok, now)
                produced += 1
        self.steps += len(toks)
        self._recent.append((now, produced))
        self.tokens_generated += produced

    def step(self) -> None:
        n = self._burst_steps()
        if n > 1 and self._decode_burst(n):
            return
        t_start = time.perf_counter()
        decoding, drafted, steady = self._propose() if self.speculative else (0, False, False)
        st = self.scheduler.schedule()
        if st.empty:
            # nothing can make progress: the pool is too small for what is held; drop one request
            if self.scheduler.running:
                seq = max(self.scheduler.running, key=lambda s: len(s.blocks))
            elif self.scheduler.waiting:
                seq = self.scheduler.waiting[0]
            else:
                return
            self._seqs.pop(seq.id, None)
            self.scheduler.free(seq)
            seq.emit("error", "request does not fit in the KV cache")
            return
        t_step = time.perf_counter()
        b, prefill, sampled = build_step(st, self.cache, self.device)
        # before the verify drops the drafts: a verify is a chunk too, a new prompt's has no draft
        new_prompts = self.spec_policy is not None and any(not seq.draft for seq, _ in prefill)
        if self._tuner is not None:
            self._tuner.before(int(b.ids.shape[0]))
        argmax = None  # the tokens of a step whose every sampled row is plain greedy, where the model finds them
        if self.graphs is not None and not st.prefill and self.graphs.can_run(b.n_decode):
            logits = self.graphs.run(b.ids, b.positions, b.slots, b.block_tables, b.ctx_lens)
        elif self._native_steps and sampled and all(not seq.draft and plain_greedy(seq.params) for seq, _ in sampled):
            logits, argmax = None, self.model.forward_argmax(b)
        else:
            logits = self.model.forward(b)
        if self._tuner is not None:
            self._tuner.observe(time.perf_counter() - t_step, int(b.ids.shape[0]))
        if self._bursts and not st.prefill:
            self._observe_decode_step(time.perf_counter() - t_step)
        for seq in st.decode:
            seq.num_computed += 1
            self.cache.register_computed(seq.tokens, seq.blocks, seq.block_keys, seq.num_computed)
        for seq, n in prefill:
            seq.num_computed += n
            if not seq.draft:  # a draft's blocks are registered once it is verified
                self.cache.register_computed(seq.tokens, seq.blocks, seq.block_keys, seq.num_computed)
        self.steps += 1
        self.last_batch_size = len(st.decode) + len(st.prefill)
        if not sampled:
            return
        now = time.perf_counter()
        plain = [seq for seq, rows in sampled if not seq.draft]
        row = 0
        plain_rows, drafts = [], []
        for seq, rows in sampled:
            (drafts if seq.draft else plain_rows).append((seq, row, rows))
            row += rows
        produced = 0
        if plain:
            idx = [r for _, r, _ in plain_rows]
            if argmax is not None:
                toks = argmax
            else:
                rows_logits = logits if len(idx) == logits.shape[0] else logits[torch.tensor(idx, device=logits.device)]
                if self._native_steps:  # overwrites rows_logits: all of them only where no draft reads them
                    toks = self.model.sample_rows(rows_logits, [s.params for s in plain], [s.sample_seed for s in plain],
                                                  [len(s.tokens) - 1 for s in plain], [s.tokens for s in plain])
                else:
                    toks = sample_batch(rows_logits, [s.params for s in plain], [s.tokens for s in plain],
                                        [s.generator for s in plain])
            for seq, tok in zip(plain, toks):
                if seq.state is State.RUNNING:
                    self.output.accept(seq, tok, now)
            produced += len(plain)
        for seq, r0, rows in drafts:
            produced += self.output.verify(seq, logits[r0:r0 + rows], now)
        if self.drafter is not None:
            self.drafter.gc()  # the draft KV of sequences that finished this step
        self._recent.append((now, produced))
        self.tokens_generated += produced
        if self.spec_policy is not None and decoding and steady and not new_prompts:
            self.spec_policy.observe(decoding, drafted, time.perf_counter() - t_start, produced)
