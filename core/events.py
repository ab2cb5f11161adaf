"""The payloads hooks receive: model requests and responses, tool calls and results.

Argument names are identical across hooks (``run``, ``request``, ``response``, ``call``,
``result``, ``outcome``), so an implementation takes only the ones it needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import TYPE_CHECKING, Any, Literal

from loopwarden.fingerprint import AnswerMasks, default_masks

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken
    from loopwarden.tools import Tool

__all__ = [
    "IN_DOUBT",
    "ModelDelta",
    "ModelRequest",
    "ModelResponse",
    "ProposedCall",
    "RetryPlan",
    "ToolCall",
    "ToolResult",
    "Usage",
]


@dataclass(slots=True)
class Usage:
    """Token usage of one model call (or a run's total)."""

    #: prompt (input) tokens billed
    prompt: int = 0
    #: completion (output) tokens billed
    completion: int = 0
    #: prompt tokens served from the provider's cache (part of ``prompt``)
    cached: int = 0

    @property
    def total(self) -> int:
        """``prompt + completion``."""
        return self.prompt + self.completion

    def add(self, other: Usage) -> None:
        """Add another call's usage to this one (a run's total)."""
        self.prompt += other.prompt
        self.completion += other.completion
        self.cached += other.cached

    def as_dict(self) -> dict[str, int]:
        """``prompt``, ``completion`` and ``total``, as the run record has them."""
        return {"prompt": self.prompt, "completion": self.completion, "total": self.total}


@dataclass(slots=True)
class ModelRequest:
    """What the loop is about to send to the model.

    ``notes`` are the guard warnings injected into this request (also present in
    ``messages``); ``final`` marks the tool-less wrap-up turn of a soft stop.
    ``estimated_tokens`` is the project's estimate of the prompt size.  ``timeout`` is the
    most this call may take, in seconds (None: only the model's own ``timeout_s``); in
    ``before_model`` a plugin may lower it (``request.timeout = min(request.timeout or t, t)``)
    -- the timeout plugin sets it to the run's time left.  A call that overruns it ends the
    run with ``timeout``.  ``cancel`` is the run's cancel token, so that a model client can
    give up on a call in flight when the run is cancelled.
    """

    #: the conversation in OpenAI chat format, notes included
    messages: list[dict[str, Any]]
    #: the tool schemas offered to the model (empty on a final, tool-less turn)
    tools: list[dict[str, Any]]
    #: ``"none"`` on the soft stop's wrap-up turn, else ``"auto"``
    tool_choice: Literal["auto", "none"] = "auto"
    #: the model turn this request starts (1-based)
    step: int = 1
    #: the guard warnings injected into this request (also in ``messages``)
    notes: list[str] = field(default_factory=list)
    #: True on the tool-less wrap-up turn of a soft stop
    final: bool = False
    #: the project's estimate of the prompt size
    estimated_tokens: int = 0
    #: the cap on output tokens per call (``[model] max_output_tokens``); a plugin may lower it
    max_output_tokens: int | None = None
    #: the most this call may take, in seconds (None: only the model's own ``timeout_s``); a
    #: plugin may lower it
    timeout: float | None = None
    #: the run's cancel token, for a model client to give up on a call in flight
    cancel: CancelToken | None = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class ProposedCall:
    """A tool call as the model proposed it: arguments are raw, untrusted JSON text."""

    #: the tool name the model wrote
    name: str
    #: the arguments as raw, untrusted JSON text
    arguments: str
    #: the provider's call id
    id: str = ""


@dataclass(slots=True)
class ModelResponse:
    """What the model answered: content and/or proposed tool calls, and usage.

    ``calls`` is filled by the loop before ``after_response``: the proposals parsed into
    :class:`ToolCall` objects (with their shared fingerprints) -- the very objects that
    ``before_tool`` and ``after_tool`` receive next.  It is empty on a final, tool-less turn.
    """

    #: the model's text (None when it only proposed calls)
    content: str | None = None
    #: the calls as the model proposed them (raw JSON arguments)
    tool_calls: list[ProposedCall] = field(default_factory=list)
    #: tokens billed for this call, when the provider said
    usage: Usage | None = None
    #: the provider's finish reason (``stop``, ``tool_calls``, ``length``, ...)
    finish_reason: str | None = None
    #: the model that answered, when the provider named it
    model: str | None = None
    #: the proposals parsed into ToolCall objects, filled in by the loop before
    #: ``after_response``; empty on a final turn
    calls: list[ToolCall] = field(default_factory=list)
    #: the provider's id of this response (``chatcmpl-...``), when it gave one: what a
    #: provider's logs and a trace's ``gen_ai.response.id`` are joined on
    id: str | None = None


ErrorKind = Literal[
    "tool_error",
    "unknown_tool",
    "malformed_arguments",
    "invalid_arguments",
    "timeout",
    "cancelled",
    "exception",
    # the shared ledger (loopwarden.store) stood in for a side effect
    "in_progress",
    "unknown_outcome",
    "store_unavailable",
]

#: the error kinds of a call whose outcome is unknown -- it may have taken effect: a timeout,
#: a cancellation, a tool (an MCP server, a connection) that died mid-call.  A side effect
#: ending so is recorded as "may have taken effect" and never executed again silently.
IN_DOUBT: frozenset[str] = frozenset({"timeout", "cancelled", "unknown_outcome"})


@dataclass(slots=True, frozen=True)
class RetryPlan:
    """How the runtime itself retries a call that fails with a retryable error.

    Set on :attr:`ToolCall.retry` in ``before_tool`` (the ``retry_policy`` plugin does); the
    loop then makes up to ``attempts`` executions of the call, the first included, and the
    model sees one observation.  Between attempts it waits ``backoff_s * factor ** (n - 1)``
    (capped at ``max_backoff_s``; ``jitter`` is the fraction of it drawn at random), or the
    ``Retry-After`` the failure carried.  All attempts and waits fit in the call's
    ``timeout``: a retry that could not finish in time is not started.
    """

    #: executions at most, the first included
    attempts: int
    #: the wait before the first retry, in seconds
    backoff_s: float = 1.0
    #: each further wait is this many times the one before
    factor: float = 2.0
    #: the longest wait between attempts
    max_backoff_s: float = 30.0
    #: the fraction of each wait drawn at random (0: none)
    jitter: float = 0.5
    #: retry a call that overran its deadline too (never a side effect's: its outcome is unknown)
    timeouts: bool = True

    def wait(self, retry: int, draw: float) -> float:
        """The wait before the ``retry``-th retry (1-based); ``draw`` is uniform in [0, 1)."""
        base = min(self.backoff_s * self.factor ** (retry - 1), self.max_backoff_s)
        return float(base * (1.0 - self.jitter * draw))


@dataclass(slots=True, eq=False)
class ToolCall:
    """One proposed tool call, parsed and resolved by the loop.

    ``arguments`` is the parsed (and, when valid, schema-validated) JSON object, or None when
    it could not be parsed.  ``error`` is set when the call cannot run at all
    (``malformed_arguments``, ``unknown_tool``, ``invalid_arguments``), with ``error_detail``.
    ``fingerprint`` (tool name + a hash of the canonical
    arguments) is computed once and shared by every plugin.  ``tool`` is the declared tool, or
    None for an unknown name.  In ``before_tool`` a plugin may lower ``timeout`` (seconds;
    set ``call.timeout = min(call.timeout or t, t)``), raise ``delay_s`` (a backoff the loop
    waits on the run's clock, cancellably, before executing) and set ``retry`` (a
    :class:`RetryPlan`: the runtime retries a retryable failure itself, within ``timeout``).
    """

    #: the tool name as the model wrote it (may name no tool: see ``error``)
    name: str
    #: the parsed (and, when valid, schema-validated) JSON object; None when it could not be
    #: parsed
    arguments: dict[str, Any] | None
    #: the arguments exactly as the model wrote them -- the only view of a malformed call
    raw_arguments: str
    #: the call id (the provider's, or one the loop made up); the tool message answers it
    id: str
    #: the model turn that proposed the call (1-based)
    step: int
    #: its position among that turn's calls (0-based)
    index: int
    #: tool name + a hash of the canonical arguments, computed once and shared by every plugin
    fingerprint: str
    #: the declared tool, or None for an unknown name
    tool: Tool | None = None
    #: why the call cannot run at all (``malformed_arguments``, ``unknown_tool``,
    #: ``invalid_arguments``), else None
    error: ErrorKind | None = None
    #: what was wrong, for ``error`` (model text: quote it with ``loopwarden.notes``)
    error_detail: str | None = None
    #: the most the call may take, in seconds; ``before_tool`` may lower it (``min(call.timeout or
    #: t, t)``)
    timeout: float | None = None
    #: a wait before executing, on the run's clock (cancellable); ``before_tool`` may raise it
    delay_s: float = 0.0
    #: set for a declared side effect: the key of the loop's and the shared ledger -- the same key
    #: never executes twice
    idempotency_key: str | None = None
    #: how the runtime retries a retryable failure itself (set in ``before_tool``), or None
    retry: RetryPlan | None = None

    def signature(self, limit: int = 200) -> str:
        """The call for people: ``name({"key": "value"})``, arguments clipped to ``limit``."""
        if self.arguments is not None:
            args = json.dumps(self.arguments, ensure_ascii=False, sort_keys=True, default=str)
        else:
            args = self.raw_arguments
        if len(args) > limit:
            args = args[:limit] + "..."
        return f"{self.name}({args})"

    @property
    def read_only(self) -> bool:
        """The tool is declared read-only (False for an unknown tool)."""
        return self.tool is not None and self.tool.read_only

    @property
    def deterministic(self) -> bool:
        """The tool is declared deterministic: the same arguments give the same result."""
        return self.tool is not None and self.tool.deterministic

    @property
    def side_effect(self) -> bool:
        """The tool is declared to change the world (its calls get an ``idempotency_key``)."""
        return self.tool is not None and self.tool.side_effect

    @property
    def declared(self) -> bool:
        """The tool's nature was declared (by the tool, ``[tools.<name>]`` or a framework's
        metadata), not guessed: only then may it skip a call or answer one from a record."""
        return self.tool is not None and self.tool.declared

    @property
    def may_change_state(self) -> bool:
        """Executing this call may have changed the world: a known tool neither declared
        read-only nor, when undeclared, named like a lookup.  Detectors take a repeat as loop
        evidence only when no such call ran in between."""
        tool = self.tool
        return tool is not None and not tool.read_only and not tool.likely_read_only


@dataclass(slots=True, eq=False)
class ToolResult:
    """The observation a tool call produced.

    ``content`` is what the model sees.  ``ok`` is False for any failure, with ``error`` naming
    its kind and ``retryable`` whether trying again may help.  ``skipped`` marks a synthetic
    observation (a guard's skip verdict, or the earlier result of a side effect replayed for
    the same idempotency key): it is not a tool result and must not count as one.  In
    ``after_tool`` a plugin may set ``retryable = False`` (a spent retry budget); plugins later
    in the config order see the change.  ``attempts`` is how many executions the result took
    (more than one when the runtime retried a retryable failure -- ``content`` then says so,
    while ``digest`` stays the hash of the last attempt's own output, so that detectors
    compare what the tool returned; 0 for a call cancelled before the tool started).
    ``retry_after`` is the wait a failure asked for (a ``ToolError``'s, or an HTTP
    ``Retry-After``), when it named one.
    """

    #: what the model sees
    content: str
    #: False for any failure
    ok: bool = True
    #: the failure's kind, when ``ok`` is False
    error: ErrorKind | None = None
    #: whether trying again may help; ``after_tool`` may clear it (a spent retry budget)
    retryable: bool = False
    #: a synthetic observation (a skip verdict, a ledger's answer): not a tool result
    skipped: bool = False
    #: the plugin whose skip verdict produced it
    skipped_by: str | None = None
    #: the time the execution took, on the run's clock
    duration_s: float = 0.0
    #: the tool's return value before it was turned into ``content``
    value: Any = None
    #: executions the result took (more than one when the runtime retried; 0 when the call was
    #: cancelled before the tool started: nothing was executed, nothing may have taken effect)
    attempts: int = 1
    #: the wait a failure asked for (a ``ToolError``'s, an HTTP ``Retry-After``), when it named
    #: one
    retry_after: float | None = None
    _digest: str | None = field(default=None, repr=False)
    #: the tool's own output when ``content`` carries a runtime note (a retry's summary)
    _answer: str | None = field(default=None, repr=False)
    #: the deployment's answer masks (set by the engine; None: the defaults)
    _masks: AnswerMasks | None = field(default=None, repr=False)
    _said: str | None = field(default=None, repr=False)

    @property
    def said(self) -> str:
        """What the tool answered, its volatile parts masked: the text detectors compare
        (:mod:`loopwarden.fingerprint`).  Computed once."""
        if self._said is None:
            masks = self._masks if self._masks is not None else default_masks()
            self._said = masks.mask(self._answer if self._answer is not None else self.content)
        return self._said

    @property
    def digest(self) -> str:
        """A short hash of what the tool answered, its volatile parts (line numbers, clocks,
        durations, ids, temp paths) masked: two answers with the same digest say the same
        thing (:mod:`loopwarden.fingerprint`).  Computed once."""
        if self._digest is None:
            self._digest = blake2b(self.said.encode("utf-8", "replace"), digest_size=8).hexdigest()
        return self._digest


@dataclass(slots=True)
class ModelDelta:
    """One piece of a streamed answer, as ``on_model_delta`` receives it."""

    #: this piece of text
    text: str
    #: its position in the answer (0-based)
    index: int
    #: the answer's estimated output tokens so far, this piece included
    tokens: int
    _parts: list[str] = field(default_factory=list, repr=False)

    def content(self) -> str:
        """The answer so far (joins every piece: O(length) -- not for every delta)."""
        return "".join(self._parts)
