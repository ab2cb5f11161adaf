"""Agent loops on the official SDKs over the demo shop's tools, for every wire: chat
completions and the Responses API (``openai``), Messages (``anthropic``).  Each takes a
client (pointed at a gateway, or wrapped by ``loopwarden.wrap``) and plays a scenario's agent
until the model answers without calling a tool."""

from __future__ import annotations

import json
from typing import Any

from loopwarden.demo import shop_tools
from support.gateway import scenarios

TOOLS = shop_tools()
CHAT_TOOLS = TOOLS.schemas()
RESPONSES_TOOLS = [{"type": "function", **s["function"]} for s in CHAT_TOOLS]
MESSAGES_TOOLS = [
    {
        "name": s["function"]["name"],
        "description": s["function"]["description"],
        "input_schema": s["function"]["parameters"],
    }
    for s in CHAT_TOOLS
]
SCENARIOS = scenarios()


def run_tool(name: str, args: dict[str, Any]) -> str:
    """The shop's tools, with the scenarios' missing order answered as it scripts it."""
    if name == "query_order" and args.get("order_id") == "99999":
        return "NOT_FOUND: 订单 99999 不存在"
    tool = TOOLS.get(name)
    try:
        return str(tool.func(**args)) if tool is not None else f"ERROR: unknown tool {name}"
    except Exception as exc:
        return f"ERROR: {exc}"


def chat_run(client: Any, name: str) -> tuple[str, dict[str, Any] | None]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS[name].user}]
    for _ in range(40):
        m = (
            client.chat.completions.create(
                model="scenario:" + name, messages=msgs, tools=CHAT_TOOLS
            )
            .choices[0]
            .message
        )
        calls = [tc.model_dump(include={"id", "type", "function"}) for tc in m.tool_calls or ()]
        msgs.append(
            {"role": "assistant", "content": m.content, **({"tool_calls": calls} if calls else {})}
        )
        if not calls:
            return m.content or "", None
        for tc in calls:
            fn = tc["function"]
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": tc["id"],
                    "content": run_tool(fn["name"], json.loads(fn["arguments"])),
                }
            )
    raise AssertionError("not stopped")


def responses_run(client: Any, name: str, *, stream: bool) -> tuple[str, str | None]:
    """An agent on the Responses API, continuing by previous_response_id; returns the last
    answer's text and the stop header (None when streamed: headers leave first)."""
    prev: str | None = None
    given: Any = SCENARIOS[name].user
    for _ in range(40):
        header = None
        if stream:
            with client.responses.stream(
                model="scenario:" + name,
                input=given,
                tools=RESPONSES_TOOLS,
                previous_response_id=prev,
            ) as s:
                for _event in s:
                    pass
                r = s.get_final_response()
        else:
            raw = client.responses.with_raw_response.create(
                model="scenario:" + name,
                input=given,
                tools=RESPONSES_TOOLS,
                previous_response_id=prev,
            )
            header = raw.headers.get("x-loopwarden-stop")
            r = raw.parse()
        calls = [it for it in r.output if it.type == "function_call"]
        if not calls:
            assert r.status == "completed"
            return r.output_text, header
        prev = r.id
        given = [
            {
                "type": "function_call_output",
                "call_id": c.call_id,
                "output": run_tool(c.name, json.loads(c.arguments)),
            }
            for c in calls
        ]
    raise AssertionError("not stopped")


def messages_run(client: Any, name: str, *, stream: bool) -> tuple[str, str | None]:
    """An agent on Anthropic Messages; returns the last answer's text and the stop header."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": SCENARIOS[name].user}]
    for _ in range(40):
        header = None
        if stream:
            with client.messages.stream(
                model="scenario:" + name, max_tokens=1024, messages=msgs, tools=MESSAGES_TOOLS
            ) as s:
                for _event in s:
                    pass
                m = s.get_final_message()
        else:
            raw = client.messages.with_raw_response.create(
                model="scenario:" + name, max_tokens=1024, messages=msgs, tools=MESSAGES_TOOLS
            )
            header = raw.headers.get("x-loopwarden-stop")
            m = raw.parse()
        msgs.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        )
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            assert m.stop_reason == "end_turn"
            return "".join(b.text for b in m.content if b.type == "text"), header
        msgs.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": b.id,
                        "content": run_tool(b.name, dict(b.input)),
                    }
                    for b in uses
                ],
            }
        )
    raise AssertionError("not stopped")
