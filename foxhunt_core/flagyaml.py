"""Bounded, safe YAML reading for flag files, with the line of every key.

Only PyYAML's ``SafeLoader`` constructs values (no Python tags). Before anything is constructed
the composed node graph is walked once, under limits, so that a hostile file is refused early:

* size: at most :data:`MAX_BYTES` bytes;
* aliases: at most :data:`MAX_ALIASES` alias uses, at most :data:`MAX_NODES` nodes once aliases
  are expanded (a "billion laughs" file is refused after :data:`MAX_NODES` steps of work), no
  recursive alias;
* nesting: at most :data:`MAX_DEPTH` levels;
* duplicate keys in a mapping are an error (YAML says keys are unique; PyYAML keeps the last),
  and so are two merge keys ``<<`` in one mapping (the last would win silently).

Scalars are read with YAML 1.2 core-schema semantics (:class:`Loader12`): ``true``/``false``
only, decimal integers, floats with or without a point (``3e-4`` is a number, as in YAML 1.2
and JSON), ``null``/``~``; dates stay text. The YAML 1.1 forms that PyYAML would read
differently from a YAML 1.2 reader are refused with the reading each gives, instead of being
guessed: leading-zero integers (``010``: octal 8 in 1.1), base-60 numbers (``1:30``: 90),
``0x``/``0o``/``0b`` integers, digits with underscores (``1_000``), and ``yes``/``no``/``on``/
``off``. Quoting any of them makes it text. Only the core tags are allowed (``!!binary``,
``!!timestamp``, ``!!set`` and the like are refused), and an explicitly tagged scalar must be
written in that tag's YAML 1.2 form.

The walk records the (1-based) line of every mapping key and sequence item by its path, which is
how validation errors point at a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_BYTES = 256 * 1024
MAX_NODES = 20_000
MAX_ALIASES = 32
MAX_DEPTH = 32

Path = tuple[Any, ...]

TAG = "tag:yaml.org,2002:"
_INT = r"[-+]?[0-9]+"
_FLOAT = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
_BOOL = r"true|True|TRUE|false|False|FALSE"
_CORE_FORMS = {"int": re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), "float": re.compile(rf"^(?:{_INT}|{_FLOAT})$"),
               "bool": re.compile(rf"^(?:{_BOOL})$"), "null": re.compile(r"^(?:null|Null|NULL|~|)$")}
_ALLOWED_TAGS = {TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}


class Loader12(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's implicit scalar types."""


Loader12.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag in (TAG + "null", TAG + "merge")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader12.add_implicit_resolver(TAG + "bool", re.compile(rf"^(?:{_BOOL})$"), list("tTfF"))
Loader12.add_implicit_resolver(TAG + "int", re.compile(rf"^{_INT}$"), list("-+0123456789"))
Loader12.add_implicit_resolver(TAG + "float", re.compile(rf"^(?:{_FLOAT})$"), list("-+.0123456789"))


def _ambiguous(value: str) -> str | None:
    """Why a plain scalar is refused: a YAML 1.1 form that 1.1 and 1.2 readers read differently."""
    v = value.strip()
    body = v.lstrip("+-")
    if re.fullmatch(r"0[0-9_]+", body):
        digits = body.replace("_", "")
        old = f"the octal number {int(digits, 8)}" if re.fullmatch(r"[0-7]+", digits) else "text"
        return (f"{v!r} is ambiguous (YAML 1.1 reads it as {old}, YAML 1.2 as {int(digits)}): "
                f"write it without leading zeros, or quote it for text")
    if re.fullmatch(r"0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+", body):
        base = {"x": 16, "o": 8, "b": 2}[body[1].lower()]
        n = int(body[2:].replace("_", "") or "0", base)
        return f"{v!r}: write the decimal number {'-' if v.startswith('-') else ''}{n} (or quote it for text)"
    if re.fullmatch(r"[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?", body):
        n = 0.0
        for part in body.split(":"):
            n = n * 60 + float(part.replace("_", ""))
        return (f"{v!r} is ambiguous (YAML 1.1 reads it as the base-60 number {n:g}, YAML 1.2 as text): "
                "quote it for text, or write the number")
    if "_" in body and re.fullmatch(r"[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?", body):
        return (f"{v!r} is ambiguous (YAML 1.1 reads it as {body.replace('_', '')}, YAML 1.2 as text): "
                "write the number without underscores, or quote it for text")
    if v in ("yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"):
        b = "true" if v.lower() in ("yes", "on") else "false"
        return f"{v!r} is ambiguous (YAML 1.1 reads it as {b}, YAML 1.2 as text): write {b}, or quote it for text"
    return None


def _short(tag: str) -> str:
    return "!!" + tag[len(TAG):] if tag.startswith(TAG) else tag


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
        if node.tag not in _ALLOWED_TAGS:
            raise YamlProblem(line, path, f"tag {_short(node.tag)} is not allowed (only plain YAML scalars, "
                                          "lists and mappings)")
        if isinstance(node, ScalarNode):
            self.scalar(node, path, line)
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
                if key in keys and key == "<<":
                    raise YamlProblem(kline, path, f"a second merge key '<<' in one mapping (first on line "
                                                   f"{keys[key]}; the last would win silently): merge several "
                                                   "with one key, <<: [*a, *b]")
                if key in keys:
                    raise YamlProblem(kline, path + (key,), f"duplicate key {key!r} (first on line {keys[key]})")
                keys[key] = kline
                self.lines.setdefault(path + (key,), kline)
                self.visit(vnode, path + (key,), kline)
        self.active.discard(id(node))

    @staticmethod
    def scalar(node: ScalarNode, path: Path, line: int) -> None:
        """Refuse ambiguous plain scalars and tagged scalars not in their tag's YAML 1.2 form."""
        if node.style is None:
            why = _ambiguous(node.value)
            if why is not None:
                raise YamlProblem(line, path, why)
        kind = node.tag[len(TAG):]
        form = _CORE_FORMS.get(kind)
        if form is not None and not form.match(node.value.strip() if kind != "null" else node.value):
            raise YamlProblem(line, path, f"{node.value!r} is not a YAML 1.2 {kind} ({_short(node.tag)})")


def read_yaml(text: str) -> YamlDoc:
    """Parse one YAML document safely under the limits; raises :class:`YamlProblem`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlProblem(1, (), f"file is {size} bytes, larger than the limit of {MAX_BYTES}")
    loader = None
    try:
        try:
            loader = Loader12(text)
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
