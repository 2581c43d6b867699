"""Safe YAML loading that remembers where every value came from (line and column, 1-based)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

Path = tuple[Any, ...]


@dataclass(frozen=True)
class Position:
    line: int
    column: int


class YamlError(ValueError):
    def __init__(self, message: str, position: Position | None) -> None:
        self.position = position
        where = f"line {position.line}, column {position.column}: " if position else ""
        super().__init__(where + message)


_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}


def _walk(node: yaml.Node, path: Path, out: dict[Path, Position], key_out: dict[Path, Position]) -> Any:
    out[path] = Position(node.start_mark.line + 1, node.start_mark.column + 1)
    if node.tag not in _PLAIN_TAGS:
        # no Python objects, timestamps or custom types: pipelines hold plain data only
        raise YamlError(f"tag {node.tag!r} is not allowed in a pipeline", out[path])
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.SafeLoader(  # construct scalar keys the way SafeLoader would
                ""
            ).construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise YamlError("mapping keys must be scalars", Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1))
            if key in result:
                raise YamlError(f"duplicate key {key!r}", Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1))
            key_out[path + (key,)] = Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            result[key] = _walk(value_node, path + (key,), out, key_out)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(child, path + (i,), out, key_out) for i, child in enumerate(node.value)]
    return yaml.SafeLoader("").construct_object(node, deep=True)


class PositionedYaml:
    """Parsed YAML data plus a lookup from a key path to where it is written."""

    def __init__(self, data: Any, values: dict[Path, Position], keys: dict[Path, Position]) -> None:
        self.data = data
        self._values = values
        self._keys = keys

    def position(self, path: Path, prefer_key: bool = False) -> Position | None:
        """Where `path` is; for a missing key, the closest enclosing value that exists."""
        path = tuple(path)
        while True:
            if prefer_key and path in self._keys:
                return self._keys[path]
            if path in self._values:
                return self._values[path]
            if not path:
                return None
            path = path[:-1]


def load_positioned(text: str) -> PositionedYaml:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Position(mark.line + 1, mark.column + 1) if mark else None
        raise YamlError(f"invalid YAML: {exc.problem or exc}", pos) from None
    except yaml.YAMLError as exc:
        raise YamlError(f"invalid YAML: {exc}", None) from None
    if node is None:
        return PositionedYaml(None, {}, {})
    values: dict[Path, Position] = {}
    keys: dict[Path, Position] = {}
    try:
        data = _walk(node, (), values, keys)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise YamlError(f"invalid YAML value: {exc.problem}", Position(mark.line + 1, mark.column + 1) if mark else None) from None
    return PositionedYaml(data, values, keys)
