"""Attribute values of the otel plugin's spans and events: what leaves the process.

Scalars cut to a bound, a keyed hash and a length standing in for content that is not
captured, the standard evidence keys, message content in the conventions' parts format
(redacted, then cut), and the attributes every chat call of a run shares, built once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from loopwarden.redaction import Redactor
    from loopwarden.run import Run, RunOutcome
    from loopwarden.store import BreakerView
    from loopwarden.verdicts import Verdict

__all__ = [
    "CallAttributes",
    "Content",
    "Digest",
    "breaker_attributes",
    "evidence_attributes",
    "run_end_attributes",
    "run_start_attributes",
    "scalar",
    "server_attributes",
    "verdict_attributes",
]

#: entries of an attribute cache (model pairs, tools) before it starts afresh
CACHED = 256

#: the standard evidence keys (docs/contracts.md) carried by a verdict's span event
EVIDENCE_KEYS = (
    "count",
    "threshold",
    "signature",
    "tool",
    "limit",
    "spent",
    "scope",
    "window",
    "rule",
)

_MAX_ATTR_CHARS = 1000  # a string attribute longer than this is cut (evidence, messages)


def scalar(value: Any, limit: int = _MAX_ATTR_CHARS) -> str | bool | int | float:
    """``value`` as an OTel attribute value: bools and numbers as they are (a Decimal as a
    float), anything else as a string cut to ``limit`` characters."""
    if isinstance(value, (bool, int, float)):
        return value
    if type(value).__name__ == "Decimal":
        return float(value)
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + "…"


#: the standard evidence keys that hold content (a call's arguments, a sentence the model
#: wrote): without capture_content only their hash and length leave the process
CONTENT_EVIDENCE_KEYS = frozenset({"signature"})


class Digest:
    """A keyed hash of content for telemetry without ``capture_content``: equal texts get
    equal hashes within one deployment (a repeat is told apart in a trace), and a value with
    few possibilities (a 9-digit number) cannot be found by hashing every candidate -- the
    key is random per deployment and never leaves the process."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key = os.urandom(16)

    def __call__(self, text: str) -> str:
        data = text.encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, digest_size=8, key=self._key).hexdigest()

    def content(self, name: str, text: str) -> dict[str, Any]:
        """``<name>.hash`` and ``<name>.chars`` attributes standing in for ``text``."""
        return {f"{name}.hash": self(text), f"{name}.chars": len(text)}


def evidence_attributes(
    evidence: Mapping[str, Any], redact: Any, digest: Digest | None = None
) -> dict[str, Any]:
    """The standard evidence keys present in ``evidence``, redacted, as ``loopwarden.evidence.*``
    attributes (other keys stay in the run record: a span event is not an archive).  With a
    ``digest`` (content is not captured), a key that holds content gives only its hash and
    length: ``loopwarden.evidence.signature.hash`` / ``.chars``."""
    out: dict[str, Any] = {}
    for key in EVIDENCE_KEYS:
        value = evidence.get(key)
        if value is None:
            continue
        if digest is not None and key in CONTENT_EVIDENCE_KEYS:
            out.update(digest.content(f"loopwarden.evidence.{key}", str(value)))
        else:
            out[f"loopwarden.evidence.{key}"] = scalar(redact(value))
    return out


class Content:
    """Message content as the conventions' attribute values: redacted (secret keys at any
    depth, API-key patterns, the model's key), then cut to ``chars`` characters -- only ever
    built when content is captured."""

    __slots__ = ("chars", "redactor")

    def __init__(self, redactor: Redactor, chars: int) -> None:
        self.redactor = redactor
        self.chars = chars

    def text(self, text: str | None) -> str:
        clean = self.redactor.text(text or "")  # redact first: a cut must not hide a secret
        n = self.chars
        return clean if len(clean) <= n else clean[:n] + "…"

    def arguments(self, raw: str) -> str:
        """A call's arguments (JSON text): secret keys masked, then as :meth:`text`."""
        return self.text(self.redactor.json_text(raw))

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """Messages in the conventions' parts format, redacted, as JSON."""
        out: list[dict[str, Any]] = []
        for m in messages:
            role = str(m.get("role"))
            parts: list[dict[str, Any]] = []
            if role == "tool":
                parts.append(
                    {
                        "type": "tool_call_response",
                        "id": m.get("tool_call_id"),
                        "response": self.text(m.get("content")),
                    }
                )
            elif m.get("content"):
                parts.append({"type": "text", "content": self.text(m.get("content"))})
            for tc in m.get("tool_calls") or ():
                fn = tc.get("function") or {}
                parts.append(
                    {
                        "type": "tool_call",
                        "id": tc.get("id"),
                        "name": fn.get("name"),
                        "arguments": self.arguments(fn.get("arguments", "")),
                    }
                )
            out.append({"role": role, "parts": parts})
        return json.dumps(out, ensure_ascii=False)

    def answer(self, text: str) -> str:
        """A final answer as ``gen_ai.output.messages``: one assistant message."""
        message = {"role": "assistant", "parts": [{"type": "text", "content": self.text(text)}]}
        return json.dumps([message], ensure_ascii=False)


def verdict_attributes(
    verdict: Verdict,
    reason: str,
    hook: str,
    step: int,
    shadow: bool,
    redactor: Redactor,
    digest: Digest | None,
) -> dict[str, Any]:
    """A ``loopwarden.verdict`` event's attributes.  A verdict's message quotes what the guard
    saw (a call's arguments): content, so with a ``digest`` (content is not captured) only its
    hash and length leave the process, as the evidence's."""
    attrs: dict[str, Any] = {
        "loopwarden.verdict.plugin": verdict.plugin,
        "loopwarden.verdict.action": verdict.kind,
        "loopwarden.verdict.reason": reason,
        "loopwarden.verdict.shadow": shadow,
        "loopwarden.verdict.hook": hook,
        "loopwarden.verdict.step": step,
    }
    soft = getattr(verdict, "soft", None)
    if soft is not None:
        attrs["loopwarden.verdict.soft"] = soft
    if verdict.message:
        if digest is None:
            attrs["loopwarden.verdict.message"] = scalar(redactor.text(verdict.message))
        else:
            attrs.update(digest.content("loopwarden.verdict.message", verdict.message))
    attrs.update(evidence_attributes(verdict.evidence, redactor, digest))
    return attrs


def breaker_attributes(breaker: BreakerView) -> dict[str, Any]:
    """A ``loopwarden.circuit_breaker`` event's attributes: names and counts (the scope's key
    -- a tenant -- is hashed)."""
    tripped = breaker.tripped or {}
    attrs: dict[str, Any] = {
        "loopwarden.breaker.change": str(breaker.changed),
        "loopwarden.breaker.state": breaker.state,
        "loopwarden.breaker.target": breaker.target,
        "loopwarden.breaker.name": breaker.name,
        "loopwarden.breaker.scope": breaker.scope,
        "loopwarden.breaker.key_hash": hashlib.blake2b(
            breaker.scope_key.encode("utf-8", "replace"), digest_size=8
        ).hexdigest(),
        "loopwarden.breaker.failures": int(tripped.get("failures", breaker.failures)),
    }
    if tripped.get("rule"):
        attrs["loopwarden.breaker.rule"] = str(tripped["rule"])
    return attrs


def server_attributes(url: str | None) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the endpoint at ``url`` (a model's base URL):
    its host, and its port or the scheme's (443, 80); nothing for no URL or one without a
    host.  User info, path and query never leave."""
    if not url:
        return {}
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number, an unbalanced IPv6 bracket
        return {}
    if not host:
        return {}
    port = port or _DEFAULT_PORTS.get(parts.scheme.lower())
    return {"server.address": host, "server.port": port} if port else {"server.address": host}


_DEFAULT_PORTS = {"https": 443, "http": 80}


class CallAttributes:
    """What every call of a kind shares, built once and never mutated (the SDK copies what it
    keeps): a chat call's attributes by model pair and endpoint (operation, provider, models,
    ``server.*``) with the token histogram's input and output sets, and a tool's
    ``gen_ai.tool.name`` value, span name and ``gen_ai.tool.description`` value.  Bounded: a
    response may name any model, and the model may invent tool names."""

    __slots__ = ("_chat", "_tools", "provider")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self._chat: dict[tuple[str | None, str | None, str | None], tuple[dict[str, Any], ...]]
        self._chat = {}
        self._tools: dict[tuple[str, str | None], tuple[Any, str, Any]] = {}

    def set_provider(self, provider: str) -> None:
        self.provider = provider
        self._chat.clear()  # they carry the provider's name

    def chat(
        self, request_model: str | None, response_model: str | None, url: str | None = None
    ) -> tuple[dict[str, Any], ...]:
        """The chat call's attributes, and the token histogram's input and output sets;
        ``url``: the endpoint the model called (``server.address`` / ``server.port``)."""
        key = (request_model, response_model, url)
        found = self._chat.get(key)
        if found is None:
            base: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.provider,
            }
            if request_model:
                base["gen_ai.request.model"] = request_model
            if response_model:
                base["gen_ai.response.model"] = response_model
            base.update(server_attributes(url))
            found = (
                base,
                {**base, "gen_ai.token.type": "input"},
                {**base, "gen_ai.token.type": "output"},
            )
            if len(self._chat) >= CACHED:
                self._chat.clear()
            self._chat[key] = found
        return found

    def tool(self, name: str, description: str | None) -> tuple[Any, str, Any]:
        """The tool's name value, its span's name, its description value (None: none)."""
        key = (name, description)
        found = self._tools.get(key)
        if found is None:
            value = scalar(name, 200)
            described = scalar(description, 1000) if description and description != name else None
            found = (value, f"execute_tool {value}", described)
            if len(self._tools) >= CACHED:
                self._tools.clear()
            self._tools[key] = found
        return found


def run_start_attributes(run: Run, provider: str, agent: str) -> dict[str, Any]:
    """The ``invoke_agent`` span's attributes when the run starts."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": provider,
    }
    if run.model_name:
        attrs["gen_ai.request.model"] = run.model_name
    attrs["gen_ai.agent.name"] = agent
    attrs["gen_ai.conversation.id"] = run.conversation.id
    attrs["loopwarden.run_id"] = run.run_id
    attrs["loopwarden.mode"] = run.mode
    if run.limits.name:
        attrs["loopwarden.profile"] = run.limits.name
    if run.scenario:
        attrs["loopwarden.scenario"] = scalar(run.scenario)
    return attrs


def run_end_attributes(
    run: Run,
    outcome: RunOutcome,
    record: Mapping[str, Any],
    *,
    normal: bool,
    framework_spans: bool,
    answer: str | None,
) -> dict[str, Any]:
    """The ``invoke_agent`` span's attributes when the run ends: the stop, the totals (under
    ``loopwarden.usage`` when a framework's own spans carry the usage: ours would count it
    twice), ``error.type`` unless it ended ``normal``-ly, and the captured ``answer``."""
    tokens = record.get("tokens") or {}
    usage = "loopwarden.usage" if framework_spans else "gen_ai.usage"
    attrs: dict[str, Any] = {
        "loopwarden.termination": outcome.termination,
        "loopwarden.soft": outcome.soft,
        "loopwarden.steps": run.step,
        "loopwarden.tool_calls": run.tool_calls,
        "loopwarden.final_answer_present": outcome.final_answer_present,
        f"{usage}.input_tokens": int(tokens.get("prompt") or 0),
        f"{usage}.output_tokens": int(tokens.get("completion") or 0),
        "loopwarden.cost": float(record.get("cost") or 0.0),
    }
    if outcome.stopped_by is not None:
        attrs["loopwarden.stopped_by"] = outcome.stopped_by
    if record.get("cost_currency"):
        attrs["loopwarden.cost_currency"] = str(record["cost_currency"])
    if run.ledger_answers:
        attrs["loopwarden.ledger_answers"] = len(run.ledger_answers)
    shadow = run.shadow_stop
    if shadow:
        attrs["loopwarden.shadow_stop.reason"] = str(shadow.get("reason"))
        attrs["loopwarden.shadow_stop.plugin"] = str(shadow.get("plugin"))
    if not normal:
        attrs["error.type"] = outcome.termination
    if answer is not None:
        attrs["gen_ai.output.messages"] = answer
    return attrs
