"""Circuit breakers in the shared store: one small JSON document per breaker, changed atomically.

A breaker guards one dependency -- a tool, or an MCP server for all of its tools -- within one
scope (the whole deployment, or one tenant), for every process and host that shares the store.
The store keeps, per breaker, its state (``closed`` / ``open`` / ``half_open``), when it
opened, who holds the half-open probe, and the calls and transient failures of the last
``window_s`` seconds in ten buckets (constant size, however busy the tool).  What a call does
to a breaker is decided by the pure functions below, applied by the backends as one atomic
read-modify-write (:meth:`loopwarden.store._Backend.breaker_admit`, ``breaker_record``):
SQLite under ``BEGIN IMMEDIATE``, Redis under ``WATCH`` / ``MULTI`` (an optimistic
transaction, tried again when another client changed the document in between).

* **admit** (before a call): closed -- go; open and ``open_s`` not yet over -- refuse; open
  and over, or half-open whose probe's lease ran out -- the caller gets the single probe
  (``half_open``, ``probe = True``); half-open with a live probe -- refuse.  The lease is
  ``probe_timeout_s``, or the probe call's own deadline when that is longer (``lease_s``:
  its ``timeout_s`` and backoff) -- a slow but healthy probe is never replaced while it runs.
  A source whose own probe failed in this half-open phase may probe again only ``open_s``
  after that failure; every other source may probe at once.  A closed breaker is only read:
  the common case writes nothing.
* **record** (after a call): closed -- count the call (and a transient failure, with its
  source) and open when a rule trips; half-open, from a probe of this half-open phase (the
  one holding it, or one whose lease ran out before it answered: its answer still counts) --
  a success closes it (counts start afresh); a failure frees the probe and, once probes from
  ``min_sources`` distinct sources have failed in this phase (or one from a run that names no
  source), opens it again from now.  So one tenant whose own input fails cannot hold a
  breaker shared with others open: its failed probe hands the next probe to another source.
  Any other call of an open breaker (one admitted before it opened) changes nothing.

**Time** is the store's (``now`` is passed in by the backend): Redis's ``TIME``, read in the
same round trip as the document, so hosts whose clocks differ agree on when a breaker opened
and when ``open_s`` is over; SQLite is one file on one host, whose clock every process
shares.

Rules (either trips): ``failures`` transient failures within the window, or a failure ratio of
at least ``failure_ratio`` over at least ``min_calls`` calls -- and, for both, failures from at
least ``min_sources`` distinct sources (tenants), unless some failure came from a run that
names no source (a deployment without tenants cannot suffer one tenant's input).

This module imports nothing of the store's backends (they import it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ANONYMOUS",
    "BUCKETS",
    "MAX_SOURCES",
    "BreakerRule",
    "BreakerView",
    "admit",
    "breaker_key",
    "record",
    "view",
]

#: the buckets a window is counted in (a sliding window, to a tenth of it)
BUCKETS = 10
#: the distinct failure sources a breaker remembers at most (the oldest are dropped)
MAX_SOURCES = 32
#: the source of a failure whose run names none (untenanted traffic)
ANONYMOUS = "*"
#: the probes of one half-open phase a breaker remembers (the latest; an older one's answer
#: no longer counts)
MAX_PROBES = 8

State = Literal["closed", "open", "half_open"]
#: what an operation changed: None, or the transition it made
Change = Literal["opened", "reopened", "half_open", "closed"] | None


@dataclass(frozen=True, slots=True)
class BreakerRule:
    """When a breaker opens and how long it stays open (the plugin's settings)."""

    window_s: float = 60.0
    failures: int | None = 5
    failure_ratio: float | None = None
    min_calls: int = 10
    min_sources: int = 1
    open_s: float = 30.0
    probe_timeout_s: float = 60.0
    keep_s: float = 86400.0


@dataclass(frozen=True, slots=True)
class BreakerView:
    """A breaker as an operation left it (or as ``loopwarden breakers`` lists it).

    ``since`` is when it opened (wall-clock seconds; None while closed); ``tripped`` what it
    saw when it opened (``failures``, ``calls``, ``window_s``, ``rule``, ``error``);
    ``failures`` / ``calls`` the counts of the current window; ``probe`` is True for the
    caller that holds the half-open probe; ``changed`` the transition this operation made.
    """

    key: str
    scope: str
    scope_key: str
    target: str
    name: str
    state: State
    since: float | None = None
    tripped: dict[str, Any] | None = None
    failures: int = 0
    calls: int = 0
    opens: int = 0
    probe: bool = False
    changed: Change = None
    expires_at: float | None = None

    @property
    def allows(self) -> bool:
        """The call may run: closed, or this caller holds the probe."""
        return self.state == "closed" or self.probe

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scope": self.scope,
            "scope_key": self.scope_key,
            "target": self.target,
            "name": self.name,
            "state": self.state,
            "since": self.since,
            "tripped": self.tripped,
            "failures": self.failures,
            "calls": self.calls,
            "opens": self.opens,
            "expires_at": self.expires_at,
        }


Doc = dict[str, Any]
Ident = tuple[str, str, str, str]  # scope, scope key, target ("tool" / "server"), name


def breaker_key(ident: Ident) -> str:
    """The store key of a breaker: its scope, scope key, target and name, each with ``%`` and
    ``|`` percent-encoded, ``|``-joined (two breakers never share a key)."""
    return "|".join(p.replace("%", "%25").replace("|", "%7C") for p in ident)


def _new(ident: Ident) -> Doc:
    scope, scope_key, target, name = ident
    return {
        "scope": scope,
        "scope_key": scope_key,
        "target": target,
        "name": name,
        "state": "closed",
        "since": None,
        "probe": None,
        "probe_until": 0.0,
        "buckets": [],
        "sources": {},
        "tripped": None,
        "opens": 0,
        "probes": [],
        "probe_failed": {},
    }


def _window(doc: Doc, rule: BreakerRule, now: float) -> tuple[int, int]:
    """Drop the buckets and sources older than the window; the calls and failures left."""
    start = now - rule.window_s
    width = rule.window_s / BUCKETS
    doc["buckets"] = [b for b in doc.get("buckets", []) if b[0] + width > start]
    doc["sources"] = {s: t for s, t in doc.get("sources", {}).items() if t > start}
    return sum(int(b[1]) for b in doc["buckets"]), sum(int(b[2]) for b in doc["buckets"])


def _expiry(doc: Doc, rule: BreakerRule, now: float) -> float:
    return now + max(rule.keep_s, rule.window_s, rule.open_s + rule.probe_timeout_s)


def view(key: str, doc: Doc, rule: BreakerRule | None, now: float, **extra: Any) -> BreakerView:
    """The document as a :class:`BreakerView` (counts within ``rule``'s window, if given)."""
    if rule is not None:
        calls, failures = _window(dict(doc), rule, now)
    else:
        calls = sum(int(b[1]) for b in doc.get("buckets", []))
        failures = sum(int(b[2]) for b in doc.get("buckets", []))
    since = doc.get("since")
    return BreakerView(
        key=key,
        scope=str(doc.get("scope", "")),
        scope_key=str(doc.get("scope_key", "")),
        target=str(doc.get("target", "")),
        name=str(doc.get("name", "")),
        state=doc.get("state", "closed"),
        since=None if since is None else float(since),
        tripped=doc.get("tripped"),
        failures=failures,
        calls=calls,
        opens=int(doc.get("opens", 0)),
        expires_at=doc.get("expires_at"),
        **extra,
    )


def admit(
    key: str,
    ident: Ident,
    doc: Doc | None,
    rule: BreakerRule,
    owner: str,
    now: float,
    *,
    source: str = ANONYMOUS,
    lease_s: float | None = None,
) -> tuple[Doc | None, BreakerView]:
    """May ``owner`` (a call from ``source``, which may run ``lease_s`` seconds at most) call
    the dependency now?  Returns the document to write (None: no change) and the breaker as
    seen (``allows``)."""
    if doc is None:
        return None, view(key, _new(ident), None, now)
    state = doc.get("state", "closed")
    if state == "closed":
        return None, view(key, doc, rule, now)
    since = float(doc.get("since") or 0.0)
    probe_free = state == "open" or float(doc.get("probe_until") or 0.0) <= now
    failed_at = doc.get("probe_failed", {}).get(source)
    backing_off = failed_at is not None and now < float(failed_at) + rule.open_s
    if now >= since + rule.open_s and probe_free and not backing_off:
        first = state == "open"
        doc["state"] = "half_open"
        doc["probe"] = owner
        doc["probe_until"] = now + max(rule.probe_timeout_s, lease_s or 0.0)
        probes = [] if first else [p for p in doc.get("probes", []) if p != owner]
        doc["probes"] = [*probes, owner][-MAX_PROBES:]
        if first:
            doc["probe_failed"] = {}
        doc["expires_at"] = _expiry(doc, rule, now)
        return doc, view(key, doc, rule, now, probe=True, changed="half_open")
    return None, view(key, doc, rule, now)


def record(
    key: str,
    ident: Ident,
    doc: Doc | None,
    rule: BreakerRule,
    owner: str,
    *,
    failed: bool,
    source: str,
    weight: int,
    error: str | None,
    now: float,
) -> tuple[Doc | None, BreakerView]:
    """Count a call's outcome (``weight`` executions; ``failed``: transient failures).
    Returns the document to write (None: no change) and the breaker after it."""
    if doc is None:
        if not failed and rule.failure_ratio is None:
            return None, view(key, _new(ident), None, now)  # nothing to count: no write
        doc = _new(ident)
    state = doc.get("state", "closed")
    if state != "closed":
        if state != "half_open" or owner not in doc.get("probes", [doc.get("probe")]):
            return None, view(key, doc, rule, now)  # admitted before it opened: no evidence
        if doc.get("probe") == owner:
            doc["probe"] = None
            doc["probe_until"] = 0.0
        doc["probes"] = [p for p in doc.get("probes", []) if p != owner]
        doc["expires_at"] = _expiry(doc, rule, now)
        if not failed:  # the dependency answered: up
            doc.update(
                state="closed",
                since=None,
                buckets=[],
                sources={},
                tripped=None,
                probe=None,
                probe_until=0.0,
                probes=[],
                probe_failed={},
            )
            return doc, view(key, doc, rule, now, changed="closed")
        probe_failed: dict[str, float] = doc.setdefault("probe_failed", {})
        probe_failed.pop(source, None)
        probe_failed[source] = now
        while len(probe_failed) > MAX_SOURCES:
            probe_failed.pop(next(iter(probe_failed)))
        if ANONYMOUS not in probe_failed and len(probe_failed) < rule.min_sources:
            # one source's failed probe: that source waits open_s, another one probes next
            return doc, view(key, doc, rule, now)
        doc.update(state="open", since=now, probe=None, probe_until=0.0, probes=[])
        doc["probe_failed"] = {}
        doc["opens"] = int(doc.get("opens", 0)) + 1
        return doc, view(key, doc, rule, now, changed="reopened")
    calls, failures = _window(doc, rule, now)
    if not failed and rule.failure_ratio is None and not failures:
        return None, view(key, doc, rule, now)  # only failures count: nothing to write
    width = rule.window_s / BUCKETS
    start = math.floor(now / width) * width
    buckets: list[list[float]] = doc["buckets"]
    if not buckets or buckets[-1][0] != start:
        buckets.append([start, 0, 0])
    buckets[-1][1] += weight
    calls += weight
    if failed:
        buckets[-1][2] += weight
        failures += weight
        sources: dict[str, float] = doc["sources"]
        sources.pop(source, None)
        sources[source] = now
        while len(sources) > MAX_SOURCES:
            sources.pop(next(iter(sources)))
    doc["expires_at"] = _expiry(doc, rule, now)
    trip = _tripped(doc, rule, calls, failures) if failed else None
    if trip is None:
        return doc, view(key, doc, rule, now)
    doc.update(state="open", since=now, probe=None, probe_until=0.0)
    doc["opens"] = int(doc.get("opens", 0)) + 1
    doc["tripped"] = {
        "rule": trip,
        "failures": failures,
        "calls": calls,
        "window_s": rule.window_s,
        "sources": len(doc["sources"]),
        "error": error,
    }
    return doc, view(key, doc, rule, now, changed="opened")


def _tripped(doc: Doc, rule: BreakerRule, calls: int, failures: int) -> str | None:
    """The rule the window's counts trip (``"failures"``, ``"failure_ratio"``), or None."""
    sources = doc["sources"]
    if ANONYMOUS not in sources and len(sources) < rule.min_sources:
        return None  # one tenant's failures never open a breaker shared with others
    if rule.failures is not None and failures >= rule.failures:
        return "failures"
    if (
        rule.failure_ratio is not None
        and calls >= rule.min_calls
        and failures / calls >= rule.failure_ratio
    ):
        return "failure_ratio"
    return None
