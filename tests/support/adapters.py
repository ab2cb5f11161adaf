"""What the adapter tests share: one deployment recipe, scripted model turns, the tools' effects.

Each framework's test plays the same scripts through that framework's own fake model, so the
scenarios (a repeat loop, a side effect proposed twice, a token budget, the example allowlist
plugin) are checked identically in LangChain, the OpenAI Agents SDK and pydantic-ai.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config

FINAL = "Order 99999 was not found; please check the number."
LOOKUP = ("query_order", {"order_id": "99999"})
REFUND_A = ("apply_refund", {"order_id": "88231", "reason": "damaged"})
REFUND_B = ("apply_refund", {"order_id": "88231", "reason": "damaged on arrival"})
FORBIDDEN = ("delete_account", {"user": "u-1"})


@dataclass
class Effects:
    """How often each framework tool really ran (a refund is a real, countable effect)."""

    counts: dict[str, int] = field(default_factory=dict)

    def hit(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


Call = tuple[str, dict[str, Any], str]  # name, arguments, call id


@dataclass
class Script:
    """Model turns: ``turns`` of tool calls, then ``final`` (or the last turn again, with
    ``repeat``).  A call made without tools (the soft stop's wrap-up) answers ``final``."""

    turns: list[list[tuple[str, dict[str, Any]]]]
    final: str = FINAL
    repeat: bool = False
    usage: tuple[int, int] = (40, 10)
    calls: int = 0  # model calls made
    toolless: int = 0  # of which without tools
    _turn: int = 0

    def next(self, tools_available: bool) -> tuple[str | None, list[Call]]:
        self.calls += 1
        if not tools_available:
            self.toolless += 1
            return self.final, []
        i = self._turn
        self._turn += 1
        if i >= len(self.turns):
            if not self.repeat:
                return self.final, []
            i = len(self.turns) - 1
        return None, [
            (n, dict(a), f"call_{self.calls}_{k}") for k, (n, a) in enumerate(self.turns[i])
        ]


def deployment(
    tmp_path: Path,
    *,
    allowlist: bool = False,
    max_total_tokens: int | None = None,
    declare_lookup: bool = True,
    **tables: dict[str, Any],
) -> Deployment:
    """The shipped config, plus: run records to ``tmp_path/runs.jsonl``, ``apply_refund``
    declared a side effect keyed by order, ``query_order`` declared a read-only, deterministic
    lookup (unless ``declare_lookup`` is false), optionally the example allowlist plugin and a
    token limit, and top-level ``tables`` (``store=``, ``plugins_conversation_limits=``: the
    plugin's table).  Every other tool is undeclared.

    ``repeat_call`` stops at the third identical call here, as it did by default before the
    defaults moved to the fifth (tests/test_precision3_*.py test those): these tests check
    that a guard's stop reaches each framework, with short scripted loops."""
    data = load_toml(default_config_path())
    plugins = data["plugins"]
    plugins["repeat_call"] = {**plugins["repeat_call"], "stop_at_repeat": 2}
    plugins["enabled"] = [*plugins["enabled"], "run_record"]
    plugins["run_record"] = {"path": str(tmp_path / "runs.jsonl")}
    data["tools"] = {"apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]}}
    if declare_lookup:
        data["tools"]["query_order"] = {"read_only": True, "deterministic": True}
    if allowlist:
        plugins["enabled"].append("allowlist")
        plugins["allowlist"] = {
            "allowed": ["query_*", "apply_refund"],
            "allow_read_only": False,
            "max_refusals": 1,
        }
    if max_total_tokens is not None:
        plugins["token_budget"] = {**plugins["token_budget"], "max_total_tokens": max_total_tokens}
    for key, table in tables.items():
        if key.startswith("plugins_"):
            plugins[key.removeprefix("plugins_")] = {**plugins.get(key[8:], {}), **table}
        else:
            data[key] = table
    return Deployment(parse_config(data, path="<adapter-test>"), tools=[])


def cancel_when(
    run: Callable[[], Awaitable[Any]], ready: Callable[[], bool], raises: type[BaseException]
) -> BaseException:
    """Start ``run()`` in a task, cancel it once ``ready()`` holds (the model call or tool is
    under way), and return what it raised -- which must be a ``raises``."""

    async def call() -> None:
        task = asyncio.ensure_future(run())
        while not ready():
            await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(raises) as raised:
        asyncio.run(call())
    return raised.value


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def only_record(tmp_path: Path) -> dict[str, Any]:
    recs = records(tmp_path)
    assert len(recs) == 1, recs
    return recs[0]


@dataclass
class Outcome:
    """What a framework run gave back: its final output, the observations the model got for
    its tool calls (in order), and the tools' real effects."""

    output: str
    observations: list[str]
    effects: Effects


Runner = Any  # (tmp_path, script, mode, **deployment kwargs) -> Outcome


def check_repeat_loop(tmp_path: Path, run: Runner, mode: str) -> None:
    """Identical lookups of a tool declared read-only and deterministic: the repeat is
    answered from the first result, the third call stops the run (repeat_call, soft) and the
    wrap-up turn -- without tools -- gives the answer."""
    script = Script([[LOOKUP]], repeat=True)
    out: Outcome = run(tmp_path, script, mode)
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["soft"] is True
    assert rec["stopped_by"] == "repeat_call"
    assert out.effects.counts == {"query_order": 1}
    assert "already made" in out.observations[1]
    assert script.toolless == 1
    assert out.output == FINAL == rec["final_answer"] and rec["final_answer_present"] is True
    assert any(w["plugin"] == "repeat_call" for w in rec["warnings"])


def check_undeclared_repeat(tmp_path: Path, run: Runner, mode: str) -> None:
    """The same lookups of a tool nobody declared: each one runs (a guess never skips a call),
    and the same result twice more stops the run (repeat_call, soft)."""
    script = Script([[LOOKUP]], repeat=True)
    out: Outcome = run(tmp_path, script, mode, declare_lookup=False)
    rec = only_record(tmp_path)
    assert rec["termination"] == "repeat_call" and rec["stopped_by"] == "repeat_call"
    assert out.effects.counts == {"query_order": 3} and rec["tools_executed"] == 3
    assert out.observations == ["NOT_FOUND: order 99999 does not exist"] * 3
    assert rec["evidence"]["rule"] == "repeat" and rec["ledger_answers"] == []
    assert script.toolless == 1 and out.output == FINAL


def check_side_effect_once(tmp_path: Path, run: Runner, mode: str) -> None:
    """A refund proposed twice for one order (``[tools.apply_refund] idempotency_keys``)
    executes once; the second proposal gets the first one's result."""
    script = Script([[REFUND_A], [REFUND_B]], final="Refunded.")
    out: Outcome = run(tmp_path, script, mode)
    assert out.effects.counts == {"apply_refund": 1}
    assert "was not executed again" in out.observations[1]
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "Refunded."
    assert rec["tool_calls"] == 2 and rec["tools_executed"] == 1
    assert out.output == "Refunded."
    [answer] = rec["ledger_answers"]  # the record says which call the ledger answered, and why
    assert answer["tool"] == "apply_refund" and answer["source"] == "conversation"
    assert answer["state"] == "done" and answer["idempotency_keys"] == ["order_id"]
    assert "declared a side effect" in answer["why"]


TOKEN_LIMIT = 7000
BIG_USAGE = (3000, 100)


def check_token_budget(tmp_path: Path, run: Runner, mode: str) -> None:
    """Calls that report 3100 tokens each against a 7000-token run budget: the third call
    would pass it, so the run stops (hard) before making it, with the best-effort answer."""
    script = Script([[LOOKUP]], repeat=True, usage=BIG_USAGE)
    out: Outcome = run(tmp_path, script, mode, max_total_tokens=TOKEN_LIMIT)
    rec = only_record(tmp_path)
    assert rec["termination"] == "max_tokens" and rec["stopped_by"] == "token_budget"
    assert rec["tokens"]["total"] <= TOKEN_LIMIT < rec["tokens"]["total"] + sum(BIG_USAGE)
    assert script.calls == rec["steps"] == 2 and script.toolless == 0
    assert rec["soft"] is False and rec["final_answer_present"] is False
    assert out.output == rec["final_answer"]
    assert out.output.startswith("Here is the last information I found")


def check_allowlist(tmp_path: Path, run: Runner, mode: str) -> None:
    """The example third-party plugin: the forbidden tool never runs; its first call is
    refused (skip), the second stops the run softly."""
    script = Script([[FORBIDDEN]], repeat=True, final="I cannot do that.")
    out: Outcome = run(tmp_path, script, mode, allowlist=True)
    assert out.effects.counts == {}
    assert out.observations[0].startswith("NOT ALLOWED: delete_account")
    rec = only_record(tmp_path)
    assert rec["termination"] == "tool_not_allowed" and rec["stopped_by"] == "allowlist"
    assert rec["final_answer"] == "I cannot do that." == out.output


def check_parallel_calls(tmp_path: Path, run: Runner, mode: str) -> None:
    """Both refunds in ONE answer: the framework may start them together, loopwarden lets
    them through one at a time, in the proposed order -- the second is answered from the
    ledger, never run."""
    script = Script([[REFUND_A, REFUND_B, LOOKUP]], final="Refunded once.")
    out: Outcome = run(tmp_path, script, mode)
    assert out.effects.counts == {"apply_refund": 1, "query_order": 1}
    assert out.observations[0].startswith("refund #1 created")
    assert "was not executed again" in out.observations[1]
    rec = only_record(tmp_path)
    assert rec["termination"] == "final_answer" and rec["tools_executed"] == 2


SCENARIOS = {
    "parallel_calls": check_parallel_calls,
    "repeat_loop": check_repeat_loop,
    "side_effect_once": check_side_effect_once,
    "token_budget": check_token_budget,
    "allowlist": check_allowlist,
    "undeclared_repeat": check_undeclared_repeat,
}


# -- tools nobody declared: a coding agent's, and one that takes its user from context --------

PYTEST = ("bash", {"command": "pytest -q"})
EDIT = ("edit_file", {"path": "app.py", "old": "return 1", "new": "return 2"})
BALANCE = ("account_balance", {})


@dataclass
class World:
    """What the framework tools act on: a checkout whose test fails until ``app.py`` is
    edited, and account balances.  Each framework's test wraps these methods as its own tools
    (``bash`` and ``edit_file`` as they are, ``account_balance`` taking the user from the
    framework's run context, not an argument); none of them is declared in the config."""

    effects: Effects
    fixed: bool = False
    balances: dict[str, int] = field(default_factory=lambda: {"alice": 100, "bob": 7})

    def bash(self, command: str) -> str:
        """Run a shell command in the checkout."""
        self.effects.hit("bash")
        return f"$ {command}\n" + ("1 passed" if self.fixed else "1 failed: test_app")

    def edit_file(self, path: str, old: str, new: str) -> str:
        """Replace text in a file."""
        self.effects.hit("edit_file")
        self.fixed = True
        return f"edited {path}"

    def account_balance(self, user: str) -> str:
        self.effects.hit("account_balance")
        return f"balance of {user}: {self.balances[user]}"


#: (tmp_path, script, mode, world, user) -> Outcome: one run of the framework's agent with
#: the World's tools, ``user`` in the framework's run context
WorldRunner = Any


def check_coding_conversations(tmp_path: Path, run: WorldRunner, mode: str) -> None:
    """Two users' conversations, each "pytest -> edit -> pytest" on its own checkout, with
    the shipped config and undeclared tools: every call executes in both (4 + 2), the second
    pytest reports the edit, and neither run is answered from the other's record."""
    effects = Effects()
    for user in ("alice", "bob"):
        script = Script([[PYTEST], [EDIT], [PYTEST]], final="Fixed: the test passes.")
        out: Outcome = run(tmp_path, script, mode, World(effects), user)
        assert out.observations == [
            "$ pytest -q\n1 failed: test_app",
            "edited app.py",
            "$ pytest -q\n1 passed",
        ]
        assert out.output == "Fixed: the test passes."
    assert effects.counts == {"bash": 4, "edit_file": 2}
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer", "final_answer"]
    assert [r["tools_executed"] for r in recs] == [3, 3]
    assert all(r["ledger_answers"] == [] and not r["warnings"] for r in recs)


def check_context_user(tmp_path: Path, run: WorldRunner, mode: str) -> None:
    """A tool that takes its user from the framework's context (no arguments at all): Alice,
    then Bob, then Alice again after her balance changed -- each sees their own, current
    balance; the tool runs every time."""
    effects = Effects()
    world = World(effects)
    seen = []
    for user in ("alice", "bob", "alice"):
        if len(seen) == 2:
            world.balances["alice"] = 55
        script = Script([[BALANCE]], final="Here is your balance.")
        out: Outcome = run(tmp_path, script, mode, world, user)
        seen.extend(out.observations)
    assert seen == ["balance of alice: 100", "balance of bob: 7", "balance of alice: 55"]
    assert effects.counts == {"account_balance": 3}
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer"] * 3
    assert all(r["ledger_answers"] == [] for r in recs)


#: the scenarios of undeclared tools, played by each framework's ``run_world``
WORLD_SCENARIOS = {
    "coding_conversations": check_coding_conversations,
    "context_user": check_context_user,
}
