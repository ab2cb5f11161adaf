"""A config file that builds on another: ``extends``, the merge, and where each value came from.

A file naming ``extends = "defaults"`` (the config shipped inside the package) or ``extends =
"base.toml"`` (a path relative to the file's directory -- the working directory for a mapping
read from no file; ``~`` and absolute paths work) lists only what differs; the parent
may extend another file in turn (a cycle is an error naming the files).  The files are merged
from the farthest parent to the file itself:

* tables merge key by key, at every depth (``[plugins.timeout]`` in the child changes only the
  keys it writes);
* every other value -- a string, a number, an array -- replaces the parent's whole;
* ``[plugins] enabled`` replaces the inherited list; ``enable = [...]`` instead appends
  plugins to it (one already enabled keeps its place) and ``disable = [...]`` removes plugins
  from it (one that is not enabled is an error: a misspelt name would leave a guard on).

A file without ``extends`` is a complete config, as always.  :func:`resolve` returns the merged
mapping that :func:`loopwarden.config.parse_config` validates, and where each value came from
(:class:`Origin`, ``loopwarden config show``).

May import: the lowest layer only (exceptions).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.exceptions import ConfigError, load_toml

__all__ = ["BUILT_IN", "SHIPPED", "Layered", "Origin", "key_lines", "resolve"]

#: the ``extends`` value naming the config shipped inside the package
SHIPPED = "defaults"
#: the origin of a value no file writes: the settings model's default
BUILT_IN = "built-in"
#: keys of ``[plugins]`` that edit the inherited ``enabled`` list (never validated as tables)
EDITS = ("enable", "disable")

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value was written: a file (``defaults`` for the shipped one) and its line."""

    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclass(slots=True)
class _Layer:
    """One file of the chain, as read."""

    label: str  # how messages name it: "defaults", or the path
    path: Path | None
    data: dict[str, Any]


@dataclass(slots=True)
class Layered:
    """The merged mapping of a chain of files, and where its values came from."""

    #: the merged mapping (``enable`` / ``disable`` applied and gone), ready to validate
    data: dict[str, Any]
    #: the layers, farthest parent first
    layers: list[_Layer]
    #: the file and key that last edited ``[plugins] enabled`` with enable / disable
    enabled_edit: tuple[_Layer, Key] | None = None
    _lines: dict[str, dict[Key, int]] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """The files, the file itself first, then each parent in turn."""
        return [layer.label for layer in reversed(self.layers)]

    def origin(self, key: Key) -> Origin | None:
        """Where the value at ``key`` was written (None: no file writes it), with its line
        when the file can be read."""
        if key == ("plugins", "enabled") and self.enabled_edit is not None:
            layer, key = self.enabled_edit
        else:
            found = self._layer_of(key)
            if found is None:
                return None
            layer = found
        lines = self._lines_of(layer)
        for n in range(len(key), 0, -1):
            if key[:n] in lines:
                return Origin(layer.label, lines[key[:n]])
        return Origin(layer.label)

    def blame(self, key: str) -> Origin | None:
        """The file (and line) that wrote the dotted ``key``, or the table holding it: where
        an error about ``key`` points.  None when no file writes any of it."""
        parts = tuple(key.split(".")) if key else ()
        for n in range(len(parts), 0, -1):
            found = self.origin(parts[:n])
            if found is not None:
                return found
        return None

    def _layer_of(self, key: Key) -> _Layer | None:
        for layer in reversed(self.layers):
            if _has(layer.data, key):
                return layer
        return None

    def _lines_of(self, layer: _Layer) -> dict[Key, int]:
        if layer.label not in self._lines:
            try:
                text = layer.path.read_text(encoding="utf-8") if layer.path else ""
            except (OSError, UnicodeDecodeError):
                text = ""
            self._lines[layer.label] = key_lines(text)
        return self._lines[layer.label]


def _has(data: Mapping[str, Any], key: Key) -> bool:
    node: Any = data
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


@functools.cache
def _shipped(path: str, mtime_ns: int) -> dict[str, Any]:
    """The shipped config's mapping, read once per version of the file."""
    return load_toml(Path(path))


def _display(path: Path) -> str:
    """``path`` as messages show it: relative to the working directory when below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return str(path) if rel.startswith("..") else rel


def resolve(data: Mapping[str, Any], *, path: str | Path | None, shipped: Path) -> Layered:
    """Merge ``data`` (the file at ``path``, already read) over the chain it ``extends``.

    :param shipped: the config shipped inside the package (``extends = "defaults"``).
    :raises ConfigError: naming the file and key -- a bad ``extends``, a missing or unreadable
        parent, a cycle, a bad ``enable`` / ``disable``.
    """
    label = str(path) if path is not None else "the config"
    if path is not None and Path(path).resolve() == shipped.resolve():
        label = SHIPPED
    chain = [_Layer(label, Path(path) if path is not None else None, dict(data))]
    seen = {chain[0].path.resolve()} if chain[0].path is not None else set()
    while "extends" in chain[-1].data:
        child = chain[-1]
        target = _parent_path(child, shipped)
        real = target.resolve()
        if real in seen:
            names = " -> ".join([*(layer.label for layer in chain), _label(target, shipped)])
            raise ConfigError(
                f"extends a file that extends it back: {names}",
                path=child.label,
                key="extends",
                expected="a chain of files that ends in one without extends",
            )
        seen.add(real)
        if not target.exists():
            raise ConfigError(
                f"the file it extends, {_label(target, shipped)}, does not exist",
                path=child.label,
                key="extends",
                expected=f'"{SHIPPED}" or a TOML file relative to this file\'s directory',
            )
        # a parent that exists but cannot be read or is not valid TOML: its own error names it
        if real == shipped.resolve():
            parent = copy.deepcopy(_shipped(str(shipped), shipped.stat().st_mtime_ns))
        else:
            parent = load_toml(target)
        chain.append(_Layer(_label(target, shipped), target, parent))
    layers = list(reversed(chain))
    merged: dict[str, Any] = {}
    enabled: list[str] | None = None
    enabled_edit: tuple[_Layer, Key] | None = None
    for i, layer in enumerate(layers):
        body = {k: v for k, v in layer.data.items() if k != "extends"}
        plugins = body.get("plugins")
        if isinstance(plugins, Mapping):
            plugins = dict(plugins)
            edits = {k: plugins.pop(k) for k in EDITS if k in plugins}
            if "enabled" in plugins:
                enabled = list(plugins["enabled"]) if isinstance(plugins["enabled"], list) else None
                enabled_edit = None
            if edits:
                enabled = _edit(layer, edits, enabled, inherited=i > 0)
                enabled_edit = (layer, ("plugins", next(iter(edits))))
            body["plugins"] = plugins
        merged = _merge(merged, body)
    if enabled is not None and isinstance(merged.get("plugins"), dict):
        merged["plugins"]["enabled"] = enabled
    if "extends" in data:
        merged["extends"] = data["extends"]
    return Layered(data=merged, layers=layers, enabled_edit=enabled_edit)


def _label(target: Path, shipped: Path) -> str:
    return SHIPPED if target.resolve() == shipped.resolve() else _display(target)


def _parent_path(child: _Layer, shipped: Path) -> Path:
    value = child.data["extends"]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"must name a file, got {value!r}",
            path=child.label,
            key="extends",
            expected=f'"{SHIPPED}" (the shipped config) or a TOML file relative to this file',
        )
    if value == SHIPPED:
        return shipped
    target = Path(value).expanduser()
    if not target.is_absolute() and child.path is not None:
        target = child.path.parent / target
    return target


def _edit(
    layer: _Layer, edits: Mapping[str, Any], enabled: list[str] | None, *, inherited: bool
) -> list[str]:
    """The inherited ``enabled`` list with this file's ``enable`` / ``disable`` applied."""
    for key, names in edits.items():
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(
                f"must be a list of plugin names, got {names!r}",
                path=layer.label,
                key=f"plugins.{key}",
            )
    if not inherited:
        raise ConfigError(
            "edits the inherited plugin list, but this file extends nothing",
            path=layer.label,
            key=f"plugins.{next(iter(edits))}",
            expected='extends = "defaults" (or another file), or [plugins] enabled = [...]',
        )
    if "enabled" in layer.data.get("plugins", {}):
        raise ConfigError(
            "enabled replaces the inherited plugin list, enable / disable edit it: use one or "
            "the other",
            path=layer.label,
            key=f"plugins.{next(iter(edits))}",
        )
    out = list(enabled or [])
    both = set(edits.get("enable", ())) & set(edits.get("disable", ()))
    if both:
        raise ConfigError(
            f"{sorted(both)} both enabled and disabled",
            path=layer.label,
            key="plugins.disable",
        )
    for name in edits.get("disable", ()):
        if name not in out:
            import difflib

            close = difflib.get_close_matches(name, out, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{name!r} is not enabled by the files it extends{hint}",
                path=layer.label,
                key="plugins.disable",
                expected="one of: " + ", ".join(out) if out else "nothing: no plugin is enabled",
            )
        out.remove(name)
    out.extend(n for n in edits.get("enable", ()) if n not in out)
    return out


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``: tables merged key by key, any other value replaced whole."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = _merge(below, value)
        elif isinstance(value, Mapping):
            out[key] = _merge({}, value)
        else:
            out[key] = value
    return out


# -- where each key is written: the lines of a TOML file -------------------------------------


def key_lines(text: str) -> dict[Key, int]:
    """The line (from 1) where each key of a TOML text is written: ``[table]`` headers and
    ``key = value`` lines, dotted and quoted keys included; keys inside inline tables and
    multi-line values take the line of the key that holds them."""
    out: dict[Key, int] = {}
    table: Key = ()
    depth = 0  # open brackets / braces of a value running over several lines
    quote: str | None = None  # the multi-line string being read
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw
        if quote is not None or depth > 0:
            depth, quote = _scan(line, depth, quote)
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("["):
            inner = stripped[2:] if stripped.startswith("[[") else stripped[1:]
            end = _key_end(inner, "]")
            table = tuple(_split_key(inner[:end]))
            out.setdefault(table, n)
            continue
        eq = _key_end(line, "=")
        if eq >= len(line):
            continue
        key = (*table, *_split_key(line[:eq]))
        out.setdefault(key, n)
        depth, quote = _scan(line[eq + 1 :], 0, None)
    return out


def _key_end(text: str, stop: str) -> int:
    """The index of the first ``stop`` outside quotes in a key (len(text) if none)."""
    quote: str | None = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == stop:
            return i
    return len(text)


def _split_key(text: str) -> Iterator[str]:
    """The parts of a dotted key, quotes removed (``a."b.c"`` -> a, b.c)."""
    part, quote = "", None
    for c in text.strip():
        if quote:
            if c == quote:
                quote = None
            else:
                part += c
        elif c in "\"'":
            quote = c
        elif c == ".":
            yield part.strip()
            part = ""
        else:
            part += c
    yield part.strip()


def _scan(text: str, depth: int, quote: str | None) -> tuple[int, str | None]:
    """Carry the open brackets and an open multi-line string across ``text`` (one line)."""
    i = 0
    while i < len(text):
        if quote is not None:
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            if text[i] == "\\" and quote == '"""':
                i += 1
            i += 1
            continue
        c = text[i]
        if text.startswith('"""', i) or text.startswith("'''", i):
            quote = text[i : i + 3]
            i += 3
        elif c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif c == "'":
            end = text.find("'", i + 1)
            i = len(text) if end < 0 else end + 1
        elif c == "#":
            break
        else:
            depth += c in "[{"
            depth -= c in "]}"
            i += 1
    return max(depth, 0), quote
