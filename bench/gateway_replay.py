"""The same judgement as replay: recorded runs played through the gateway, compared per run.

Usage::

    python bench/gateway_replay.py [FILE ...] [--config FILE] [--limit N] [--quick]
                                   [--via app|gate] [--stream] [--json]
                                   [--wire chat|responses|messages|all]

Each trajectory (the JSONL format of docs/contracts.md; default: the shared
``real-trajectories.jsonl`` and ``coding-agent-trajectories.jsonl.gz``) is turned into the
requests its agent would have sent -- the growing chat-completions history: the user's message,
the assistant's turns with ``tool_calls`` (ids minted by the upstream, as a real one does),
``tool`` results from the recorded observations, and a ``user_reply`` starting the next run of
the same conversation -- and played through the gateway in front of a **recorded upstream**
that answers each request with the next recorded step of that run, reporting the recorded
``usage`` (a tool-less wrap-up request, and a request past the run's recorded steps, get an
empty answer without usage -- what ``loopwarden replay`` feeds its engine there).  When the
gateway stops a run the agent gets the gateway's answer: the trajectory ends there, or -- a
stop that only replaced the run's closing text -- goes on with the next user turn, as replay
does.  The same trajectory is replayed with :func:`loopwarden.traffic.replay.replay_trajectory`
on a deployment of the same config (:func:`~loopwarden.traffic.replay.replay_config`'s
adjustments applied to both), and the terminations -- the stop's step and reason, or none --
are compared.

``--via app`` (the default) sends every request through the real ASGI application
(:class:`~loopwarden.gateway.app.GatewayApp`, in process over ``httpx.ASGITransport``; its
upstream client is an ``httpx.MockTransport`` serving the recording): the wire codec, the
headers, the conversation found again from the history the client sends, the snapshot saved
and loaded between requests.  ``--via gate`` drives :class:`~loopwarden.gateway.exchange.Gate`
directly (the same judging without HTTP: a cross-check).  ``--stream``: the agent asks for
server-sent events and the upstream streams (the gateway's streamed path; a streamed answer
carries no ``x-loopwarden-run`` header, so its run is the one that ended during the request).
Each trajectory is its own tenant (its own API key): nothing of one conversation can be found
by another's history.  The agent's first message is replay's (the trajectory's ``user``, else
"(recorded conversation)"); its tools are every tool the recording calls, with open schemas.

``--wire`` (issue 44): the shape the agent speaks, through the same app (``--via app``, not
streamed); ``all`` plays every shape in turn, one table each (the JSON: the first shape's
object, with ``by_wire``).  ``chat`` is the above.  ``responses``: the agent continues by
``previous_response_id`` -- each request carries only what is new (the ``function_call_output``
items, or the next user message) -- and the recorded upstream keeps each response's
conversation as a provider does (an id it never gave is a 400 ``previous_response_not_found``),
answering in the Responses shape (``output`` items, ``input_tokens`` / ``output_tokens``).
``messages``: Anthropic's shape, the whole history each request, calls as ``tool_use`` blocks
(``input`` an object: recorded arguments that are not one are wrapped, ``{"input": ...}``),
results as ``tool_result`` blocks with the recorded ``observation_is_error`` as ``is_error``.

A stop is read as ``loopwarden replay`` reads one: the run's stop verdict (hook and step, from
the run the gateway finished: ``run_stopped``) gives the file step (a ``before_model`` stop
names the call it precedes), and ``calls_cut`` (recorded calls of the run that never reached
their hooks: ``tool_finished``) its kind.  Every difference is listed with the evidence the
bench can read off the two runs and its cause (``why``) -- ``error_flag`` is established by a
counterfactual (replay of the trajectory without its recorded error flags does what the gateway
did), the others are read off the two stops; the known causes:

* ``order`` -- the gateway gives ``before_tool`` to every proposed call of an answer before any
  has a result (the client runs them after delivery); replay interleaves before/after per call;
* ``error_flag`` -- a recorded ``observation_is_error``: the chat-completions wire has no error
  flag on a ``tool`` message, nor the Responses wire on a ``function_call_output``, so the
  gateway judges the text only (not looked for on ``messages``, whose ``is_error`` carries it);
* ``sizing`` -- replay sizes each request at its recorded ``usage.prompt_tokens``; the gateway
  can only estimate a request before it is sent (the answer's usage comes after).  On
  ``responses`` a request continued by ``previous_response_id`` is sized as what the gateway
  counted before plus the request's new items -- the model's own answers (held at the
  provider, never resent) are left out, and a new run of the conversation starts from zero
  (bench/README.md, "Gateway: every wire");
* ``args_object`` -- ``messages`` only: a recorded call whose arguments are no JSON object,
  wrapped to be a ``tool_use.input``, before the stop;
* ``skip_reask`` -- a call a guard skipped is answered by replay with the skip's observation
  beside the turn's other calls; the gateway withholds the whole answer and asks the model
  again (the turn's other calls are dropped);
* ``time`` -- replay's clock does not move; the gateway's is the wall clock.

On the shared data (851 runs, the shipped config) every termination difference of the chat
wire is ``error_flag`` and terminations agree on 99.41% (real 99.19%, coding 100%); Responses
99.18% (the same 5, and 2 ``sizing``); Messages 100%.  bench/README.md has the figures and the
fixes measured.

Prints a table per source (trajectories, stops on each side, agreement) and every difference;
``--json`` prints one object.  Target (issue 42, item 8): terminations agree on >= 99% of runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loopwarden import signals
from loopwarden.config import load_config
from loopwarden.deployment import Deployment
from loopwarden.gateway import chat
from loopwarden.gateway.app import GatewayApp
from loopwarden.gateway.exchange import Deliver, Forward, Gate
from loopwarden.gateway.state import MemoryState
from loopwarden.gateway.wires import MessagesWire, ResponsesWire
from loopwarden.run import Run, RunOutcome
from loopwarden.traffic.replay import (
    _ends_conversation,
    _file_step,
    iter_trajectories,
    replay_config,
    replay_trajectory,
)
from loopwarden.traffic.trajectory import _calls, _model_name, _segments, _usage, file_label

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
DEFAULT_FILES = (
    SHARED / "real-trajectories.jsonl",
    SHARED / "coding-agent-trajectories.jsonl.gz",
)
TARGET = 0.99
UPSTREAM = "http://recorded.invalid/v1"
FIRST_USER = "(recorded conversation)"  # what replay_trajectory says for a trajectory without one


# -- the recording, as an agent and its upstream see it --------------------------------------


def _arguments(tc: Mapping[str, Any]) -> str:
    """A recorded call's arguments as the wire carries them (replay's own conversion)."""
    args = tc.get("arguments")
    return args if isinstance(args, str) else json.dumps(args or {}, ensure_ascii=False)


def tool_schemas(traj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tools the agent declares: every tool the recording calls (replay's registry holds the
    same names), with an open parameter schema -- recordings carry no declarations."""
    names = sorted({str(tc.get("name")) for s in traj["steps"] for tc in _calls(s)})
    return [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": n,
                "parameters": {"type": "object", "properties": {}},
            },
        }
        for n in names
    ]


@dataclass
class Recording:
    """One trajectory being played: what the recorded upstream answers next, and the recorded
    call each minted id stands for."""

    steps: list[dict[str, Any]]
    model: str
    next: int = 0  # file index of the next recorded step the upstream answers
    end: int = 0  # end (exclusive) of the current run's recorded steps
    ids: dict[str, tuple[int, int]] = field(default_factory=dict)  # call id -> (step, index)
    upstream_calls: int = 0
    beyond: int = 0  # requests past the run's recorded steps (answered empty)
    wrap_ups: int = 0  # tool-less wrap-up requests (answered empty)
    id_prefix: str = "call_"  # the upstream's call ids ("toolu_" on Anthropic's wire)
    #: the Responses upstream's memory: response id -> the conversation so far (chat form), as
    #: a provider keeps it for ``previous_response_id``
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def begin_run(self, offset: int, length: int) -> None:
        self.next, self.end = offset, offset + length

    def answer(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The recorded upstream's completion for one forwarded request body."""
        self.upstream_calls += 1
        if body.get("tool_choice") == "none" or _wrap_up(body):
            self.wrap_ups += 1
            return self._completion(None, [], None)
        if self.next >= self.end:
            self.beyond += 1
            return self._completion(None, [], None)
        idx, self.next = self.next, self.next + 1
        step = self.steps[idx]
        calls = []
        for i, tc in enumerate(_calls(step)):
            cid = self.id_prefix + uuid.uuid4().hex[:24]
            self.ids[cid] = (idx, i)
            calls.append(
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": str(tc.get("name")), "arguments": _arguments(tc)},
                }
            )
        content = step.get("content")
        usage = _usage(step)
        return self._completion(
            content if isinstance(content, str) else None,
            calls,
            None
            if usage is None
            else {
                "prompt_tokens": usage.prompt,
                "completion_tokens": usage.completion,
                "total_tokens": usage.total,
            },
        )

    def _completion(
        self, content: str | None, calls: list[dict[str, Any]], usage: dict[str, int] | None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        out: dict[str, Any] = {
            "id": "chatcmpl-rec" + uuid.uuid4().hex[:20],
            "object": "chat.completion",
            "created": 0,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
        }
        if usage is not None:
            out["usage"] = usage
        return out

    def is_error(self, call_id: str) -> bool:
        """The recorded ``observation_is_error`` of a call (False where none is recorded)."""
        idx, i = self.ids[call_id]
        errs = self.steps[idx].get("observation_is_error") or []
        return bool(errs[i]) if i < len(errs) and errs[i] is not None else False

    def observation(self, call_id: str) -> str:
        """The recorded observation of the call an id was minted for (the agent's tool)."""
        idx, i = self.ids[call_id]
        obs = self.steps[idx].get("observations") or []
        return str(obs[i]) if i < len(obs) else "(no observation recorded)"


_WRAP_UP: list[str] = []  # the deployment's wrap-up instruction (set in main)


def _wrap_up(body: Mapping[str, Any]) -> bool:
    """A soft stop's wrap-up request of a tool-less agent (no ``tool_choice`` to read)."""
    msgs = body.get("messages") or []
    if not msgs or not _WRAP_UP:
        return False
    # the last message (a note appended), or the system text (Anthropic's wire puts a system
    # note into ``system``)
    return any(
        _WRAP_UP[0] in chat.text_of(m.get("content"))
        for m in (msgs[-1], msgs[0])
        if m is msgs[-1] or m.get("role") == "system"
    )


# -- the three wire shapes: the agent's requests and the recorded upstream's answers ------------


def _as_input(arguments: str) -> tuple[dict[str, Any], bool]:
    """A call's arguments as Anthropic's ``tool_use.input`` (an object); False when the recorded
    arguments are not a JSON object and had to be wrapped (``{"input": <text>}``)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"input": arguments}, False
    return (value, True) if isinstance(value, dict) else ({"input": value}, False)


class Shape:
    """One wire shape as the agent and the recorded upstream speak it.  The agent's
    conversation is kept in chat form (``messages``, with ``errors``: call id -> the recorded
    error flag); each shape writes its request from it and reads the answer back into it."""

    name = "chat"
    path = "/chat/completions"
    id_prefix = "call_"

    def __init__(self) -> None:
        self.wrapped_args = 0  # recorded arguments that are no JSON object (Messages only)

    def reset(self) -> None:
        """A new trajectory."""

    def headers(self, key: str) -> dict[str, str]:
        return {"authorization": "Bearer " + key}

    def request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        errors: Mapping[str, bool],
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": messages}
        if tools:
            body["tools"] = tools
        return body

    def message(self, data: dict[str, Any], sent: int) -> dict[str, Any]:
        """The assistant message of the gateway's answer, in chat form; ``sent`` is the number
        of chat messages the conversation had when the request left."""
        msg: dict[str, Any] = data["choices"][0]["message"]
        return msg

    def upstream(self, rec: Recording, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The recorded upstream's answer to a forwarded body: (status, JSON)."""
        return 200, rec.answer(body)


class ResponsesShape(Shape):
    """The Responses API, continued by ``previous_response_id``: each request carries only
    what is new since the answer it continues (the tool outputs, or the next user message);
    the recorded upstream keeps each response's conversation, as a provider does, and
    answers an id it never gave with a 400 (``previous_response_not_found``)."""

    name = "responses"
    path = "/responses"

    def reset(self) -> None:
        self.prev: str | None = None
        self.known = 0  # chat messages the provider holds (up to and with the last answer)

    def request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        errors: Mapping[str, bool],
    ) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for m in messages[self.known :]:
            if m["role"] == "tool":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": m["tool_call_id"],
                        "output": m["content"],
                    }
                )
            else:  # a user message (the first, or the next run's)
                items.append({"role": m["role"], "content": m["content"]})
        body: dict[str, Any] = {"model": model, "input": items}
        if self.prev is not None:
            body["previous_response_id"] = self.prev
        if tools:
            body["tools"] = [{"type": "function", **t["function"]} for t in tools]
        return body

    def message(self, data: dict[str, Any], sent: int) -> dict[str, Any]:
        self.prev = str(data["id"])
        self.known = sent + 1  # the answer is at the provider now
        return _RESPONSES.message_of(data)

    def upstream(self, rec: Recording, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from loopwarden.gateway.responses import to_chat

        prev = body.get("previous_response_id")
        if isinstance(prev, str) and prev not in rec.history:
            return 400, {
                "error": {
                    "message": f"Previous response with id '{prev}' not found.",
                    "type": "invalid_request_error",
                    "param": "previous_response_id",
                    "code": "previous_response_not_found",
                }
            }
        new, _ = to_chat(body.get("instructions"), body.get("input"))
        history = [*(rec.history[prev] if isinstance(prev, str) else []), *new]
        tc = body.get("tool_choice")
        answer = rec.answer({"messages": history, "tool_choice": tc})
        msg = answer["choices"][0]["message"]
        rid = "resp_rec" + uuid.uuid4().hex[:24]
        rec.history[rid] = [*history, msg]
        output: list[dict[str, Any]] = []
        if isinstance(msg.get("content"), str):
            output.append(
                {
                    "type": "message",
                    "id": "msg_rec" + uuid.uuid4().hex[:20],
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": msg["content"], "annotations": []}],
                }
            )
        for c in msg.get("tool_calls") or ():
            output.append(
                {
                    "type": "function_call",
                    "id": "fc_rec" + uuid.uuid4().hex[:20],
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                    "status": "completed",
                }
            )
        out: dict[str, Any] = {
            "id": rid,
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": answer["model"],
            "output": output,
        }
        u = answer.get("usage")
        if u:
            out["usage"] = {
                "input_tokens": u["prompt_tokens"],
                "output_tokens": u["completion_tokens"],
                "total_tokens": u["total_tokens"],
            }
        return 200, out


class MessagesShape(Shape):
    """Anthropic Messages: the whole history each request, an assistant turn's calls as
    ``tool_use`` blocks (``input`` an object), the results as ``tool_result`` blocks with the
    recorded ``observation_is_error`` as ``is_error`` -- the flag Chat Completions cannot
    carry."""

    name = "messages"
    path = "/messages"
    id_prefix = "toolu_"

    def headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": "2023-06-01"}

    def request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        errors: Mapping[str, bool],
    ) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for m in messages:
            if m["role"] == "assistant":
                blocks: list[dict[str, Any]] = []
                if isinstance(m.get("content"), str) and m["content"]:
                    blocks.append({"type": "text", "text": m["content"]})
                for tc in m.get("tool_calls") or ():
                    value, _ = _as_input(tc["function"]["arguments"])
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": tc["id"],
                            "name": tc["function"]["name"],
                            "input": value,
                        }
                    )
                out.append({"role": "assistant", "content": blocks})
            elif m["role"] == "tool":
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m["tool_call_id"],
                    "content": m["content"],
                }
                if errors.get(m["tool_call_id"]):
                    block["is_error"] = True
                if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                    out[-1]["content"].append(block)
                else:
                    out.append({"role": "user", "content": [block]})
            else:
                out.append({"role": "user", "content": m["content"]})
        body: dict[str, Any] = {"model": model, "max_tokens": 4096, "messages": out}
        if tools:
            body["tools"] = [
                {
                    "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"],
                }
                for t in tools
            ]
        return body

    def message(self, data: dict[str, Any], sent: int) -> dict[str, Any]:
        return _MESSAGES.message_of(data)

    def upstream(self, rec: Recording, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from loopwarden.gateway.messages import to_chat

        history = to_chat(body.get("system"), body.get("messages") or [])
        tc = body.get("tool_choice")
        none = isinstance(tc, dict) and tc.get("type") == "none"
        answer = rec.answer({"messages": history, "tool_choice": "none" if none else None})
        msg = answer["choices"][0]["message"]
        blocks: list[dict[str, Any]] = []
        if isinstance(msg.get("content"), str):
            blocks.append({"type": "text", "text": msg["content"]})
        for c in msg.get("tool_calls") or ():
            value, whole = _as_input(c["function"]["arguments"])
            self.wrapped_args += not whole
            blocks.append(
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": value}
            )
        out: dict[str, Any] = {
            "id": "msg_rec" + uuid.uuid4().hex[:24],
            "type": "message",
            "role": "assistant",
            "model": answer["model"],
            "content": blocks,
            "stop_reason": "tool_use" if msg.get("tool_calls") else "end_turn",
            "stop_sequence": None,
        }
        u = answer.get("usage")
        out["usage"] = (
            {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"]}
            if u
            else {"input_tokens": 0, "output_tokens": 0}
        )
        if not u:
            out.pop("usage")
        return 200, out


SHAPES: dict[str, type[Shape]] = {
    "chat": Shape,
    "responses": ResponsesShape,
    "messages": MessagesShape,
}
_RESPONSES = ResponsesWire()
_MESSAGES = MessagesWire()

# -- what the gateway did: its runs, read off the signals ------------------------------------


class Watch:
    """The gateway's finished runs (``run_stopped``) and the calls that reached their hooks
    (``tool_finished``), per run id -- only while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.runs: dict[str, Run] = {}
        self.order: list[str] = []
        self.reached: Counter[str] = Counter()
        signals.run_stopped.connect(self._stopped)
        signals.tool_finished.connect(self._tool)

    def reset(self) -> None:
        self.runs, self.order, self.reached = {}, [], Counter()

    def _stopped(self, sender: Any, **_: Any) -> None:
        if self.on and isinstance(sender, Run):
            self.runs[sender.run_id] = sender
            self.order.append(sender.run_id)

    def _tool(self, sender: Any, **_: Any) -> None:
        if self.on and isinstance(sender, Run):
            self.reached[sender.run_id] += 1

    def close(self) -> None:
        signals.run_stopped.disconnect(self._stopped)
        signals.tool_finished.disconnect(self._tool)


def stop_of(run: Run, offset: int, n_steps: int) -> dict[str, Any] | None:
    """A finished run's stop as replay reports one (``_attribute``): file step, reason, plugin,
    the hook of its verdict; None when no guard stopped it."""
    outcome: RunOutcome | None = run.outcome
    if outcome is None or outcome.stopped_by is None:
        return None
    entry = next(
        (
            e
            for e in run.verdicts
            if e["kind"] == "stop"
            and e["plugin"] == outcome.stopped_by
            and e.get("reason") == outcome.termination
        ),
        None,
    )
    step = _file_step(offset, entry) if entry else offset + max(run.step, 1)
    return {
        "step": min(step, n_steps),
        "reason": outcome.termination,
        "plugin": outcome.stopped_by,
        "soft": outcome.soft,
        "hook": entry["hook"] if entry else None,
    }


def first_warning(runs: Sequence[tuple[int, Run]]) -> dict[str, Any] | None:
    for offset, run in runs:
        for entry in run.verdicts:
            if entry["kind"] in ("warn", "skip"):
                return {"step": _file_step(offset, entry), "plugin": entry["plugin"]}
    return None


# -- the agent: requests built from the recording, sent through the gateway -------------------


@dataclass
class Played:
    """What the gateway did to one trajectory."""

    stop: dict[str, Any] | None = None
    stop_kind: str | None = None
    closing_stops: int = 0
    first_warning: dict[str, Any] | None = None
    requests: int = 0
    upstream_calls: int = 0
    beyond: int = 0
    wrap_ups: int = 0
    max_run_s: float = 0.0  # the longest gateway run, wall clock
    answered_early: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)


class Sender:
    """Sends one request and returns (the delivered assistant message, the gateway's run id)."""

    async def send(
        self, body: dict[str, Any], key: str, rec: Recording, sent: int = 0
    ) -> tuple[dict[str, Any], str | None]:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


class ViaApp(Sender):
    """Through the ASGI application, in process (``httpx.ASGITransport``); ``stream``: the
    agent asks for server-sent events, and the recorded upstream streams its answers."""

    def __init__(
        self, dep: Deployment, *, stream: bool = False, shape: Shape | None = None
    ) -> None:
        self.current: Recording | None = None
        self.stream = stream
        self.shape = shape or Shape()
        upstream = httpx.AsyncClient(transport=httpx.MockTransport(self._upstream))
        self.app = GatewayApp(dep, UPSTREAM, MemoryState(max_entries=100_000), client=upstream)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gateway.local/v1"
        )

    def _upstream(self, request: httpx.Request) -> httpx.Response:
        assert self.current is not None
        body = json.loads(request.content)
        status, answer = self.shape.upstream(self.current, body)
        if not body.get("stream") or status != 200:
            return httpx.Response(status, json=answer)
        # a stream, as from the network (content=bytes would be read already: no aiter_raw)
        return httpx.Response(
            200, stream=_Events(sse_of(answer)), headers={"content-type": "text/event-stream"}
        )

    async def send(
        self, body: dict[str, Any], key: str, rec: Recording, sent: int = 0
    ) -> tuple[dict[str, Any], str | None]:
        self.current = rec
        if self.stream:
            body = {**body, "stream": True}
        resp = await self.client.post(self.shape.path, json=body, headers=self.shape.headers(key))
        if resp.status_code != 200:
            raise RuntimeError(f"gateway answered {resp.status_code}: {resp.text[:300]}")
        if self.stream:
            return message_of_sse(resp.content), resp.headers.get("x-loopwarden-run")
        return self.shape.message(resp.json(), sent), resp.headers.get("x-loopwarden-run")

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.app.aclose()


class _Events(httpx.AsyncByteStream):
    """A response body that arrives in parts, one event each."""

    def __init__(self, data: bytes) -> None:
        self.parts = [p + b"\n\n" for p in data.split(b"\n\n") if p]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part


def sse_of(completion: Mapping[str, Any]) -> bytes:
    """A completion as an upstream streams it: text, each call's fragments, the end, usage."""
    base = {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    msg = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        c = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return chat.sse(c)

    out = [chunk({"role": "assistant", "content": ""})]
    if msg.get("content"):
        out.append(chunk({"content": msg["content"]}))
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        fn = tc["function"]
        head = {"index": i, "id": tc["id"], "type": "function"}
        out.append(chunk({"tool_calls": [{**head, "function": {"name": fn["name"]}}]}))
        out.append(
            chunk({"tool_calls": [{"index": i, "function": {"arguments": fn["arguments"]}}]})
        )
    out.append(chunk({}, choice["finish_reason"]))
    if completion.get("usage"):
        out.append(chat.sse({**base, "choices": [], "usage": completion["usage"]}))
    out.append(chat.sse("[DONE]"))
    return b"".join(out)


def message_of_sse(raw: bytes) -> dict[str, Any]:
    """The assistant message a streaming client assembles from the gateway's events."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for event in raw.split(b"\n\n"):
        data = chat.event_data(event)
        if data is None or data.strip() == "[DONE]":
            continue
        obj = json.loads(data)
        if "error" in obj:
            raise RuntimeError(f"the gateway's stream ended in an error: {obj['error']}")
        for ch in obj.get("choices") or ():
            delta = ch.get("delta") or {}
            if isinstance(delta.get("content"), str):
                text.append(delta["content"])
            for tc in delta.get("tool_calls") or ():
                slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "args": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["args"] += fn.get("arguments") or ""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["args"]},
            }
            for _, c in sorted(calls.items())
        ]
    return msg


class ViaGate(Sender):
    """The sans-I/O machine driven directly: the same judging, no HTTP."""

    def __init__(self, dep: Deployment) -> None:
        self.gate = Gate(dep, MemoryState(max_entries=100_000))

    async def send(
        self, body: dict[str, Any], key: str, rec: Recording, sent: int = 0
    ) -> tuple[dict[str, Any], str | None]:
        raw = json.dumps(body, ensure_ascii=False).encode()
        req = chat.parse_request(raw, 1 << 30)
        ex = self.gate.exchange(req, {"authorization": "Bearer " + key})
        step = ex.start()
        last: dict[str, Any] | None = None
        while isinstance(step, Forward):
            last = rec.answer(json.loads(step.body))
            step = ex.answer(chat.parse_response(last))
        ex.close()
        assert isinstance(step, Deliver)
        if step.kind == "pass" and last is not None:
            return last["choices"][0]["message"], step.run_id
        if step.kind == "message" and step.message is not None:
            return step.message, step.run_id
        return chat.completion_body(step.text, model=req.model)["choices"][0][
            "message"
        ], step.run_id


async def play(traj: dict[str, Any], sender: Sender, watch: Watch, key: str) -> Played:
    """One trajectory through the gateway (see the module doc)."""
    steps: list[dict[str, Any]] = traj["steps"]
    n_steps = len(steps)
    shape: Shape = getattr(sender, "shape", None) or Shape()
    shape.reset()
    rec = Recording(steps=steps, model=_model_name(traj), id_prefix=shape.id_prefix)
    errors: dict[str, bool] = {}  # call id -> the recorded error flag (Messages carries it)
    out = Played()
    tools = tool_schemas(traj)
    first_user = str(traj.get("user") or FIRST_USER)
    messages: list[dict[str, Any]] = [{"role": "user", "content": first_user}]
    segments = _segments(steps)
    watch.reset()
    watch.on = True
    finished: list[tuple[int, Run]] = []
    first_closing: dict[str, Any] | None = None
    try:
        for k, (offset, seg, user) in enumerate(segments):
            if k > 0:
                messages.append(
                    {"role": "user", "content": user if user is not None else first_user}
                )
            rec.begin_run(offset, len(seg))
            run_id: str | None = None
            while True:
                body = shape.request(rec.model, messages, tools, errors)
                ended = len(watch.order)
                msg, run_id = await sender.send(body, key, rec, len(messages))
                out.requests += 1
                if run_id is None and len(watch.order) > ended:
                    run_id = watch.order[-1]  # a streamed answer carries no run header
                kept: dict[str, Any] = {"role": "assistant", "content": msg.get("content")}
                if msg.get("tool_calls"):
                    kept["tool_calls"] = msg["tool_calls"]
                messages.append(kept)
                run = watch.runs.get(run_id or "")
                if run is not None and run.outcome is not None:
                    break  # the run ended (an answer, or a stop)
                calls = msg.get("tool_calls") or []
                if not calls:
                    break  # cannot happen: a delivered answer without calls ends the run
                for tc in calls:
                    errors[tc["id"]] = rec.is_error(tc["id"])
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": tc["id"],
                            "content": rec.observation(tc["id"]),
                        }
                    )
            run = watch.runs.get(run_id or "")
            if run is None or run.outcome is None:
                raise RuntimeError(f"{traj.get('id')}: run {run_id} did not finish")
            finished.append((offset, run))
            out.max_run_s = max(out.max_run_s, run.elapsed)
            outcome = run.outcome
            stop = stop_of(run, offset, n_steps)
            out.runs.append(
                {
                    "offset": offset,
                    "steps": run.step,
                    "termination": outcome.termination,
                    "reached": watch.reached[run.run_id],
                }
            )
            if stop is None:
                if rec.next < rec.end:  # the run ended on an answer before its recorded end
                    out.answered_early.append(
                        {"step": offset + run.step, "left": rec.end - rec.next}
                    )
                continue
            cut = sum(len(_calls(s)) for s in seg) - watch.reached[run.run_id]
            kind = (
                "hand_off"
                if stop["reason"] == "terminal_tool"
                else "work_left"
                if cut > 0
                else "closing_text"
            )
            if kind == "closing_text" and k + 1 < len(segments) and not _ends_conversation(outcome):
                out.closing_stops += 1
                first_closing = first_closing or stop
                continue
            out.stop, out.stop_kind = stop, kind
            break
        if out.stop is None and first_closing is not None:
            out.stop, out.stop_kind = first_closing, "closing_text"
    finally:
        watch.on = False
    out.first_warning = first_warning(finished)
    out.upstream_calls, out.beyond, out.wrap_ups = rec.upstream_calls, rec.beyond, rec.wrap_ups
    return out


# -- comparing ----------------------------------------------------------------------------------


def termination(stop: Mapping[str, Any] | None) -> tuple[int, str] | None:
    return None if stop is None else (int(stop["step"]), str(stop["reason"]))


def _without_error_flags(traj: Mapping[str, Any]) -> dict[str, Any]:
    """The trajectory as the wire tells it: no ``observation_is_error`` (text only)."""
    steps = [{k: v for k, v in s.items() if k != "observation_is_error"} for s in traj["steps"]]
    return {**traj, "steps": steps}


def _parallel_before(traj: Mapping[str, Any], step: int) -> bool:
    """Whether a turn with several calls comes at or before file step ``step``."""
    return any(len(_calls(s)) > 1 for s in traj["steps"][:step])


def _non_object_args(traj: Mapping[str, Any], step: int) -> bool:
    """Whether a call at or before file step ``step`` has arguments that are no JSON object
    (Anthropic's ``tool_use.input`` must be one: the bench wraps them)."""
    for s in traj["steps"][:step]:
        for tc in _calls(s):
            if not _as_input(_arguments(tc))[1]:
                return True
    return False


def _first_step(*marks: Mapping[str, Any] | None) -> int:
    return min((int(m["step"]) for m in marks if m is not None), default=0)


def why(
    traj: Mapping[str, Any],
    dep_replay: Deployment,
    replayed: Mapping[str, Any] | None,
    gateway: Mapping[str, Any] | None,
    *,
    warning: bool = False,
    answered_early: bool = False,
    wire: str = "chat",
) -> str:
    """The cause of a difference (module doc): ``error_flag`` when replay without the
    recorded error flags does what the gateway did (a counterfactual, not a guess); else
    read off the two stops."""
    if wire != "messages":  # Anthropic's wire carries the flag (``is_error``)
        plain = replay_trajectory(dep_replay, _without_error_flags(traj))
        if warning:
            if plain.first_warning == gateway:
                return "error_flag"
        elif termination(plain.stop) == termination(gateway):
            return "error_flag"
    marks = [m for m in (replayed, gateway) if m is not None]
    if wire == "messages" and _non_object_args(traj, _first_step(replayed, gateway)):
        return "args_object"
    if any(m.get("plugin") == "timeout" for m in marks):
        return "time"
    if any(m.get("reason") in ("max_tokens", "max_context", "max_cost") for m in marks):
        return "sizing"
    if answered_early:
        return "skip_reask"
    if _parallel_before(traj, _first_step(replayed, gateway)):
        return "order"
    return "unclassified"


@dataclass
class Row:
    id: str
    source: str
    file: str
    steps: int
    replay: dict[str, Any] | None
    gateway: dict[str, Any] | None
    agree: bool
    same_plugin: bool
    warning_agrees: bool
    replay_warning: dict[str, Any] | None
    gateway_warning: dict[str, Any] | None
    why: str | None
    warning_why: str | None
    gateway_kind: str | None
    replay_kind: str | None
    requests: int
    upstream_calls: int
    wrap_ups: int
    beyond: int
    max_run_s: float
    answered_early: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compare(
    traj: dict[str, Any], file: str, dep_replay: Deployment, played: Played, *, wire: str = "chat"
) -> Row:
    r = replay_trajectory(dep_replay, traj)
    agree = termination(r.stop) == termination(played.stop)
    fw_r, fw_g = r.first_warning, played.first_warning
    return Row(
        id=r.id,
        source=r.source or "?",
        file=file,
        steps=r.steps,
        replay=r.stop,
        gateway=played.stop,
        agree=agree,
        same_plugin=(r.stop or {}).get("plugin") == (played.stop or {}).get("plugin"),
        warning_agrees=fw_r == fw_g,
        replay_warning=fw_r,
        gateway_warning=fw_g,
        why=None if agree else why(traj, dep_replay, r.stop, played.stop, wire=wire),
        warning_why=None
        if fw_r == fw_g
        else why(traj, dep_replay, fw_r, fw_g, warning=True, wire=wire),
        gateway_kind=played.stop_kind,
        replay_kind=r.stop_kind,
        requests=played.requests,
        upstream_calls=played.upstream_calls,
        wrap_ups=played.wrap_ups,
        beyond=played.beyond,
        max_run_s=played.max_run_s,
        answered_early=played.answered_early,
    )


# -- the whole run ------------------------------------------------------------------------------


def trajectories(files: Sequence[Path], limit: int | None) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in files:
        label = file_label(path)
        n = 0
        for _lineno, traj in iter_trajectories(path):
            if traj is None:
                continue
            if limit is not None and n >= limit:
                break
            n += 1
            yield label, traj


async def run_all(
    files: Sequence[Path],
    config_path: str | None,
    via: str,
    limit: int | None,
    *,
    stream: bool = False,
    wire: str = "chat",
) -> tuple[list[Row], dict[str, Any]]:
    config = replay_config(load_config(config_path))
    _WRAP_UP[:] = [config.run.wrap_up_instruction]
    watch = Watch()
    rows: list[Row] = []
    t0 = time.perf_counter()
    with Deployment(config) as dep_gateway, Deployment(config) as dep_replay:
        sender: Sender = (
            ViaApp(dep_gateway, stream=stream, shape=SHAPES[wire]())
            if via == "app"
            else ViaGate(dep_gateway)
        )
        try:
            for n, (label, traj) in enumerate(trajectories(files, limit)):
                key = f"sk-replay-{n}-{uuid.uuid4().hex[:8]}"
                played = await play(traj, sender, watch, key)
                rows.append(compare(traj, label, dep_replay, played, wire=wire))
        finally:
            await sender.aclose()
            watch.close()
    meta = {
        "wire": wire,
        "via": via,
        "stream": stream,
        "config": config_path,
        "plugins": [n for n in config.plugins.enabled if n not in config.plugins.blocked],
        "timeout_s": (config.plugins.model_dump().get("timeout") or {}).get("max_seconds"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return rows, meta


def summary(rows: Sequence[Row]) -> dict[str, Any]:
    def block(rs: Sequence[Row]) -> dict[str, Any]:
        n = len(rs)
        agree = sum(r.agree for r in rs)
        return {
            "trajectories": n,
            "replay_stops": sum(r.replay is not None for r in rs),
            "gateway_stops": sum(r.gateway is not None for r in rs),
            "agree": agree,
            "agreement": round(agree / n, 4) if n else None,
            "same_plugin": sum(r.same_plugin for r in rs),
            "first_warning_agrees": sum(r.warning_agrees for r in rs),
            "first_warning_differences_by_why": dict(
                Counter(r.warning_why for r in rs if not r.warning_agrees)
            ),
            "requests": sum(r.requests for r in rs),
            "upstream_calls": sum(r.upstream_calls for r in rs),
            "wrap_up_requests": sum(r.wrap_ups for r in rs),
            "requests_past_recording": sum(r.beyond for r in rs),
            "max_run_s": round(max((r.max_run_s for r in rs), default=0.0), 3),
            "differences_by_why": dict(Counter(r.why for r in rs if not r.agree)),
        }

    by_file: dict[str, list[Row]] = {}
    for r in rows:
        by_file.setdefault(r.file, []).append(r)
    out: dict[str, Any] = {
        "overall": block(rows),
        "by_file": {k: block(v) for k, v in by_file.items()},
    }
    agreement = out["overall"]["agreement"]
    out["target"] = TARGET
    out["target_met"] = agreement is not None and agreement >= TARGET
    return out


def _fmt_stop(s: Mapping[str, Any] | None) -> str:
    if s is None:
        return "-"
    return f"@{s['step']} {s['reason']} ({s['plugin']}, {s.get('hook')})"


def print_table(result: Mapping[str, Any], rows: Sequence[Row]) -> None:
    head = (
        f"{'source':<28} {'runs':>5} {'replay stops':>12} {'gw stops':>8} {'agree':>6} "
        f"{'%':>7} {'same plugin':>11} {'1st warning':>11}"
    )
    print(head)
    print("-" * len(head))
    blocks = [*result["by_file"].items(), ("overall", result["overall"])]
    for name, b in blocks:
        pct = f"{100 * b['agreement']:.2f}" if b["agreement"] is not None else "-"
        print(
            f"{name:<28} {b['trajectories']:>5} {b['replay_stops']:>12} "
            f"{b['gateway_stops']:>8} {b['agree']:>6} {pct:>7} {b['same_plugin']:>11} "
            f"{b['first_warning_agrees']:>11}"
        )
    o, meta = result["overall"], result["meta"]
    print()
    print(
        f"{o['requests']} requests ({o['wrap_up_requests']} wrap-up, "
        f"{o['requests_past_recording']} past a run's recording), {o['upstream_calls']} "
        f"upstream calls; via {meta['via']}{' (streamed)' if meta.get('stream') else ''}, "
        f"{meta['seconds']} s"
    )
    print(
        f"time: the longest gateway run took {o['max_run_s']:.2f} s of wall clock "
        f"(timeout at {meta['timeout_s']} s; replay's clock stands still)"
    )
    diffs = [r for r in rows if not r.agree]
    print(f"\ntermination differences ({len(diffs)}):" if diffs else "\nno termination differences")
    for r in diffs:
        print(
            f"  {r.file}:{r.id}  [{r.why}]  replay {_fmt_stop(r.replay)} {r.replay_kind or ''}"
            f" | gateway {_fmt_stop(r.gateway)} {r.gateway_kind or ''}"
            + (f" | answered early {r.answered_early}" if r.answered_early else "")
        )
    warns = [r for r in rows if not r.warning_agrees]
    if warns:
        print(f"\nfirst-warning differences ({len(warns)}):")
        for r in warns:
            print(
                f"  {r.file}:{r.id}  [{r.warning_why}]  replay {_fmt_mark(r.replay_warning)}"
                f" | gateway {_fmt_mark(r.gateway_warning)}"
            )
    verdict = "met" if result["target_met"] else "MISSED"
    print(f"\ntarget: terminations agree on >= {100 * TARGET:.0f}% of runs: {verdict}")


def _fmt_mark(m: Mapping[str, Any] | None) -> str:
    return "-" if m is None else f"@{m['step']} {m['plugin']}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench/gateway_replay.py", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="trajectory JSONL files, plain or .gz (default: the shared real and coding files)",
    )
    parser.add_argument("--config", default=None, help="the deployment config (default: shipped)")
    parser.add_argument("--via", choices=["app", "gate"], default="app", help="see the doc")
    parser.add_argument(
        "--stream", action="store_true", help="--via app: the agent and the upstream stream"
    )
    parser.add_argument(
        "--wire",
        choices=[*SHAPES, "all"],
        default="chat",
        help="the shape the agent speaks (all: each in turn, one table per shape)",
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N of each file")
    parser.add_argument("--quick", action="store_true", help="the first 10 of each file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    files = list(args.files) or list(DEFAULT_FILES)
    for f in files:
        if not f.is_file():
            print(f"bench/gateway_replay.py: no such file: {f}", file=sys.stderr)
            return 2
    if args.stream and args.via != "app":
        parser.error("--stream needs --via app")
    wires = list(SHAPES) if args.wire == "all" else [args.wire]
    if wires != ["chat"] and (args.via != "app" or args.stream):
        parser.error("--wire responses|messages|all: --via app, not streamed")
    limit = 10 if args.quick and args.limit is None else args.limit
    results: dict[str, tuple[dict[str, Any], list[Row]]] = {}
    for wire in wires:
        # the shared store (side-effect ledger) of both deployments: a scratch directory
        with tempfile.TemporaryDirectory(prefix="lw-gw-replay-") as data_dir:
            os.environ["LOOPWARDEN_DATA_DIR"] = data_dir
            rows, meta = asyncio.run(
                run_all(files, args.config, args.via, limit, stream=args.stream, wire=wire)
            )
        result = summary(rows)
        result["meta"] = meta
        results[wire] = (result, rows)
    if args.json:
        out: dict[str, Any] = {}
        for wire, (result, rows) in results.items():
            result["differences"] = [r.as_dict() for r in rows if not r.agree]
            result["warning_differences"] = [r.as_dict() for r in rows if not r.warning_agrees]
            result["rows"] = [r.as_dict() for r in rows]
            out[wire] = result
        # one shape: its object as before; every shape: the first's at the top, each by name
        top = dict(out[wires[0]])
        if len(wires) > 1:
            top["by_wire"] = out
        print(json.dumps(top, ensure_ascii=False))
    else:
        for wire, (result, rows) in results.items():
            if len(wires) > 1:
                print(f"\n== wire: {wire} ==")
            print_table(result, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
