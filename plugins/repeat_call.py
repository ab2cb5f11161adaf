"""repeat_call: the same call again, when it cannot bring anything new.

Two calls are the same when their fingerprints match (tool name + canonical arguments, computed
once by the loop with ``[run] volatile_keys``; see :mod:`loopwarden.fingerprint`).  What a
repeat means depends on the tool's nature and on the last *real* result of that fingerprint
(skipped calls' synthetic observations are never results):

* **read-only + deterministic tool, earlier call succeeded** -- the answer cannot change.
  Repeats are skipped: the model gets the earlier observation plus a hint, and the hint is
  injected as a warning.  The repeat numbered ``stop_at_repeat`` (default: the fourth, the
  fifth identical call) stops the run with ``repeat_call``.
* **earlier call failed with a non-retryable error** (``NOT_FOUND``, an unknown tool, bad
  arguments) -- skipped the same way ("this call already failed with ...; do not retry it"),
  then stopped.
* **earlier call failed with a retryable error** -- the repeat is a retry and is allowed while
  the last result of that fingerprint says ``retryable``.  The ``retry_policy`` plugin (placed
  before this one) turns ``result.retryable`` off when its budget is spent; from then on the
  non-retryable rule applies.  Allowed retries do not count toward the window rule.
* **non-deterministic tool** (a clock, live stock, polling), and **every tool whose nature
  is not declared** (a framework's ``bash``, ``edit_file``, ``cd``) -- not a repeat while its
  results change.  A call whose result equals the previous result of the same fingerprint is a
  repeat: each warns, saying which call repeated, the ``stop_at_repeat``-th stops.  It cannot
  be skipped (only running it tells whether the result changed).
* **side-effect tool** -- never skipped as a repeat (the loop already returns the earlier
  result for the same idempotency key and never runs the side effect twice); only the window
  rule may stop it.

**Answers compared** by the shared rule of :mod:`loopwarden.fingerprint`: a successful answer
by its digest (volatile parts masked, numbers kept), a failure by its shape (every number
masked: the same error with a new line number is the same error).  The same call of an
undeclared tool ``shape_streak`` times in a row, answered alike but for numbers that keep coming
back (3, 4, 3, 3, 4 of 10 healthy), stops; numbers that move on (10%, 20%, 30%) are progress.

**Only a repeat with nothing new in between counts.**  An answer is *new* when the run has not
seen it before (from any call).  A repeat whose call got new answers in between -- a directory
listed again beside each new file read, a migration retried after reading something new -- is
weak evidence: a successful one is not counted, a failing one is warned once and stopped only
after ``ignored_failure_warnings`` more.  A repeat with nothing new since (in a row, or
interleaved with no-op calls that say nothing new) counts.  The held-back runs escaped after up
to four identical calls in a row and the loops to stop repeat five times or more, hence
``stop_at_repeat = 4`` (docs/defaults.md).  When the model's own text stands still as well --
the turn's text nearly the same as when the call got its last answer -- its reasoning is not
moving either: such a repeat stops at ``still_text_stop_at_repeat`` (the third identical call).
An empty text is no evidence either way.

Window rule: ``window_count`` repeats of one fingerprint within the last ``window`` tool calls,
nothing new in between, stop the run, even with other calls between them (real runs interleave
repeats with no-op calls).

A repeat is only a repeat while nothing has changed the world.  Every executed, successful
call that may change state (:attr:`loopwarden.ToolCall.may_change_state`: a tool not declared
``read_only``, unless it is undeclared and named like a lookup) starts a new *epoch*: earlier
results are no longer handed back, and calls before and after it are not repeats of each
other (looking an order up again after a refund, re-running a speed test after toggling a
setting, re-running the tests after an edit, ``ls`` after ``cd`` is how an agent works).  A
call does not change the world for itself: ``cd repo/`` again with the same output, nothing
else in between, is a repeat.  Repeated calls of a declared side effect count across epochs:
the loop replays them, so they change nothing.

Every repeat detected adds one to the run record's ``duplicate_calls``.  State per run is
bounded: at most ``max_fingerprints`` fingerprints (least recently used forgotten first),
each with one clipped observation, and a window of ``window`` calls.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from loopwarden import ModelResponse, Plugin, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.fingerprint import shape_of
from loopwarden.notes import render_note, tool_name
from loopwarden.plugins._repeat_call import RepeatCallSettings, _Entry, _Pending, _State
from loopwarden.plugins._text import jaccard, token_set
from loopwarden.sanitize import first_line as _first_line
from loopwarden.stash import StashKey

__all__ = ["RepeatCall", "RepeatCallSettings"]


class RepeatCall(Plugin[RepeatCallSettings]):
    """Skips, warns about and finally stops repeated tool calls (see the module docstring)."""

    name = "repeat_call"
    Settings = RepeatCallSettings

    def __init__(self, settings: RepeatCallSettings | None = None) -> None:
        super().__init__(settings)
        #: duplicate calls in a run (the record's ``duplicate_calls``)
        self.repeats = StashKey[int]()

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, int]:
        return {"duplicate_calls": run.stash.get(self.repeats, 0)}

    def new_state(self) -> _State:
        return _State(window=deque(maxlen=self.settings.window))

    # -- helpers -------------------------------------------------------------------------

    def _entry(self, st: _State, fp: str) -> _Entry:
        e = st.entries.get(fp)
        if e is None:
            e = st.entries[fp] = _Entry()
            if len(st.entries) > self.settings.max_fingerprints:
                st.entries.popitem(last=False)
        else:
            st.entries.move_to_end(fp)
        return e

    @staticmethod
    def _volatile(call: ToolCall) -> bool:
        """A call judged by its result: a valid call of a non-deterministic, side-effect-free
        tool (for a tool that is not declared at all the same holds: its result decides)."""
        return call.error is None and not call.side_effect and not call.deterministic

    @staticmethod
    def _key(result: ToolResult) -> str:
        """What an answer is compared by: a success by its digest, a failure by its shape
        (every number masked too) -- the rule of :mod:`loopwarden.fingerprint`."""
        return result.digest if result.ok else "!" + shape_of(result.said)

    def _note(self, st: _State, key: str, moved: bool) -> None:
        """Count the answer ``key`` as news when the run has not seen it recently, unless
        only its numbers ``moved`` from its call's last answer (a clock read again says
        nothing new about the task)."""
        said = st.said
        if key in said:
            said.move_to_end(key)
            return
        if not moved:
            st.news += 1
        said[key] = None
        if len(said) > self.settings.max_fingerprints:
            said.popitem(last=False)

    def _in_window(self, st: _State, key: str) -> int:
        # entries are (key, counts) with counts a bool: count the counting ones, in C
        return st.window.count((key, True))

    def _evidence(
        self, call: ToolCall, e: _Entry, window_hits: int, **extra: Any
    ) -> dict[str, Any]:
        s = self.settings
        return dict(
            tool=call.name,
            fingerprint=call.fingerprint,
            signature=call.signature(),
            count=e.seen,
            repeats=e.repeats,
            threshold=s.stop_at_repeat,
            window=s.window,
            window_count=window_hits,
            window_threshold=s.window_count,
            step=call.step,
            **extra,
        )

    @staticmethod
    def _fields(call: ToolCall, e: _Entry) -> dict[str, Any]:
        """The template fields of a call: its tool's name (registered: runtime text, made
        up: data) and signature (model text: a note quotes it, see :mod:`loopwarden.notes`);
        an observation, a tool message, shows them as they are."""
        return dict(name=tool_name(call), signature=call.signature(), count=e.seen)

    def _stop(
        self, call: ToolCall, e: _Entry, window_hits: int, *, by_repeats: bool = True, **extra: Any
    ) -> Verdict:
        """The stop verdict; ``rule`` in its evidence names the rule that fired."""
        s = self.settings
        rule = extra.pop("rule", None) or (
            "repeat" if by_repeats and e.repeats >= s.stop_at_repeat else "window"
        )
        if rule == "still_text":
            extra["threshold"] = s.still_text_stop_at_repeat
        sig = call.signature()
        return self.stop(
            "repeat_call",
            soft=s.soft,
            message=render_note(s.stop_message, name=tool_name(call), signature=sig, count=e.seen),
            **{**self._evidence(call, e, window_hits, rule=rule), **extra},
        )

    def _stops(
        self, e: _Entry, window_hits: int, st: _State | None = None, *, by_repeats: bool = True
    ) -> str | None:
        """The rule by which the entry's counted repeats (unless not ``by_repeats``: a side
        effect) or the window's stop the run, or None; with ``st``, a repeat in a turn whose
        text stands still since the call's last answer stops earlier (``still_text``)."""
        s = self.settings
        if by_repeats and e.repeats >= s.stop_at_repeat:
            return "repeat"
        if window_hits >= s.window_count:
            return "window"
        early = s.still_text_stop_at_repeat
        if (
            early is not None
            and st is not None
            and e.repeats >= early
            and st.text
            and e.text
            and jaccard(st.text, e.text) >= s.still_text_similarity
        ):
            return "still_text"
        return None

    @hookimpl
    def after_response(self, run: Run, response: ModelResponse) -> None:
        """Keep the words of this turn's text: a repeat judged in it compares them with those
        of the turn of the call's last answer."""
        st: _State = self.state(run)
        content = (response.content or "").strip()
        st.text = token_set(content, 2000) if content else frozenset()

    def _follow(self, st: _State, e: _Entry, fp: str, shape: str, key: str) -> None:
        """Carry on or restart the entry's streak of answers of one shape: an answer in the
        streak whose numbers came back (its key seen in the streak) is stale, a failure
        always is (its numbers are noise)."""
        if st.last_fp == fp and shape == e.shape:
            e.streak += 1
            if key in e.values or key.startswith("!"):
                e.stale += 1
            e.values = (*e.values[-(self.settings.shape_streak or 3) :], key)
        else:
            e.streak, e.stale, e.values = 1, 0, (key,)
        e.shape = shape

    def _weak_failure(
        self, run: Run, call: ToolCall, result: ToolResult, e: _Entry, st: _State
    ) -> Verdict | None:
        """The identical failure again, with new answers in between: the agent is working
        around it.  Warned once, saying what failed; stopped only when the same failing call
        comes ``ignored_failure_warnings`` more times after the warning."""
        s = self.settings
        e.weak += 1
        run.stash[self.repeats] = run.stash.get(self.repeats, 0) + 1
        hits = self._in_window(st, f"{call.fingerprint}@{st.epoch}#{self._key(result)}")
        if e.weak > s.ignored_failure_warnings:
            return self._stop(
                call, e, hits, by_repeats=False, rule="ignored_warning", ignored=e.weak - 1
            )
        if e.weak > 1:
            return None  # warned already: the model has the note
        fields = self._fields(call, e)
        return self.warn(
            render_note(s.failed_hint, error=_first_line(result.content), **fields),
            **self._evidence(call, e, hits, rule="failed_between_successes"),
        )

    def _shape_streak(self, call: ToolCall, e: _Entry, *, expected: bool = False) -> Verdict | None:
        """The same call of an undeclared tool in a row, its answer the same apart from its
        numbers, and those numbers coming back: a status that never settles.  Warned at
        ``shape_streak - 2`` calls, stopped at ``shape_streak`` with ``shape_streak - 2`` stale
        answers (:meth:`_follow` has counted this one)."""
        s = self.settings
        limit = s.shape_streak
        # the streak (:meth:`_follow`) is of calls in a row; a declared nature vouches that
        # its answers change (no shape kept)
        if limit is None or not e.shape or e.streak < 2:
            return None
        n = e.streak  # this call included
        if n >= limit and e.stale >= limit - 2:
            return self._stop(
                call, e, 0, by_repeats=False, rule="same_shape", streak=n, stale=e.stale
            )
        if n == limit - 2 and e.stale and not expected:
            return self.warn(
                render_note(s.unchanged_hint, **self._fields(call, e)),
                **self._evidence(call, e, 0, rule="same_shape", streak=n),
            )
        return None

    # -- hooks ---------------------------------------------------------------------------

    def new_conversation_state(self) -> OrderedDict[str, list[Any]]:
        # fingerprint -> [clipped observation, digest, repeats] of a call that failed for good
        return OrderedDict()

    def _remember_failure(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        failures: OrderedDict[str, list[Any]] = self.conversation_state(run)
        fp = call.fingerprint
        if result.ok:
            failures.pop(fp, None)
            if call.may_change_state:
                failures.clear()  # the world changed: earlier failures may not hold now
        elif not result.retryable:
            known = failures.get(fp)
            failures[fp] = [
                result.content[: self.settings.max_observation_chars],
                result.digest,
                known[2] if known is not None else 0,
            ]
            failures.move_to_end(fp)
            if len(failures) > self.settings.max_fingerprints:
                failures.popitem(last=False)

    def _failed_again(
        self, run: Run, call: ToolCall, result: ToolResult, e: _Entry, st: _State
    ) -> Verdict | None:
        """A call that failed for good in an earlier user turn ran again: failing again is a
        repeat (warned, then stopped); succeeding forgets the old failure."""
        carried = e.carried
        if carried is None or result.ok or result.retryable:
            return None
        s = self.settings
        carried[2] += 1
        e.repeats = carried[2]
        e.seen = max(e.seen, e.repeats + 1)  # calls made, counting the earlier turns
        run.stash[self.repeats] = run.stash.get(self.repeats, 0) + 1
        hits = self._in_window(st, f"{call.fingerprint}@{st.epoch}")
        if e.repeats >= s.stop_at_repeat:
            return self._stop(call, e, hits, across_turns=True)
        error = _first_line(result.content)
        fields = self._fields(call, e)
        return self.warn(
            render_note(s.failed_hint, error=error, **fields),
            **self._evidence(call, e, hits, rule="failed", across_turns=True),
        )

    @staticmethod
    def _hold(st: _State, pending: _Pending) -> None:
        """Keep before_tool's decision for the call's after_tool -- per call: a front that
        sees a whole answer at once (the gateway) decides every call of it before any result."""
        call = pending.call
        if st.pending and next(iter(st.pending))[0] != call.step:
            st.pending.clear()  # calls of an earlier turn that never got a result
        st.pending[(call.step, call.index)] = pending

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        st: _State = self.state(run)
        s = self.settings
        fp = call.fingerprint
        e = self._entry(st, fp)
        e.seen += 1
        tool = call.tool
        if tool is not None and tool.likely_repeatable:
            # a hand-off or a wait nobody declared: its repeats are expected, not a loop
            self._hold(st, _Pending(call, retry=False, deferred=False, entry=e, expected=True))
            return None
        if not e.has_result and e.carried is None and s.failures_across_turns:
            # failed for good in an earlier run of this conversation: it runs once more (the
            # user may have fixed something); after_tool judges the result
            e.carried = self.conversation_state(run).get(fp)
        retry = e.has_result and not e.ok and e.retryable
        current = e.has_result and e.epoch == st.epoch  # a result nothing has changed since
        if e.has_result and not current and not retry:
            e.repeats = 0  # the world changed since its result: a fresh call
        # A non-deterministic call is judged by its result -- unless it failed for good and
        # its tool's nature is declared (an undeclared tool is never skipped: a guess must
        # not change execution).
        deferred = self._volatile(call) and (not current or e.ok or retry or not call.declared)
        self._hold(st, _Pending(call, retry=retry, deferred=deferred, entry=e))
        if deferred:
            return None
        side_effect = call.side_effect and call.error is None
        # the window keys a call with the count of new answers so far: a repeat with nothing
        # new since shares its key with the repeat before it (the first call's own new answer
        # sets it apart, so the hits count repeats)
        key = (fp if side_effect else f"{fp}@{st.epoch}") + f"~{st.news}"
        st.window.append((key, not retry))
        hits = self._in_window(st, key)
        repeat = current or (side_effect and e.has_result)
        if retry or not repeat:
            # no result to repeat (e.g. earlier occurrences skipped by other plugins): the
            # first of the calls sharing its key is not a repeat
            if hits - 1 >= s.window_count:
                return self._stop(call, e, hits - 1, by_repeats=False)
            return None
        if st.news == e.news:  # nothing new since its last answer: a repeat that counts
            e.repeats += 1
        run.stash[self.repeats] = run.stash.get(self.repeats, 0) + 1
        if not e.ok and s.failures_across_turns:
            remembered = self.conversation_state(run).get(fp)
            if remembered is not None:
                remembered[2] = max(remembered[2], e.repeats)  # carries on to the next turn
        if side_effect and e.ok:
            # Never skipped: the loop replays the earlier result for the same idempotency key.
            rule = self._stops(e, hits, st, by_repeats=False)
            if rule:
                return self._stop(call, e, hits, rule=rule)
            return None
        rule = self._stops(e, hits, st)
        if rule:
            return self._stop(call, e, hits, rule=rule)
        fields = self._fields(call, e)
        if not e.ok:
            error = _first_line(e.content)
            hint = render_note(s.failed_hint, error=error, **fields)
            return self.skip(
                s.failed_observation.format(
                    observation=e.content, hint=hint, error=error, **fields
                ),
                message=hint,
                **self._evidence(call, e, hits, rule="failed"),
            )
        hint = render_note(s.repeat_hint, **fields)
        if call.read_only:
            return self.skip(
                s.repeat_observation.format(observation=e.content, hint=hint, **fields),
                message=hint,
                **self._evidence(call, e, hits, rule="repeat"),
            )
        # deterministic but not declared read-only: its result is above, but do not skip it
        return self.warn(hint, **self._evidence(call, e, hits, rule="repeat"))

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        st: _State = self.state(run)
        pending = st.pending.pop((call.step, call.index), None)
        if pending is None or pending.call is not call:
            pending = _Pending(call, retry=False, deferred=False)
        fp = call.fingerprint
        # the entry before_tool used, still the most recent one (no call came in between)
        e = pending.entry if pending.entry is not None else self._entry(st, fp)
        if result.skipped:
            if pending.deferred and not pending.expected:
                st.window.append((fp, False))
            return None
        key = self._key(result)
        strong = st.news == e.news  # nothing new said since this call's last answer
        form = shape_of(result.said)
        self._note(st, key, e.has_result and form == e.form)
        shape = "" if self.settings.shape_streak is None or call.declared else form
        self._follow(st, e, fp, shape, key)
        verdict: Verdict | None = None
        if pending.expected:
            # a hand-off or a wait: only a long streak in a row is a loop (a hand-off called
            # a hundred times); a few repeats are the run ending, or time passing
            verdict = self._shape_streak(call, e, expected=True)
        elif pending.deferred:
            verdict = self._judge(run, call, result, e, st, pending, key, strong)
        if e.carried is not None and not e.has_result:
            verdict = self._failed_again(run, call, result, e, st) or verdict
        if not pending.expected and self.settings.failures_across_turns:
            self._remember_failure(run, call, result)
        if result.ok and call.may_change_state:
            st.epoch += 1  # this call may have changed the world
        st.last_fp = fp
        e.news = st.news
        e.has_result = True
        e.epoch = st.epoch
        e.ok = result.ok
        e.retryable = result.retryable
        e.content = result.content[: self.settings.max_observation_chars]
        e.digest = key
        e.form = form
        e.text = st.text
        return verdict

    def _judge(
        self,
        run: Run,
        call: ToolCall,
        result: ToolResult,
        e: _Entry,
        st: _State,
        pending: _Pending,
        key: str,
        strong: bool,
    ) -> Verdict | None:
        """Judge a call by its answer: the same outcome as last time (the same answer, or a
        failure of the same shape), nothing having changed the world since, is a repeat --
        counted when nothing new was said in between, weak evidence otherwise."""
        s = self.settings
        unchanged = (
            e.has_result
            and e.epoch == st.epoch
            and e.ok == result.ok
            and not pending.retry
            and key == e.digest
        )
        wkey = f"{call.fingerprint}@{st.epoch}#{key}~{st.news}"
        st.window.append((wkey, not pending.retry and unchanged and strong))
        if unchanged and not strong:
            if not result.ok:
                return self._weak_failure(run, call, result, e, st)
            return None  # the same answer, but the run learned something in between
        if not unchanged:
            e.repeats = 0  # the result changed: not a repeat
            return self._shape_streak(call, e)
        e.repeats += 1
        run.stash[self.repeats] = run.stash.get(self.repeats, 0) + 1
        hits = self._in_window(st, wkey)
        rule = self._stops(e, hits, st)
        if rule:
            return self._stop(call, e, hits, rule=rule, result_digest=result.digest)
        fields = self._fields(call, e)
        hint = (
            render_note(s.unchanged_hint, **fields)
            if result.ok
            else render_note(s.failed_hint, error=_first_line(result.content), **fields)
        )
        return self.warn(
            hint, **self._evidence(call, e, hits, rule="unchanged", result_digest=result.digest)
        )
