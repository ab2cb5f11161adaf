"""``loopwarden gateway demo``: the built-in scenarios through a real gateway, offline.

Each scenario's model is a scripted upstream speaking chat completions over HTTP
(:mod:`loopwarden.gateway.scripted`); a ``loopwarden gateway`` (the same ASGI application,
under uvicorn on a free local port) stands in front of it; and the agent is a plain loop over
the real ``openai`` client that runs the demo shop's tools itself -- no loopwarden code in
it.  The guarded column is what the gateway's records say of each run; the unguarded column
is ``loopwarden demo``'s own baseline (the scenario played in process under the step cap).
The table and the exit code are ``loopwarden demo``'s.

A gateway sees requests, not tool execution: a scenario whose guard needs the tool's own
clock (``slow-tool``: a call abandoned at its deadline) is left out, with a note
(docs/gateway.md, "What a gateway cannot see").
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

#: scenarios whose guard acts inside tool execution, out of a gateway's sight
IN_PROCESS_ONLY = ("slow-tool",)
#: the agent loop's own cap (as the unguarded baseline's)
AGENT_CAP = 60


@contextlib.contextmanager
def _serve(app: Any, lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan=lifespan)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the demo's local server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


class _Switch:
    """One server, the current scenario's gateway application behind it; the applications
    it served are closed on the server's loop (their upstream sessions live there)."""

    def __init__(self) -> None:
        self.app: Any = None
        self.served: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for app in self.served:
                        await app.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if self.app not in self.served:
            self.served.append(self.app)
        await self.app(scope, receive, send)


def _agent(
    client: Any,
    model: str,
    user: str,
    system: str | None,
    tools: Any,
    stream: bool,
    profile: str | None = None,
) -> str:
    """A plain agent loop over the openai client: the run id of its last answer."""
    from loopwarden.clock import CancelToken, FakeClock
    from loopwarden.tools import ToolContext

    msgs: list[dict[str, Any]] = []
    if system:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": user})
    schemas = tools.schemas()
    headers = {"x-loopwarden-profile": profile} if profile else {}
    run_id = ""
    clock = FakeClock()
    for _ in range(AGENT_CAP):
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=model, messages=msgs, tools=schemas, stream=True, extra_headers=headers
            ) as raw:
                run_id = raw.headers.get("x-loopwarden-run", run_id)
                text = ""
                calls: dict[int, dict[str, str]] = {}
                for line in raw.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for ch in chunk.get("choices") or ():
                        d = ch.get("delta") or {}
                        text += d.get("content") or ""
                        for tc in d.get("tool_calls") or ():
                            c = calls.setdefault(tc["index"], {"id": "", "name": "", "args": ""})
                            c["id"] = tc.get("id") or c["id"]
                            fn = tc.get("function") or {}
                            c["name"] += fn.get("name") or ""
                            c["args"] += fn.get("arguments") or ""
            tcs: list[dict[str, Any]] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in calls.values()
            ]
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=msgs, tools=schemas, extra_headers=headers
            )
            run_id = raw.headers.get("x-loopwarden-run", run_id)
            m = raw.parse().choices[0].message
            text = m.content or ""
            tcs = [tc.model_dump(include={"id", "type", "function"}) for tc in m.tool_calls or ()]
        msgs.append(
            {"role": "assistant", "content": text or None, **({"tool_calls": tcs} if tcs else {})}
        )
        if not tcs:
            return str(run_id)
        for tc in tcs:
            name = tc["function"]["name"]
            tool = tools.get(name)
            try:
                args = json.loads(tc["function"]["arguments"] or "{}")
                if tool is None:
                    out: Any = f"ERROR: unknown tool {name}"
                else:
                    if tool.context_param:
                        args[tool.context_param] = ToolContext("demo", clock, CancelToken())
                    out = tool.func(**args)
            except Exception as exc:  # the agent reports a failing tool to its model
                out = f"ERROR: {type(exc).__name__}: {exc}"
            content = (
                out if isinstance(out, str) else json.dumps(out, ensure_ascii=False, default=str)
            )
            msgs.append({"role": "tool", "tool_call_id": tc["id"], "content": content})
    return run_id


def main(config_path: str | None, *, stream: bool = False) -> int:
    import openai

    from loopwarden import signals
    from loopwarden.commands.demotable import render_legend_plain, render_plain, summary_lines
    from loopwarden.config import load_config
    from loopwarden.demo import UNGUARDED_CAP, Shop, Totals, find_scenarios, with_shop_prompt
    from loopwarden.demo.runner import (
        Pair,
        Pricer,
        fresh_store,
        judge,
        play,
        stop_step,
        unguarded_deployment,
    )
    from loopwarden.deployment import Deployment, scripted_tools
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.scripted import ScriptedUpstream
    from loopwarden.gateway.state import MemoryState
    from loopwarden.models.scenario import load_scenario
    from loopwarden.traffic.offline import without_observers

    config = with_shop_prompt(load_config(config_path))
    config, _ = without_observers(config)
    config = _declare_shop_tools(config)
    scenarios = [load_scenario(p) for p in find_scenarios()]
    left_out = [sc.name for sc in scenarios if sc.name in IN_PROCESS_ONLY]
    scenarios = [sc for sc in scenarios if sc.name not in IN_PROCESS_ONLY]
    prefix = config.run.warning_prefix
    switch = _Switch()
    pairs: list[Pair] = []
    with (
        Deployment(config) as dep,
        unguarded_deployment(config, UNGUARDED_CAP) as bare,
        tempfile.TemporaryDirectory(prefix="loopwarden-gateway-demo-") as tmp,
        _serve(ScriptedUpstream({sc.name: sc for sc in scenarios}, prefix=prefix)) as upstream,
        _serve(switch, lifespan="on") as gateway,
    ):
        runs: dict[str, Any] = {}

        def keep(sender: Any, **_: Any) -> None:
            runs[sender.run_id] = sender

        dep.connect(signals.run_stopped, keep)
        pricer = Pricer(dep)
        client = openai.OpenAI(base_url=gateway + "/v1", api_key="demo-key", max_retries=0)
        for i, sc in enumerate(scenarios):
            db = Path(tmp) / f"{i:03d}-{sc.name}.sqlite3"
            with fresh_store(dep, db.with_suffix(".store")) as shared:
                dep.shared = shared
                switch.app = GatewayApp(dep, upstream + "/v1", MemoryState())
                shop = Shop(db, now=_ticking(), durable=False)
                tools = scripted_tools(shop.tools(), sc)
                run_id = _agent(
                    client,
                    "scenario:" + sc.name,
                    sc.user,
                    config.run.system_prompt,
                    tools,
                    stream,
                    sc.profile,
                )
                run = runs.get(run_id)
                if run is None:
                    print(
                        f"loopwarden gateway demo: {sc.name}: no record of run {run_id!r}",
                        file=sys.stderr,
                    )
                    return 1
                rec = run.record()
                step, hook = stop_step(run)
                rec.update(
                    guarded=True,
                    refund_rows=len(shop.refunds()),
                    stop_step=step,
                    stop_hook=hook,
                    first_warning_step=rec["warnings"][0]["step"] if rec["warnings"] else None,
                    expect=sc.expect.model_dump(exclude_none=True),
                )
                priced = pricer.cost(run.model_name, run.usage.prompt, run.usage.completion)
                rec["priced_cost"] = None if priced is None else float(priced)
            _, base = play(
                bare, sc, Path(tmp) / f"{i:03d}-bare.sqlite3", pricer=pricer, guarded=False
            )
            ok, why = judge(sc, rec)
            rec["ok"] = ok
            pairs.append(Pair(sc, rec, base, ok, why))
    totals = Totals.of(pairs)
    currency = next(
        (p.guarded.get("cost_currency") for p in pairs if p.guarded.get("cost_currency")), None
    )
    print(render_plain(pairs, totals, currency, UNGUARDED_CAP))
    print()
    print(render_legend_plain(pairs, UNGUARDED_CAP))
    print()
    print("\n".join(summary_lines(pairs, totals, currency)))
    how = "streamed" if stream else "JSON"
    print(f"played by the openai client over HTTP through loopwarden gateway ({how})")
    print(
        "left out (guarded inside tool execution, out of a gateway's sight): "
        + (", ".join(left_out) or "none")
    )
    failed = [p for p in pairs if p.ok is False]
    for p in failed:
        print(f"loopwarden gateway demo: {p.name}: {p.why}", file=sys.stderr)
    return 1 if failed else 0


def _ticking() -> Any:
    from loopwarden.demo.runner import TickingNow

    return TickingNow()


def _declare_shop_tools(config: Any) -> Any:
    """The shop's tool natures as ``[tools.<name>]`` tables: a gateway knows a tool only by
    its name in the request, so a deployment declares what its agents' tools are (what
    ``loopwarden demo``'s in-process shop declares in code)."""
    import tempfile as _tf

    from loopwarden.config import ToolNature
    from loopwarden.demo import Shop

    with _tf.TemporaryDirectory() as tmp:
        tools = Shop(Path(tmp) / "shop.sqlite3", durable=False).tools()
        tables = dict(config.tools)
        for t in tools:
            if t.name in tables:
                continue
            tables[t.name] = ToolNature(
                read_only=t.read_only,
                deterministic=t.deterministic,
                side_effect=t.side_effect,
                terminal=t.terminal,
                idempotency_keys=list(t.idempotency_keys)
                if t.side_effect and t.idempotency_keys is not None
                else None,
            )
    return config.model_copy(update={"tools": tables})
