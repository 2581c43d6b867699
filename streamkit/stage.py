"""The Stage base class, stage configuration and the registry of stage types.

A stage is an async object that turns input frames into output frames:

    @register_stage("gain")
    class Gain(Stage):
        class Config(StageConfig):
            db: float = 0.0
        accepts = (AudioFrame,)

        async def process(self, frame):
            yield replace(frame, samples=frame.samples * 10 ** (self.config.db / 20))

Frames of a type the stage does not list in `accepts` pass through unchanged, so a speech_start
event from the VAD reaches the TTS stage behind the ASR and the LLM. Control frames are handled
by the runtime: EOS and FLUSH call `flush()`, INTERRUPT calls `interrupt()`; all are forwarded.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from streamkit.frames import Frame

log = logging.getLogger("streamkit.stage")


class StageConfig(BaseModel):
    """Keys every stage accepts. Subclasses add their own; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    type: str
    input: str | list[str] | None = None
    transport: Literal["memory", "redis"] | None = None
    queue_size: int = Field(default=256, ge=1, le=100_000)
    # What a full input queue does with video frames; everything else always waits (backpressure).
    video_overflow: Literal["block", "drop_oldest"] = "block"


class StageContext:
    """What a running stage may know about its surroundings."""

    def __init__(
        self,
        pipeline: str,
        session: str,
        params: dict[str, Any] | None = None,
        output_audio_rate: int = 24000,
    ) -> None:
        self.pipeline = pipeline
        self.session = session
        self.params = dict(params or {})
        self.output_audio_rate = output_audio_rate
        self.log = logging.LoggerAdapter(log, {"pipeline": pipeline, "session": session})


class Stage:
    type_name: ClassVar[str] = ""
    Config: ClassVar[type[StageConfig]] = StageConfig
    accepts: ClassVar[tuple[type, ...]] = ()
    # A stateful stage calls self.checkpoint() when every input so far is reflected in output it
    # has emitted; on Redis, inputs are acknowledged only then, together with snapshot(), so a
    # replacement worker restores the snapshot and rebuilds the rest of the state by replaying
    # what is still pending. Stateless stages are acknowledged per input.
    stateful: ClassVar[bool] = False
    # An interruptible stage does long work per frame (generating, speaking): in-process, the
    # runtime keeps reading its inbox meanwhile, cancels the work when an INTERRUPT arrives and
    # lets frames the stage does not want pass it. Others handle every frame strictly in order,
    # which costs no extra tasks per frame and never cuts a frame's processing short.
    interruptible: ClassVar[bool] = False
    # Its TextFrames are transcripts (role TRANSCRIPT): a run of a pipeline with such a stage
    # writes a transcript file even when nothing was said.
    emits_transcripts: ClassVar[bool] = False

    def __init__(self, config: StageConfig, context: StageContext) -> None:
        self.config = config
        self.context = context
        self.name = config.name
        self._checkpoint = False

    async def start(self) -> None:
        """Load models and allocate state. Models should come from streamkit.resources."""

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        """Turn one input frame into zero or more output frames."""
        if False:  # pragma: no cover - makes this an async generator
            yield frame

    async def flush(self) -> AsyncIterator[Frame]:
        """Emit whatever is buffered (end of stream or explicit flush)."""
        if False:  # pragma: no cover
            yield

    async def interrupt(self) -> None:
        """The user barged in: cancel in-flight work, drop queued output."""

    async def stop(self) -> None:
        """Release per-session resources."""

    def wants(self, frame: Frame) -> bool:
        """Whether process() should see this frame; others pass through unchanged."""
        return isinstance(frame, self.accepts)

    def checkpoint(self) -> None:
        self._checkpoint = True

    def snapshot(self) -> Any:
        """What a replacement worker needs besides the inputs after the checkpoint (counters,
        ids): msgpack-able data, saved atomically with the acknowledgement."""
        return None

    def restore(self, snapshot: Any) -> None:
        """Take back what snapshot() returned; called after start() when a worker takes over."""

    def take_checkpoint(self) -> bool:
        hit, self._checkpoint = self._checkpoint, False
        return hit


# type name -> class, filled by @register_stage; looked up through streamkit.stages.catalog
REGISTRY: dict[str, type[Stage]] = {}


def register_stage(type_name: str) -> Callable[[type[Stage]], type[Stage]]:
    """Class decorator: make a Stage subclass available to pipelines as `type: <type_name>`.

    Pipelines can only name registered types: YAML never names arbitrary Python objects. An
    operator adds their own stages by importing a module that registers them (see
    `streamkit.stages.catalog.load_plugins`)."""

    def decorate(cls: type[Stage]) -> type[Stage]:
        existing = REGISTRY.get(type_name)
        if existing is not None and existing is not cls:
            raise ValueError(f"stage type {type_name!r} is already registered by {existing.__module__}")
        cls.type_name = type_name
        REGISTRY[type_name] = cls
        return cls

    return decorate
