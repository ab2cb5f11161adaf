"""An MCP tool's ``inputSchema``, read safely: the argument names it declares, and a checker
that never leaves the process and never hangs.

A server chooses its tools' schemas, so a schema is untrusted input:

- **No remote references, ever.** ``$ref`` is resolved within the schema document only (a
  ``#...`` pointer, or a ``$id`` / ``$anchor`` the document itself holds).  A reference to
  anything else -- a URL, a file -- is never fetched: the agent host does not request
  addresses a server chose, and a check never waits on a network.  A call to a tool whose
  schema needs such a reference is an ``invalid_arguments`` observation: its arguments cannot
  be checked, so nothing is sent.
- **Bounded patterns.** ``pattern`` and ``patternProperties`` are matched with the ``regex``
  engine under a time bound (:data:`PATTERN_TIMEOUT_S` per match, :data:`CHECK_BUDGET_S` per
  call): a catastrophic-backtracking pattern makes the call invalid, never a hung run.
- **Keys from the resolved schema.** :func:`argument_names` reads the properties through
  local ``$ref`` and ``allOf`` / ``anyOf`` / ``oneOf`` (and ``if`` / ``then`` / ``else``); when
  they cannot be known -- a free-form object, ``additionalProperties`` or
  ``patternProperties`` that admit other arguments, a reference that does not resolve -- it
  answers None, and a side effect is keyed on the call's actual arguments instead.

Imported with :mod:`loopwarden.mcp.client` (needs ``jsonschema`` and ``regex``: the ``mcp`` extra).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]  # no stubs for a plugin's mypy
import referencing
import referencing.exceptions
import referencing.jsonschema
import regex  # type: ignore[import-untyped, unused-ignore]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped, unused-ignore]

__all__ = ["CHECK_BUDGET_S", "PATTERN_TIMEOUT_S", "argument_names", "checker"]

#: the longest one ``pattern`` match may take
PATTERN_TIMEOUT_S = 0.1
#: the longest all the pattern matches of one call's check may take together
CHECK_BUDGET_S = 0.5
#: how deep :func:`argument_names` follows nested schemas and references
_MAX_DEPTH = 32
#: the URI a schema without ``$id`` is read under
_HERE = "urn:loopwarden:input-schema"
#: the current call's pattern budget (validation runs on the run's thread)
_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("loopwarden_schema_budget")


class RemoteReference(Exception):
    """A ``$ref`` outside the schema document: never fetched."""


def _refuse(uri: str) -> referencing.Resource[Any]:
    raise RemoteReference(f"the reference {uri!r} is outside the schema and is never fetched")


#: resolves references within a schema only: any retrieval is refused
_LOCAL_ONLY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse)  # type: ignore[call-arg, unused-ignore]


def argument_names(schema: Mapping[str, Any]) -> list[str] | None:
    """The argument names ``schema`` declares, read through local references and
    combinators (sorted); None when they cannot all be known (see the module docstring)."""
    names: set[str] = set()
    try:
        resource = referencing.Resource.from_contents(
            dict(schema), default_specification=referencing.jsonschema.DRAFT202012
        )
        resolver = _LOCAL_ONLY.with_resource(_HERE, resource).resolver(_HERE)
        complete = _collect(schema, resolver, names, 0)
    except (
        referencing.exceptions.Unresolvable,
        referencing.exceptions.Unretrievable,
        RemoteReference,
        RecursionError,
        TypeError,
    ):
        return None
    if not complete or not names:
        return None
    return sorted(names)


def _collect(node: Any, resolver: Any, names: set[str], depth: int) -> bool:
    """Add the property names of ``node`` to ``names``; False when other arguments may
    matter (free-form extras, an unresolvable reference, too deep)."""
    if not isinstance(node, Mapping):
        return node is not False  # ``true`` admits anything; ``false`` admits nothing
    if depth > _MAX_DEPTH:
        return False
    complete = True
    ref = node.get("$ref")
    if isinstance(ref, str):
        resolved = resolver.lookup(ref)  # raises for a remote or missing reference
        complete &= _collect(resolved.contents, resolved.resolver, names, depth + 1)
    elif ref is not None:
        return False
    props = node.get("properties")
    if isinstance(props, Mapping):
        names.update(str(k) for k in props)
    elif props is not None:
        return False
    if node.get("patternProperties"):
        complete = False
    extra = node.get("additionalProperties")
    if extra is not None and extra is not False:
        complete = False
    for key in ("allOf", "anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            for branch in branches:
                complete &= _collect(branch, resolver, names, depth + 1)
        elif branches is not None:
            return False
    for key in ("if", "then", "else"):
        if key in node:
            complete &= _collect(node[key], resolver, names, depth + 1)
    return complete


class _Budget:
    """The time left for one call's pattern matches."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end = time.monotonic() + CHECK_BUDGET_S

    def search(self, pattern: Any, text: str) -> bool | str:
        """Whether ``pattern`` matches in ``text``, or why it could not be told (text)."""
        left = min(PATTERN_TIMEOUT_S, self.end - time.monotonic())
        try:
            if left <= 0:
                raise TimeoutError
            return regex.search(pattern, text, timeout=left) is not None
        except TimeoutError:
            return f"checking the pattern {pattern!r} took too long"
        except (regex.error, TypeError) as exc:
            return f"the schema's pattern {pattern!r} is not valid: {exc}"


def _bounded_keywords(budget_of: Any) -> dict[str, Any]:
    """``pattern`` and ``patternProperties`` on the bounded engine (``budget_of()`` gives
    the current call's :class:`_Budget`)."""

    def pattern(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if not validator.is_type(instance, "string"):
            return
        matched = budget_of().search(patrn, instance)
        if isinstance(matched, str):
            yield ValidationError(matched)
        elif not matched:
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(
        validator: Any, patterns: Any, instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for k, v in instance.items():
                matched = budget_of().search(patrn, k)
                if isinstance(matched, str):
                    yield ValidationError(matched)
                    return
                if matched:
                    yield from validator.descend(v, subschema, path=k, schema_path=patrn)

    return {"pattern": pattern, "patternProperties": pattern_properties}


def checker(schema: Mapping[str, Any]) -> Any:
    """A function ``check(arguments) -> list[str]`` (the first errors, as text; empty when
    valid) for ``schema``; raises ``jsonschema.SchemaError`` for a schema that is not one.
    A reference it cannot resolve locally, a pattern too slow to match, a schema that breaks
    the checker: each is an error for that call, never an exception."""
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    base.check_schema(schema)
    cls = jsonschema.validators.extend(base, _bounded_keywords(_BUDGET.get))
    validator = cls(schema, registry=_LOCAL_ONLY)

    def check(arguments: Any) -> list[str]:
        token = _BUDGET.set(_Budget())
        try:
            errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        except (referencing.exceptions.Unresolvable, RemoteReference) as exc:
            return [
                "the tool's inputSchema has a reference that cannot be resolved within it "
                f"(a remote reference is never fetched): {exc}"
            ]
        except Exception as exc:  # a schema that breaks the checker: the call is not sent
            return [f"the tool's inputSchema cannot be checked: {type(exc).__name__}: {exc}"]
        finally:
            _BUDGET.reset(token)
        return [
            (".".join(map(str, e.path)) + ": " if e.path else "") + e.message for e in errors[:5]
        ]

    return check
