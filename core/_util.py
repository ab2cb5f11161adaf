"""Small helpers shared by the core and the built-in plugins (one definition of each)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

__all__ = ["first_line", "jsonable"]

_MAX_INT_BITS = 4000  # about 1200 digits: far below what int -> str refuses (4300 digits)


def jsonable(value: Any, *, exact: bool = False) -> Any:
    """``value`` as plain JSON data: mappings, sequences, sets, pydantic models, enums and
    Decimals converted (to floats -- the record's ``cost`` is a number -- or, when ``exact``,
    to their exact text, as money in a config file is written); anything else printed with
    ``str`` -- never raising, whatever a third-party object does."""
    if value is None or isinstance(value, (str, float, bool)):
        return value
    if isinstance(value, int):
        if value.bit_length() > _MAX_INT_BITS:
            return f"<an integer of {value.bit_length()} bits>"  # json cannot print it
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, exact=exact) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, exact=exact) for v in value]
    if isinstance(value, Decimal):
        return str(value) if exact else float(value)
    if isinstance(value, BaseModel):
        return jsonable(value.model_dump(), exact=exact)
    if isinstance(value, enum.Enum):
        return jsonable(value.value, exact=exact)
    try:
        return str(value)
    except Exception as exc:  # a third-party object whose __str__ raises
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, clipped to ``limit`` characters."""
    line = text.strip().split("\n", 1)[0].strip()
    return line[:limit] + "..." if len(line) > limit else line
