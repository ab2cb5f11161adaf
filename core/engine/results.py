"""A tool call's result, each way it can end: a return value (late ones become timeouts), a
timeout, an error (a :class:`~loopwarden.exceptions.ToolError`'s retry hints read, an HTTP
error's ``Retry-After``), a cancellation -- and values as the text the model reads.

Used by :mod:`loopwarden.engine.execution` (which re-exports these names) and the loop.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
from typing import TYPE_CHECKING, Any

from loopwarden.clock import MAX_DURATION_S, bounded_seconds
from loopwarden.config import Texts
from loopwarden.events import ToolCall, ToolResult
from loopwarden.exceptions import ToolError

if TYPE_CHECKING:
    from loopwarden.engine.effects import RunTool
    from loopwarden.run import Run


def tool_result(t: Texts, eff: RunTool, value: Any, started: float, run: Run) -> ToolResult:
    """Turn a tool's return value into a result (late results become timeouts)."""
    call, ctx = eff.call, eff.ctx
    now = run.clock.now()
    if ctx.deadline is not None and now >= ctx.deadline:
        return timeout_result(t, call, now - started)
    return ToolResult(content=to_text(value), duration_s=now - started, value=value)


def timeout_result(t: Texts, call: ToolCall, elapsed: float) -> ToolResult:
    # An abandoned side effect may still complete: its outcome is unknown, so it is never
    # retried automatically.
    return ToolResult(
        content=t.tool_timeout.format(name=call.name, seconds=call.timeout or elapsed),
        ok=False,
        error="timeout",
        retryable=not call.side_effect,
        duration_s=elapsed,
    )


def error_result(t: Texts, eff: RunTool, exc: BaseException, elapsed: float) -> ToolResult:
    """The result of a tool that raised: its ``ToolError``, a cancellation, or an exception."""
    if isinstance(exc, ToolError):
        if getattr(exc, "in_doubt", False):
            # the request went out, no answer came: it may have taken effect (as a timeout)
            return ToolResult(
                content=to_text(exc.message),
                ok=False,
                error="unknown_outcome",
                retryable=exc.retryable and not eff.call.side_effect,
                duration_s=elapsed,
            )
        return ToolResult(
            content=to_text(exc.message),
            ok=False,
            error="tool_error",
            retryable=exc.retryable,
            duration_s=elapsed,
            retry_after=retry_after_of(exc),
        )
    if eff.ctx.cancel.cancelled:
        return ToolResult(
            content=t.tool_cancelled.format(name=eff.call.name),
            ok=False,
            error="cancelled",
            duration_s=elapsed,
        )
    retryable = eff.tool.is_retryable(exc)
    return ToolResult(
        content=f"ERROR: {type(exc).__name__}: {safe_str(exc)}",
        ok=False,
        error="exception",
        retryable=retryable,
        duration_s=elapsed,
        retry_after=retry_after_of(exc) if retryable else None,
    )


def retry_after_of(exc: BaseException) -> float | None:
    """The seconds a failure asks to wait before trying again: a ``ToolError``'s
    ``retry_after``, else an HTTP error's ``Retry-After`` header (seconds or an HTTP date,
    as httpx's, requests' and openai's errors carry it on ``exc.response``)."""
    given = getattr(exc, "retry_after", None)
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        try:
            seconds = float(given)  # an int too large for a float overflows
        except OverflowError:
            return MAX_DURATION_S if given > 0 else 0.0
        return bounded_seconds(seconds) if math.isfinite(seconds) else None
    headers = getattr(getattr(exc, "response", None), "headers", None)
    try:
        value = None if headers is None else headers.get("retry-after", headers.get("Retry-After"))
    except Exception:  # a third-party object that only looks like headers
        return None
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return bounded_seconds(seconds) if math.isfinite(seconds) else None


def cancelled_result(t: Texts, eff: RunTool, *, started: bool = True) -> ToolResult:
    """A cancelled call: in doubt once the tool started; ``started=False`` (``attempts``
    0): cancelled before it started, nothing was executed."""
    return ToolResult(
        content=t.tool_cancelled.format(name=eff.call.name),
        ok=False,
        error="cancelled",
        attempts=1 if started else 0,
    )


def to_text(value: Any) -> str:
    """A tool's return value as the observation text -- whatever the value: one whose
    ``__str__`` raises, or an int too long to print (``10**5000``), gives a placeholder."""
    if isinstance(value, str):
        return value
    if value is None:
        return "(no output)"
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except Exception:  # not JSON, or its __str__ / __repr__ raise: third-party objects
        return safe_str(value)


def safe_str(value: object) -> str:
    """``str(value)``, or a placeholder when that raises (third-party objects; an int longer
    than Python prints)."""
    try:
        return str(value)
    except Exception as exc:
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits, too long to print>"
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"
