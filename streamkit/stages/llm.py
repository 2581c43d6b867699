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

Models: `model:` takes a GGUF path or a packaged model's name. Without one the stage uses
SmolLM2-135M-Instruct (fast; follows short answer prompts, but its translations are poor);
pipelines/dubbing.yaml names `qwen2.5-coder-1.5b` (the `translate` extra), which translates well.
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
    # chosen with `streamkit bench translate` (Qwen2.5-Coder-1.5B, 47 sentences; docs/engine.md):
    # chrF 67.8 for the earlier two-line prompt with 2 examples, 70.5 for this one with 8 labelled examples
    "translate": ("You are a professional English-to-{language} interpreter for live meetings and everyday "
                  "conversation; your {language} is read aloud by a speech synthesizer. Translate the user's "
                  "sentence into natural, faithful {language}: keep every detail (names, days, times, numbers, "
                  "tense) and write numbers and times in words. Reply with the {language} translation only."),
    "summarize": "You summarise text. Reply with a one-sentence summary of the user's text, nothing else.",
    "answer": ("You are a friendly voice assistant. Answer the user's question in one or two short, "
               "plain sentences that sound natural when spoken aloud."),
}
TRANSLATE_REQUEST = "Translate to {language}: {text}"
# few-shot examples (none of them in the benchmark's sentences); with the system prompt they are one
# prefix that the engine's prefix cache keeps, so they cost nothing per utterance after the first
TRANSLATE_EXAMPLES = {
    "Spanish": [("Good morning, how are you?", "Buenos días, ¿cómo estás?"),
                ("The house is very big.", "La casa es muy grande."),
                ("Yesterday we talked about it on Tuesday afternoon.", "Ayer hablamos de ello el martes por la tarde."),
                ("I agree, let's do it next week.", "Estoy de acuerdo, hagámoslo la semana que viene."),
                ("Sorry, could you repeat that?", "Perdón, ¿podrías repetir eso?"),
                ("The report is ready, I'll send it to you this afternoon.",
                 "El informe está listo, te lo envío esta tarde."),
                ("How much time do we have left?", "¿Cuánto tiempo nos queda?"),
                ("My brother bought a new car last month.", "Mi hermano compró un coche nuevo el mes pasado.")],
    "French": [("Good morning, how are you?", "Bonjour, comment allez-vous ?"),
               ("The house is very big.", "La maison est très grande.")],
}


def chat_messages(mode: str, language: str, text: str, system: str | None = None,
                  history: list[dict[str, str]] | None = None) -> list[dict[str, str]]:
    """The built-in chat prompt of `mode` (translate: system prompt plus few-shot examples)."""
    msgs = [{"role": "system", "content": (system or SYSTEM_PROMPTS[mode]).replace("{language}", language)}]

    def request(t: str) -> str:
        return TRANSLATE_REQUEST.format(language=language, text=t) if mode == "translate" and not system else t

    if not system and mode == "translate":
        for en, tr in TRANSLATE_EXAMPLES.get(language, []):
            msgs += [{"role": "user", "content": request(en)}, {"role": "assistant", "content": tr}]
    return msgs + list(history or []) + [{"role": "user", "content": request(text)}]


@register_stage("llm")
class LLM(Stage):
    class Config(StageConfig):
        type: Literal["llm"] = "llm"
        engine: str = "local"  # local | redis://host:port/db
        engine_prefix: str | None = None  # Redis key prefix of the engine workers (default: theirs)
        # a GGUF path or a packaged model's name (qwen2.5-coder-1.5b, smollm2-135m); default: smollm2-135m
        model: str | None = None
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
        return chat_messages(c.mode, self.language_name, text, c.system,
                             self._history[-2 * c.history:] if c.history else None)

    def sampling_params(self) -> Any:
        """The engine sampling parameters this stage generates with (from its config)."""
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
        async with aclosing(self.engine.generate(prompt, self.sampling_params())) as stream:
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
