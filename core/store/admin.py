"""What an operator sees and changes in the store: limit overrides, ledger entries, changes.

Three kinds of value, shared by both backends (:mod:`loopwarden.store.sqlite`,
:mod:`loopwarden.store.redis`) and the commands (``loopwarden budgets``, ``loopwarden
ledger``, ``loopwarden breakers``):

:class:`LimitOverride`
    a budget limit set at run time for one scope key and window (``budgets set tenant acme
    --window day --max-cost 80``).  The store applies it inside every reserve, so every
    process on the store sees it at its next call; it takes precedence over the config's
    limit until it is cleared.
:class:`LedgerRow`
    a side effect's entry in the ledger as ``loopwarden ledger`` lists it: its scope (the
    meta values that prefix the key), its tool and idempotency key, its state and result.
:class:`Change`
    one line of the store's change log: who changed what, when, from what to what -- every
    override set or cleared, every budget reset, ledger entry forgotten and breaker reset.
    The log keeps the last :data:`CHANGES_KEPT` changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "CHANGES_KEPT",
    "Change",
    "LedgerRow",
    "LimitOverride",
    "operator_name",
    "split_ledger_key",
]

#: how many changes the store's change log keeps (the oldest go first)
CHANGES_KEPT = 10_000


def operator_name() -> str:
    """Who makes a change when nobody says: ``user@host`` of this process."""
    import getpass  # here: not paid by ``import loopwarden``
    import socket

    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container without a passwd entry)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _quantities() -> tuple[str, ...]:
    from loopwarden.store import QUANTITIES

    return QUANTITIES


def limits_dict(limits: Sequence[int | None] | None) -> dict[str, Any] | None:
    """Store-unit limits (``QUANTITIES`` order) as ``{quantity: value}`` in the units people
    use -- cost in the currency (a ``float``) -- leaving out the unset ones; None for none."""
    from loopwarden.store import COST_UNIT, QUANTITIES

    if limits is None:
        return None
    out: dict[str, Any] = {}
    for q, v in zip(QUANTITIES, limits, strict=True):
        if v is not None:
            out[q] = float(Decimal(v) * COST_UNIT) if q == "cost" else v
    return out or None


def limits_tuple(values: Mapping[str, Any] | None) -> tuple[int | None, ...] | None:
    """The inverse of :func:`limits_dict` for a stored record (store units kept as text or
    numbers): ``{quantity: units}`` -> a ``QUANTITIES``-ordered tuple; None for none."""
    if not values:
        return None
    return tuple(int(values[q]) if values.get(q) is not None else None for q in _quantities())


@dataclass(frozen=True, slots=True)
class LimitOverride:
    """A budget limit set at run time: ``scope`` = ``key`` in ``window``.

    ``limits`` are in the store's units (:data:`~loopwarden.store.QUANTITIES` order; cost in
    :data:`~loopwarden.store.COST_UNIT`); None leaves that quantity to the config.
    """

    scope: str
    key: str
    window: str
    limits: tuple[int | None, ...]
    set_at: float
    set_by: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "key": self.key,
            "window": self.window,
            "limits": limits_dict(self.limits) or {},
            "set_at": self.set_at,
            "set_by": self.set_by,
        }


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the change log: ``action`` (``set_limits``, ``clear_limits``,
    ``reset_budget``, ``forget_ledger``, ``reset_breaker``) on ``target`` by ``by`` at
    ``at`` (wall-clock seconds), with what was there before (``old``) and after (``new``)."""

    at: float
    by: str
    action: str
    target: dict[str, Any]
    old: Any = None
    new: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "by": self.by,
            "action": self.action,
            "target": self.target,
            "old": self.old,
            "new": self.new,
        }


def _unescape(text: str) -> str:
    """The inverse of :func:`loopwarden.store._escape` (percent-decoding)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(c in "0123456789abcdefABCDEF" for c in s)


def split_ledger_key(stored: str) -> tuple[list[tuple[str, str]], str]:
    """A stored ledger key (:func:`loopwarden.store.ledger_key`) split into its scope
    (``(meta key, value)`` pairs) and the idempotency key (``tool:arguments``).

    A scope part has an escaped name, so no ``:`` before its ``=``; the first part that has
    a ``:`` before any ``=`` (or no ``=``) starts the idempotency key."""
    parts = stored.split("|")
    scope: list[tuple[str, str]] = []
    for i, part in enumerate(parts):
        eq, colon = part.find("="), part.find(":")
        if eq < 0 or (0 <= colon < eq):
            return scope, "|".join(parts[i:])
        scope.append((_unescape(part[:eq]), _unescape(part[eq + 1 :])))
    return [], stored  # no idempotency key after the scope: not a key of ours, shown whole


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A ledger entry as ``loopwarden ledger`` lists it (``key``: the stored key; ``expires_at``
    in wall-clock seconds, None when the store does not say)."""

    key: str
    state: str
    owner: str
    started_at: float
    expires_at: float | None
    result: dict[str, Any] | None = None
    corrupt: str | None = None

    @property
    def scope(self) -> list[tuple[str, str]]:
        return split_ledger_key(self.key)[0]

    @property
    def idempotency_key(self) -> str:
        return split_ledger_key(self.key)[1]

    @property
    def tool(self) -> str:
        return self.idempotency_key.split(":", 1)[0]

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scope": dict(self.scope),
            "tool": self.tool,
            "idempotency_key": self.idempotency_key,
            "state": self.state,
            "owner": self.owner,
            "started_at": self.started_at,
            "expires_at": self.expires_at,
            "result": self.result,
            "corrupt": self.corrupt,
        }
