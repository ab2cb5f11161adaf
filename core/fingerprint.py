"""Canonical tool-call fingerprints, computed once per call and shared by every plugin.

Two calls are "the same call" when their tool name and canonical arguments match: keys sorted,
whitespace collapsed, strings case-folded, volatile keys (request ids, timestamps, nonces)
dropped at any depth.  The fingerprint is a short hash of the canonical JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from hashlib import blake2b
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

# One encoder, built once: ``json.dumps`` with non-default options builds a new one per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _c_encoder() -> Callable[[Any], str] | None:
    """The C iterencoder that ``_ENCODER.encode`` would build on every call, built once.

    Without a circular-reference check (canonical trees are fresh and acyclic).  ``None`` when
    this Python has no C encoder or its output differs from ``_ENCODER`` on a sample.
    """
    try:
        from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]

        make = c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",",
                              True, False, True)

        def encode(obj: Any) -> str:
            return "".join(make(obj, 0))

        sample = {"b": [1, 2.5, None, True, float("nan")], "a": {"q": 'x"\n\u00e9\u4e2d'}}
        if encode(sample) != _ENCODER.encode(sample):
            return None
    except Exception:  # no C accelerator (another Python), or a changed signature
        return None
    return encode


_encode: Callable[[Any], str] = _c_encoder() or _ENCODER.encode


def _canon(value: Any, volatile: frozenset[str]) -> Any:
    if isinstance(value, str):
        # whitespace runs collapsed to one space, ends stripped (str.split's whitespace is
        # exactly the regex \s), then case-folded
        return " ".join(value.split()).casefold()
    if isinstance(value, dict):
        # Key order is left to the encoder's sort_keys.  (Keys that are equal as strings,
        # 1 and "1", keep their dict order: the later one wins, as it would after a stable
        # sort by str(k).)
        out = {}
        for k, v in value.items():
            sk = k if type(k) is str else str(k)
            if sk.casefold() not in volatile:
                out[sk] = _canon(v, volatile)
        return out
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
    return _encode(_canon(arguments, vol))


class Fingerprinter:
    """Computes ``name:hash`` fingerprints with one deployment's volatile-key list."""

    __slots__ = ("_volatile",)

    def __init__(self, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> None:
        self._volatile = frozenset(k.casefold() for k in volatile_keys)

    def canonical(self, arguments: Any) -> str:
        return _encode(_canon(arguments, self._volatile))

    def __call__(self, name: str, arguments: Any) -> str:
        data = _encode(_canon(arguments, self._volatile)).encode("utf-8")
        return name + ":" + blake2b(data, digest_size=8).hexdigest()
