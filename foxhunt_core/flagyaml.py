"""Bounded, safe YAML reading for flag files, with the line of every key.

Only PyYAML's ``SafeLoader`` constructs values (no Python tags). Before anything is constructed
the composed node graph is walked once, under limits, so that a hostile file is refused early:

* size: at most :data:`MAX_BYTES` bytes;
* aliases: at most :data:`MAX_ALIASES` alias uses, at most :data:`MAX_NODES` nodes once aliases
  are expanded (a "billion laughs" file is refused after :data:`MAX_NODES` steps of work), no
  recursive alias;
* nesting: at most :data:`MAX_DEPTH` levels;
* duplicate keys in a mapping are an error (YAML says keys are unique; PyYAML keeps the last).

The walk records the (1-based) line of every mapping key and sequence item by its path, which is
how validation errors point at a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 256 * 1024
MAX_NODES = 20_000
MAX_ALIASES = 32
MAX_DEPTH = 32

Path = tuple[Any, ...]


class YamlProblem(ValueError):
    """One problem at one place of a YAML text."""

    def __init__(self, line: int, path: Path, message: str) -> None:
        super().__init__(message)
        self.line, self.path, self.message = line, path, message


@dataclass
class YamlDoc:
    """A safely loaded document and the line of each path in it."""

    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """Line of ``path`` or of its longest recorded prefix (1 when nothing matches)."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)


def _mark_line(exc: yaml.YAMLError) -> int:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return mark.line + 1 if mark is not None else 1


def _syntax_message(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    msg = problem or str(exc)
    if context and problem:
        msg = f"{problem} ({context})"
    return " ".join(str(msg).split())


class _Walk:
    def __init__(self) -> None:
        self.nodes = 0
        self.aliases = 0
        self.seen: set[int] = set()
        self.active: set[int] = set()
        self.lines: dict[Path, int] = {}

    def visit(self, node: Node, path: Path, parent_line: int = 1) -> None:
        line = node.start_mark.line + 1
        if id(node) in self.seen:  # an alias: report the line that uses it, not the anchor's
            line = parent_line
        if id(node) in self.active:
            raise YamlProblem(line, path, "recursive alias")
        if id(node) in self.seen and isinstance(node, (MappingNode, SequenceNode)):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise YamlProblem(line, path, f"more than {MAX_ALIASES} alias uses")
        self.seen.add(id(node))
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise YamlProblem(line, path, f"document expands to more than {MAX_NODES} nodes (alias bomb?)")
        if len(path) > MAX_DEPTH:
            raise YamlProblem(line, path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, ScalarNode):
            return
        self.active.add(id(node))
        if isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                self.lines.setdefault(path + (i,), item.start_mark.line + 1)
                self.visit(item, path + (i,), line)
        elif isinstance(node, MappingNode):
            keys: dict[str, int] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, ScalarNode):
                    raise YamlProblem(knode.start_mark.line + 1, path, "mapping keys must be plain scalars")
                key, kline = knode.value, knode.start_mark.line + 1
                if key in keys and key != "<<":
                    raise YamlProblem(kline, path + (key,), f"duplicate key {key!r} (first on line {keys[key]})")
                keys[key] = kline
                self.lines.setdefault(path + (key,), kline)
                self.visit(vnode, path + (key,), kline)
        self.active.discard(id(node))


def read_yaml(text: str) -> YamlDoc:
    """Parse one YAML document safely under the limits; raises :class:`YamlProblem`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlProblem(1, (), f"file is {size} bytes, larger than the limit of {MAX_BYTES}")
    loader = None
    try:
        try:
            loader = yaml.SafeLoader(text)
            node = loader.get_single_node()
        except yaml.reader.ReaderError as exc:
            line = text[: exc.position].count("\n") + 1
            raise YamlProblem(line, (), f"invalid YAML: {exc.reason} (character #x{exc.character:04x})") from None
        except yaml.YAMLError as exc:
            raise YamlProblem(_mark_line(exc), (), f"invalid YAML: {_syntax_message(exc)}") from None
        except RecursionError:
            raise YamlProblem(1, (), "invalid YAML: nested too deeply") from None
        if node is None:
            return YamlDoc(None, {(): 1})
        walk = _Walk()
        walk.visit(node, ())
        try:
            data = loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise YamlProblem(_mark_line(exc), (), f"invalid YAML: {_syntax_message(exc)}") from None
        return YamlDoc(data, {(): node.start_mark.line + 1, **walk.lines})
    finally:
        if loader is not None:
            loader.dispose()
