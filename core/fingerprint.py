"""Canonical tool-call fingerprints, computed once per call and shared by every plugin.

Two calls are "the same call" when their tool name and canonical arguments match: keys sorted,
whitespace collapsed, strings case-folded, volatile keys (request ids, timestamps, nonces)
dropped at any depth.  The fingerprint is a short hash of the canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_VOLATILE_KEYS", "Fingerprinter", "canonical_arguments"]

DEFAULT_VOLATILE_KEYS: tuple[str, ...] = (
    "request_id",
    "trace_id",
    "span_id",
    "timestamp",
    "nonce",
    "idempotency_key",
)

_WS = re.compile(r"\s+")


def _canon(value: Any, volatile: frozenset[str]) -> Any:
    if isinstance(value, str):
        return _WS.sub(" ", value).strip().casefold()
    if isinstance(value, dict):
        return {
            str(k): _canon(v, volatile)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            if str(k).casefold() not in volatile
        }
    if isinstance(value, (list, tuple)):
        return [_canon(v, volatile) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical_arguments(
    arguments: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS
) -> str:
    """Canonical JSON of a call's arguments (see the module docstring)."""
    vol = frozenset(k.casefold() for k in volatile_keys)
    return json.dumps(
        _canon(arguments, vol), sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )


class Fingerprinter:
    """Computes ``name:hash`` fingerprints with one deployment's volatile-key list."""

    __slots__ = ("_volatile",)

    def __init__(self, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> None:
        self._volatile = frozenset(k.casefold() for k in volatile_keys)

    def canonical(self, arguments: Any) -> str:
        return json.dumps(
            _canon(arguments, self._volatile),
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )

    def __call__(self, name: str, arguments: Any) -> str:
        digest = hashlib.blake2b(
            self.canonical(arguments).encode("utf-8"), digest_size=8
        ).hexdigest()
        return f"{name}:{digest}"
