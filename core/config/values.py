"""The value types every config table shares, so the loader means what the JSON Schema says.

Durations (:data:`Seconds`, :data:`PositiveSeconds`), :class:`TypedTable` (scalar fields that
take only values of their JSON Schema type) and the validators settings models call
(:func:`check_templates`, :func:`check_patterns`).  They live with the config, below
everything that validates a table -- the config itself, the MCP server tables, scenario files
and plugin settings; :mod:`loopwarden.plugin` re-exports them for plugin authors.

May import: the lowest layer only (:mod:`loopwarden.clock`) and pydantic.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from loopwarden.clock import MAX_DURATION_S

__all__ = [
    "PositiveSeconds",
    "Seconds",
    "TypedTable",
    "check_patterns",
    "check_templates",
    "scalar_type_error",
]

# -- value types every config table shares, so the loader means what the JSON Schema says ------
#
# Durations (Seconds, PositiveSeconds): finite, at most loopwarden.clock.MAX_DURATION_S (1e9 s,
# about 31 years) -- a timeout of 1e10 s is an error naming its key, never an overflowing
# timer.  Scalar types (TypedTable): pydantic converts "12" to 12 and true to 1 where a number
# is expected, and 1 to true where a boolean is; the JSON Schema (loopwarden config schema)
# refuses all three, and so does a table model deriving from TypedTable: a number field takes
# a number (an integer field an integer-valued one), never a boolean or a string; a boolean
# field only true or false.  An integer where a float is expected is a number, as in the
# schema.

#: a duration in seconds: 0 or more, finite, at most MAX_DURATION_S
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]
#: a duration in seconds above 0, finite, at most MAX_DURATION_S
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)]

_NUMBER = frozenset({int, float})


def _kinds(annotation: Any) -> frozenset[Any]:
    """The scalar types an annotation admits (``Annotated`` and ``X | None`` unwrapped);
    anything else (str, Decimal, Literal, lists, tables) makes it not a scalar field."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        out: set[Any] = set()
        for arg in typing.get_args(annotation):
            if arg is type(None):
                continue
            out |= _kinds(arg)
        return frozenset(out)
    if annotation in (bool, int, float):
        return frozenset({annotation})
    return frozenset({object})


def scalar_type_error(annotation: Any, value: Any) -> str | None:
    """Why ``value`` is not of the scalar type ``annotation`` names, as the JSON Schema
    checks it (the error adds the value); None when it is (or the field is not a scalar
    one)."""
    if value is None:
        return None
    kinds = _kinds(annotation)
    if not kinds or object in kinds:
        return None
    if kinds == {bool}:
        return None if isinstance(value, bool) else "expected true or false"
    if bool in kinds:  # a field taking a boolean or a number (none so far): left to pydantic
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return None
    return "expected an integer" if kinds == {int} else "expected a number"


class TypedTable(BaseModel):
    """A config table whose scalar fields take only values of their JSON Schema type, as
    ``loopwarden config schema`` says: a number field takes a number (an integer field a
    whole one; an integer where a float is expected is fine), never a string or a boolean
    (``max_steps = "12"``, ``stop_at_repeat = true``); a boolean field only ``true`` or
    ``false`` (``soft = 1`` is an error).  Each wrong value is an error at its own key.
    :class:`PluginSettings` derives from it; durations are typed ``Seconds`` /
    ``PositiveSeconds`` (finite, at most ``loopwarden.clock.MAX_DURATION_S``)."""

    @model_validator(mode="before")
    @classmethod
    def _scalar_types(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        errors: list[InitErrorDetails] = []
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if key not in data:
                continue
            problem = scalar_type_error(field.annotation, data[key])
            if problem is not None:
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError("scalar_type", problem),
                        loc=(key,),
                        input=data[key],
                    )
                )
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return data


def check_templates(settings: BaseModel, keys: Iterable[str], sample: Mapping[str, Any]) -> None:
    """Raise ValueError when one of the ``str.format`` templates ``keys`` uses an unknown field.

    Call it from a settings model's ``model_validator``: a bad text then fails when the config
    loads, naming the key -- not in the middle of a run.  ``None`` values are skipped.
    """
    for key in keys:
        value = getattr(settings, key)
        if value is None:
            continue
        try:
            value.format(**sample)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            fields = ", ".join("{" + k + "}" for k in sample)
            raise ValueError(f"{key}: bad template field {exc} (known: {fields})") from None


def check_patterns(patterns: list[str]) -> list[str]:
    """Raise ValueError naming the first pattern that is not a valid regular expression
    (for a ``field_validator``: the config then fails to load, naming the key)."""
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"bad regular expression {p!r}: {exc}") from None
    return patterns
