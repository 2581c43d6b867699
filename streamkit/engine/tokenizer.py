"""Byte-level BPE tokenizer (GPT-2 style) built from GGUF metadata.

Uses the `tokenizers` library when installed (fast, Rust); otherwise a pure-Python BPE
with the same pre-tokenizer rules. Special/control tokens are matched verbatim in text.
"""
from __future__ import annotations

import codecs
import logging
from functools import lru_cache

log = logging.getLogger("streamkit.engine")

# llama.cpp pre-tokenizer regexes by `tokenizer.ggml.pre`
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
# llama.cpp's qwen2 pre-tokenizer: llama3's with single digits
_QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
          r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_PRE = {
    "smollm": [r"\p{N}", _GPT2],
    "starcoder": [r"\p{N}", _GPT2],
    "refact": [r"\p{N}", _GPT2],
    "gpt2": [_GPT2],
    "default": [_GPT2],
    "llama3": [_LLAMA3],
    "llama-bpe": [_LLAMA3],
    "qwen2": [_QWEN2],
}
_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>")



@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class Tokenizer:
    def __init__(self, metadata: dict, prefer_fast: bool = True):
        model = metadata.get("tokenizer.ggml.model", "gpt2")
        if model != "gpt2":
            raise NotImplementedError(f"tokenizer model {model!r} (only byte-level BPE 'gpt2' is supported)")
        self.tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
        self.token_type: list[int] = list(metadata.get("tokenizer.ggml.token_type", [1] * len(self.tokens)))
        merges = list(metadata.get("tokenizer.ggml.merges", []))
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self._bpe = lru_cache(maxsize=65536)(self._bpe_uncached)  # per instance: a method cache would keep self alive
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        self.pad_id = metadata.get("tokenizer.ggml.padding_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
        eot = metadata.get("tokenizer.ggml.eot_token_id")
        self.stop_ids = {i for i in (self.eos_id, eot) if i is not None}

        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE:
            raise NotImplementedError(f"pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE))})")
        self.pre_patterns = _PRE[pre]
        # control (3) and user-defined (4) tokens are matched literally in input text
        self.special = {t: i for i, t in enumerate(self.tokens) if self.token_type[i] in (3, 4)}
        self.control_ids = {i for i, tt in enumerate(self.token_type) if tt == 3}
        # chat models end a turn with <|im_end|> / <|eot_id|> but may also emit the base model's end token
        self.stop_ids |= {i for i in self.control_ids if self.tokens[i] in _END_TOKENS}
        self._merge_rank = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self._b2u = bytes_to_unicode()
        self._u2b = {v: k for k, v in self._b2u.items()}
        import regex

        self._pre_re = [regex.compile(p) for p in self.pre_patterns]
        self._special_re = (regex.compile("|".join(regex.escape(s) for s in sorted(self.special, key=len, reverse=True)))
                            if self.special else None)
        self._token_bytes: list[bytes] = [self._to_bytes(i) for i in range(len(self.tokens))]
        self._fast = None
        if prefer_fast:
            try:
                self._fast = self._build_fast(merges)
            except Exception as e:  # pragma: no cover - optional
                log.debug("fast tokenizer unavailable: %s", e)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def _to_bytes(self, i: int) -> bytes:
        t = self.tokens[i]
        if self.token_type[i] in (3, 4):
            return b"" if self.token_type[i] == 3 else t.encode("utf-8")
        try:
            return bytes(self._u2b[c] for c in t)
        except KeyError:
            return t.encode("utf-8")

    def _build_fast(self, merges):
        from tokenizers import Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTok

        bpe = models.BPE(vocab=self.vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                         ignore_merges=False)
        tok = HFTok(bpe)
        pres = [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in self.pre_patterns]
        pres.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(pres)
        tok.decoder = decoders.ByteLevel()
        return tok

    # ---- BPE (pure python) ----
    def _bpe_uncached(self, word: str) -> tuple[int, ...]:
        parts = list(word)
        rank = self._merge_rank
        while len(parts) > 1:
            best, bi = None, -1
            for j in range(len(parts) - 1):
                r = rank.get((parts[j], parts[j + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, j
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        out = []
        for p in parts:
            i = self.vocab.get(p)
            if i is None:  # fall back to single byte symbols
                out.extend(self.vocab[c] for c in p if c in self.vocab)
            else:
                out.append(i)
        return tuple(out)

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        if self._fast is not None:
            return self._fast.encode(text, add_special_tokens=False).ids
        pieces = [text]
        for rx in self._pre_re:
            nxt = []
            for p in pieces:
                pos = 0
                for m in rx.finditer(p):
                    if m.start() > pos:
                        nxt.append(p[pos:m.start()])
                    nxt.append(m.group(0))
                    pos = m.end()
                if pos < len(p):
                    nxt.append(p[pos:])
            pieces = [p for p in nxt if p]
        ids: list[int] = []
        for p in pieces:
            ids.extend(self._bpe("".join(self._b2u[b] for b in p.encode("utf-8"))))
        return ids

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.append(self.bos_id)
        if parse_special and self._special_re is not None:
            pos = 0
            for m in self._special_re.finditer(text):
                ids.extend(self._encode_plain(text[pos:m.start()]))
                ids.append(self.special[m.group(0)])
                pos = m.end()
            ids.extend(self._encode_plain(text[pos:]))
        else:
            ids.extend(self._encode_plain(text))
        return ids

    def token_bytes(self, i: int) -> bytes:
        return self._token_bytes[i] if 0 <= i < len(self._token_bytes) else b""

    def decode(self, ids, skip_special: bool = True) -> str:
        b = b"".join(self._token_bytes[i] if (not skip_special or i not in self.control_ids)
                     else b"" for i in ids)
        return b.decode("utf-8", "replace")


class IncrementalDecoder:
    """Token ids -> text pieces, never splitting a UTF-8 character."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self.tok.token_bytes(token_id))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
