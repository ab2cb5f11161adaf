"""The side-effect ledger and the repeat detector agree on what "the same call" is (item 4).

``send_email(to, body)`` keyed on ``to``: ``"Bob@Example.com"``, ``"bob@example.com"`` and
``" bob@example.com "`` are one address.  repeat_call already counted the later proposals as
duplicates (its fingerprint folds case and whitespace) and left side effects to the ledger,
which keyed on the raw values: two e-mails went out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden import Conversation, Deployment, FakeClock
from loopwarden.config import default_config_path, load_config
from loopwarden.fingerprint import Fingerprinter, idempotency_key
from loopwarden.models.scripted import ScriptedModel
from loopwarden.testing import script, tool_call, turn
from loopwarden.tools import Tool, ToolRegistry, tool

ADDRESSES = ["Bob@Example.com", "bob@example.com", " bob@example.com "]


def _mailer(normalize: bool = True) -> tuple[Tool, list[str]]:
    sent: list[str] = []

    @tool(side_effect=True, idempotency_keys=("to",), normalize_arguments=normalize)
    def send_email(to: str, body: str) -> str:
        """Send an e-mail."""
        sent.append(to)
        return f"sent to {to}"

    return send_email, sent


def _run(
    dep: Deployment,
    turns: list[dict[str, Any]],
    mode: str = "run",
    conversation: Conversation | None = None,
    tools: ToolRegistry | None = None,
) -> Any:
    model = ScriptedModel(script(turns, then="final", final_text="done"))
    kwargs: dict[str, Any] = {"model": model, "tools": tools, "conversation": conversation}
    if mode == "run":
        return dep.run("mail bob", **kwargs)
    return asyncio.run(dep.arun("mail bob", **kwargs))


@pytest.fixture
def shipped() -> Any:
    return load_config(default_config_path())


@pytest.mark.parametrize("mode", ["run", "arun"])
def test_keys_that_differ_only_by_case_and_spaces_send_once(mode: str, shipped: Any) -> None:
    mail, sent = _mailer()
    turns = [
        turn(f"try {i}", tool_call("send_email", to=a, body=f"hello {i}"))
        for i, a in enumerate(ADDRESSES)
    ]
    with Deployment(shipped, clock=FakeClock()) as dep:
        run = _run(dep, turns, mode, tools=ToolRegistry([mail]))
    assert sent == ["Bob@Example.com"]
    assert run.tools_executed == 1
    replayed = [m["content"] for m in run.messages if m["role"] == "tool"][1:]
    assert replayed and all("not executed again" in text for text in replayed)


def test_parallel_calls_in_one_turn_send_once(shipped: Any) -> None:
    mail, sent = _mailer()
    turns = [turn("all at once", *(tool_call("send_email", to=a, body="hi") for a in ADDRESSES))]
    with Deployment(shipped, clock=FakeClock()) as dep:
        _run(dep, turns, tools=ToolRegistry([mail]))
    assert sent == ["Bob@Example.com"]


def test_a_conversation_sends_once_across_runs(shipped: Any) -> None:
    mail, sent = _mailer()
    conv = Conversation()
    with Deployment(shipped, clock=FakeClock()) as dep:
        for a in ADDRESSES:
            _run(
                dep,
                [turn("again", tool_call("send_email", to=a, body="hi"))],
                conversation=conv,
                tools=ToolRegistry([mail]),
            )
    assert sent == ["Bob@Example.com"]


def test_a_tool_can_ask_for_exact_values_in_both_places(shipped: Any) -> None:
    mail, sent = _mailer(normalize=False)
    turns = [
        turn(f"try {i}", tool_call("send_email", to=a, body="hi"))
        for i, a in enumerate(ADDRESSES[:2])
    ]
    with Deployment(shipped, clock=FakeClock()) as dep:
        run = _run(dep, turns, tools=ToolRegistry([mail]))
    assert sent == ADDRESSES[:2]  # case-sensitive values: two different recipients
    assert run.record()["duplicate_calls"] == 0  # and repeat_call agrees: not a repeat


_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 5),
        st.sampled_from(["Bob", "bob", " bob ", "b  ob", "B OB", "x", "request_id"]),
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["to", "To", "body", "request_id", "n"]), inner, max_size=3
        )
    ),
    max_leaves=8,
)
_ARGS = st.dictionaries(
    st.sampled_from(["to", "body", "request_id", "timestamp"]), _VALUES, max_size=4
)


@settings(max_examples=400, deadline=None)
@given(_ARGS, _ARGS, st.booleans())
def test_ledger_key_and_fingerprint_agree(
    a: dict[str, Any], b: dict[str, Any], normalize: bool
) -> None:
    """For a tool keyed on all its arguments the two notions of "the same call" coincide;
    for a tool keyed on ``to``, the same fingerprint always means the same ledger key."""
    fp = Fingerprinter()
    same_call = fp("t", a, normalize) == fp("t", b, normalize)
    assert same_call == (
        idempotency_key("t", a, normalize=normalize) == idempotency_key("t", b, normalize=normalize)
    )
    if same_call:
        assert idempotency_key("t", a, ("to",), normalize=normalize) == idempotency_key(
            "t", b, ("to",), normalize=normalize
        )
