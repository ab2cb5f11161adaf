"""Tool calls as the step machine handles them before and instead of executing them.

A response's proposals parsed into :class:`~loopwarden.ToolCall` objects (arguments decoded and
validated, fingerprint and idempotency key computed) -- :func:`parse_calls`, public through
:mod:`loopwarden.engine.loop` for the test kit and the framework adapters -- the checks on a model
adapter's response, and the observations the machine writes for a call it does not execute:
invalid, a side effect the run's ledger already holds, or one the shared ledger answers for.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from loopwarden.events import (
    IN_DOUBT,
    ErrorKind,
    ModelResponse,
    ProposedCall,
    ToolCall,
    ToolResult,
    Usage,
)
from loopwarden.fingerprint import Fingerprinter
from loopwarden.run import Run
from loopwarden.sanitize import clean_text, loads_arguments
from loopwarden.tools import format_validation_error

if TYPE_CHECKING:
    from loopwarden.config import RunConfig, Texts
    from loopwarden.store import LedgerEntry

__all__ = ["CORE", "parse_calls"]

CORE = "loopwarden"  # the plugin name on notes and skips the loop writes itself


def parse_calls(
    run: Run, response: ModelResponse, settings: RunConfig | None = None
) -> list[ToolCall]:
    """Parse ``response.tool_calls`` exactly as the loop does: arguments decoded and validated
    against ``run.tools`` (an unknown tool or bad arguments set ``call.error``), and
    ``fingerprint`` (with ``settings.volatile_keys``), ``idempotency_key`` and ``timeout``
    computed -- for the test kit and the framework adapters, which must see the calls the
    plugins see.  ``settings`` defaults to the run's deployment's ``[run]`` table."""
    if settings is None:
        from loopwarden.config import RunConfig

        dep = run.deployment
        settings = dep.config.run if dep is not None else RunConfig()
    return parse_proposals(run, response, Fingerprinter(settings.volatile_keys))


def parse_proposals(
    run: Run, response: ModelResponse, fingerprint: Fingerprinter
) -> list[ToolCall]:
    """:func:`parse_calls` with the engine's own fingerprinter (the machine's hot path)."""
    calls = []
    for i, pc in enumerate(response.tool_calls):
        call_id = pc.id or f"call_{run.step}_{i}"
        err: ErrorKind | None = None
        detail: str | None = None
        parsed: Any = None
        raw: Any = pc.arguments
        text = type(raw) is str  # the common case, told without an isinstance() call
        if not text and isinstance(raw, dict):  # adapters handing over parsed arguments: re-read
            try:  # as text, so that they are checked (depth, surrogates) like text
                raw = json.dumps(raw, ensure_ascii=False, default=str)
            except (ValueError, TypeError, RecursionError) as exc:
                raw, err, detail = "{}", "malformed_arguments", f"not encodable: {exc}"
        if raw is None:  # some providers send null for a call without arguments
            parsed, raw = {}, ""
        elif not text and not isinstance(raw, str):
            raw = clean_text(repr(raw))
            err, detail = "malformed_arguments", "arguments are not JSON text"
        elif err is None:
            if not raw.isascii():  # clean_text leaves ASCII text as it is
                raw = clean_text(raw)
            try:
                parsed = loads_arguments(raw) if raw.strip() else {}
            except ValueError as exc:  # also too deep, or a number Python refuses
                err, detail = "malformed_arguments", str(exc)
        pc.arguments = raw  # plugins always see JSON text, as ProposedCall promises
        is_object = type(parsed) is dict or isinstance(parsed, dict)
        if err is None and not is_object:
            err, detail = "malformed_arguments", "arguments must be a JSON object"
        tool = run.tools.get(pc.name) if run.tools is not None else None
        args: dict[str, Any] | None = parsed if is_object else None
        if err is None and tool is None:
            err = "unknown_tool"
        if err is None and tool is not None and args is not None:
            try:
                args = tool.validate(args)
            except ValidationError as exc:
                err, detail = "invalid_arguments", format_validation_error(exc)
        fp_args: Any = args if args is not None else raw
        call = ToolCall(
            name=pc.name,
            arguments=args,
            raw_arguments=raw,
            id=call_id,
            step=run.step,
            index=i,
            fingerprint=fingerprint(
                pc.name, fp_args, tool.normalize_arguments if tool is not None else True
            ),
            tool=tool,
            error=err,
            error_detail=detail,
        )
        if tool is not None:
            call.timeout = tool.timeout_s
            if err is None and tool.side_effect and args is not None:
                call.idempotency_key = tool.idempotency_key(args, fingerprint.volatile_keys)
        calls.append(call)
    return calls


def ignore_proposals(response: ModelResponse) -> list[ToolCall]:
    """A final (tool-less) turn's proposals: none runs, but each is kept as JSON text."""
    for pc in response.tool_calls:
        raw: object = pc.arguments  # typed str, but adapters may hand over parsed arguments
        if not isinstance(raw, str):
            try:
                text = json.dumps(raw, ensure_ascii=False, default=str)
            except (ValueError, TypeError, RecursionError):
                text = "{}"
            pc.arguments = clean_text(text)
    return []


# -- a model adapter's response ---------------------------------------------------------------


def well_formed(response: Any) -> bool:
    """Content is text or None, and every proposed call is a ProposedCall with a str name
    (a model adapter is third-party code: its response is checked, not trusted)."""
    # written out, without all() over generators: this runs on every model turn
    content = response.content
    if content is not None and type(content) is not str and not isinstance(content, str):
        return False
    usage = response.usage
    if usage is not None:
        if type(usage) is not Usage and not isinstance(usage, Usage):
            return False
        prompt, completion, cached = usage.prompt, usage.completion, usage.cached
        if not (
            type(prompt) is int
            and prompt >= 0
            and type(completion) is int
            and completion >= 0
            and type(cached) is int
            and cached >= 0
        ):
            return False
    calls = response.tool_calls
    if type(calls) is not list and not isinstance(calls, list):
        return False
    for c in calls:  # type(x) is T first: the exact type needs no isinstance() call
        if not (
            (type(c) is ProposedCall or isinstance(c, ProposedCall))
            and (type(c.name) is str or isinstance(c.name, str))
            and (type(c.id) is str or isinstance(c.id, str))
        ):
            return False
    return True


def clean_response(response: ModelResponse) -> None:
    """Replace lone surrogates in the model's text, call names and ids (see
    :func:`loopwarden.sanitize.clean_text`): they could not be stored, printed or sent back."""
    # clean_text returns ASCII text unchanged: asked inline first, no call for the common case
    content = response.content
    if content and not content.isascii():
        response.content = clean_text(content)
    for pc in response.tool_calls:
        if not pc.name.isascii():
            pc.name = clean_text(pc.name)
        if not pc.id.isascii():
            pc.id = clean_text(pc.id)
        args = pc.arguments
        if isinstance(args, str) and not args.isascii():
            pc.arguments = clean_text(args)


# -- observations for calls that do not run ---------------------------------------------------


def invalid_result(t: Texts, run: Run, call: ToolCall) -> ToolResult:
    """The observation for an unknown tool or malformed / invalid arguments."""
    if call.error == "unknown_tool":
        available = ", ".join(run.tools.names) if run.tools is not None else "(none)"
        text = t.unknown_tool.format(name=call.name, available=available)
    elif call.error == "malformed_arguments":
        text = t.malformed_arguments.format(name=call.name, detail=call.error_detail)
    else:
        text = t.invalid_arguments.format(name=call.name, detail=call.error_detail)
    return ToolResult(content=text, ok=False, error=call.error)


def side_effect_replay(t: Texts, call: ToolCall, earlier: ToolResult) -> ToolResult:
    """The synthetic observation for a side effect already executed with this key."""
    if earlier.ok:
        text = t.side_effect_replayed.format(name=call.name, content=earlier.content)
    elif earlier.error in IN_DOUBT:
        text = t.side_effect_unknown.format(name=call.name, content=earlier.content)
    else:
        text = t.side_effect_failed.format(name=call.name, content=earlier.content)
    return ToolResult(
        content=text,
        ok=earlier.ok,
        error=earlier.error,
        skipped=True,
        skipped_by=CORE,
        value=earlier.value,
    )


def note_ledger_answer(
    run: Run, call: ToolCall, source: str, earlier: ToolResult | LedgerEntry
) -> None:
    """Record on the run that ``call`` was answered from a record instead of running: its
    tool is *declared* a side effect, and its idempotency key was already executed -- earlier
    in this conversation (``source = "conversation"``) or by another run sharing the store's
    ledger (``"shared"``, within the ledger's scope)."""
    tool = call.tool
    keys = list(tool.idempotency_keys) if tool is not None and tool.idempotency_keys else None
    if isinstance(earlier, ToolResult):
        state = "done" if earlier.ok else "unknown" if earlier.error in IN_DOUBT else "failed"
        where = "earlier in this conversation"
    else:
        state = earlier.state
        if state == "running" and run.shared is not None and run.shared.stale(earlier):
            state = "unknown"
        where = "by another run sharing the ledger"
    run.ledger_answers.append(
        {
            "step": call.step,
            "tool": call.name,
            "call_id": call.id,
            "source": source,
            "state": state,
            "idempotency_keys": keys,
            "why": f"{call.name} is declared a side effect; the same "
            f"{'arguments ' + ', '.join(keys) if keys else 'arguments'} were executed {where}",
        }
    )


def shared_replay(t: Texts, run: Run, call: ToolCall, entry: LedgerEntry) -> ToolResult:
    """The observation for a side effect the shared ledger already holds: recorded by
    another run, in progress there, possibly taken effect, or a store that failed closed."""
    recorded = entry.result or {}
    content = str(recorded.get("content", ""))
    state = entry.state
    if state == "running" and run.shared is not None and run.shared.stale(entry):
        state = "unknown"
    error: ErrorKind
    if state == "done":
        text = t.shared_side_effect_done.format(name=call.name, content=content)
        return ToolResult(content=text, skipped=True, skipped_by=CORE)
    if state == "unknown":
        text, error = (
            t.shared_side_effect_unknown.format(name=call.name, content=content),
            "unknown_outcome",
        )
    elif state == "running":
        text, error = (
            t.shared_side_effect_in_progress.format(name=call.name, content=content),
            "in_progress",
        )
    else:
        text, error = (
            t.store_unavailable.format(name=call.name, content=content),
            "store_unavailable",
        )
    return ToolResult(content=text, ok=False, error=error, skipped=True, skipped_by=CORE)
