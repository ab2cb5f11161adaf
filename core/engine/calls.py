"""The model turn: the request, the model call, the response checked and its proposals parsed.

:class:`ModelTurn` is one of the two units the step machine (:meth:`Engine.machine
<loopwarden.engine.loop.Engine.machine>`) is made of, the tool turn
(:class:`loopwarden.engine.toolturn.ToolTurn`) the other.  In order: the request is built
(pending warnings become notes; the schemas' token estimate is cached per schema list), then
``before_model`` (a soft stop turns this into the tool-less wrap-up turn), the
:class:`~loopwarden.engine.effects.CallModel` effect the driver answers, the response checked
(a model adapter is third-party code: :func:`well_formed`) and cleaned, its proposals parsed
into :class:`~loopwarden.ToolCall` objects (arguments decoded and validated, fingerprint and
idempotency key computed: :func:`parse_proposals`), ``model_responded`` sent and
``after_response`` called.  It returns the run's outcome, or the calls for the tool turn.

The unit is built once per engine over what it needs, passed in -- the hooks, the ``[run]``
settings and texts and the verdict handling (:class:`~loopwarden.engine.guards.Guards`), and
the fingerprinter -- and never reaches back into the engine; it holds no run state but the
token estimates of the tool schemas it has seen.  The checks and the parsing live here with the
turn that uses them, so that a model turn runs in this module from request to proposals.
:func:`parse_calls` (public through :mod:`loopwarden.engine.loop`) parses proposals exactly as
the turn does, for the test kit and the framework adapters.  The observations for calls that
do not run moved to the tool turn; their 0.2 names here point there.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from loopwarden import signals
from loopwarden.engine.effects import CallModel, Effect, Failed
from loopwarden.engine.guards import CORE, Guards, Turn
from loopwarden.engine.outcomes import best_effort, hard, model_failed, soft_end, vetoed
from loopwarden.engine.toolturn import (
    invalid_result,
    note_ledger_answer,
    shared_replay,
    side_effect_replay,
)
from loopwarden.events import ErrorKind, ModelRequest, ModelResponse, ProposedCall, ToolCall, Usage
from loopwarden.exceptions import ModelError
from loopwarden.fingerprint import Fingerprinter
from loopwarden.models.tokens import estimate_tools
from loopwarden.notes import instruction_text
from loopwarden.run import Run, RunOutcome
from loopwarden.sanitize import clean_text, loads_arguments
from loopwarden.tools import format_validation_error
from loopwarden.verdicts import resolve

if TYPE_CHECKING:
    from loopwarden.config import RunConfig

__all__ = [
    "CORE",
    "ModelSteps",
    "ModelTurn",
    "invalid_result",
    "note_ledger_answer",
    "parse_calls",
    "shared_replay",
    "side_effect_replay",
]

_SCHEMA_CACHE_SIZE = 64  # tool-schema lists whose token estimate a model turn remembers
#: what a model turn ends with: the run's outcome, or the calls for the tool turn
ModelSteps = Generator[Effect, Any, RunOutcome | list[ToolCall]]


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


# -- the turn ---------------------------------------------------------------------------------


class ModelTurn(Turn):
    """Runs the model turn of one step (see the module doc)."""

    __slots__ = ("_tools_tokens", "fingerprint")

    def __init__(self, guards: Guards, fingerprint: Fingerprinter) -> None:
        super().__init__(guards)
        self.fingerprint = fingerprint
        # id(schema list) -> (that list, its estimated tokens); the list is kept so that its
        # id cannot be reused by another list while cached; bounded (cleared when full)
        self._tools_tokens: dict[int, tuple[list[dict[str, Any]], int]] = {}

    def schemas(self, run: Run) -> tuple[list[dict[str, Any]], int]:
        """The run's tool schemas and their estimated tokens (cached per schema list)."""
        tools = run.tools
        if tools is None:
            return [], 0
        schemas = tools.schemas()  # cached by the registry until it changes
        if not schemas:
            return [], 0
        cache = self._tools_tokens
        hit = cache.get(id(schemas))
        if hit is not None and hit[0] is schemas:
            return schemas, hit[1]
        n = estimate_tools(schemas, run.estimator)
        if len(cache) >= _SCHEMA_CACHE_SIZE:
            cache.clear()
        cache[id(schemas)] = (schemas, n)
        return schemas, n

    def request(self, run: Run, final: bool) -> ModelRequest:
        """The next request: pending warnings added as notes, sized with the schemas."""
        # a note's instruction form: data that is not a short identifier withheld, so tool
        # and model text never rise to the note's role (loopwarden.notes); records keep all
        notes = [instruction_text(n) for n in run.pending_notes]
        run.pending_notes = []
        settings = self.settings
        role, prefix = settings.warning_role, settings.warning_prefix
        for n in notes:
            run.add_message({"role": role, "content": prefix + n})
        schemas, schema_tokens = self.schemas(run)
        request = ModelRequest(
            messages=run.messages,
            tools=schemas,
            tool_choice="auto",
            step=run.step + 1,
            notes=notes,
            estimated_tokens=run.context_tokens + schema_tokens,
            max_output_tokens=run.max_output_tokens,
            cancel=run.cancel,
        )
        if final:
            self.make_final(run, request)
        return request

    def make_final(self, run: Run, request: ModelRequest) -> None:
        """Turn ``request`` into the tool-less wrap-up request of a soft stop."""
        stop = run.stopping
        settings = self.settings
        text = settings.wrap_up_instruction
        if stop is not None and stop.message:
            text = f"{instruction_text(stop.message)} {text}"
        run.add_message({"role": settings.warning_role, "content": settings.warning_prefix + text})
        request.notes.append(text)
        request.tool_choice = "none"
        request.final = True
        _, schema_tokens = self.schemas(run)
        request.estimated_tokens = run.context_tokens + schema_tokens

    def __call__(self, run: Run) -> ModelSteps:
        """``before_model``, the model call, ``after_response``: returns the run's outcome
        when this turn ends the run, else the calls for the tool turn (none when a soft stop
        in ``after_response`` leaves them unexecuted)."""
        hooks = self.hooks
        guards = self.guards
        final = run.stopping is not None
        request = self.request(run, final)
        res = hooks.before_model(run, request)
        stop = None
        if res.verdicts:  # the common case has none: no property reads, no checks
            res = guards.note(run, "before_model", res)
            stop = res.stop
        if stop is not None:
            if not stop.soft:
                if run.stopping is not None:
                    return hard(
                        self.settings,
                        run,
                        run.stopping,
                        {
                            "final_turn_refused_by": stop.plugin,
                            "final_turn_refused_reason": stop.reason,
                        },
                    )
                return guards.hard(run, stop)
            if not final:
                run.stopping = stop
                self.make_final(run, request)
                final = True
        t0 = run.clock.now()
        response = yield CallModel(request)
        usable = isinstance(response, ModelResponse) and well_formed(response)
        if not usable:
            if not isinstance(response, Failed):
                response = Failed(
                    ModelError(
                        f"the model returned {type(response).__name__} {response!r:.200}, "
                        "not a well-formed ModelResponse",
                        kind="malformed",
                    )
                )
            err, took = response.error, run.clock.now() - t0
            text = guards.redact(run, f"{type(err).__name__}: {err}")
            return model_failed(self.settings, run, request, err, took, text)
        run.step += 1
        if response.model is not None and not isinstance(response.model, str):
            response.model = None  # a server's odd "model" field is not passed on
        if response.usage is not None:
            run.usage.add(response.usage)
        clean_response(response)
        content = response.content
        if content and content.strip():
            run.best_answer = content
        # tools disabled: proposed calls are ignored (kept as JSON text)
        calls = (
            ignore_proposals(response)
            if final
            else parse_proposals(run, response, self.fingerprint)
        )
        response.calls = calls
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.raw_arguments},
                }
                for c in calls
            ]
        run.add_message(message)
        if signals.model_responded.receivers:
            signals.send(
                signals.model_responded,
                run,
                request=request,
                response=response,
                duration_s=run.clock.now() - t0,
            )
        res = hooks.after_response(run, response)
        if res.verdicts:
            res = guards.note(run, "after_response", res)
        if type(response) is not ModelResponse and getattr(response, "cut_by", None) is not None:
            # a streamed answer an on_model_delta stop cut (loopwarden.engine.streaming): that stop
            # is honoured with the after_response verdicts, as if this hook had returned it
            res = resolve((response.cut_by, *res.verdicts))
            cut = res.stop
            if cut is not None and cut.soft:  # a cut answer is no final answer
                if final:
                    return vetoed(self.settings, run, cut)
                run.stopping = cut  # the tool-less wrap-up turn answers instead
                return []
        stop = res.stop if res.verdicts else None
        if (final or not calls) and stop is not None and not stop.soft:
            # A hard stop on an answer is a veto (an output guard, or a guard that failed
            # and fails closed): the model's text is withheld.
            return vetoed(self.settings, run, stop, normal=hooks.ends_runs_normally(stop.plugin))
        if final and run.stopping is not None:  # the soft stop's wrap-up turn
            return soft_end(self.settings, run, run.stopping, response)
        if not calls:
            text = (content or "").strip()
            return RunOutcome(
                termination="final_answer",
                final_answer=text or best_effort(self.settings, run),
                final_answer_present=bool(text),
            )
        run.tool_calls += len(calls)
        if stop is not None:
            guards.close_calls(run, calls, stop.reason)
            if not stop.soft:
                return guards.hard(run, stop)
            run.stopping = stop
            return []
        return calls
