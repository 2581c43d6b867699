"""Pipeline definitions: YAML -> validated graph of stage configs.

    name: dubbing
    input:  {audio: {sample_rate: 16000}}
    stages:
      - {name: vad, type: vad}
      - {name: asr, type: asr}              # input defaults to the stage above
      - {name: tts, type: tts, input: asr}  # `input` names another stage (fan-out) or "input"
    output: [asr, tts]

Every problem is reported with its line and column. Running a pipeline is runtime.py's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streamkit.shipped import shipped_dir
from streamkit.stage import StageConfig
from streamkit.stages.catalog import get_stage_class, stage_types
from streamkit.yamlpos import Position, PositionedYaml, YamlError, load_positioned

SOURCE = "input"  # the pseudo-stage that session input comes from


class AudioInputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sample_rate: int = Field(default=16000, ge=8000, le=192000)
    channels: int = Field(default=1, ge=1, le=2)


class VideoInputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fps: float | None = Field(default=None, gt=0, le=240)


class InputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    audio: AudioInputSpec | None = None
    video: VideoInputSpec | None = None


class OutputAudioSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sample_rate: int = Field(default=24000, ge=8000, le=192000)


class _PipelineHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    description: str = ""
    input: InputSpec = Field(default_factory=InputSpec)
    output_audio: OutputAudioSpec = Field(default_factory=OutputAudioSpec)
    stages: list[dict[str, Any]] = Field(min_length=1)
    output: list[str] = Field(default_factory=list)
    # sessions of this pipeline an in-process server runs at once, per CPU core (at least one);
    # more are refused. None: no limit of its own (the server's --max-sessions still holds)
    sessions_per_core: float | None = Field(default=None, gt=0, le=64)


@dataclass
class Issue:
    message: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.message
        return f"line {self.line}, column {self.column}: {self.message}"


class PipelineError(ValueError):
    def __init__(self, issues: list[Issue], source: str = "") -> None:
        self.issues = issues
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("\n".join(prefix + str(i) for i in issues))


@dataclass
class PipelineSpec:
    name: str
    description: str
    input: InputSpec
    output_audio: OutputAudioSpec
    stages: list[StageConfig]
    output: list[str]
    inputs_of: dict[str, list[str]] = field(default_factory=dict)  # stage -> upstream names
    sessions_per_core: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # the validated YAML mapping, for workers

    def stage(self, name: str) -> StageConfig:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def downstream_of(self, name: str) -> list[str]:
        return [s for s, ups in self.inputs_of.items() if name in ups]

    def order(self) -> list[str]:
        return [s.name for s in self.stages]


def _loc_str(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _pydantic_issues(exc: ValidationError, doc: PositionedYaml, base: tuple[Any, ...], what: str) -> list[Issue]:
    issues = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            pos = doc.position(base + loc, prefer_key=True)
            msg = f"{what}: unknown key {_loc_str(loc)!r}"
        else:
            pos = doc.position(base + loc)
            field_name = _loc_str(loc) or "value"
            msg = f"{what}: {field_name}: {err['msg']}"
            if "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], (dict, list)):
                msg += f" (got {err['input']!r})"
        issues.append(_issue(msg, pos))
    return issues


def _issue(message: str, pos: Position | None) -> Issue:
    return Issue(message, pos.line if pos else None, pos.column if pos else None)


def parse_pipeline(text: str, source: str = "") -> PipelineSpec:
    """Validate pipeline YAML text; raises PipelineError listing every problem."""
    try:
        doc = load_positioned(text)
    except YamlError as exc:
        pos = exc.position
        raise PipelineError([_issue(str(exc).split(": ", 1)[-1] if pos else str(exc), pos)], source) from None
    if not isinstance(doc.data, dict):
        raise PipelineError([Issue("a pipeline file must be a YAML mapping with name, stages and output", 1, 1)], source)
    issues: list[Issue] = []
    try:
        header = _PipelineHeader.model_validate(doc.data)
    except ValidationError as exc:
        raise PipelineError(_pydantic_issues(exc, doc, (), "pipeline"), source) from None

    known = stage_types()
    configs: list[StageConfig] = []
    raw_index: dict[int, int] = {}  # position in configs -> position in the YAML stages list
    for i, raw in enumerate(header.stages):
        where = ("stages", i)
        label = f"stage {raw.get('name', i)!r}" if isinstance(raw, dict) else f"stage {i}"
        type_name = raw.get("type")
        if not isinstance(type_name, str):
            issues.append(_issue(f"{label}: missing 'type' (one of {', '.join(sorted(known))})", doc.position(where)))
            continue
        if type_name not in known:
            issues.append(
                _issue(f"{label}: unknown stage type {type_name!r}; known types: {', '.join(sorted(known))}",
                       doc.position(where + ("type",)))
            )
            continue
        try:
            raw_index[len(configs)] = i
            configs.append(get_stage_class(type_name).Config.model_validate(raw))
        except ValidationError as exc:
            issues.extend(_pydantic_issues(exc, doc, where, label))

    names = [c.name for c in configs]
    seen: set[str] = set()
    for i, c in enumerate(configs):
        if c.name in seen or c.name == SOURCE:
            issues.append(_issue(f"stage name {c.name!r} is used twice or reserved",
                                 doc.position(("stages", raw_index[i], "name"))))
        seen.add(c.name)

    inputs_of: dict[str, list[str]] = {}
    previous = SOURCE
    for i, c in enumerate(configs):
        ups = [previous] if c.input is None else ([c.input] if isinstance(c.input, str) else list(c.input))
        for up in ups:
            if up != SOURCE and up not in names:
                issues.append(_issue(f"stage {c.name!r}: input {up!r} is not a stage of this pipeline (stages: {', '.join(names)})",
                                     doc.position(("stages", raw_index[i], "input"))))
            elif up == c.name and c.input is not None:
                issues.append(_issue(f"stage {c.name!r} cannot take its own output as input", doc.position(("stages", raw_index[i], "input"))))
        inputs_of[c.name] = ups
        previous = c.name

    for i, out in enumerate(header.output):
        if out not in names:
            issues.append(_issue(f"output {out!r} is not a stage of this pipeline", doc.position(("output", i))))

    if not issues:
        cycle = _find_cycle(inputs_of)
        if cycle:
            issues.append(_issue(f"stages form a cycle: {' -> '.join(cycle)}", doc.position(("stages",))))
    if issues:
        raise PipelineError(issues, source)
    return PipelineSpec(
        name=header.name,
        description=header.description,
        input=header.input,
        output_audio=header.output_audio,
        stages=configs,
        output=header.output or [configs[-1].name],
        inputs_of=inputs_of,
        sessions_per_core=header.sessions_per_core,
        raw=doc.data,
    )


def _find_cycle(inputs_of: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if state.get(node) == 1:
            return trail[trail.index(node):] + [node]
        if state.get(node) == 2 or node == SOURCE:
            return None
        state[node] = 1
        for up in inputs_of.get(node, []):
            found = visit(up, trail + [node])
            if found:
                return found
        state[node] = 2
        return None

    for n in inputs_of:
        found = visit(n, [])
        if found:
            return found
    return None


def load_pipeline(path: str | Path) -> PipelineSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PipelineError([Issue(f"cannot read pipeline file: {exc.strerror}")], str(path)) from None
    return parse_pipeline(text, str(path))


def spec_from_mapping(data: dict[str, Any]) -> PipelineSpec:
    """Rebuild a spec from its validated mapping (what workers receive over Redis)."""
    import yaml

    return parse_pipeline(yaml.safe_dump(data, sort_keys=False))


def find_pipeline(name_or_path: str, pipelines_dir: str | Path | None = None) -> Path:
    """A pipeline by file path, or by name in the pipelines directory."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    directory = Path(pipelines_dir) if pipelines_dir else default_pipelines_dir()
    for ext in (".yaml", ".yml"):
        candidate = directory / f"{name_or_path}{ext}"
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no pipeline named {name_or_path!r} in {directory}")


def default_pipelines_dir() -> Path:
    return shipped_dir("pipelines")
