"""One request through the guards: a run rebuilt from the wire, judged, and handed on.

The gateway and the client wrapper see an agent's loop only as requests: each carries the
history -- the tool calls the last answer proposed and their results -- and asks for the next
answer.  :class:`Gate` (one per deployment) turns each request into the hook events of
loopwarden's own loop, with the same turn units, verdict handling, ledgers, records and
signals (:mod:`loopwarden.engine`):

1. **Find the run** (:meth:`Gate.locate`), first match wins: an explicit session id (a
   ``x-loopwarden-run`` header, and those common clients send -- ``[gateway]
   session_headers``); the ids of the tool calls in the last assistant turn, which this
   gateway handed out (also when the agent replays them as text); a hash of the history up to
   the last assistant turn (system messages and ``<system-reminder>`` blocks left out); else
   a new conversation.  Every key is scoped by the tenant, so nothing crosses tenants.
2. **Settle the last step**: each call handed out last time gets its result from the request
   (a ``tool`` message, or a user message naming the call's id) -- ``after_tool``; a call the
   client never answered is recorded "not executed".
3. **The model turn**: a run that ended (a final answer) and a new user message start the
   conversation's next run (``on_start``); then ``before_model`` -- warnings become notes
   appended to the forwarded request, a soft stop a tool-less wrap-up request, a hard stop an
   answer without any upstream call.  The exchange asks its driver to *forward* (the sans-I/O
   :class:`Forward`), and is sent the upstream's answer: ``after_response``, then
   ``before_tool`` for every proposed call **before the client sees it**.
4. **Deliver** (:class:`Deliver`): the upstream's answer untouched when every call passed;
   a skipped call (a duplicate side effect, an open breaker) never reaches the client -- the
   model is told why and asked again, once; a stop is an answer the agent can finish on.
5. **Save**: the conversation's snapshot and the aliases of its next request go to the
   shared store (:mod:`loopwarden.gateway.state`), so any worker serves the next step.

A step's order differs from the in-process loop in one respect: every proposed call of an
answer gets ``before_tool`` before any of them has a result (the client runs them after the
answer is delivered), then each its ``after_tool`` when the results come.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from loopwarden import signals
from loopwarden.clock import CancelToken, SystemClock
from loopwarden.engine.effects import CallModel
from loopwarden.engine.toolturn import ledger_answer
from loopwarden.events import IN_DOUBT, ModelResponse, ToolCall, ToolResult
from loopwarden.exceptions import StoreError
from loopwarden.gateway import state as st
from loopwarden.gateway.chat import ChatRequest, _obj, json_bytes, text_of
from loopwarden.gateway.wires import WIRES, Wire
from loopwarden.models.tokens import estimate_message
from loopwarden.run import Conversation, Run, RunOutcome
from loopwarden.sanitize import clean_text
from loopwarden.stash import StashKey
from loopwarden.tools import Tool, ToolRegistry
from loopwarden.tools.recorded import recorded_tool
from loopwarden.verdicts import Stop
from loopwarden.verdicts import stop as make_stop

if TYPE_CHECKING:
    from loopwarden.config import GatewayConfig
    from loopwarden.deployment import Deployment

__all__ = ["Deliver", "Exchange", "Forward", "Gate", "WallClock"]

log = logging.getLogger("loopwarden.gateway")


class WallClock(SystemClock):
    """Wall-clock seconds: a run's steps are served by different processes and hosts, whose
    monotonic clocks share no origin (hosts' clocks are kept in step by NTP)."""

    now = staticmethod(time.time)


#: ids that clients print when they replay tool calls as text (OpenAI, Anthropic, vLLM,
#: Ollama, the Responses API)
_ID_IN_TEXT = re.compile(
    r"\b(call_[A-Za-z0-9_-]{6,64}|toolu_[A-Za-z0-9_-]{6,64}|fc_[A-Za-z0-9_-]{6,64}"
    r"|chatcmpl-tool-[A-Za-z0-9_-]{6,64})\b"
)
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.S)
#: roles left out of the history hash: what a client may rewrite every turn
_UNHASHED = frozenset({"system", "developer"})


#: answers in one request whose every call was answered for the model (skipped, or a side
#: effect already done) before the run is wrapped up -- each is a model turn the step cap
#: counts as well
MAX_REASKS = 4


@dataclass(slots=True)
class Forward:
    """Effect: send ``body`` to the upstream, and send its answer back (:meth:`Exchange.answer`)."""

    body: bytes
    #: a tool-less wrap-up turn (a soft stop), or the re-ask after a skip: never streamed
    #: to the client as it comes
    final: bool = False
    followup: bool = False


@dataclass(slots=True)
class Deliver:
    """What the client gets."""

    kind: Literal["pass", "answer", "message", "error"]
    #: the answer's text (``answer``), or the error's message (``error``)
    text: str = ""
    #: the stop it ends: reason, plugin, soft (None when no guard stopped the run)
    stop: dict[str, Any] | None = None
    #: deliver the answer as a call to the agent's finish tool: (name, arguments)
    finish_call: tuple[str, dict[str, Any]] | None = None
    #: ``message``: the assistant message to deliver instead of the upstream's (calls that
    #: were skipped taken out)
    message: dict[str, Any] | None = None
    run_id: str | None = None
    #: the id of an answer the gateway writes itself (continuations find the run by it)
    answer_id: str | None = None


@dataclass(slots=True)
class Live:
    """A conversation between two requests (its snapshot)."""

    conv_id: str
    tenant: str
    conversation: Conversation
    run: Run | None = None
    #: calls handed out to the client and not yet answered, in order
    pending: list[ToolCall] = field(default_factory=list)
    #: side effects that failed in this run (they may run again, once the model retries)
    failed_here: dict[str, ToolResult] = field(default_factory=dict)
    #: the client's messages counted so far, and their estimated tokens
    seen: int = 0
    seen_tokens: int = 0
    #: the tokens the provider holds after its latest answer (its reported prompt and
    #: completion): what a request continued by ``previous_response_id`` adds its items to
    held_tokens: int | None = None
    version: int = 0
    #: the request that handed out ``pending``: its message count and the digest of its
    #: last message (the same request sent again is a retry, not the next step)
    asked: tuple[int, str] | None = None
    #: the upstream's id of its latest answer: what a continuation of an answer the gateway
    #: wrote itself (a stop) continues at the upstream (``previous_response_id``)
    upstream_last: str | None = None


def _canonical_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return str(args).strip()
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical(m: Mapping[str, Any]) -> str | None:
    """A message as the history hash reads it: role, text without reminders, the calls'
    names and arguments (ids and formatting left out); None for a role left out."""
    role = str(m.get("role"))
    if role in _UNHASHED:
        return None
    text = _REMINDER.sub("", text_of(m.get("content"))).strip()
    calls = []
    for tc in m.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn = _obj(tc.get("function"))
            calls.append(f"{fn.get('name')}({_canonical_args(fn.get('arguments'))})")
    return role + "\x1f" + text + "\x1f" + "\x1e".join(calls)


def history_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """The hash of a history, as :func:`canonical` reads each message."""
    h = hashlib.sha256()
    for m in messages:
        c = canonical(m)
        if c is not None:
            h.update(c.encode("utf-8", "surrogatepass"))
            h.update(b"\x1d")
    return h.hexdigest()[:32]


def _last_assistant(messages: Sequence[Mapping[str, Any]]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            return i
    return -1


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


class _Tools(dict[str, object]):
    """The request's tools by snapshot name; a call whose tool left the request's list gets
    a stand-in of the same name."""

    def __init__(self, registry: ToolRegistry, declared: Mapping[str, Any]) -> None:
        super().__init__()
        self._declared = declared
        for t in registry:
            self["tool:" + t.name] = t

    def __contains__(self, key: object) -> bool:
        return (isinstance(key, str) and key.startswith("tool:")) or super().__contains__(key)

    def __missing__(self, key: str) -> object:
        name = key[5:]
        tool = recorded_tool(name, self._declared.get(name))
        self[key] = tool
        return tool


class Gate:
    """One deployment's judge of wire requests (shared by every request; holds no run)."""

    def __init__(
        self,
        deployment: Deployment,
        state: st.StateStore,
        settings: GatewayConfig | None = None,
        *,
        front: str = "gateway",
    ) -> None:
        self.deployment = deployment
        self.engine = deployment.engine
        self.state = state
        self.settings = settings if settings is not None else deployment.config.gateway
        self.front = front
        self.clock = WallClock()
        self._declared: dict[str, dict[str, Any]] = {
            name: t.model_dump(exclude_none=True) for name, t in deployment.config.tools.items()
        }
        self._registries: OrderedDict[str, ToolRegistry] = OrderedDict()
        self._lock = threading.Lock()
        self.symbols = self._symbols()
        self.session_headers = [h.lower() for h in self.settings.session_headers]
        #: plugins whose per-run state could not be pickled: left out of snapshots
        self.unpicklable: set[str] = set()
        self.finish_tools = list(self.settings.finish_tools)
        self.error_patterns = [re.compile(p) for p in self.settings.tool_error_patterns]

    def failed(self, text: str) -> bool:
        """Whether a tool result's text says it failed (``[gateway] tool_error_patterns``):
        chat completions have no error flag, so a result is judged by what it says."""
        head = text[:500]
        return any(p.search(head) for p in self.error_patterns)

    def _symbols(self) -> st.Symbols:
        dep = self.deployment
        engine = self.engine
        named: dict[str, object] = {
            "deployment": dep,
            "shared": dep.shared,
            "estimator": dep.estimator,
            "clock": self.clock,
            "answers": engine.answers,
            "fingerprint": engine.fingerprint,
        }
        for name in dep.plugins.names:
            plugin = dep.plugins.get(name)
            named["plugin:" + name] = plugin
            st.Symbols.collect("plugin:" + name, plugin, named)
            module = sys.modules.get(type(plugin).__module__)
            if module is not None:
                st.Symbols.collect("module:" + module.__name__, module, named)
        for mod_name, module in list(sys.modules.items()):
            if mod_name.startswith("loopwarden") and module is not None:
                for attr, value in list(vars(module).items()):
                    if isinstance(value, StashKey):
                        named.setdefault(f"module:{mod_name}.{attr}", value)
        lock_type = type(threading.Lock())
        symbols = st.Symbols(
            named, {lock_type: ("lock", threading.Lock), CancelToken: ("cancel", CancelToken)}
        )
        symbols.types |= {Tool, ToolRegistry}  # a request's tools, named per request
        return symbols

    # -- tools ----------------------------------------------------------------------------

    def registry(self, tools: list[dict[str, Any]]) -> ToolRegistry:
        """The request's tools as loopwarden declarations (cached per tool list): their
        schemas count in token estimates; natures from ``[tools.<name>]``."""
        key = _digest(json.dumps(tools, sort_keys=True, ensure_ascii=False)) if tools else ""
        with self._lock:
            reg = self._registries.get(key)
            if reg is not None:
                self._registries.move_to_end(key)
                return reg
        reg = ToolRegistry(self._tool(fn) for fn in tools)
        with self._lock:
            self._registries[key] = reg
            while len(self._registries) > 256:
                self._registries.popitem(last=False)
        return reg

    def _tool(self, fn: Mapping[str, Any]) -> Tool:
        name = str(fn["name"])
        tool = recorded_tool(name, self._declared.get(name))
        tool.description = str(fn.get("description") or name)
        params = fn.get("parameters")
        tool._schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": tool.description,
                "parameters": dict(params)
                if isinstance(params, Mapping)
                else {"type": "object", "properties": {}},
            },
        }
        return tool

    # -- identity -------------------------------------------------------------------------

    def tenant(self, headers: Mapping[str, str], req: ChatRequest) -> str:
        """Who the request is for: a ``x-loopwarden-tenant`` header, the request's user, else
        a hash of its API key (never the key)."""
        t = headers.get("x-loopwarden-tenant")
        if t:
            return "h:" + t[:200]
        if req.user:
            return "u:" + req.user[:200]
        auth = headers.get("authorization") or headers.get("x-api-key") or ""
        if auth:
            return "k:" + _digest("loopwarden-key\x00" + auth)[:16]
        return "anon"

    def locate(
        self, headers: Mapping[str, str], req: ChatRequest, tenant: str
    ) -> tuple[str | None, list[str]]:
        """The conversation the request names directly (a session header, or the body's own
        conversation id), and the aliases that may lead to it, best first: the ids of the
        calls in its last assistant turn (or, in a request without one, the call ids its
        results answer), then the answer it continues (see the module doc)."""
        for h in self.session_headers:
            v = headers.get(h)
            if v:
                return _digest(f"{tenant}\x00session\x00{v}"), []
        if req.session:
            return _digest(f"{tenant}\x00session\x00{req.session}"), []
        msgs = req.messages
        last = _last_assistant(msgs)
        aliases: list[str] = []
        if last >= 0:
            for tc in msgs[last].get("tool_calls") or ():
                if isinstance(tc, dict) and tc.get("id"):
                    aliases.append(f"{tenant}\x00id\x00{tc['id']}")
            if not aliases:  # calls replayed as text: the ids the gateway handed out
                for m in msgs[last:]:
                    for found in _ID_IN_TEXT.findall(text_of(m.get("content"))):
                        a = f"{tenant}\x00id\x00{found}"
                        if a not in aliases:
                            aliases.append(a)
        else:
            aliases.extend(f"{tenant}\x00id\x00{cid}" for cid in req.answered if cid)
        if req.previous:
            aliases.append(f"{tenant}\x00answer\x00{req.previous}")
        return None, [_digest(a) for a in aliases]

    @staticmethod
    def history_alias(req: ChatRequest, tenant: str) -> str | None:
        """The alias of the request's history up to its last assistant turn (None without
        one): the last resort, read only when no id led anywhere (it costs a pass over the
        whole history)."""
        msgs = req.messages
        last = _last_assistant(msgs)
        if last < 0:
            return None
        return _digest(f"{tenant}\x00hist\x00{history_hash(msgs[: last + 1])}")

    def exchange(
        self, req: ChatRequest, headers: Mapping[str, str], *, wire: Wire | None = None
    ) -> Exchange:
        """The judging of one request (see :class:`Exchange`) of ``wire``'s shape (chat
        completions by default)."""
        return Exchange(self, req, headers, wire or WIRES[0])


class Exchange:
    """One request, judged: a sans-I/O machine its driver advances (the gateway's ASGI app,
    the client wrapper's transport).  :meth:`start` returns a :class:`Forward` or a
    :class:`Deliver`; after each ``Forward`` the driver sends the upstream's answer to
    :meth:`answer`, which returns the next; :meth:`close` saves the conversation."""

    def __init__(
        self, gate: Gate, req: ChatRequest, headers: Mapping[str, str], wire: Wire
    ) -> None:
        self.gate = gate
        self.req = req
        self.headers = headers
        #: the request's wire shape: how a forwarded request is written
        self.wire = wire
        self.live: Live | None = None
        self.run: Run | None = None
        self._turn: Generator[Any, Any, Any] | None = None
        self._request_notes: list[dict[str, Any]] = []
        self._followup: list[dict[str, Any]] = []
        self._reasks = 0
        self._delivered: dict[str, Any] | None = None
        self._handed: list[ToolCall] = []
        #: the ids of the answers delivered (the provider's, and any the gateway wrote):
        #: a request continuing one of them (``previous_response_id``) finds the run
        self.answer_ids: list[str] = []
        self.outcome: RunOutcome | None = None
        self.store_calls = 0

    # -- start ----------------------------------------------------------------------------

    def start(self) -> Forward | Deliver:
        gate = self.gate
        req = self.req
        tenant = gate.tenant(self.headers, req)
        direct, aliases = gate.locate(self.headers, req, tenant)
        registry = gate.registry(req.tools)
        extra = _Tools(registry, gate._declared)
        extra["tools"] = registry
        conv_id, blob = gate.state.fetch(direct, aliases)
        self.store_calls += 1
        if conv_id is None and direct is None:
            hist = gate.history_alias(req, tenant)
            if hist is not None:
                conv_id, blob = gate.state.fetch(None, [hist])
                self.store_calls += 1
        live: Live | None = None
        if blob is not None and conv_id is not None:
            try:
                live = st.load(blob, gate.symbols, extra)
            except Exception as exc:  # an unreadable snapshot: a new conversation, logged
                log.warning(
                    "gateway: conversation %s unreadable (%s): starting afresh", conv_id, exc
                )
                live = None
            if live is not None and live.tenant != tenant:
                live = None  # never another tenant's state (a hash collision)
        if live is None:
            live = Live(
                conv_id=conv_id or direct or uuid.uuid4().hex,
                tenant=tenant,
                conversation=Conversation(),
            )
            live.conversation.id = live.conv_id
        self.live = live
        self._upstream_previous(live)
        run = live.run
        if run is not None:
            run.tools = registry
            self._settle(run, live)
            if run.outcome is not None:  # a stop while settling
                return self._ended(run.outcome)
        if run is None or run.outcome is not None:
            run = self._new_run(live, registry)
            if req.previous and conv_id is None:
                # it continues an answer this gateway never saw (a run begun elsewhere, or
                # expired): judged as a new run, the record says so
                run.meta["unknown_previous"] = req.previous
            if run.outcome is not None:
                return self._ended(run.outcome)
        self.run = run
        self._sync_messages(run, live)
        return self._model_turn(run)

    def _upstream_previous(self, live: Live) -> None:
        """A continuation of an answer the gateway wrote itself (a stop) continues, at the
        upstream, from the upstream's own latest answer: the upstream never saw the
        gateway's id."""
        req = self.req
        prev = req.previous
        if not prev or not self.wire.wrote(prev):
            return
        body = dict(req.body)
        if live.upstream_last:
            body["previous_response_id"] = live.upstream_last
        else:
            body.pop("previous_response_id", None)
        req.body = body
        req.raw = json_bytes(body)

    def _new_run(self, live: Live, registry: ToolRegistry) -> Run:
        gate = self.gate
        dep = gate.deployment
        req = self.req
        last_user = next(
            (m for m in reversed(req.messages) if m.get("role") == "user"), {"content": ""}
        )
        meta: dict[str, Any] = {"front": gate.front, "wire": self.wire.name, "tenant": live.tenant}
        if req.user:
            meta["user"] = req.user
        profile = self.headers.get("x-loopwarden-profile") or None
        run = Run(
            clean_text(text_of(last_user.get("content"))),
            deployment=dep,
            tools=registry,
            clock=gate.clock,
            limits=dep.limits(profile),
            estimator=dep.estimator,
            model_name=req.model,
            max_output_tokens=_max_tokens(req.body) or dep.config.model.max_output_tokens,
            meta=meta,
            conversation=live.conversation,
        )
        run.shared = dep.shared
        live.run = run
        live.pending = []
        live.failed_here = {}
        live.seen = 0
        live.seen_tokens = 0
        signals.send(signals.run_started, run)
        res = dep.hooks.on_start(run)
        if res.verdicts:
            res = gate.engine.guards.note(run, "on_start", res)
            stop = res.stop
            if stop is not None:
                if not stop.soft:
                    self._finish(run, gate.engine.guards.hard(run, stop))
                else:
                    run.stopping = stop
        return run

    def _sync_messages(self, run: Run, live: Live) -> None:
        """The run's messages are the client's: counted once each (only what is new since
        the last request is estimated).  A delta request (the history kept at the
        provider) adds what it carries to what was counted before."""
        msgs = self.req.messages
        est = run.estimator
        if self.req.delta:
            # the history stays at the provider, the model's own answers too: what it holds
            # after its latest answer, and what this request adds
            held = live.held_tokens if live.held_tokens is not None else live.seen_tokens
            tokens = held + sum(estimate_message(_plain(m), est) for m in msgs)
        elif live.seen <= len(msgs) and live.seen > 0:
            tokens = live.seen_tokens + sum(
                estimate_message(_plain(m), est) for m in msgs[live.seen :]
            )
        else:
            tokens = sum(estimate_message(_plain(m), est) for m in msgs)
        live.seen, live.seen_tokens = len(msgs), tokens
        run.messages = [_plain(m) for m in msgs]
        run._added = list(run.messages)
        run.context_tokens = tokens

    # -- settling the calls handed out last time ------------------------------------------

    def _results(self, pending: list[ToolCall]) -> dict[str, tuple[str, bool]]:
        """The results the request carries for ``pending``: call id -> (text, is_error)."""
        msgs = self.req.messages
        last = _last_assistant(msgs)
        failed = self.gate.failed
        found: dict[str, tuple[str, bool]] = {}
        want = {c.id for c in pending}
        after = msgs[last + 1 :]  # a delta request (no assistant turn): all of it
        unmatched: list[str] = []
        for m in after:
            role = m.get("role")
            text = text_of(m.get("content"))
            if role == "tool":
                cid = m.get("tool_call_id")
                if isinstance(cid, str) and cid in want:
                    # a wire with an error flag (Anthropic's is_error) says so; chat
                    # completions have none: the text is judged
                    found[cid] = (text, bool(m.get("is_error")) or failed(text))
                else:
                    unmatched.append(text)
            elif role == "user":
                for cid in want - found.keys():
                    if cid and cid in text:
                        found[cid] = (text, failed(text))
        # results in order for calls whose id the client did not keep
        rest = [c for c in pending if c.id not in found]
        for c, text in zip(rest, unmatched, strict=False):
            found[c.id] = (text, failed(text))
        if not found and len(pending) == 1 and after:
            # one call replayed as text, its result a plain user message ("Observation: ...")
            users = [text_of(m.get("content")) for m in after if m.get("role") == "user"]
            if users:
                found[pending[0].id] = (users[0], failed(users[0]))
        return found

    def _asked(self) -> tuple[int, str]:
        """What identifies this request if it comes again: its message count and its last
        message exactly (ids included -- two tool results of equal text are two steps)."""
        msgs = self.req.messages
        last = json.dumps(msgs[-1], sort_keys=True, ensure_ascii=False, default=str) if msgs else ""
        return len(msgs), _digest(last)

    def _settle(self, run: Run, live: Live) -> None:
        pending, live.pending = live.pending, []
        if not pending:
            return
        if live.asked is not None and live.asked == self._asked():
            # the request that got these calls, sent again: its answer never reached the
            # client (a timeout, a dropped connection), so none of them ran -- their claims
            # are released and the step is asked again
            self.gate.engine.guards.close_calls(run, pending, "not_delivered")
            self._release(run, pending)
            return
        results = self._results(pending)
        engine = self.gate.engine
        guards = engine.guards
        ledger = run.conversation.side_effects
        for i, call in enumerate(pending):
            got = results.get(call.id)
            if got is None:
                # handed out, never answered: the client may have run it -- a side effect
                # is "may have taken effect", never run again silently
                guards.close_calls(run, [call], "not_answered")
                if call.idempotency_key is not None:
                    doubt = ToolResult(
                        content="the client sent no result", ok=False, error="unknown_outcome"
                    )
                    ledger[call.idempotency_key] = doubt
                    if run.shared is not None:
                        run.shared.finish(run, call, doubt)
                continue
            text, is_err = got
            result = ToolResult(content=text, ok=not is_err, error="tool_error" if is_err else None)
            run.tools_executed += 1
            if call.idempotency_key is not None:
                done = result.ok or result.error in IN_DOUBT
                (ledger if done else live.failed_here)[call.idempotency_key] = result
                if run.shared is not None:
                    run.shared.finish(run, call, result)
            stop = self._after_tool(run, call, result)
            if stop is not None:
                rest = [c for c in pending[i + 1 :] if c.id in results]
                guards.close_calls(run, rest, stop.reason)
                if not stop.soft:
                    self._finish(run, guards.hard(run, stop))
                else:
                    run.stopping = stop
                return

    def _after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Stop | None:
        """The second half of a call's tool turn: observation kept, ``tool_finished``,
        ``after_tool``; returns a stop the run honours."""
        engine = self.gate.engine
        result.content = engine.tool_turn.clip(result.content)
        run.add_message({"role": "tool", "tool_call_id": call.id, "content": result.content})
        if result.ok and not result.skipped:
            run.last_observation = result.content
        if signals.tool_finished.receivers:
            signals.send(signals.tool_finished, run, call=call, result=result)
        if result._digest is None:
            result._masks = engine.answers
        res = engine.hooks.after_tool(run, call, result)
        if not res.verdicts:
            return None
        res = engine.guards.note(run, "after_tool", res)
        return res.stop

    # -- the model turn -------------------------------------------------------------------

    def _model_turn(self, run: Run) -> Forward | Deliver:
        engine = self.gate.engine
        before = len(run.messages)
        turn = engine.model_turn(run)
        try:
            eff = next(turn)
        except StopIteration as done:  # a hard stop in before_model
            return self._turn_result(run, done.value)
        assert isinstance(eff, CallModel)
        self._turn = turn
        added = [m for m in run.messages[before:] if m.get("role") != "assistant"]
        self._request_notes.extend(added)
        extra = [*self._followup, *self._request_notes]
        return Forward(
            self.wire.forward_body(self.req, extra, final=eff.request.final),
            final=eff.request.final,
            followup=bool(self._followup),
        )

    def answer(self, response: ModelResponse) -> Forward | Deliver:
        """The upstream's answer to the last :class:`Forward`."""
        turn, self._turn = self._turn, None
        assert turn is not None and self.run is not None
        run = self.run
        if response.id:
            self.answer_ids.append(response.id)
            if self.live is not None:
                self.live.upstream_last = response.id
        live = self.live
        if live is not None:
            # what the provider holds now: its own count when it reports one, else what was
            # counted of this request plus the answer
            u = response.usage
            live.held_tokens = (
                u.prompt + u.completion
                if u is not None and u.prompt
                else live.seen_tokens
                + estimate_message(_plain(_message_of(response)), run.estimator)
            )
        try:
            turn.send(response)
        except StopIteration as done:
            return self._turn_result(run, done.value, response)
        raise RuntimeError("the model turn asked for a second model call")

    def _turn_result(
        self, run: Run, value: Any, response: ModelResponse | None = None
    ) -> Forward | Deliver:
        if isinstance(value, RunOutcome):
            if value.termination == "final_answer" and response is not None:
                self._delivered = _message_of(response)
                self._finish(run, value)
                return Deliver("pass", run_id=run.run_id)
            return self._ended(self._finish(run, value))
        calls: list[ToolCall] = value
        if not calls:  # a soft stop: the tool-less wrap-up turn
            return self._model_turn(run)
        return self._propose(run, calls, response)

    def _propose(
        self, run: Run, calls: list[ToolCall], response: ModelResponse | None
    ) -> Forward | Deliver:
        """``before_tool`` for every proposed call, before the client sees any of them."""
        engine = self.gate.engine
        guards = engine.guards
        hooks = engine.hooks
        texts = engine.texts
        live = self.live
        assert live is not None
        ledger = run.conversation.side_effects
        passed: list[ToolCall] = []
        answered: list[tuple[ToolCall, ToolResult]] = []
        for i, call in enumerate(calls):
            res = hooks.before_tool(run, call)
            skip = None
            if res.verdicts:
                res = guards.note(run, "before_tool", res)
                stop = res.stop
                if stop is not None:
                    guards.close_calls(run, [*passed, *calls[i:]], stop.reason)
                    self._release(run, passed)
                    if not stop.soft:
                        return self._ended(self._finish(run, guards.hard(run, stop, call)))
                    run.stopping = stop
                    return self._model_turn(run)
                skip = res.skip
            result: ToolResult | None = None
            if skip is not None:
                result = ToolResult(content=skip.observation, skipped=True, skipped_by=skip.plugin)
            elif call.error is not None and call.error != "unknown_tool" and call.arguments is None:
                result = None  # malformed arguments: the client answers them its own way
            elif call.idempotency_key is not None:
                result = ledger_answer(texts, run, call, ledger, live.failed_here)
            if result is None:
                passed.append(call)
            else:
                answered.append((call, result))
        if not answered:
            live.pending = passed
            live.asked = self._asked()
            self._handed = passed
            if response is not None:
                self._delivered = _message_of(response)
            return Deliver("pass", run_id=run.run_id)
        # answered calls never reach the client: their observations go to the model, which
        # is asked again (once); calls that passed are dropped with that answer
        for call, result in answered:
            stop = self._after_tool(run, call, result)
            if stop is not None:
                guards.close_calls(run, passed, stop.reason)
                self._release(run, passed)
                if not stop.soft:
                    return self._ended(self._finish(run, guards.hard(run, stop)))
                run.stopping = stop
                return self._model_turn(run)
        self._reasks += 1
        if self._reasks > MAX_REASKS and run.stopping is None:
            # the model keeps proposing only calls that are answered for it: wrap up
            plugin = answered[-1][1].skipped_by or "loopwarden"
            run.stopping = make_stop(
                "skipped_calls",
                soft=True,
                plugin=plugin,
                count=self._reasks,
                threshold=MAX_REASKS,
                tool=answered[-1][0].name,
            )
        guards.close_calls(run, passed, "superseded")
        self._release(run, passed)
        self._followup.append(
            {
                "role": "assistant",
                "content": response.content if response is not None else None,
                "tool_calls": [_wire_call(c) for c, _ in answered],
            }
        )
        for call, result in answered:
            self._followup.append(
                {"role": "tool", "tool_call_id": call.id, "content": result.content}
            )
        return self._model_turn(run)

    def _release(self, run: Run, calls: list[ToolCall]) -> None:
        """Calls that will not go out after all: their ledger claims are released."""
        if run.shared is None:
            return
        never = ToolResult(content="not handed out", ok=False, error="tool_error")
        for call in calls:
            if call.idempotency_key is not None:
                run.shared.finish(run, call, never)  # a failure releases the claim

    # -- endings --------------------------------------------------------------------------

    def _finish(self, run: Run, outcome: RunOutcome) -> RunOutcome:
        self.outcome = outcome
        return self.gate.engine.finish(run, outcome)

    def _ended(self, outcome: RunOutcome) -> Deliver:
        """A stop as the client gets it (``[gateway] stop_mode``)."""
        run = self.run or (self.live.run if self.live else None)
        stop = {
            "reason": outcome.termination,
            "plugin": outcome.stopped_by,
            "soft": outcome.soft,
        }
        text = outcome.final_answer or ""
        self._delivered = {"role": "assistant", "content": text}
        if self.gate.settings.stop_mode == "error" and outcome.termination != "final_answer":
            return Deliver("error", text=text, stop=stop, run_id=run.run_id if run else None)
        finish = self.finish_call(text)
        if finish is not None:
            self._delivered = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": finish[0], "arguments": json.dumps(finish[1])}}
                ],
            }
        answer_id = self.wire.new_answer_id()
        self.answer_ids.append(answer_id)
        return Deliver(
            "answer",
            text=text,
            stop=stop,
            finish_call=finish,
            run_id=run.run_id if run else None,
            answer_id=answer_id,
        )

    def finish_call(self, text: str) -> tuple[str, dict[str, Any]] | None:
        """The agent's own finish tool and its arguments, when the request lists one and
        requires a tool call (plain text would be a malformed step for such an agent)."""
        req = self.req
        if not req.requires_tool:
            return None
        by_name = {fn["name"]: fn for fn in req.tools}
        for name in self.gate.finish_tools:
            fn = by_name.get(name)
            if fn is None:
                continue
            params = _obj(fn.get("parameters"))
            props = _obj(params.get("properties"))
            required = [p for p in params.get("required") or () if p in props]
            names = required or list(props)
            strings = [p for p in names if _obj(props.get(p)).get("type") in ("string", None)]
            key = (strings or names or ["answer"])[0]
            return name, {key: text}
        return None

    def upstream_failed(self, error: str) -> None:
        """The upstream did not answer: the turn is abandoned, nothing is saved (the
        client's retry is judged afresh); the error is logged."""
        if self._turn is not None:
            self._turn.close()
            self._turn = None
        log.info("gateway: upstream failed: %s", error)
        self.live = None

    def cancel(self, reason: str = "client disconnected") -> None:
        """The client went away mid-answer: the run ends ``cancelled``."""
        run = self.run
        if self._turn is not None:
            self._turn.close()
            self._turn = None
        if run is not None and run.outcome is None:
            self._finish(
                run,
                RunOutcome(
                    termination="cancelled",
                    evidence={"reason": reason},
                    final_answer=run.best_answer or "",
                ),
            )
        self.close()

    def close(self) -> None:
        """Save the conversation and the aliases its next request will carry."""
        live = self.live
        if live is None:
            return
        self.live = None
        gate = self.gate
        run = live.run
        if run is not None and run.outcome is not None:
            live.run = None
            live.pending = []
        tenant = live.tenant
        aliases = [_digest(f"{tenant}\x00id\x00{c.id}") for c in self._handed if c.id]
        aliases += [_digest(f"{tenant}\x00answer\x00{a}") for a in self.answer_ids]
        if self._delivered is not None and (
            not self._delivered.get("tool_calls") or not all(c.id for c in self._handed)
        ):
            # a final answer: the next request (a new user turn) is found by the history;
            # a step with calls is found by their ids
            history = [*self.req.messages, self._delivered]
            aliases.append(_digest(f"{tenant}\x00hist\x00{history_hash(history)}"))
        conv = live.conversation
        conv._messages = []  # the client holds the history
        conv._known = None
        live.version += 1
        extra: dict[int, str] = {}
        if run is not None and run.tools is not None:
            extra[id(run.tools)] = "tools"
            for t in run.tools:
                extra[id(t)] = "tool:" + t.name
        for c in live.pending:
            if c.tool is not None:
                extra[id(c.tool)] = "tool:" + c.tool.name
        blob = self._snapshot(live, run, extra)
        if blob is None:
            return
        try:
            gate.state.save(live.conv_id, blob, aliases, gate.settings.state_ttl_s)
        except StoreError as exc:  # the answer is out: the next request starts afresh
            log.warning("gateway: conversation %s not saved: %s", live.conv_id, exc)
        self.store_calls += 1

    def _snapshot(self, live: Live, run: Run | None, extra: dict[int, str]) -> bytes | None:
        """The conversation pickled.  A plugin whose per-run state cannot be pickled (a
        live span, a socket) has it left out -- that plugin starts afresh on each request
        of the run, logged once -- rather than the whole conversation being lost."""
        gate = self.gate
        saved = None
        if run is not None:
            saved = run.messages, run._added
            run.messages, run._added = [], []
        dropped: dict[str, Any] = {}
        try:
            if run is not None:
                for name in gate.unpicklable & run.state.keys():
                    dropped[name] = run.state.pop(name)
            try:
                return st.dump(live, gate.symbols, extra)
            except Exception as exc:
                if run is None:
                    log.warning("gateway: conversation %s not saved: %s", live.conv_id, exc)
                    return None
                for name, value in list(run.state.items()):
                    try:
                        st.dump(value, gate.symbols, extra)
                    except Exception:
                        log.warning(
                            "gateway: plugin %s keeps per-run state that cannot be saved "
                            "between requests (%s): it starts afresh on each request",
                            name,
                            type(value).__name__,
                        )
                        gate.unpicklable.add(name)
                        dropped[name] = run.state.pop(name)
                try:
                    return st.dump(live, gate.symbols, extra)
                except Exception as again:
                    log.warning("gateway: conversation %s not saved: %s", live.conv_id, again)
                    return None
        finally:
            if run is not None and saved is not None:
                run.messages, run._added = saved
                run.state.update(dropped)


def _plain(m: dict[str, Any]) -> dict[str, Any]:
    """A client message as the run keeps it: text content (parts joined)."""
    c = m.get("content")
    if c is None or isinstance(c, str):
        return m
    out = dict(m)
    out["content"] = text_of(c)
    return out


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for k in ("max_completion_tokens", "max_tokens"):
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _wire_call(c: ToolCall) -> dict[str, Any]:
    return {
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.raw_arguments},
    }


def _message_of(response: ModelResponse) -> dict[str, Any]:
    """The assistant message a client keeps of an upstream answer (for the history hash)."""
    msg: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in response.tool_calls
        ]
    return msg
