"""NativeLlamaModel: the Llama forward on the native kernels (one C call per step).

Same contract as `LlamaModel.forward(StepBatch)`; weights stay in the GGUF's own block formats.
Two modes:
  native       fp32 activations, float16 KV cache; steps of at least `bf16_min_rows` rows multiply in
               bf16 (fp32 accumulation) on AMX tiles (each operand as two bf16 terms) or with
               vdpbf16ps, or from `int8_min_rows` with
               int8 VNNI on two-term int8 activations (avx2: int16 activations),
               where the path has them (see streamkit.engine.native), fewer rows dequantize into
               fp32 FMAs. The CPU default.
  native-fp32  fp32 FMAs for every step and a float32 KV cache: the same arithmetic as the fp32
               reference up to summation order (greedy output equals transformers' token for token on
               the reference prompts).
"""
from __future__ import annotations

import logging
import os
from typing import Callable

import numpy as np
import torch

from streamkit.engine import native
from streamkit.engine.arena import HugePageArena
from streamkit.engine.gguf_loader import GGUFModel
from streamkit.engine.model import StepBatch, rope_angles
from streamkit.engine.native.sampling import sample_rows, sampling_arrays
from streamkit.engine.native.weights import PackedWeight, greedy_head_bytes, pack, stack
from streamkit.engine.paged_attention import default_scale
from streamkit.engine.params import SamplingParams

log = logging.getLogger("streamkit.engine")

MODES = ("native", "native-fp32")
# Rows per step from which the AMX path (three bf16 products a block, sk_bf16.h) beats fp32 FMAs:
# SmolLM2's gate / down matrices, 2 threads, Intel Xeon: 7 rows 71 / 73 us in fp32 FMAs against
# 81 / 105 on AMX; 8 rows, where fp32 switches to strips, 108 / 122 against 82 / 103.
AMX_MIN_ROWS = 8
# The same for vdpbf16ps (the avx512 path on a CPU with AVX512_BF16 and no AMX): it pads rows to
# tiles of 16, and on the Xeon measured here one vdpbf16ps (32 multiply-adds) costs as much as 3.3
# fp32 FMAs (16 each), so it ties the fp32 strips at 16 rows (gate+up matmul, 1 thread: 602 vs 628
# us) and loses below (8 rows: 616 vs 390 us).
DPBF16_MIN_ROWS = 12
# On AMD Zen (native.fast_dpbf16) vdpbf16ps costs about one FMA: from 8 rows it beats the fp32
# strips on every matmul of a layer (Zen 5, 1 thread, 8 rows: gate+up 152 vs 412 us; at 6 rows
# they tie and the fp32 down projection is faster, 73 vs 90 us).
DPBF16_MIN_ROWS_AMD = 8
# The int8 path (avx512 where the CPU has AVX512_VNNI; sk_int8.h): activations quantized
# to int8 per block of 32 values. One term (llama.cpp's scheme): 2.7x the fp32 strips at 16 rows
# here (gate+up, 1 thread: 221 vs 628 us) but it fails the greedy-agreement gate (72 of 91 steps
# of the test prompts; docs/engine.md). Two terms (the second quantizes what the first left, ~15
# bits): 2x the fp32 strips (284 vs 581 us) and logits within 0.02 of fp32 (bf16: 0.26), so that is
# the default (native.int8_terms); STREAMKIT_NATIVE_INT8=1 picks one term, 0 turns the path off
# (vdpbf16ps then, where the CPU has it). It pads rows to tiles
# of 16: the fp32 path is faster below 8 rows (6 rows: 229 vs 274 us).
INT8_MIN_ROWS = 8
# The int16 path (avx2, sk_int16.h: int16 activations, vpdpwssd with AVX-VNNI, else vpmaddwd) pads rows
# to tiles of 8 and beats the fp32 strips from 5 rows (Zen 5 built as a CPU without AVX-VNNI, 2
# threads, every matmul of a step: SmolLM2 5 rows 10.6 vs 11.6 ms, 16 rows 20.5 vs 45.1; the 1.5B 5
# rows 158 vs 183 ms). With AVX-VNNI it also beats two-term int8 on ymm (16 rows 15.8 vs 17.6 ms).
INT16_MIN_ROWS = 5
INT8_ALL, INT8_TWO_TERMS = 31, 32  # sk_forward's i8_mask: every matmul (qkv, o, gate/up, down, head)
# Steps of 1-8 rows (decode at batch 1-8, a speculative verify) on Q4_K / Q6_K weights,
# and of 1-2 rows on Q4_1 / Q4_0 / Q8_0: llama.cpp's int8 schemes (sk_gemv.h), two activation terms
# (one where INT8_TWO_TERMS is clear), on every instruction set; also a batched step's last 1-4 rows.
# STREAMKIT_NATIVE_GEMV=0 turns it off (fp32 FMAs, as before).
INT8_GEMV = 64


def _raise_for(rc: int) -> None:
    """The error of a native forward's return code (0: none)."""
    if rc == -2:
        raise ValueError("token id or position out of range for this model")
    if rc == -4:
        raise RuntimeError("the native model's fused QKV or gate+up lacks parts (sk_model_add_part)")
    if rc != 0:
        raise MemoryError("native forward could not allocate its scratch buffers")


class StopFlag:
    """A word the native decode loop reads after each step: set() from any thread ends a running
    decode_greedy / decode_sample after the step under way; the caller clear()s it before the next."""

    def __init__(self) -> None:
        self.word = np.zeros(1, np.int32)

    def set(self) -> None:
        self.word[0] = 1

    def clear(self) -> None:
        self.word[0] = 0

    def is_set(self) -> bool:
        return bool(self.word[0])


class NativeLlamaModel:
    def __init__(self, gm: GGUFModel, weights: str = "native", bf16_min_rows: int | None = None,
                 isa: str | None = None, int8_min_rows: int | None = None, int8_terms: int | None = None):
        """isa: the kernels' instruction-set path (native.ISAS); None: STREAMKIT_NATIVE_ISA, else the best.
        int8_terms: activation terms of the batched int8 kernel (2, 1; 0: not used), and with 1 of
        the few-row kernel too; None: native.int8_terms(). One term is for drafts, which the target
        checks anyway."""
        if weights not in MODES:
            raise ValueError(f"unknown native weight mode {weights!r}; expected one of {MODES}")
        self.isa = native.resolve_isa(isa)
        lib = native.load(self.isa) if self.isa else None
        if lib is None:
            raise RuntimeError(f"native kernels unavailable: {native.error(self.isa)}")
        if not gm.blocks:
            raise ValueError("the native model needs the GGUF loaded with raw=True")
        cfg = self.cfg = gm.config
        if cfg.rope_dim is not None and cfg.rope_dim != cfg.head_dim:
            raise NotImplementedError("partial rotary embeddings are not supported")
        self._lib = lib
        self.device = torch.device("cpu")
        self.weights = weights
        self.act_dtype = torch.float32
        # the KV cache the engine should allocate: float16 halves the bytes attention reads per step;
        # native-fp32 keeps float32 so it stays the fp32 reference's arithmetic
        self.kv_dtype = torch.float32 if weights == "native-fp32" else torch.float16
        self.attn_backend = "native"
        caps = native.caps(self.isa)
        default_rows = (AMX_MIN_ROWS if caps & native.CAP_AMX
                        else DPBF16_MIN_ROWS_AMD if native.fast_dpbf16() else DPBF16_MIN_ROWS)
        use_bf16 = weights == "native" and bool(caps & native.CAP_BF16)
        self.bf16_min_rows = (bf16_min_rows or default_rows) if use_bf16 else 0
        terms = native.int8_terms() if int8_terms is None else int8_terms
        if terms not in (0, 1, 2):
            raise ValueError(f"int8_terms must be 0, 1 or 2, got {int8_terms!r}")
        use_int8 = weights == "native" and bool(caps & (native.CAP_INT8 | native.CAP_INT16)) and terms > 0
        default_int8 = INT8_MIN_ROWS if caps & native.CAP_INT8 else INT16_MIN_ROWS
        self.int8_min_rows = (int8_min_rows or default_int8) if use_int8 else 0
        use_gemv = weights == "native" and os.environ.get("STREAMKIT_NATIVE_GEMV", "1") != "0"
        self.int8_mask = INT8_ALL | (INT8_TWO_TERMS if terms != 1 else 0) | (INT8_GEMV if use_gemv else 0)
        B, T = gm.blocks, gm.tensors

        # the packed weights move into one arena of (where Linux grants them) 2 MB pages, a tensor at
        # a time, so that a model's weights are never held twice (streamkit/engine/arena.py)
        self._arena = HugePageArena()

        def home(p: PackedWeight) -> PackedWeight:
            return PackedWeight(p.fmt, p.n, p.k, self._arena.place(p.qs), self._arena.place(p.sc))

        def w(name: str) -> PackedWeight:
            return home(pack(*B[name], lib))

        def fused(*names: str) -> list[PackedWeight]:
            return [home(part) for part in stack([pack(*B[name], lib) for name in names])]

        def vec(name: str) -> np.ndarray:
            return np.ascontiguousarray(T[name], dtype=np.float32)

        self._embed = w("token_embd.weight")
        self._head = w("output.weight") if "output.weight" in B else self._embed
        self._out_norm = vec("output_norm.weight")
        # cos/sin taken from the same complex table the fp32 torch path multiplies with
        cis = torch.polar(torch.ones(1), rope_angles(cfg, T.get("rope_freqs.weight")))
        self._cos = np.ascontiguousarray(cis.real.numpy())
        self._sin = np.ascontiguousarray(cis.imag.numpy())
        self._layers = []
        self._biases: list[np.ndarray] = []
        P = native.ptr
        self._m = lib.sk_model_new(cfg.n_layers, cfg.dim, cfg.ffn_dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                   cfg.vocab_size, cfg.norm_eps, default_scale(cfg.head_dim))
        if not self._m:
            raise NotImplementedError(f"the native kernels do not support this shape: {cfg}")
        lib.sk_model_set_globals(self._m, self._embed.fmt, P(self._embed.qs), P(self._embed.sc), self._head.fmt,
                                 P(self._head.qs), P(self._head.sc), P(self._out_norm), P(self._cos), P(self._sin),
                                 self._cos.shape[0])
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            layer = (vec(p + "attn_norm.weight"), vec(p + "ffn_norm.weight"),
                     fused(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
                     w(p + "attn_output.weight"),
                     fused(p + "ffn_gate.weight", p + "ffn_up.weight"),
                     w(p + "ffn_down.weight"))
            if cfg.qkv_bias:
                bias = np.concatenate([vec(p + "attn_q.bias"), vec(p + "attn_k.bias"), vec(p + "attn_v.bias")])
                self._biases.append(bias)
                lib.sk_model_set_qkv_bias(self._m, i, P(bias))
            self._layers.append(layer)  # the C side points into these arrays: keep them alive
            an, fn, qkv, o, gu, down = layer
            lib.sk_model_set_layer(self._m, i, P(an), P(fn), o.fmt, P(o.qs), P(o.sc), down.fmt, P(down.qs), P(down.sc))
            for which, parts in enumerate((qkv, gu)):
                for part in parts:
                    if lib.sk_model_add_part(self._m, i, which, part.fmt, part.n, P(part.qs), P(part.sc)):
                        raise NotImplementedError(f"the native kernels do not support layer {i}'s "
                                                  f"{('QKV', 'gate+up')[which]} parts {[(q.fmt, q.n) for q in parts]}")
        self._kv_cache = None
        # True (set by EngineCore, which samples before the next step): forward returns a view of one
        # reused buffer, valid until the next forward; a fresh [64, 49152] tensor per step cost page
        # faults on 12 MB
        self.reuse_logits = False
        self._logits = torch.empty(0)
        log.info("engine: native model ready (%s on %s, %.1f MB of weights, bf16 from %s rows, int8 from %s)",
                 weights, native.describe(self.isa), self.weight_bytes / 1e6, self.bf16_min_rows or "never",
                 self.int8_min_rows or "never")

    def __del__(self):
        m, self._m = getattr(self, "_m", None), None
        if m:
            self._lib.sk_model_free(m)

    # ------------------------------------------------------------------ cache
    @property
    def kv_cache(self):
        return self._kv_cache

    @kv_cache.setter
    def kv_cache(self, cache) -> None:
        if cache is not None:
            if cache.k.dtype not in (torch.float32, torch.float16, torch.int8) or cache.k.device.type != "cpu":
                raise ValueError(f"the native kernels need a float32, float16 or int8 KV cache on the CPU, not "
                                 f"{cache.k.dtype} on {cache.k.device}")
            scales = (cache.k_scale, cache.v_scale) if cache.k.dtype == torch.int8 else (None, None)
            rc = self._lib.sk_model_set_kv(self._m, native.ptr(cache.k), native.ptr(cache.v), cache.k.shape[2],
                                           cache.block_size, cache.k.element_size(),
                                           *(native.ptr(p) if p is not None else None for p in scales))
            if rc == -1:
                raise ValueError(f"the native kernels need a KV block size that is a multiple of 16, "
                                 f"not {cache.block_size}")
            if rc:
                raise ValueError("an int8 KV cache needs its scale pools (PagedKVCache k_scale / v_scale)")
        self._kv_cache = cache

    # ------------------------------------------------------------------ info
    @property
    def weight_bytes(self) -> int:
        """The packed matrices' bytes (the embedding aside: a step reads only its rows)."""
        return self._head.nbytes + self._layer_bytes()

    @property
    def weight_bytes_per_step(self) -> int:
        """The weight bytes a greedy batch-1 step reads: the head's as its 4-bit copy where the
        kernels keep one (sk_head4.h)."""
        return greedy_head_bytes(self._head) + self._layer_bytes()

    def _layer_bytes(self) -> int:
        return sum(sum(p.nbytes for p in qkv + gu) + o.nbytes + down.nbytes
                   for _an, _fn, qkv, o, gu, down in self._layers)

    # ------------------------------------------------------------------ forward
    def _tables(self, b: StepBatch) -> tuple[np.ndarray, np.ndarray]:
        """One block table per sequence in the step and, per token, the row of its sequence."""
        T = b.ids.shape[0]
        bs = self._kv_cache.block_size
        tok_seq = np.empty(T, np.int32)
        rows: list[np.ndarray] = []
        if b.n_decode:
            tok_seq[:b.n_decode] = np.arange(b.n_decode, dtype=np.int32)
            rows.extend(b.block_tables.numpy())
        slots = b.slots.numpy()
        for t0, n, _start, prev in b.prefills:
            seq_slots = slots[t0:t0 + n] if prev is None else np.concatenate([prev.numpy(), slots[t0:t0 + n]])
            tok_seq[t0:t0 + n] = len(rows)
            rows.append(seq_slots[::bs] // bs)  # the slot of every block's first position names the block
        width = max(len(r) for r in rows)
        tables = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tables[i, :len(r)] = r
        return tables, tok_seq

    def _step_args(self, b: StepBatch) -> tuple:
        """sk_forward's arguments for a step, up to its logits (kept alive by the tuple), and the
        logit rows"""
        tables, tok_seq = self._tables(b)
        T = b.ids.shape[0]
        ids = b.ids.numpy().astype(np.int32)
        pos = b.positions.numpy().astype(np.int32)
        slots = np.ascontiguousarray(b.slots.numpy(), dtype=np.int64)
        rows = (np.arange(T, dtype=np.int32) if b.logit_rows is None
                else b.logit_rows.numpy().astype(np.int32))
        P = native.ptr
        return (self._m, T, P(ids), P(pos), P(slots), P(tok_seq), P(tables), tables.shape[1], len(rows),
                P(rows)), (ids, pos, slots, tok_seq, tables, rows)

    def _logits_for(self, rows: int, reuse: bool) -> torch.Tensor:
        shape = (rows, self.cfg.vocab_size)
        if not reuse:
            return torch.empty(shape, dtype=torch.float32)
        if self._logits.shape[0] < rows:
            self._logits = torch.empty(shape, dtype=torch.float32)
        return self._logits[:rows]

    @torch.inference_mode()
    def forward(self, b: StepBatch) -> torch.Tensor:
        """float32 logits [S, V] for b.logit_rows (all rows when None)."""
        args, keep = self._step_args(b)
        logits = self._logits_for(len(keep[-1]), self.reuse_logits)
        rc = self._lib.sk_forward(*args, native.ptr(logits), self.bf16_min_rows, self.int8_min_rows,
                                  self.int8_mask, torch.get_num_threads())
        _raise_for(rc)
        return logits

    @torch.inference_mode()
    def forward_argmax(self, b: StepBatch) -> list[int]:
        """The index of the largest logit of each of b.logit_rows (the first, on a tie), as greedy
        decoding picks it, without every logit: from 5 rows on, on a Q8_0 head, the kernels find it
        from a cheap approximation of the logits and its error bound, then compute the few logits
        that bound cannot rule out exactly (sk_greedy.h); below 5 rows from the logits of a 4-bit copy
        of the head and the columns within 8 standard deviations of its error (sk_head4.h)."""
        args, keep = self._step_args(b)
        rows = len(keep[-1])
        tokens = np.empty(rows, np.int32)
        rc = self._lib.sk_forward_argmax(*args, native.ptr(self._logits_for(rows, True)), native.ptr(tokens),
                                         self.bf16_min_rows, self.int8_min_rows, self.int8_mask,
                                         torch.get_num_threads())
        _raise_for(rc)
        return tokens.tolist()

    def _decode_args(self, ids: list[int], positions: list[int], block_tables: list[list[int]], stop_ids: list[int],
                     may_stop: list[bool]) -> tuple:
        """sk_decode_greedy's arguments from ids to may_stop: ids, positions, tables, its width, stops (a
        placeholder where there are none), their count, may"""
        width = max(len(t) for t in block_tables)
        tables = np.zeros((len(ids), width), np.int32)
        for i, t in enumerate(block_tables):
            tables[i, :len(t)] = t
        return (np.asarray(ids, np.int32), np.asarray(positions, np.int32), tables, width,
                np.asarray(sorted(stop_ids) or [0], np.int32), len(stop_ids), np.asarray(may_stop, np.uint8))

    def sample_rows(self, logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], positions: list[int],
                    prevs: list[list[int]]) -> list[int]:
        """Each row's token from logits [S, V] (overwritten): native.sampling.sample_rows."""
        return sample_rows(self._lib, logits, params, seeds, positions, prevs)

    @torch.inference_mode()
    def decode_greedy(self, ids: list[int], positions: list[int], block_tables: list[list[int]], n_steps: int,
                      stop_ids: list[int], may_stop: list[bool], stop: StopFlag | None = None, deliver_every: int = 0,
                      on_tokens: Callable[[np.ndarray], bool] | None = None) -> np.ndarray:
        """Up to n_steps greedy decode steps of len(ids) sequences in one native call (sk_decode_greedy):
        sequence i feeds ids[i] at positions[i] and then each token it produces. Its block table must
        cover positions[i] + n_steps - 1. Stops early after a step in which a sequence with may_stop
        produced one of stop_ids, or after one that found `stop` set. Every `deliver_every` steps short
        of the last, on_tokens(the tokens so far, [steps, sequences]) runs on this thread between two
        steps (it must not call the kernels: their threads are this call's); a true return ends the
        call there. Returns the tokens, [steps run, sequences]."""
        args = self._decode_args(ids, positions, block_tables, stop_ids, may_stop)
        return self._decode(self._lib.sk_decode_greedy, n_steps, args, (), stop, deliver_every, on_tokens)

    @torch.inference_mode()
    def decode_sample(self, ids: list[int], positions: list[int], block_tables: list[list[int]], n_steps: int,
                      stop_ids: list[int], may_stop: list[bool], params: list[SamplingParams], seeds: list[int],
                      prevs: list[list[int]], stop: StopFlag | None = None, deliver_every: int = 0,
                      on_tokens: Callable[[np.ndarray], bool] | None = None) -> np.ndarray:
        """decode_greedy with each sequence's tokens drawn as sample_rows draws them (sk_decode_sample):
        every logit of each step, so a decode burst of sampled sequences runs in one native call."""
        args = self._decode_args(ids, positions, block_tables, stop_ids, may_stop)
        arrays = sampling_arrays(params, seeds, prevs, self.cfg.vocab_size)
        P = native.ptr
        sampling = (*(P(a) for a in arrays[:5]), P(arrays[5]) if arrays[5] is not None else None)
        return self._decode(self._lib.sk_decode_sample, n_steps, args, sampling, stop, deliver_every, on_tokens)

    def _decode(self, entry, n_steps: int, args: tuple, sampling: tuple, stop: StopFlag | None, deliver_every: int,
                on_tokens: Callable[[np.ndarray], bool] | None) -> np.ndarray:
        """One sk_decode_greedy / sk_decode_sample call: _decode_args' arrays, the sampling arrays
        (decode_sample's), then the scratch, the output and the loop's stop flag and hand-overs."""
        ids_a, pos_a, tables, width, stops, n_stop, may = args
        S = len(ids_a)
        out = np.empty((n_steps, S), np.int32)
        failed: list[BaseException] = []

        def deliver(steps: int) -> int:
            try:
                return int(bool(on_tokens(out[:steps])))
            except BaseException as e:  # ctypes would print it and carry on: end the loop, raise it below
                failed.append(e)
                return 1

        hand_over = native.DELIVER(deliver) if on_tokens is not None and deliver_every > 0 else native.DELIVER()
        P = native.ptr
        rc = entry(self._m, S, n_steps, P(ids_a), P(pos_a), P(tables), width, P(stops), n_stop, P(may), *sampling,
                   P(self._logits_for(S, True)), P(out), self.bf16_min_rows, self.int8_min_rows, self.int8_mask,
                   torch.get_num_threads(), P(stop.word) if stop is not None else None,
                   deliver_every if hand_over else 0, hand_over)
        if failed:
            raise failed[0]
        return self._decoded(rc, n_steps, out)

    @staticmethod
    def _decoded(rc: int, n_steps: int, out: np.ndarray) -> np.ndarray:
        if rc == -3:
            raise ValueError(f"a block table does not cover {n_steps} decode steps")
        _raise_for(min(rc, 0))
        return out[:rc]
