"""Canonical tool-call fingerprints, computed once per call and shared by every plugin.

Two calls are "the same call" when their tool name and canonical arguments match: keys sorted,
whitespace collapsed, strings case-folded, volatile keys (request ids, timestamps, nonces)
dropped at any depth.  The fingerprint is a short hash of the canonical JSON.  A side
effect's idempotency key (:func:`idempotency_key`) is canonicalised the same way, so the
ledger never runs twice what the repeat detector calls one call.  A tool declared with
``normalize_arguments=False`` compares its string values exactly, in both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from hashlib import blake2b
from typing import Any

__all__ = ["DEFAULT_VOLATILE_KEYS", "Fingerprinter", "canonical_arguments", "idempotency_key"]

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

        make = c_make_encoder(
            None, _ENCODER.default, encode_basestring, None, ":", ",", True, False, True
        )

        def encode(obj: Any) -> str:
            return "".join(make(obj, 0))

        sample = {"b": [1, 2.5, None, True, float("nan")], "a": {"q": 'x"\n\u00e9\u4e2d'}}
        if encode(sample) != _ENCODER.encode(sample):
            return None
    except Exception:  # no C accelerator (another Python), or a changed signature
        return None
    return encode


_encode: Callable[[Any], str] = _c_encoder() or _ENCODER.encode


def _canon(value: Any, volatile: frozenset[str], fold: bool = True) -> Any:
    # the exact types first (no isinstance() call for a JSON string or object), subclasses
    # after them, in the same order
    t = type(value)
    if t is not str and t is not dict:
        if isinstance(value, str):
            t = str
        elif isinstance(value, dict):
            t = dict
    if t is str:
        # whitespace runs collapsed to one space, ends stripped (str.split's whitespace is
        # exactly the regex \s), then case-folded -- unless the tool asks for exact values
        return " ".join(value.split()).casefold() if fold else value
    if t is dict:
        # Key order is left to the encoder's sort_keys.  (Keys that are equal as strings,
        # 1 and "1", keep their dict order: the later one wins, as it would after a stable
        # sort by str(k).)
        out = {}
        for k, v in value.items():
            sk = k if type(k) is str else str(k)
            if sk.casefold() not in volatile:
                out[sk] = _canon(v, volatile, fold)
        return out
    if isinstance(value, (list, tuple)):
        return [_canon(v, volatile, fold) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical_arguments(
    arguments: Any, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS
) -> str:
    """Canonical JSON of a call's arguments (see the module docstring)."""
    vol = frozenset(k.casefold() for k in volatile_keys)
    return _encode(_canon(arguments, vol))


def idempotency_key(
    name: str,
    arguments: Mapping[str, Any],
    keys: Iterable[str] | None = None,
    *,
    normalize: bool = True,
    volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS,
) -> str:
    """The key under which a side effect of tool ``name`` happens at most once.

    The tool's idempotency arguments ``keys`` (all arguments when None, volatile keys dropped
    as in fingerprints), canonicalised exactly as fingerprints are -- so the side-effect
    ledger and the repeat detector agree on what "the same call" is: ``"Bob@Example.com"``
    and ``" bob@example.com "`` are one e-mail address.  ``normalize=False`` (a tool whose
    values are case-sensitive, such as tokens or file names) compares values exactly, in
    both places.  The one function every ledger computes its keys with.
    """
    volatile = frozenset(k.casefold() for k in volatile_keys)
    if keys is None:
        canon: Any = _canon(arguments, volatile, normalize)
    else:  # named keys are kept even when they look volatile: the tool chose them
        canon = {k: _canon(arguments.get(k), volatile, normalize) for k in keys}
    return name + ":" + _encode(canon)


class Fingerprinter:
    """Computes ``name:hash`` fingerprints with one deployment's volatile-key list."""

    __slots__ = ("_volatile", "volatile_keys")

    def __init__(self, volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS) -> None:
        self.volatile_keys = tuple(volatile_keys)
        self._volatile = frozenset(k.casefold() for k in self.volatile_keys)

    def canonical(self, arguments: Any, normalize: bool = True) -> str:
        return _encode(_canon(arguments, self._volatile, normalize))

    def __call__(self, name: str, arguments: Any, normalize: bool = True) -> str:
        """``name:hash`` of the canonical arguments (values compared exactly when
        ``normalize`` is False: the tool's choice, see :func:`idempotency_key`)."""
        data = _encode(_canon(arguments, self._volatile, normalize)).encode(
            "utf-8", "surrogatepass"
        )
        return name + ":" + blake2b(data, digest_size=8).hexdigest()
