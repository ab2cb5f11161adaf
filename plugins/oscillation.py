"""oscillation: the agent alternates between a few calls (A-B-A-B, A-B-C-A-B-C) and learns
nothing new.

Every tool call becomes a symbol: its fingerprint (tool name + canonical arguments).  For a
non-deterministic tool the symbol also carries the digest of that call's previous result, so
polling that keeps returning new results is not an oscillation.  Over the last ``window``
symbols, a cycle of period ``min_period``..``max_period`` repeated for ``cycles`` full cycles,
with at least two distinct symbols in it (one symbol again and again is repeat_call's
business), is a hit.

The check runs in ``after_response``, on the proposals of the turn (``response.calls``), so a
stop prevents those calls from running.  The first hit warns ("you are alternating between
...; change strategy or answer now"); the hit numbered ``stop_at_hit`` (default: the next one)
stops the run with ``oscillation``.  Every hit adds one to the run record's
``oscillation_hits``.

Calls are also followed *as answered* (``after_tool``): each symbol is the call's fingerprint
plus the digest of its answer (volatile parts masked).  A sequence of calls that comes back to
the same state with the same answers -- search, open the same wrong item, back, two invalid
actions, the same search again -- is a cycle of any period up to ``max_long_period`` (default
28), far beyond ``max_period``: a loop whose every answer repeats exactly is evidence at any
length, while matching proposals alone stays short (a longer cycle of proposals can be an
agent re-checking things whose answers changed).  The bound: the second repetition of a
period-``p`` cycle ends at call ``2p``, and the stop comes at the next hit, call ``2p + 1``; a
stop that comes after a third of the shipped step cap (165) saves little, so ``2p + 1 <= 57``, p <=
28.  Among recorded successful runs (518 customer-service, 179 coding) not one repeats a
sequence of calls with the same answers twice at any period from 2 to 60, so precision does
not bound it; memory and work per call are O(``max_long_period``).

Detection is incremental: for each period ``p`` the plugin keeps how many of the latest
symbols equal the symbol ``p`` places earlier; a cycle of period ``p`` has repeated ``c``
times exactly when that run length reaches ``p * (c - 1)``.  Constant memory and constant work
per symbol.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from pydantic import Field, model_validator

from loopwarden import (
    ModelResponse,
    Plugin,
    PluginSettings,
    Run,
    ToolCall,
    ToolResult,
    Verdict,
    hookimpl,
)
from loopwarden.notes import quote_data, render_note, runtime
from loopwarden.plugin import check_templates
from loopwarden.stash import StashKey

__all__ = ["CycleDetector", "Oscillation", "OscillationSettings"]


class OscillationSettings(PluginSettings):
    """``[plugins.oscillation]``."""

    window: int = Field(
        default=8, ge=4, description="tool-call symbols kept (must hold max_period * cycles)"
    )
    min_period: int = Field(default=2, ge=2, description="shortest cycle length looked for")
    max_period: int = Field(default=4, ge=2, description="longest cycle length looked for")
    max_long_period: int = Field(
        default=28,
        ge=2,
        description="longest cycle looked for among calls as answered (the same calls with "
        "the same answers); at least max_period",
    )
    cycles: int = Field(
        default=2, ge=2, description="full repetitions of the cycle that make a hit"
    )
    stop_at_hit: int = Field(
        default=2,
        ge=1,
        description="the hit that stops the run; earlier hits warn (1: stop at the first)",
    )
    soft: bool = Field(
        default=True,
        description="stop softly (one last tool-less turn to answer from what is known); "
        "false stops at once with the best-effort answer",
    )
    message: str = Field(
        default="You are alternating between {cycle} with no new information; change strategy "
        "or answer now.",
        description="the warning injected at the first hit ({cycle}: the calls of the cycle, "
        "{period}, {hits})",
    )
    stop_message: str = Field(
        default="The run kept alternating between {cycle}.",
        description="why the run stops, put before the wrap-up instruction of a soft stop "
        "({cycle}, {period}, {hits})",
    )
    max_label_chars: int = Field(
        default=80, ge=10, description="each call in {cycle} is shown clipped to this length"
    )

    @model_validator(mode="after")
    def _check(self) -> OscillationSettings:
        if self.max_period < self.min_period:
            raise ValueError(
                f"max_period ({self.max_period}) must be >= min_period ({self.min_period})"
            )
        if self.max_long_period < self.max_period:
            raise ValueError(
                f"max_long_period ({self.max_long_period}) must be >= max_period "
                f"({self.max_period})"
            )
        if self.max_period * self.cycles > self.window:
            raise ValueError(
                f"window ({self.window}) must hold max_period * cycles "
                f"({self.max_period * self.cycles}) symbols"
            )
        check_templates(self, ("message", "stop_message"), dict(cycle="a -> b", period=2, hits=1))
        return self


class CycleDetector:
    """Incremental periodicity check over a stream of symbols (constant memory and work).

    After each :meth:`push`, :meth:`period` is the smallest ``p`` in ``min_period..max_period``
    such that the last ``p * cycles`` symbols are ``cycles`` copies of the last ``p`` symbols,
    and those ``p`` symbols are not all the same -- or None.
    """

    __slots__ = ("_cycles", "_max", "_min", "_runs", "_symbols")

    def __init__(
        self, min_period: int = 2, max_period: int = 4, cycles: int = 2, window: int = 8
    ) -> None:
        self._min, self._max, self._cycles = min_period, max_period, cycles
        self._symbols: deque[str] = deque(maxlen=max(window, max_period * cycles))
        # _runs[p]: how many of the latest symbols equal the symbol p places before them,
        # for the periods where that is not 0 (in ascending order): a long max_period costs
        # one pass over the latest symbols, not a dict or deque lookup per period
        self._runs: dict[int, int] = {}

    def push(self, symbol: str) -> None:
        runs, lo = self._runs, self._min
        new: dict[int, int] = {}
        for p, earlier in enumerate(islice(reversed(self._symbols), self._max), 1):
            if earlier == symbol and p >= lo:
                new[p] = runs.get(p, 0) + 1
        self._runs = new
        self._symbols.append(symbol)

    def period(self) -> int | None:
        need = self._cycles - 1
        for p, run in self._runs.items():
            if run >= p * need:
                latest = reversed(self._symbols)
                first = next(latest)
                if any(s != first for s in islice(latest, p - 1)):
                    return p
        return None

    def last(self, k: int) -> list[str]:
        """The latest ``k`` symbols, oldest first."""
        syms = self._symbols
        n = len(syms)
        return [syms[i] for i in range(max(0, n - k), n)]


@dataclass(slots=True)
class _State:
    detector: CycleDetector
    #: symbol -> the call that first showed it, whose label is rendered only for a verdict
    #: (most symbols never are); plugins may not change a call's arguments (hookspecs).
    #: Least recently seen first: a symbol still in either window is never the one dropped
    labels: OrderedDict[str, ToolCall] = field(default_factory=OrderedDict)
    last_digest: OrderedDict[str, str] = field(default_factory=OrderedDict)
    hits: int = 0
    #: the calls as they were answered: fingerprint and answer (volatile parts masked)
    answered: CycleDetector | None = None
    hit_step: int = -1  # the model turn of the latest hit (one hit per turn)


# json.dumps(v, ensure_ascii=False, default=str), with the encoder built once
_dumps = json.JSONEncoder(ensure_ascii=False, default=str).encode


def _label(call: ToolCall, limit: int) -> str:
    if call.arguments is not None:
        args = ", ".join(f"{k}={_dumps(v)}" for k, v in call.arguments.items())
    else:
        args = call.raw_arguments
    text = f"{call.name}({args})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Oscillation(Plugin[OscillationSettings]):
    """Warns about, then stops, runs that cycle between a few calls (module docstring)."""

    name = "oscillation"
    Settings = OscillationSettings

    def __init__(self, settings: OscillationSettings | None = None) -> None:
        super().__init__(settings)
        #: oscillation hits in a run (the record's ``oscillation_hits``)
        self.hits = StashKey[int]()
        s = self.settings
        #: symbols the answered detector keeps
        self._long_window = max(s.window, s.max_long_period * s.cycles)
        #: labels kept: every symbol of both windows (they hold at most this many distinct)
        self._labels_cap = s.window + self._long_window

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, int]:
        return {"oscillation_hits": run.stash.get(self.hits, 0)}

    def new_state(self) -> _State:
        s = self.settings
        return _State(
            CycleDetector(s.min_period, s.max_period, s.cycles, s.window),
            answered=CycleDetector(s.min_period, s.max_long_period, s.cycles, self._long_window),
        )

    def _symbol(self, st: _State, call: ToolCall) -> str:
        if call.deterministic or call.side_effect:
            return call.fingerprint
        # Non-deterministic: predicted by its last result until this one is known.
        return f"{call.fingerprint}#{st.last_digest.get(call.fingerprint, '?' + call.id)}"

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> Verdict | None:
        if not response.calls:
            return None
        st: _State = self.state(run)
        det = st.detector
        found: int | None = None
        for call in response.calls:
            tool = call.tool
            if tool is not None and tool.likely_repeatable:
                continue  # a wait or a hand-off nobody declared: polling is no cycle
            sym = self._symbol(st, call)
            det.push(sym)
            self._remember(st, sym, call)
            if found is None:
                found = det.period()
        if found is None:
            return None
        return self._hit(run, st, st.detector, found)

    def _remember(self, st: _State, sym: str, call: ToolCall) -> None:
        """Keep ``sym``'s label, dropping the least recently seen beyond the cap (bounded
        state: a symbol still in a window was seen more recently than any it displaces)."""
        labels = st.labels
        if sym in labels:
            labels.move_to_end(sym)
            return
        labels[sym] = call
        if len(labels) > self._labels_cap:
            labels.popitem(last=False)

    def _hit(self, run: Run, st: _State, det: CycleDetector, period: int) -> Verdict | None:
        if st.hit_step == run.step:
            return None  # this turn's cycle is counted already
        st.hit_step = run.step
        st.hits += 1
        run.stash[self.hits] = run.stash.get(self.hits, 0) + 1
        return self._verdict(run, st, det, period)

    def _verdict(self, run: Run, st: _State, det: CycleDetector, period: int) -> Verdict:
        s = self.settings
        cycle_syms = det.last(period)
        limit = s.max_label_chars
        labels = [
            _label(call, limit) if (call := st.labels.get(sym)) is not None else sym
            for sym in cycle_syms
        ]
        cycle = " -> ".join(labels)
        evidence: dict[str, Any] = dict(
            count=st.hits,
            signatures=list(cycle_syms),
            period=period,
            cycles=s.cycles,
            window=s.window,
            hits=st.hits,
            threshold=s.stop_at_hit,
            cycle=cycle_syms,
            calls=cycle,
            step=run.step,
        )
        # each call is model text: quoted as data, joined by the runtime's arrows
        quoted = runtime(" -> ".join(quote_data(label) for label in labels))
        fields = dict(cycle=quoted, period=period, hits=st.hits)
        if st.hits >= s.stop_at_hit:
            return self.stop(
                "oscillation",
                soft=s.soft,
                message=render_note(s.stop_message, **fields),
                **evidence,
            )
        return self.warn(render_note(s.message, **fields), **evidence)

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        """Remember a non-deterministic call's result digest (its next symbol), and look for
        a cycle of calls *as answered*: an edit made, reverted and made again with the same
        answers is a cycle even though each edit changes the world."""
        tool = call.tool
        if result.skipped or (tool is not None and tool.likely_repeatable):
            return None
        st: _State = self.state(run)
        det = st.answered
        found: int | None = None
        if det is not None:
            sym = f"{call.fingerprint}#{result.digest}"
            det.push(sym)
            self._remember(st, sym, call)
            found = det.period()
        if not (call.deterministic or call.side_effect):
            st.last_digest[call.fingerprint] = result.digest
            st.last_digest.move_to_end(call.fingerprint)
            if len(st.last_digest) > self.settings.window:
                st.last_digest.popitem(last=False)
        if found is None or det is None:
            return None
        return self._hit(run, st, det, found)
