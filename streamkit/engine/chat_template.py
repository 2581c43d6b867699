"""Render chat messages with the GGUF's Jinja chat template."""
from __future__ import annotations

from functools import lru_cache

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


class ChatTemplate:
    def __init__(self, template: str | None, bos_token: str = "", eos_token: str = ""):
        self.template = template or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_metadata(cls, metadata: dict, tokens: list[str] | None = None) -> "ChatTemplate":
        tokens = tokens or metadata.get("tokenizer.ggml.tokens", [])
        bos = metadata.get("tokenizer.ggml.bos_token_id")
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        return cls(metadata.get("tokenizer.chat_template"),
                   tokens[bos] if bos is not None and bos < len(tokens) else "",
                   tokens[eos] if eos is not None and eos < len(tokens) else "")

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError("each message must be a dict with 'role' and 'content'")
        return _compile(self.template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                              bos_token=self.bos_token, eos_token=self.eos_token)
