"""Shadow: what a shadowed plugin would have changed -- snapshot, restore, record.

A plugin acts through its verdicts *and* by changing the objects its hooks receive: timeout sets
``call.timeout``, ``request.timeout`` and ``run.deadline``, retry_policy sets ``call.delay_s`` and
clears ``result.retryable``.  In shadow mode none of that may reach the run: the dispatcher takes
a :class:`Snapshot` of a hook's arguments before it calls a shadowed plugin and restores it
afterwards; what had changed becomes a ``shadow_effects`` entry of the run record
(:func:`record`).  Each change can be applied again (:data:`Change`): the shadowed plugins after
it on the same event see it, as they would if all were enforced, and it is undone after each.

The snapshot is generic: every field of every (non-frozen) dataclass among the arguments and of
the dataclasses they hold (``response.calls``, ``response.usage``), so a field added to an event
later is covered; of the run, the fields a plugin can change its course with
(:data:`RUN_FIELDS`).  Lists and dicts are copied one level deep (a note appended, a call's
arguments edited in place are undone too); values inside them are not.  Tools, cancel tokens and
a result's raw value are compared by identity only.  What cannot be undone, is not: a shadowed
plugin that cancels the run's token, or writes to a store.  Private fields (``_digest``, a memo)
are left alone.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("loopwarden.plugins")

#: the run's attributes a plugin could steer the run with (the rest are the loop's counters
#: and records, or plugin state, which a shadowed plugin keeps)
RUN_FIELDS = (
    "deadline",
    "limits",
    "pending_notes",
    "messages",
    "context_tokens",
    "stopping",
    "best_answer",
    "last_observation",
    "meta",
)

#: fields compared by identity, never copied or walked into
_OPAQUE = frozenset({"tool", "cancel", "value"})

#: the shadow effects a run records at most (later ones are counted, not kept)
MAX_EFFECTS = 200

#: a change undone: (label, before, after, a function that applies it again)
Change = tuple[str, Any, Any, Callable[[], None]]


_NO_COPY: Any = object()
_MISSING: Any = object()
_TEXT_CHARS = 200


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    """The public fields of dataclass ``cls`` (a ``_private`` one is a memo, such as a
    result's digest: filling it in changes nothing); cached per class."""
    got = _FIELDS.get(cls)
    if got is None:
        got = _FIELDS[cls] = tuple(
            f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")
        )
    return got


def _walkable(value: object) -> bool:
    cls = type(value)
    params = getattr(cls, "__dataclass_params__", None)
    return params is not None and not params.frozen


def _same(a: object, b: object) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a third-party value whose comparison fails: say it changed
        return False


class Snapshot:
    """The mutable state of one hook call's arguments, to be restored after a shadowed plugin.

    Entries: (owner, attribute, value, copy of a list's / dict's contents or nothing, label).
    """

    __slots__ = ("_copied", "_entries")

    def __init__(self, names: tuple[str, ...], args: tuple[Any, ...]) -> None:
        self._entries: list[tuple[Any, str, Any, Any, str]] = []
        self._copied: set[int] = set()
        for name, arg in zip(names, args, strict=True):
            if name == "run":
                for attr in RUN_FIELDS:
                    value = getattr(arg, attr, _MISSING)
                    if value is not _MISSING:
                        self._add(arg, attr, value, f"run.{attr}", depth=0)
            elif _walkable(arg):
                self._walk(arg, name, depth=2)

    def _walk(self, obj: Any, label: str, depth: int) -> None:
        for attr in _fields(type(obj)):
            value = getattr(obj, attr, _MISSING)
            if value is not _MISSING:
                self._add(obj, attr, value, f"{label}.{attr}", depth)

    def _add(self, obj: Any, attr: str, value: Any, label: str, depth: int) -> None:
        entries = self._entries
        if attr in _OPAQUE or not isinstance(value, (list, dict)) or id(value) in self._copied:
            entries.append((obj, attr, value, _NO_COPY, label))
            if depth > 0 and attr not in _OPAQUE and _walkable(value):
                self._walk(value, label, depth - 1)
            return
        self._copied.add(id(value))
        if isinstance(value, list):
            entries.append((obj, attr, value, list(value), label))
            if depth > 0:
                for i, item in enumerate(value):
                    if _walkable(item):
                        self._walk(item, f"{label}[{i}]", depth - 1)
        else:
            entries.append((obj, attr, value, dict(value), label))

    def restore(self) -> list[Change]:
        """Put every value back; return what had changed: (label, before, after, and a
        function that applies the change again)."""
        changes: list[Change] = []
        for obj, attr, value, saved, label in self._entries:
            now = getattr(obj, attr, _MISSING)
            if saved is not _NO_COPY:
                if now is not value:  # the container was replaced ...
                    changes.append((label, saved, _or_none(now), _setter(obj, attr, now)))
                    setattr(obj, attr, value)
                if not _same(value, saved):  # ... or changed in place
                    after = type(value)(value)
                    if now is value:
                        changes.append((label, saved, after, _filler(value, after)))
                    _fill(value, saved)
            elif now is _MISSING or not _same(now, value):
                changes.append((label, value, _or_none(now), _setter(obj, attr, now)))
                setattr(obj, attr, value)
        return changes


def _or_none(value: Any) -> Any:
    return None if value is _MISSING else value


def _fill(container: Any, contents: Any) -> None:
    if isinstance(container, list):
        container[:] = contents
    else:
        container.clear()
        container.update(contents)


def _setter(obj: Any, attr: str, value: Any) -> Callable[[], None]:
    def apply() -> None:
        if value is _MISSING:
            delattr(obj, attr)
        else:
            setattr(obj, attr, value)

    return apply


def _filler(container: Any, contents: Any) -> Callable[[], None]:
    return lambda: _fill(container, contents)


def describe(value: Any) -> Any:
    """A short JSON-able stand-in for a value in a shadow effect: numbers, booleans, None and
    (clipped) text as they are; containers by their size; a dataclass (a retry plan) by its
    numbers and flags; anything else by its type."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) <= _TEXT_CHARS else value[:_TEXT_CHARS] + "..."
    if isinstance(value, (list, tuple)):
        return f"<{len(value)} items>"
    if isinstance(value, dict):
        return f"<{len(value)} keys>"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # e.g. a RetryPlan
        return {
            name: v
            for name in _fields(type(value))
            if (v := getattr(value, name, None)) is None or isinstance(v, (bool, int, float))
        }
    return f"<{type(value).__name__}>"


def record(hook: str, plugin: str, args: tuple[Any, ...], changes: list[Change]) -> None:
    """Add what a shadowed plugin would have changed to the run's ``shadow_effects``."""
    run = args[0]
    effects = getattr(run, "shadow_effects", None)
    if effects is None:  # a hand-built run object without the records
        return
    call = args[1] if hook in ("before_tool", "after_tool") else None
    for label, before, after, _ in changes:
        log.debug("shadowed plugin %r would have changed %s in %s", plugin, label, hook)
        if label == "run.deadline":  # a time on the run's clock: say when, from its start
            before, after = (
                round(t - run.started_at, 6) if isinstance(t, (int, float)) else t
                for t in (before, after)
            )
        if len(effects) >= MAX_EFFECTS:
            run.shadow_effects_dropped += 1
            continue
        entry: dict[str, Any] = {
            "step": run.step,
            "hook": hook,
            "plugin": plugin,
            "shadow": True,
            "effect": label,
            "value": describe(after),
            "was": describe(before),
        }
        if call is not None:
            entry["tool"], entry["call_id"] = call.name, call.id
        effects.append(entry)
