"""Shared by the correctness test and the benchmark: prompts and the transformers reference."""
from __future__ import annotations

import logging
import os

log = logging.getLogger("streamkit.engine")

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "Explain photosynthesis in one sentence.",
    "Translate to Spanish: Good morning, how are you?",
    "List three primary colors.",
    "What is 17 times 23?",
    "Give me a short motivational quote.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat to someone who has never seen one.",
    "What are the benefits of regular exercise?",
    "Write a Python function that reverses a string.",
    "Summarize the plot of Cinderella in two sentences.",
    "Why is the sky blue?",
    "Name a famous scientist and one discovery.",
    "How do I boil an egg?",
    "Tell me a joke about computers.",
    "What is the difference between weather and climate?",
    "Suggest a name for a pet goldfish.",
    "Convert 100 degrees Fahrenheit to Celsius.",
    "What does HTTP stand for?",
    "Write the opening line of a mystery novel.",
    "What is the tallest mountain in the world?",
    "Explain what a black hole is to a child.",
    "Give two tips for learning a new language.",
]


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def load_hf(model_path: str, dtype=None):
    """transformers' own GGUF loader (dequantizes to float32)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    d, f = os.path.split(os.path.abspath(model_path))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype or torch.float32)
    model.eval()
    return model


def hf_greedy(model, ids: list[int], n: int, eos_id: int | None) -> list[int]:
    """Greedy continuation of `ids`, stopping after n tokens or at EOS (EOS not included)."""
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id,
                             top_p=None, top_k=None, temperature=None)
    gen = out[0, len(ids):].tolist()
    if eos_id is not None and eos_id in gen:
        gen = gen[:gen.index(eos_id)]
    return gen


def hf_first_logits(model, ids: list[int]):
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()
