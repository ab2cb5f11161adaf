"""Tools: declarations with a JSON schema and a nature, and a registry.

A tool is a plain function (sync or async) declared with :func:`tool`.  Its JSON schema comes
from the type hints (through pydantic), its description from the docstring, and its *nature*
from flags that guards read:

``read_only``       it changes nothing outside the run
``deterministic``   the same arguments give the same result (a clock is not)
``side_effect``     it changes the world; never executed twice for the same idempotency key
                    (its ``idempotency_keys`` arguments, normalised as fingerprints are)
``terminal``        a successful call ends the run (a hand-off to a human, a "done" tool)
``retryable``       exception types that mean "trying again may work" (besides ToolError)

Only a declared nature changes execution (a repeat skipped, a side effect answered from the
ledger).  A tool whose nature nobody declared -- a framework's tool without a ``[tools.<name>]``
table, a tool seen in a recording -- is a stand-in with ``declared = False``: it asserts none
of the flags and runs every time it is called; what its name suggests (``likely_read_only``
for ``get_...`` / ``search_...``) may only weigh a loop detector's evidence.

Arguments from the model are untrusted: :meth:`Tool.validate` checks them against the schema
before anything runs.  A parameter annotated :class:`ToolContext` is not part of the schema;
the loop passes the run's clock, cancel token and deadline through it.

May import: the lowest layer only (clock, exceptions, fingerprint) -- a tool knows nothing of
runs, plugins, the engine or the config; the run, the engine, the MCP servers, the plugins and
the commands import it.

Example (``from loopwarden import tool, ToolRegistry`` works as well; docs/tools.md)::

    from loopwarden.tools import tool

    @tool(read_only=True, deterministic=True)
    def query_order(order_id: str) -> str:
        '''Look up an order by its id.'''
        ...
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from loopwarden.clock import MAX_DURATION_S
from loopwarden.exceptions import ToolDefinitionError, ToolError
from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, idempotency_key

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken, Clock

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "tool"]


@dataclass(slots=True)
class ToolContext:
    """What a running tool may know about its run: clock, cancel token and deadline.

    Taking a ``ToolContext`` makes a tool *cooperative*: sync runs call it inline (no worker
    thread), trusting it to honour ``deadline`` -- sleep with :meth:`sleep`, bound its I/O by
    :attr:`time_left`.  A result that arrives after the deadline is discarded all the same.
    """

    #: the id of the run the call belongs to
    run_id: str
    #: the run's clock (a FakeClock in tests): measure and sleep on it
    clock: Clock
    #: set when the run is cancelled: stop early
    cancel: CancelToken
    #: the call's deadline on ``clock`` (its timeout), or None without one
    deadline: float | None = None

    @property
    def time_left(self) -> float | None:
        """Seconds until the call's deadline, or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - self.clock.now())

    def sleep(self, seconds: float) -> None:
        """Sleep on the run's clock; returns early at the deadline or on cancellation."""
        left = self.time_left
        self.clock.sleep(seconds if left is None else min(seconds, left), self.cancel)

    async def asleep(self, seconds: float) -> None:
        """:meth:`sleep` on the event loop, for async tools."""
        left = self.time_left
        await self.clock.asleep(seconds if left is None else min(seconds, left), self.cancel)


_ARGS_CONFIG = ConfigDict(extra="forbid", coerce_numbers_to_str=True)


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ").strip()


@dataclass(eq=False)
class Tool:
    """A declared tool.  Build it with :func:`tool`; the fields are read by guards."""

    #: the name the model calls it by (the function's, unless ``tool(name=...)``)
    name: str
    #: the function that runs (sync or async)
    func: Callable[..., Any]
    #: what the model reads about it (the docstring's first paragraph by default)
    description: str
    #: the pydantic model the model's arguments are validated against (from the type hints)
    args_model: type[BaseModel]
    #: it changes nothing outside the run
    read_only: bool = False
    #: the same arguments give the same result (a clock is not)
    deterministic: bool = False
    #: it changes the world: never executed twice for the same idempotency key
    side_effect: bool = False
    #: a successful call ends the run (a hand-off to a human, a "done" tool)
    terminal: bool = False
    #: exception types that mean "trying again may work" (besides a retryable ToolError)
    retryable: tuple[type[BaseException], ...] = ()
    #: the most one call may take, in seconds (None: the run's own limits only)
    timeout_s: float | None = None
    #: the arguments a side effect's idempotency key is made of (None: all of them)
    idempotency_keys: tuple[str, ...] | None = None
    #: string arguments differing only in case or surrounding whitespace are the same call
    normalize_arguments: bool = True
    #: the parameter that receives the :class:`ToolContext`, if the function takes one
    context_param: str | None = None
    #: the function is ``async def``
    is_async: bool = False
    #: False for a stand-in whose nature nobody declared (see the module docstring)
    declared: bool = True
    #: an undeclared tool whose name reads as a lookup or a probe: detectors do not take its
    #: calls as changes of the world (never a reason to skip or answer a call)
    likely_read_only: bool = False
    #: an undeclared tool whose name reads as a hand-off to a human or a wait: its repeats
    #: are expected (the run is ending as the user asked; time passes), so detectors do not
    #: take them as a loop -- never a reason to skip, end or answer a call (declare
    #: ``terminal`` to end a run at a hand-off's first success)
    likely_repeatable: bool = False
    #: the MCP server that serves the tool (``[mcp.servers.<name>]``), else None: the
    #: circuit_breaker plugin pauses all of a server's tools when the server is down
    server: str | None = None
    _schema: dict[str, Any] | None = field(default=None, repr=False)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-tool schema (computed once)."""
        if self._schema is None:
            params = self.args_model.model_json_schema()
            params.pop("title", None)
            for prop in params.get("properties", {}).values():
                prop.pop("title", None)
            params.setdefault("properties", {})
            self._schema = {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": params,
                },
            }
        return self._schema

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate model-given arguments; raises pydantic's ValidationError."""
        return self.args_model.model_validate(dict(arguments)).model_dump()

    def idempotency_key(
        self, arguments: Mapping[str, Any], volatile_keys: Iterable[str] = DEFAULT_VOLATILE_KEYS
    ) -> str:
        """The key under which a side effect must happen at most once: the idempotency
        arguments, normalised as fingerprints are (see
        :func:`loopwarden.fingerprint.idempotency_key`)."""
        return idempotency_key(
            self.name,
            arguments,
            self.idempotency_keys,
            normalize=self.normalize_arguments,
            volatile_keys=volatile_keys,
        )

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Call the function (sync tools return the value, async ones an awaitable)."""
        kwargs = dict(arguments)
        if self.context_param:
            kwargs[self.context_param] = ctx
        return self.func(**kwargs)

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` from this tool means "trying again may work": a ToolError's own
        ``retryable``, else whether it is one of :attr:`retryable`."""
        if isinstance(exc, ToolError):
            return exc.retryable
        return bool(self.retryable) and isinstance(exc, self.retryable)


def _build(
    func: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    read_only: bool,
    deterministic: bool,
    side_effect: bool,
    terminal: bool,
    retryable: Iterable[type[BaseException]],
    timeout_s: float | None,
    idempotency_keys: Sequence[str] | None,
    normalize_arguments: bool = True,
) -> Tool:
    if read_only and side_effect:
        raise ToolDefinitionError(
            f"tool {func.__name__!r} cannot be both read_only and side_effect"
        )
    if timeout_s is not None and (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s <= MAX_DURATION_S
    ):
        raise ToolDefinitionError(
            f"tool {func.__name__!r}: timeout_s must be a number of seconds above 0 and at "
            f"most {MAX_DURATION_S:g}, got {timeout_s!r}"
        )
    try:
        hints = get_type_hints(func, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {func.__name__!r}: cannot read type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    context_param = None
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {func.__name__!r}: *args/**kwargs are not supported")
        ann = hints.get(pname, Any)
        if ann is ToolContext or ToolContext in get_args(ann):
            context_param = pname
            continue
        default = ... if param.default is param.empty else param.default
        fields[pname] = (ann, default)
    tname = name or func.__name__
    model = create_model(f"{tname}_arguments", __config__=_ARGS_CONFIG, **fields)
    if idempotency_keys is not None:
        unknown = set(idempotency_keys) - set(fields)
        if unknown:
            raise ToolDefinitionError(f"tool {tname!r}: unknown idempotency keys {sorted(unknown)}")
    return Tool(
        name=tname,
        func=func,
        description=description if description is not None else _first_paragraph(func.__doc__),
        args_model=model,
        read_only=read_only,
        deterministic=deterministic,
        side_effect=side_effect,
        terminal=terminal,
        retryable=tuple(retryable),
        timeout_s=timeout_s,
        idempotency_keys=tuple(idempotency_keys) if idempotency_keys is not None else None,
        normalize_arguments=normalize_arguments,
        context_param=context_param,
        is_async=inspect.iscoroutinefunction(func),
    )


@overload
def tool(func: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    deterministic: bool = False,
    side_effect: bool = False,
    terminal: bool = False,
    retryable: Iterable[type[BaseException]] = (),
    timeout_s: float | None = None,
    idempotency_keys: Sequence[str] | None = None,
    normalize_arguments: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    deterministic: bool = False,
    side_effect: bool = False,
    terminal: bool = False,
    retryable: Iterable[type[BaseException]] = (),
    timeout_s: float | None = None,
    idempotency_keys: Sequence[str] | None = None,
    normalize_arguments: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool; usable bare (``@tool``) or with flags (``@tool(read_only=True)``).

    ``normalize_arguments=False`` makes string arguments count as different when they differ
    only in case or surrounding whitespace -- for repeat detection and for the side-effect
    ledger alike (by default ``"Bob@Example.com"`` and ``" bob@example.com "`` are the same
    call, and a side effect keyed on them runs once)."""

    def deco(f: Callable[..., Any]) -> Tool:
        return _build(
            f,
            name=name,
            description=description,
            read_only=read_only,
            deterministic=deterministic,
            side_effect=side_effect,
            terminal=terminal,
            retryable=retryable,
            timeout_s=timeout_s,
            idempotency_keys=idempotency_keys,
            normalize_arguments=normalize_arguments,
        )

    return deco(func) if func is not None else deco


class ToolRegistry:
    """Tools by name, in declaration order."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: list[dict[str, Any]] | None = None
        for t in tools:
            self.add(t)

    def add(self, t: Tool, *, replace: bool = False) -> Tool:
        """Add a tool; a second tool of the same name is a ToolDefinitionError unless
        ``replace``."""
        if not isinstance(t, Tool):
            raise ToolDefinitionError(f"not a Tool: {t!r} (declare it with @tool)")
        if t.name in self._tools and not replace:
            raise ToolDefinitionError(f"duplicate tool name {t.name!r}")
        self._tools[t.name] = t
        self._schemas = None
        return t

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        """The tools' names, in declaration order."""
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """Schemas of every tool, for the model request (computed once)."""
        if self._schemas is None:
            self._schemas = [t.schema() for t in self._tools.values()]
        return self._schemas

    def copy(self) -> ToolRegistry:
        """A new registry of the same tools (adding to it leaves this one as it is)."""
        return ToolRegistry(self._tools.values())


def format_validation_error(exc: ValidationError) -> str:
    """A short, model-readable summary of what was wrong with the arguments."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(arguments)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


AsyncToolFunc = Callable[..., Awaitable[Any]]
