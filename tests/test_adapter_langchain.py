"""LangChain v1 ``create_agent`` guarded by ``LoopwardenMiddleware``, offline.

The model is LangChain's own ``GenericFakeChatModel`` (given ``bind_tools``, which it lacks),
playing :class:`support.adapters.Script`; the tools are real LangChain tools.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from pydantic import BaseModel
from support.adapters import (
    SCENARIOS,
    WORLD_SCENARIOS,
    Effects,
    Outcome,
    Script,
    World,
    cancel_when,
    deployment,
    only_record,
    records,
)
from support.openai_stub import Stub, completion, serve
from support.stores import store_table

from loopwarden import Deployment
from loopwarden.adapters.langchain import RESULT_KEY, LoopwardenMiddleware
from loopwarden.config import default_config_path, load_toml, parse_config


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel whose next message depends on whether tools are bound."""

    tools_bound: bool = False

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(lw_tools=[getattr(t, "name", t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.tools_bound = bool(kwargs.get("lw_tools"))
        return super()._generate(messages, stop=stop, run_manager=run_manager)


def make_model(script: Script) -> ScriptedChatModel:
    model: ScriptedChatModel

    def play() -> Iterator[AIMessage]:
        while True:
            text, calls = script.next(model.tools_bound)
            p, c = script.usage
            yield AIMessage(
                content=text or "",
                tool_calls=[{"name": n, "args": a, "id": i} for n, a, i in calls],
                usage_metadata={"input_tokens": p, "output_tokens": c, "total_tokens": p + c},
            )

    model = ScriptedChatModel(messages=play())
    return model


def make_tools(effects: Effects) -> list[Any]:
    @tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        effects.hit("query_order")
        return f"NOT_FOUND: order {order_id} does not exist"

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    @tool
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        effects.hit("delete_account")
        return f"account {user} deleted"

    return [query_order, apply_refund, delete_account]


def run_agent(tmp_path: Path, script: Script, mode: str, **dep_kwargs: Any) -> Outcome:
    effects = Effects()
    dep = deployment(tmp_path, **dep_kwargs)
    agent = create_agent(
        make_model(script),
        make_tools(effects),
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
    )
    state = {"messages": [HumanMessage("Where is my order 99999?")]}
    try:
        out = agent.invoke(state) if mode == "sync" else asyncio.run(agent.ainvoke(state))
    finally:
        dep.close()
    messages = out["messages"]
    last = messages[-1]
    assert isinstance(last, AIMessage) and not last.tool_calls
    return Outcome(
        output=str(last.content),
        observations=[str(m.content) for m in messages if isinstance(m, ToolMessage)],
        effects=effects,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_scenario(tmp_path: Path, scenario: str, mode: str) -> None:
    check: Callable[..., None] = SCENARIOS[scenario]
    check(tmp_path, run_agent, mode)


@dataclass
class UserContext:
    user: str


def run_world(tmp_path: Path, script: Script, mode: str, world: World, user: str) -> Outcome:
    """One run of an agent whose tools nobody declared, ``user`` in the run's context."""

    @tool
    def account_balance(runtime: ToolRuntime[UserContext]) -> str:
        """The signed-in user's account balance."""
        return world.account_balance(runtime.context.user)

    dep = deployment(tmp_path)
    agent = create_agent(
        make_model(script),
        [tool(world.bash), tool(world.edit_file), account_balance],
        middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")],
        context_schema=UserContext,
    )
    state = {"messages": [HumanMessage("Please help.")]}
    ctx = UserContext(user)
    try:
        out = (
            agent.invoke(state, context=ctx)
            if mode == "sync"
            else asyncio.run(agent.ainvoke(state, context=ctx))
        )
    finally:
        dep.close()
    messages = out["messages"]
    return Outcome(
        output=str(messages[-1].content),
        observations=[str(m.content) for m in messages if isinstance(m, ToolMessage)],
        effects=world.effects,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("scenario", sorted(WORLD_SCENARIOS))
def test_undeclared_tools(tmp_path: Path, scenario: str, mode: str) -> None:
    """Tools nobody declared run every time, for every user (support.adapters.World)."""
    WORLD_SCENARIOS[scenario](tmp_path, run_world, mode)


def test_warnings_reach_the_model_as_messages(tmp_path: Path) -> None:
    effects = Effects()
    dep = deployment(tmp_path)
    seen: list[list[BaseMessage]] = []
    script = Script([[("query_order", {"order_id": "99999"})]], repeat=True)
    model = make_model(script)
    original = model._generate

    def spy(messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        seen.append(list(messages))
        return original(messages, *args, **kwargs)

    object.__setattr__(model, "_generate", spy)
    agent = create_agent(
        model, make_tools(effects), middleware=[LoopwardenMiddleware(dep, model_name="gpt-4o-mini")]
    )
    out = agent.invoke({"messages": [HumanMessage("Where is my order 99999?")]})
    dep.close()
    role = HumanMessage if dep.config.run.warning_role == "user" else SystemMessage

    def is_note(m: BaseMessage) -> bool:
        return isinstance(m, role) and str(m.content).startswith("[loopwarden] ")

    notes = [m for m in seen[-1] if is_note(m)]
    assert len(notes) >= 2  # the repeat warning, then the wrap-up instruction
    assert "already made" in str(notes[0].content)
    # kept in the agent's messages, each just before the model's answer to it
    kept = out["messages"]
    for i, m in enumerate(kept):
        if is_note(m):
            assert is_note(kept[i + 1]) or isinstance(kept[i + 1], AIMessage)
    assert [str(m.content) for m in notes] == [str(m.content) for m in kept if is_note(m)]


def test_the_frameworks_own_limit_ends_the_run_with_a_record(tmp_path: Path) -> None:
    from langchain.agents.middleware import ModelCallLimitMiddleware

    effects = Effects()
    dep = deployment(tmp_path)
    script = Script([[("query_order", {"order_id": str(n)})] for n in range(10)])
    agent = create_agent(
        make_model(script),
        make_tools(effects),
        middleware=[
            ModelCallLimitMiddleware(run_limit=2, exit_behavior="end"),
            LoopwardenMiddleware(dep, model_name="gpt-4o-mini"),
        ],
    )
    agent.invoke({"messages": [HumanMessage("Orders?")]})
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and rec["steps"] == 2


def test_a_tool_exception_that_ends_the_agent_is_recorded(tmp_path: Path) -> None:
    dep = deployment(tmp_path)

    @tool
    def query_order(order_id: str) -> str:
        """Look up an order by its id."""
        raise RuntimeError("database down")

    script = Script([[("query_order", {"order_id": "1"})]])
    middleware = LoopwardenMiddleware(dep, model_name="gpt-4o-mini")
    agent = create_agent(make_model(script), [query_order], middleware=[middleware])
    with pytest.raises(RuntimeError, match="database down"):
        agent.invoke({"messages": [HumanMessage("Order 1?")]})
    dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "error" and "database down" in rec["evidence"]["error"]
    assert rec["tools_executed"] == 1
    assert middleware.runs() == []


def approved_refund(effects: Effects) -> Any:
    """``apply_refund`` that a person approves first (``interrupt``, human in the loop)."""
    from langgraph.types import interrupt

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order (a person approves it first)."""
        if interrupt({"approve": order_id}) != "yes":
            return "refund declined"
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    return apply_refund


def test_an_interrupted_tool_resumes_in_a_new_run_of_the_thread(tmp_path: Path) -> None:
    """An interrupt ends the invocation and its run (nothing stays open); the resumed
    invocation is a new run of the same conversation that executes the call once."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    effects = Effects()
    dep = deployment(tmp_path)

    apply_refund = approved_refund(effects)

    script = Script(
        [[("apply_refund", {"order_id": "88231", "reason": "damaged"})]], final="Refunded."
    )
    middleware = LoopwardenMiddleware(dep, model_name="gpt-4o-mini")
    agent = create_agent(
        make_model(script), [apply_refund], checkpointer=InMemorySaver(), middleware=[middleware]
    )
    config: Any = {"configurable": {"thread_id": "t1"}}
    first = agent.invoke({"messages": [HumanMessage("Refund 88231")]}, config)
    assert "__interrupt__" in first and effects.counts == {}
    assert middleware.runs() == []
    out = agent.invoke(Command(resume="yes"), config)
    dep.close()
    assert effects.counts == {"apply_refund": 1}
    assert out["messages"][-1].content == "Refunded."
    paused, resumed = records(tmp_path)
    assert paused["termination"] == "ended_by_framework" and paused["evidence"]["interrupted"]
    assert paused["tools_executed"] == 0
    assert resumed["termination"] == "final_answer" and resumed["tools_executed"] == 1
    assert resumed["meta"]["resumed_from"] == paused["run_id"]
    assert paused["conversation_id"] == resumed["conversation_id"] == "t1"
    assert out[RESULT_KEY]["run_id"] == resumed["run_id"]


# -- over real HTTP: a real ChatOpenAI against the local chat-completions stub ---------------


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    with serve() as served:
        yield served


def chat(url: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="gpt-4o-mini", base_url=url, api_key="sk-test", max_retries=0, timeout=10
    )


def http_deployment(tmp_path: Path, store: str | None = None, **plugins: Any) -> Deployment:
    """:func:`support.adapters.deployment`'s config, with plugin settings and a ``[store]``."""
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "run_record"]
    data["plugins"]["run_record"] = {"path": str(tmp_path / "runs.jsonl")}
    for name, table in plugins.items():
        data["plugins"][name] = {**data["plugins"].get(name, {}), **table}
    data["tools"] = {
        "apply_refund": {"side_effect": True, "idempotency_keys": ["order_id"]},
        "query_order": {"read_only": True, "deterministic": True},
    }
    if store is not None:
        data["store"] = store_table(store)
    return Deployment(parse_config(data, path="<adapter-http>"), tools=[])


def wait_for(done: Callable[[], bool], seconds: float) -> bool:
    """Poll ``done`` until it holds or ``seconds`` pass (for what happens on another thread)."""
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def lookup(order_id: str) -> dict[str, Any]:
    return completion(
        None,
        [{"name": "query_order", "arguments": json.dumps({"order_id": order_id})}],
        usage={"prompt_tokens": 40, "completion_tokens": 10},
    )


def answer(text: str) -> dict[str, Any]:
    return completion(text, usage={"prompt_tokens": 40, "completion_tokens": 10})


REFUND = completion(
    None,
    [{"name": "apply_refund", "arguments": '{"order_id": "88231", "reason": "damaged"}'}],
    usage={"prompt_tokens": 40, "completion_tokens": 10},
)


def asked(payload: dict[str, Any]) -> str:
    """The first user message of a chat-completions request."""
    return next(str(m["content"]) for m in payload["messages"] if m["role"] == "user")


def tool_answers(payload: dict[str, Any]) -> int:
    return sum(1 for m in payload["messages"] if m["role"] == "tool")


@tool
def query_order(order_id: str) -> str:
    """Look up an order by its id."""
    return f"NOT_FOUND: order {order_id} does not exist"


def test_http_each_result_names_its_own_stop_under_concurrency(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Two invocations of one agent at once: the looping one is stopped by repeat_call, the
    other answers; each result's ``loopwarden`` key names its own run and stop."""
    server, url = stub

    def route(payload: dict[str, Any]) -> dict[str, Any]:
        if asked(payload).startswith("loop"):
            return lookup("99999") if payload.get("tools") else answer("Not found.")
        return lookup("1") if tool_answers(payload) == 0 else answer("Order 1 is on its way.")

    server.route = route
    dep = http_deployment(tmp_path)
    agent = create_agent(chat(url), [query_order], middleware=[LoopwardenMiddleware(dep)])

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    agent.ainvoke({"messages": [HumanMessage(text)]})
                    for text in ("loop: where is 99999?", "ok: where is 1?")
                )
            )
        )

    try:
        looped, healthy = asyncio.run(both())
    finally:
        dep.close()
    by_id = {r["run_id"]: r for r in records(tmp_path)}
    assert looped[RESULT_KEY] == {
        "run_id": looped[RESULT_KEY]["run_id"],
        "termination": "repeat_call",
        "stopped": True,
        "stopped_by": "repeat_call",
        "soft": True,
    }
    assert healthy[RESULT_KEY]["termination"] == "final_answer"
    assert healthy[RESULT_KEY]["stopped"] is False and healthy[RESULT_KEY]["stopped_by"] is None
    assert by_id[looped[RESULT_KEY]["run_id"]]["final_answer"] == "Not found."
    assert by_id[healthy[RESULT_KEY]["run_id"]]["final_answer"] == "Order 1 is on its way."


@pytest.mark.parametrize(("limit", "requests"), [(4, 1), (5, 1), (6, 2)])
def test_http_graph_recursion_error_is_recorded(
    tmp_path: Path, stub: tuple[Stub, str], limit: int, requests: int
) -> None:
    """LangGraph's recursion_limit ends the graph with GraphRecursionError: the run is
    recorded as ended by the framework, with no answer (the caller got none), and nothing
    stays open.  A model call in the last steps, whose answer nobody would receive, is not
    made (limit 5: the second call)."""
    from langgraph.errors import GraphRecursionError

    server, url = stub
    server.route = lambda payload: lookup(str(len(server.requests)))
    dep = http_deployment(tmp_path)
    middleware = LoopwardenMiddleware(dep)
    agent = create_agent(chat(url), [query_order], middleware=[middleware])
    try:
        with pytest.raises(GraphRecursionError):
            agent.invoke({"messages": [HumanMessage("Orders?")]}, {"recursion_limit": limit})
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and rec["evidence"]["recursion_limit"]
    assert rec["final_answer"] is None and rec["final_answer_present"] is False
    assert len(server.requests) == requests == rec["steps"]
    assert middleware.runs() == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_http_model_call_limit_error_is_recorded_at_once(
    tmp_path: Path, stub: tuple[Stub, str], mode: str
) -> None:
    """Issue 32: ModelCallLimitMiddleware(exit_behavior="error") raises in its own node,
    where the middleware sees no end of the run: the agent graph's ``on_chain_error`` (a
    callback handler loopwarden registers) records the run at once -- when ``invoke``
    raises, the record is there (``ainvoke``: moments later, off the event loop) -- not at
    the run's deadline."""
    from langchain.agents.middleware import ModelCallLimitMiddleware
    from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError

    from loopwarden import signals

    server, url = stub
    server.route = lambda payload: lookup(str(len(server.requests)))
    dep = http_deployment(tmp_path)  # the shipped timeout: a deadline minutes away
    stopped: list[str] = []
    dep.connect(signals.run_stopped, lambda run, record, **_: stopped.append(record["run_id"]))
    middleware = LoopwardenMiddleware(dep)
    agent = create_agent(
        chat(url),
        [query_order],
        middleware=[middleware, ModelCallLimitMiddleware(run_limit=1, exit_behavior="error")],
    )
    state = {"messages": [HumanMessage("Orders?")]}
    try:
        with pytest.raises(ModelCallLimitExceededError):
            agent.invoke(state) if mode == "sync" else asyncio.run(agent.ainvoke(state))
        if mode == "async":
            assert wait_for(lambda: bool(stopped), seconds=10)
        assert len(stopped) == 1  # no waiting for a deadline
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and "abandoned" not in rec["evidence"]
    assert rec["evidence"]["raised"] == "ModelCallLimitExceededError"
    assert rec["steps"] == 1 and rec["final_answer"] is None and stopped == [rec["run_id"]]
    assert middleware.runs() == []


def test_http_model_call_limit_error_is_recorded_in_a_thread(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """Behind a checkpointer, each invocation that ends in ModelCallLimitExceededError is
    recorded when it raises, in the thread's conversation."""
    from langchain.agents.middleware import ModelCallLimitMiddleware
    from langchain.agents.middleware.model_call_limit import ModelCallLimitExceededError
    from langgraph.checkpoint.memory import InMemorySaver

    server, url = stub
    server.route = lambda payload: lookup(str(len(server.requests)))
    dep = http_deployment(tmp_path)
    middleware = LoopwardenMiddleware(dep)
    agent = create_agent(
        chat(url),
        [query_order],
        checkpointer=InMemorySaver(),
        middleware=[middleware, ModelCallLimitMiddleware(thread_limit=1, exit_behavior="error")],
    )
    config: Any = {"configurable": {"thread_id": "t-limit"}}
    try:
        for _ in range(2):
            with pytest.raises(ModelCallLimitExceededError):
                agent.invoke({"messages": [HumanMessage("Orders?")]}, config)
    finally:
        dep.close()
    first, second = records(tmp_path)
    assert first["termination"] == "ended_by_framework" and first["evidence"]["raised"]
    assert first["steps"] == 1 and first["conversation_id"] == "t-limit"
    assert second["steps"] == 0 and second["conversation_id"] == "t-limit"
    assert middleware.runs() == []


def test_http_framework_limit_records_what_the_caller_received(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """ModelCallLimitMiddleware(exit_behavior="end") ends the agent on its own message: the
    record's final_answer is that message, not loopwarden's fallback text."""
    from langchain.agents.middleware import ModelCallLimitMiddleware

    server, url = stub
    server.route = lambda payload: lookup(str(len(server.requests)))
    dep = http_deployment(tmp_path)
    agent = create_agent(
        chat(url),
        [query_order],
        middleware=[
            LoopwardenMiddleware(dep),
            ModelCallLimitMiddleware(run_limit=2, exit_behavior="end"),
        ],
    )
    try:
        out = agent.invoke({"messages": [HumanMessage("Orders?")]})
    finally:
        dep.close()
    received = out["messages"][-1].content
    assert received.startswith("Model call limits exceeded")
    rec = only_record(tmp_path)
    assert rec["termination"] == "ended_by_framework" and rec["steps"] == 2
    assert rec["final_answer"] == received and rec["final_answer_present"] is False
    assert out[RESULT_KEY]["termination"] == "ended_by_framework"
    assert out[RESULT_KEY]["run_id"] == rec["run_id"]


def test_http_cancelled_invocation_is_recorded_cancelled(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """The invocation (under ``asyncio.wait_for``) is cancelled during the model call:
    recorded ``cancelled``, not ``model_error``."""
    server, url = stub
    server.push_hang(30.0)
    dep = http_deployment(tmp_path)
    middleware = LoopwardenMiddleware(dep)
    agent = create_agent(chat(url), [query_order], middleware=[middleware])

    def invocation() -> Any:
        return asyncio.wait_for(agent.ainvoke({"messages": [HumanMessage("Orders?")]}), 60.0)

    try:  # cancelled while the model call is under way
        cancel_when(invocation, lambda: bool(server.requests), asyncio.CancelledError)
    finally:
        dep.close()
    rec = only_record(tmp_path)
    assert rec["termination"] == "cancelled" and "CancelledError" in rec["evidence"]["error"]
    assert middleware.runs() == []


def test_http_interrupt_resumed_by_another_worker_is_guarded(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    """Two workers (two deployments on one shared store, two middleware instances) behind one
    checkpointer: worker A's run ends at the interrupt (nothing left open), worker B's resume
    is guarded and recorded, and the refund proposed again later on A is answered from the
    shared ledger -- it executes once."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    server, url = stub
    effects = Effects()
    for body in (REFUND, answer("Refunded."), REFUND, answer("Already refunded.")):
        server.push(body)

    apply_refund = approved_refund(effects)

    saver = InMemorySaver()
    deps = [http_deployment(tmp_path, store_url) for _ in range(2)]
    workers = [LoopwardenMiddleware(d) for d in deps]
    a, b = (
        create_agent(chat(url), [apply_refund], checkpointer=saver, middleware=[w]) for w in workers
    )
    config: Any = {"configurable": {"thread_id": "t-refund"}}
    try:
        first = a.invoke({"messages": [HumanMessage("Refund 88231")]}, config)
        assert "__interrupt__" in first
        assert workers[0].runs() == []  # the interrupt ended the run: nothing held open
        resumed = b.invoke(Command(resume="yes"), config)
        again = a.invoke({"messages": [HumanMessage("Refund 88231 again")]}, config)
    finally:
        for d in deps:
            d.close()
    assert effects.counts == {"apply_refund": 1}
    assert resumed["messages"][-1].content == "Refunded."
    assert again["messages"][-1].content == "Already refunded."
    paused, on_b, later = records(tmp_path)
    assert paused["termination"] == "ended_by_framework" and paused["evidence"]["interrupted"]
    assert on_b["termination"] == "final_answer" and on_b["tools_executed"] == 1
    assert on_b["meta"]["resumed_from"] == paused["run_id"]
    assert on_b["run_id"] == resumed[RESULT_KEY]["run_id"]
    assert later["tools_executed"] == 0
    [ledger] = later["ledger_answers"]
    assert ledger["source"] == "shared" and ledger["tool"] == "apply_refund"
    assert [w.runs() for w in workers] == [[], []]


def test_http_conversation_limits_count_across_a_thread(
    tmp_path: Path, stub: tuple[Stub, str]
) -> None:
    """The thread is the conversation (as ModelCallLimitMiddleware's thread_limit counts it):
    conversation_limits' max_turns = 2 refuses the thread's third invocation."""
    from langgraph.checkpoint.memory import InMemorySaver

    server, url = stub
    server.route = lambda payload: answer("Hello again.")
    dep = http_deployment(tmp_path, conversation_limits={"max_turns": 2})
    agent = create_agent(
        chat(url),
        [query_order],
        checkpointer=InMemorySaver(),
        middleware=[LoopwardenMiddleware(dep)],
    )
    config: Any = {"configurable": {"thread_id": "t-chat"}}
    try:
        outs = [agent.invoke({"messages": [HumanMessage(f"Hi {n}")]}, config) for n in range(3)]
        other = agent.invoke(
            {"messages": [HumanMessage("Hi")]}, {"configurable": {"thread_id": "t-other"}}
        )
    finally:
        dep.close()
    recs = records(tmp_path)
    assert [r["termination"] for r in recs] == ["final_answer"] * 2 + ["max_turns", "final_answer"]
    refused = recs[2]
    assert refused["stopped_by"] == "conversation_limits"
    assert refused["evidence"]["key"] == "t-chat" == refused["conversation_id"]
    assert len(server.requests) == 3  # the refused turn made no model call
    assert [o[RESULT_KEY]["termination"] for o in outs] == ["final_answer"] * 2 + ["max_turns"]
    assert other[RESULT_KEY]["termination"] == "final_answer"


class OrderInfo(BaseModel):
    """What the agent found about an order."""

    order_id: str
    status: str


def structured_route(server: Stub, strategy: str, loop: bool) -> Callable[[dict[str, Any]], Any]:
    """The model: lookups (repeated when ``loop``), then the structured answer -- through the
    ``OrderInfo`` tool (ToolStrategy) or as JSON text (ProviderStrategy)."""
    info = {"order_id": "1", "status": "missing"}

    def route(payload: dict[str, Any]) -> dict[str, Any]:
        names = [t["function"]["name"] for t in payload.get("tools") or ()]
        if "query_order" in names and (loop or tool_answers(payload) == 0):
            return lookup("1")
        if strategy == "provider":
            return answer(json.dumps(info))
        return completion(
            None,
            [{"name": "OrderInfo", "arguments": json.dumps(info)}],
            usage={"prompt_tokens": 40, "completion_tokens": 10},
        )

    return route


@pytest.mark.parametrize(
    ("strategy", "loop"), [("tool", False), ("tool", True), ("provider", True)]
)
def test_http_structured_output_survives_guarding(
    tmp_path: Path, stub: tuple[Stub, str], strategy: str, loop: bool
) -> None:
    """``response_format``: a healthy ToolStrategy run ends as final_answer (its output tool
    is the answer, not a tool left unrun), and a soft stop's wrap-up turn still produces the
    structured response (ToolStrategy and ProviderStrategy).  Issue 43 item 10: the wrap-up
    offers only the agent's own way to answer -- ToolStrategy's output tool, required;
    ProviderStrategy's response format, no tool -- and a note next to the wrap-up instruction
    says so ("stop calling tools" alone would keep a model from the output tool)."""
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy

    server, url = stub
    server.route = structured_route(server, strategy, loop)
    fmt: Any = ToolStrategy(OrderInfo) if strategy == "tool" else ProviderStrategy(OrderInfo)
    dep = http_deployment(tmp_path)
    agent = create_agent(
        chat(url), [query_order], middleware=[LoopwardenMiddleware(dep)], response_format=fmt
    )
    try:
        out = agent.invoke({"messages": [HumanMessage("Where is order 1?")]})
    finally:
        dep.close()
    assert out["structured_response"] == OrderInfo(order_id="1", status="missing")
    rec = only_record(tmp_path)
    assert rec["termination"] == ("repeat_call" if loop else "final_answer")
    assert json.loads(rec["final_answer"]) == {"order_id": "1", "status": "missing"}
    assert out[RESULT_KEY]["termination"] == rec["termination"]
    if loop:
        wrap_up = server.requests[-1]
        notes = [str(m["content"]) for m in wrap_up["messages"] if m["role"] != "tool"]
        [note] = [n for n in notes if "required structured form" in n]
        if strategy == "tool":
            assert "by calling OrderInfo" in note and wrap_up["tool_choice"] == "required"
            assert [t["function"]["name"] for t in wrap_up["tools"]] == ["OrderInfo"]
        else:
            assert "as JSON" in note and not wrap_up.get("tools")
            assert wrap_up["response_format"]["json_schema"]["name"] == "OrderInfo"


def test_http_hitl_middleware_approval_on_another_worker_runs_the_call_once(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    """LangChain's HumanInTheLoopMiddleware pauses the proposed refund in its own node (the
    run's side-effect claim already taken on worker A); A's run is recorded when the
    invocation pauses (the agent graph's end), its claim released; the approval is resumed on
    worker B: the refund executes there once."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    server, url = stub
    effects = Effects()
    for body in (REFUND, answer("Refunded."), answer("You are welcome.")):
        server.push(body)

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit("apply_refund")
        return f"refund #1 created for order {order_id}"

    saver = InMemorySaver()
    deps = [http_deployment(tmp_path, store_url) for _ in range(2)]
    workers = [LoopwardenMiddleware(d) for d in deps]
    a, b = (
        create_agent(
            chat(url),
            [apply_refund],
            checkpointer=saver,
            middleware=[w, HumanInTheLoopMiddleware(interrupt_on={"apply_refund": True})],
        )
        for w in workers
    )
    config: Any = {"configurable": {"thread_id": "t-hitl"}}
    try:
        first = a.invoke({"messages": [HumanMessage("Refund 88231")]}, config)
        assert "__interrupt__" in first and effects.counts == {}
        resumed = b.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
        a.invoke({"messages": [HumanMessage("Thanks")]}, config)
    finally:
        for d in deps:
            d.close()
    assert effects.counts == {"apply_refund": 1}
    assert resumed["messages"][-1].content == "Refunded."
    paused, on_b, thanks = records(tmp_path)  # A's run is recorded when its invocation pauses
    assert on_b["termination"] == "final_answer" and on_b["tools_executed"] == 1
    assert on_b["meta"]["resumed_from"] == paused["run_id"]
    assert paused["termination"] == "ended_by_framework" and paused["evidence"]["interrupted"]
    assert paused["tools_executed"] == 0
    assert thanks["termination"] == "final_answer"
    assert [w.runs() for w in workers] == [[], []]


def refund_of(order_id: str, call_id: str) -> dict[str, Any]:
    """The model's answer asking for one refund, its call id ``call_id``."""
    body = completion(
        None,
        [
            {
                "name": "apply_refund",
                "arguments": json.dumps({"order_id": order_id, "reason": "late"}),
            }
        ],
        usage={"prompt_tokens": 40, "completion_tokens": 10},
    )
    body["choices"][0]["message"]["tool_calls"][0]["id"] = call_id
    return body


def counted_refund(effects: Effects) -> Any:
    """``apply_refund``, counting each run per order in ``effects``."""

    @tool
    def apply_refund(order_id: str, reason: str) -> str:
        """Refund an order."""
        effects.hit(f"apply_refund {order_id}")
        return f"refund created for order {order_id}"

    return apply_refund


def test_http_hitl_turns_served_by_worker_a_then_b_then_a_run_each_refund_once(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str
) -> None:
    """Issue 32: one thread with HumanInTheLoopMiddleware behind one checkpointer and one
    store, its turns served by worker A, B, then A (two deployments, two middleware
    instances).  Each paused invocation's run is recorded when it pauses; the third turn, on
    A, resumes from the thread's tip (B's run, named in the graph state), not from A's own
    earlier run -- each approved refund runs exactly once, and every run's record says what it
    ran."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    server, url = stub
    effects = Effects()
    for body in (
        refund_of("1", "call_r1"),
        refund_of("2", "call_r2"),
        answer("Both refunded."),
        answer("You are welcome."),
    ):
        server.push(body)

    apply_refund = counted_refund(effects)

    saver = InMemorySaver()
    deps = [http_deployment(tmp_path, store_url) for _ in range(2)]
    workers = [LoopwardenMiddleware(d) for d in deps]
    a, b = (
        create_agent(
            chat(url),
            [apply_refund],
            checkpointer=saver,
            middleware=[w, HumanInTheLoopMiddleware(interrupt_on={"apply_refund": True})],
        )
        for w in workers
    )
    config: Any = {"configurable": {"thread_id": "t-aba"}}
    approve = Command(resume={"decisions": [{"type": "approve"}]})
    try:
        assert "__interrupt__" in a.invoke({"messages": [HumanMessage("Refund 1, then 2")]}, config)
        assert "__interrupt__" in b.invoke(approve, config)
        assert effects.counts == {"apply_refund 1": 1}
        third = a.invoke(approve, config)
        b.invoke({"messages": [HumanMessage("Thanks")]}, config)
    finally:
        for d in deps:
            d.close()
    assert effects.counts == {"apply_refund 1": 1, "apply_refund 2": 1}
    assert third["messages"][-1].content == "Both refunded."
    refunds = [m.content for m in third["messages"] if isinstance(m, ToolMessage)]
    assert refunds == ["refund created for order 1", "refund created for order 2"]
    first, on_b, on_a, thanks = records(tmp_path)  # each pause recorded when it happens
    assert first["termination"] == "ended_by_framework" and first["tools_executed"] == 0
    assert first["evidence"]["interrupted"] and on_b["evidence"]["interrupted"]
    assert on_b["termination"] == "ended_by_framework" and on_b["tools_executed"] == 1
    assert on_b["meta"]["resumed_from"] == first["run_id"]
    assert on_a["termination"] == "final_answer" and on_a["tools_executed"] == 1
    assert on_a["meta"]["resumed_from"] == on_b["run_id"]
    assert on_a["run_id"] == third[RESULT_KEY]["run_id"] and on_a["ledger_answers"] == []
    assert thanks["termination"] == "final_answer"
    assert [w.runs() for w in workers] == [[], []]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_http_structured_stop_without_structured_output_raises_a_typed_stop(
    tmp_path: Path, stub: tuple[Stub, str], mode: str
) -> None:
    """Issue 32: with a ToolStrategy ``response_format``, a soft stop's wrap-up answered with
    text (no ``OrderInfo`` call) leaves no structured response: the invocation raises
    ``GuardStopped`` (the stop, its run id, the best-effort text) instead of returning a
    result whose ``structured_response`` is silently None."""
    from langchain.agents.structured_output import ToolStrategy

    from loopwarden.exceptions import GuardStopped

    server, url = stub
    server.route = lambda payload: (
        lookup("1")
        if "query_order" in [t["function"]["name"] for t in payload.get("tools") or ()]
        else answer("Order 1 is lost.")  # the wrap-up: text, although OrderInfo was asked for
    )
    dep = http_deployment(tmp_path)
    agent = create_agent(
        chat(url),
        [query_order],
        middleware=[LoopwardenMiddleware(dep)],
        response_format=ToolStrategy(OrderInfo),
    )
    state = {"messages": [HumanMessage("Where is order 1?")]}
    try:
        with pytest.raises(GuardStopped) as raised:
            agent.invoke(state) if mode == "sync" else asyncio.run(agent.ainvoke(state))
    finally:
        dep.close()
    rec = only_record(tmp_path)
    stop = raised.value
    assert rec["termination"] == "repeat_call" == stop.termination and stop.soft is True
    assert stop.run_id == rec["run_id"] and stop.final_answer == "Order 1 is lost."


def test_http_a_server_tool_call_is_recorded(tmp_path: Path, stub: tuple[Stub, str]) -> None:
    """Issue 32: a provider-side tool (web search through ChatOpenAI's Responses API) runs
    during the model call, over real HTTP: no hook could refuse it, and the record says it
    ran (``evidence.hosted_tools``, from LangChain's ``server_tool_call`` content blocks)."""
    from langchain_openai import ChatOpenAI
    from test_adapter_openai_agents import _responses_body

    server, url = stub
    search = {"type": "search", "query": "order 7"}
    server.push(
        _responses_body(
            [
                {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": search},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Found it.", "annotations": []}],
                },
            ]
        )
    )
    model = ChatOpenAI(
        model="gpt-4o-mini", base_url=url, api_key="sk-test", max_retries=0, use_responses_api=True
    )
    dep = http_deployment(tmp_path)
    agent = create_agent(
        model, [{"type": "web_search_preview"}], middleware=[LoopwardenMiddleware(dep)]
    )
    try:
        out = agent.invoke({"messages": [HumanMessage("Where is order 7?")]})
    finally:
        dep.close()
    assert out[RESULT_KEY]["termination"] == "final_answer"
    rec = only_record(tmp_path)
    assert rec["evidence"]["hosted_tools"] == [{"type": "web_search", "id": "ws_1"}]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_http_hitl_edit_decision_guards_what_executes(
    tmp_path: Path, stub: tuple[Stub, str], store_url: str, mode: str
) -> None:
    """Issue 43 item 1: HumanInTheLoopMiddleware's "edit" decision corrects the proposed
    refund of order 1001 to 2002: the refund runs for 2002, and 2002 is what the guards and
    the side-effect ledger saw -- a later refund of 1001 runs (it never ran), a later refund
    of 2002 is answered from the ledger (it must not run twice)."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    server, url = stub
    effects = Effects()
    for body in (
        refund_of("1001", "call_e1"),
        answer("Refunded 2002."),
        refund_of("1001", "call_e2"),
        answer("Refunded 1001."),
        refund_of("2002", "call_e3"),
        answer("2002 was refunded already."),
    ):
        server.push(body)

    apply_refund = counted_refund(effects)

    dep = http_deployment(tmp_path, store_url)
    reviewed = create_agent(
        chat(url),
        [apply_refund],
        checkpointer=InMemorySaver(),
        middleware=[
            LoopwardenMiddleware(dep),
            HumanInTheLoopMiddleware(interrupt_on={"apply_refund": True}),
        ],
    )
    plain = create_agent(chat(url), [apply_refund], middleware=[LoopwardenMiddleware(dep)])
    config: Any = {"configurable": {"thread_id": "t-edit"}}
    edit = {"name": "apply_refund", "args": {"order_id": "2002", "reason": "late"}}
    resume = Command(resume={"decisions": [{"type": "edit", "edited_action": edit}]})

    async def turns() -> list[Any]:
        out = [await reviewed.ainvoke({"messages": [HumanMessage("Refund 1001")]}, config)]
        out.append(await reviewed.ainvoke(resume, config))
        out.append(await plain.ainvoke({"messages": [HumanMessage("Refund 1001")]}))
        out.append(await plain.ainvoke({"messages": [HumanMessage("Refund 2002")]}))
        return out

    try:
        if mode == "sync":
            paused = reviewed.invoke({"messages": [HumanMessage("Refund 1001")]}, config)
            edited = reviewed.invoke(resume, config)
            later_1001 = plain.invoke({"messages": [HumanMessage("Refund 1001")]})
            later_2002 = plain.invoke({"messages": [HumanMessage("Refund 2002")]})
        else:
            paused, edited, later_1001, later_2002 = asyncio.run(turns())
    finally:
        dep.close()
    assert "__interrupt__" in paused
    assert edited["messages"][-1].content == "Refunded 2002."
    assert effects.counts == {"apply_refund 2002": 1, "apply_refund 1001": 1}
    assert [m.content for m in later_1001["messages"] if isinstance(m, ToolMessage)] == [
        "refund created for order 1001"
    ]
    [ledger] = [m for m in later_2002["messages"] if isinstance(m, ToolMessage)]
    assert "2002" in str(ledger.content)
    # under ainvoke the paused run is recorded off the loop, moments later; the resumed
    # invocation is a run of its own even when it starts before that record is written
    assert wait_for(lambda: len(records(tmp_path)) == 4, 10.0)
    recs = records(tmp_path)
    [pause] = [r for r in recs if r["evidence"].get("interrupted")]
    [resumed] = [r for r in recs if r["meta"].get("resumed_from")]
    assert pause["tools_executed"] == 0 and resumed["tools_executed"] == 1
    assert resumed["meta"]["resumed_from"] == pause["run_id"]
    assert sorted(r["tools_executed"] for r in recs) == [0, 0, 1, 1]
