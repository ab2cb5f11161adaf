"""circuit_breaker: fleet-wide breakers per tool, on a real SQLite file and a real redis-server.

Every test that takes ``store_url`` runs once per store.  Time is the store's clock
(``store.now``), moved by the tests; the two-process test runs ``loopwarden run`` twice as
real subprocesses against one store and waits for a real ``open_s``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from support.stores import deployment_for, make_store, split_url, store_table, write_scenario

from loopwarden import Deployment, ToolError, signals
from loopwarden.config import ConfigError
from loopwarden.plugins.circuit_breaker import CircuitBreakerSettings, transient
from loopwarden.store import BreakerRule, BreakerView, open_store
from loopwarden.tools import ToolContext, tool

TOOL = ("deployment", "*", "tool", "query_logistics")

#: one call of query_logistics, then the answer: a run after the upstream recovered
RECOVERED = """
name = "recovered"
user = "运单 SF1234567890 现在到哪了？"
[model]
turns = [
  { content = "我查一下。", tool_calls = [
      { name = "query_logistics", arguments = { tracking_no = "SF1234567890" } } ] },
  { content = "查到了。" },
]
then = "final"
final_text = "查到了。"
"""

#: a semantic error, again and again: the caller's mistake, not the dependency's
NOT_FOUND = """
name = "not-found"
user = "运单 SF0000000000 到哪了？"
[model]
turns = [
  { content = "查一下。", tool_calls = [
      { name = "query_logistics", arguments = { tracking_no = "SF0000000000" } } ] },
]
then = "repeat_last"
final_text = "没有这个运单。"
[tools.query_logistics]
error = "NOT_FOUND: 运单 SF0000000000 不存在"
"""


class Clock:
    """The store's wall clock, moved by hand."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def breaker(store_url: str, **settings: Any) -> dict[str, Any]:
    """The plugin's table: the defaults a test needs, plus ``settings``."""
    return {"circuit_breaker": {"failures": 3, "failure_ratio": None, **settings}}


@pytest.fixture
def clocked() -> Iterator[Callable[..., tuple[Deployment, Clock]]]:
    """A deployment with circuit_breaker (and max_steps) on a store, its clock in hand."""
    made: list[Deployment] = []

    def make(
        store_url: str,
        *,
        enabled: tuple[str, ...] = ("circuit_breaker",),
        steps: int = 20,
        tables: dict[str, Any] | None = None,
        **settings: Any,
    ) -> tuple[Deployment, Clock]:
        plugins = {
            **breaker(store_url, **settings),
            "max_steps": {"max_steps": steps, "warn_remaining": 0},
            **(tables or {}),
        }
        dep = deployment_for(store_url, plugins=plugins, enabled=enabled)
        clock = Clock()
        dep.shared.store.now = clock  # type: ignore[attr-defined]
        made.append(dep)
        return dep, clock

    yield make
    for dep in made:
        dep.close()


def tool_messages(run: Any) -> list[str]:
    return [m["content"] for m in run.messages if m["role"] == "tool"]


# -- the store: one atomic document per breaker -------------------------------------------


def test_the_store_opens_at_the_threshold_and_lets_exactly_one_probe_through(
    store_url: str,
) -> None:
    store = make_store(store_url)
    clock = Clock()
    store.now = clock  # type: ignore[attr-defined]
    rule = BreakerRule(failures=3, failure_ratio=None, min_sources=1, open_s=30.0)
    try:
        seen = [
            store.breaker_record(TOOL, rule, f"r{i}/c", failed=True, source="*", error="timeout")
            for i in range(3)
        ]
        assert [v.changed for v in seen] == [None, None, "opened"]
        assert seen[-1].tripped == {
            "rule": "failures",
            "failures": 3,
            "calls": 3,
            "window_s": 60.0,
            "sources": 1,
            "error": "timeout",
        }
        assert not store.breaker_admit(TOOL, rule, "r9/c").allows
        clock.t += 29.9
        assert not store.breaker_admit(TOOL, rule, "r9/c").allows  # open_s not over
        clock.t += 0.2
        admits = [store.breaker_admit(TOOL, rule, f"p{i}/c") for i in range(5)]
        assert [a.probe for a in admits] == [True, False, False, False, False]
        assert admits[0].changed == "half_open" and all(a.state == "half_open" for a in admits)
        # a call admitted before the breaker opened reports late: no evidence either way
        late = store.breaker_record(TOOL, rule, "r0/c", failed=False, source="*")
        assert late.state == "half_open" and late.changed is None
        closed = store.breaker_record(TOOL, rule, "p0/c", failed=False, source="*")
        assert closed.changed == "closed" and closed.state == "closed"
        assert store.breaker_admit(TOOL, rule, "r10/c").allows
        assert [(b.name, b.state, b.opens) for b in store.breakers()] == [
            ("query_logistics", "closed", 1)
        ]
    finally:
        store.close()


def test_a_failed_probe_opens_it_again_and_a_lost_probe_is_replaced(store_url: str) -> None:
    store = make_store(store_url)
    clock = Clock()
    store.now = clock  # type: ignore[attr-defined]
    rule = BreakerRule(failures=1, failure_ratio=None, open_s=10.0, probe_timeout_s=5.0)
    try:
        store.breaker_record(TOOL, rule, "a/c", failed=True, source="*", error="timeout")
        clock.t += 10
        assert store.breaker_admit(TOOL, rule, "probe1/c").probe
        clock.t += 5  # the probe's process died: after probe_timeout_s another caller probes
        assert store.breaker_admit(TOOL, rule, "probe2/c").probe
        again = store.breaker_record(TOOL, rule, "probe2/c", failed=True, source="*")
        assert again.changed == "reopened" and again.since == clock.t
        assert not store.breaker_admit(TOOL, rule, "b/c").allows  # open_s from now
        clock.t += 10
        assert store.breaker_admit(TOOL, rule, "c/c").probe
    finally:
        store.close()


def test_the_window_slides_and_the_ratio_rule_needs_its_minimum_of_calls(store_url: str) -> None:
    store = make_store(store_url)
    clock = Clock()
    store.now = clock  # type: ignore[attr-defined]
    by_count = BreakerRule(window_s=60.0, failures=3, failure_ratio=None)
    by_ratio = BreakerRule(failures=None, failure_ratio=0.5, min_calls=4)
    other = ("deployment", "*", "tool", "search_knowledge")
    try:
        store.breaker_record(TOOL, by_count, "a", failed=True, source="*")
        store.breaker_record(TOOL, by_count, "b", failed=True, source="*")
        clock.t += 30
        v = store.breaker_record(TOOL, by_count, "b2", failed=False, source="*")
        assert (v.state, v.failures, v.calls) == ("closed", 2, 3)  # a success: no failure
        clock.t += 37  # both fell out of the window (and its last, partly covered tenth)
        v = store.breaker_record(TOOL, by_count, "c", failed=True, source="*")
        assert (v.state, v.failures) == ("closed", 1)
        outcomes = [True, True, False]  # 2 of 3: over the ratio, under min_calls
        for i, failed in enumerate(outcomes):
            v = store.breaker_record(other, by_ratio, f"r{i}", failed=failed, source="*")
        assert v.state == "closed" and v.calls == 3
        v = store.breaker_record(other, by_ratio, "r3", failed=True, source="*")
        assert v.changed == "opened" and v.tripped is not None
        assert v.tripped["rule"] == "failure_ratio" and v.tripped["calls"] == 4
    finally:
        store.close()


def test_concurrent_writers_count_every_failure_and_open_it_once(store_url: str) -> None:
    """Eight threads, each with its own connection, record 25 failures each at once: the
    document's read-modify-write is atomic, so nothing is lost and one writer opens it."""
    rule = BreakerRule(failures=150, failure_ratio=None)
    stores = [make_store(store_url) for _ in range(8)]
    changes: list[str | None] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def work(i: int) -> None:
        start.wait()
        for j in range(25):
            v = stores[i].breaker_record(TOOL, rule, f"w{i}/{j}", failed=True, source="*")
            with lock:
                changes.append(v.changed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert changes.count("opened") == 1
        (b,) = stores[0].breakers()
        assert b.state == "open" and b.tripped is not None and b.tripped["failures"] == 150
    finally:
        for s in stores:
            s.close()


def test_of_many_callers_at_once_exactly_one_gets_the_probe(store_url: str) -> None:
    rule = BreakerRule(failures=1, failure_ratio=None, open_s=30.0)
    stores = [make_store(store_url) for _ in range(8)]
    clock = Clock()
    for s in stores:
        s.now = clock  # type: ignore[attr-defined]
    stores[0].breaker_record(TOOL, rule, "a/c", failed=True, source="*", error="timeout")
    clock.t += 30.0
    views: list[BreakerView] = []
    lock = threading.Lock()
    start = threading.Barrier(len(stores))

    def admit(i: int) -> None:
        start.wait()
        for j in range(5):
            v = stores[i].breaker_admit(TOOL, rule, f"c{i}/{j}")
            with lock:
                views.append(v)

    threads = [threading.Thread(target=admit, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(views) == 40
        assert sum(v.probe for v in views) == 1
        assert [v.changed for v in views].count("half_open") == 1
    finally:
        for s in stores:
            s.close()


# -- the plugin, through a deployment -------------------------------------------------------


def test_an_outage_opens_the_breaker_and_the_next_run_is_skipped_from_its_first_call(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]], tmp_path: Path
) -> None:
    dep, clock = clocked(store_url, open_s=30.0)
    first = dep.run(scenario="outage").record()
    # three timeouts open it; the run's own fourth call is already skipped
    assert first["tools_executed"] == 3
    changes = first["circuit_breaker"]["changes"]
    assert [(c["change"], c["breaker"], c["count"]) for c in changes] == [("opened", "tool", 3)]
    second = dep.run(scenario="outage")
    rec = second.record()
    assert rec["tools_executed"] == 0  # skipped from its first call
    assert rec["termination"] == "circuit_open" and rec["soft"] is True
    assert rec["stopped_by"] == "circuit_breaker"
    ev = rec["evidence"]
    assert ev["tool"] == "query_logistics" and ev["state"] == "open" and ev["count"] == 3
    assert ev["scope"] == "deployment" and ev["threshold"] == 3 and ev["rule"] == "failures"
    skipped = rec["circuit_breaker"]["skipped"]
    assert skipped[0]["step"] == 1 and skipped[0]["tool"] == "query_logistics"
    first_observation = tool_messages(second)[0]
    assert first_observation.startswith("query_logistics is unavailable since ")
    assert "for all users (3 failures in 60 s); do not retry it" in first_observation
    assert [v["kind"] for v in rec["verdicts"]] == ["skip", "stop"]

    # after open_s the upstream is back: one probe goes through and closes it
    clock.t += 30.0
    recovered = dep.run(scenario=str(write_scenario(tmp_path, RECOVERED, "recovered")))
    rec = recovered.record()
    assert rec["termination"] == "final_answer" and rec["tools_executed"] == 1
    assert "已签收" in tool_messages(recovered)[0]  # the real logistics answer
    assert [c["change"] for c in rec["circuit_breaker"]["changes"]] == ["half_open", "closed"]
    (b,) = dep.shared.store.breakers()
    assert b.state == "closed" and b.opens == 1


def test_semantic_errors_never_count(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]], tmp_path: Path
) -> None:
    dep, _ = clocked(store_url, steps=6, failures=2, failure_ratio=0.1, min_calls=2, max_skips=None)
    path = write_scenario(tmp_path, NOT_FOUND, "not-found")
    for _ in range(3):
        run = dep.run(scenario=str(path))
        assert run.record()["tools_executed"] == 5  # every call ran: never skipped
        assert "circuit_breaker" not in run.record()
    assert all(b.state == "closed" and b.failures == 0 for b in dep.shared.store.breakers())


def test_what_counts_as_transient() -> None:
    from loopwarden import ToolResult

    assert transient(ToolResult("t", ok=False, error="timeout"))
    # an MCP server that died mid-call: in doubt, not retryable (a side effect), transient
    assert transient(ToolResult("Connection closed", ok=False, error="unknown_outcome"))
    assert transient(ToolResult("503", ok=False, error="tool_error", retryable=True))
    assert transient(ToolResult("reset", ok=False, error="exception", retryable=True))
    # retried by the runtime, its flag cleared since by retry_policy (a spent budget)
    assert transient(ToolResult("503", ok=False, error="tool_error", attempts=3))
    assert not transient(ToolResult("NOT_FOUND", ok=False, error="tool_error"))
    assert not transient(ToolResult("bad", ok=False, error="invalid_arguments"))
    assert not transient(ToolResult("c", ok=False, error="cancelled", retryable=True))
    assert not transient(ToolResult("skip", ok=False, skipped=True, retryable=True))
    assert not transient(ToolResult("ok"))


def test_a_tenants_breaker_pauses_only_that_tenant(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]]
) -> None:
    dep, _ = clocked(store_url, scope=["tenant"])
    first = dep.run(scenario="outage", meta={"tenant": "acme"}).record()
    assert first["circuit_breaker"]["changes"][0]["key"] == "acme"
    acme = dep.run(scenario="outage", meta={"tenant": "acme"}).record()
    assert acme["tools_executed"] == 0 and acme["termination"] == "circuit_open"
    assert acme["evidence"]["scope"] == "tenant" and acme["evidence"]["key"] == "acme"
    other = dep.run(scenario="outage", meta={"tenant": "globex"}).record()
    assert other["tools_executed"] == 3  # its own breaker: opened by its own failures
    untenanted = dep.run(scenario="outage").record()  # no tenant: no breaker covers it
    assert untenanted["tools_executed"] > 3 and "circuit_breaker" not in untenanted
    skipped = dep.run(scenario="outage", meta={"tenant": "acme"})
    assert "for this tenant (3 failures in 60 s)" in tool_messages(skipped)[0]
    states = {(b.scope, b.scope_key): b.state for b in dep.shared.store.breakers()}
    assert states == {("tenant", "acme"): "open", ("tenant", "globex"): "open"}


def test_one_tenants_failures_never_open_a_breaker_shared_with_others(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]]
) -> None:
    dep, _ = clocked(store_url, steps=5, min_sources=2, max_skips=None)
    for _ in range(3):
        rec = dep.run(scenario="outage", meta={"tenant": "acme"}).record()
        assert rec["tools_executed"] == 4  # acme's own input: never paused for anyone
    (b,) = dep.shared.store.breakers()
    assert b.state == "closed" and b.failures == 12
    rec = dep.run(scenario="outage", meta={"tenant": "globex"}).record()
    assert [c["change"] for c in rec["circuit_breaker"]["changes"]] == ["opened"]
    assert rec["tools_executed"] == 1  # a second tenant fails too: an outage
    assert dep.run(scenario="outage", meta={"tenant": "initech"}).record()["tools_executed"] == 0


def test_shadow_mode_records_what_it_would_have_skipped_and_runs_the_calls(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]]
) -> None:
    dep, _ = clocked(store_url, steps=4, shadow=True)
    dep.run(scenario="outage")
    rec = dep.run(scenario="outage").record()
    assert rec["tools_executed"] == 3  # every call ran (max_steps ended it)
    assert rec["termination"] == "max_steps"
    shadowed = [v for v in rec["verdicts"] if v["plugin"] == "circuit_breaker"]
    assert shadowed and all(v.get("shadow") for v in shadowed)
    assert shadowed[0]["kind"] == "skip" and shadowed[0]["step"] == 1
    assert rec["shadow_stop"]["reason"] == "circuit_open"
    assert rec["circuit_breaker"]["skipped"][0]["state"] == "open"
    assert not any("unavailable" in m for m in tool_messages(dep.run(scenario="outage")))


def test_a_store_that_times_out_mid_run_never_pauses_a_tool(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]]
) -> None:
    """The store fails once the breaker is open (the answer of an admit lost): the run's
    calls go on running, the failure is noted, and the next runs are skipped again once the
    store answers."""
    from loopwarden.testing.faults import FlakyStore, install_store

    dep, _ = clocked(store_url, steps=5)
    dep.run(scenario="outage")  # opens it
    flaky = install_store(
        dep, lambda s: FlakyStore(s, every=1, first=1, mode="after", methods=("breaker_admit",))
    )
    rec = dep.run(scenario="outage").record()
    assert rec["tools_executed"] == 4 and rec["termination"] == "max_steps"
    assert [e["hook"] for e in rec["errors"]] == ["asking a circuit breaker"]
    assert flaky.failed == [("breaker_admit", "after")]  # one try; the run stopped asking
    flaky.methods = ()
    assert dep.run(scenario="outage").record()["tools_executed"] == 0


@pytest.fixture(params=["sqlite", "redis"])
def broken_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL that cannot be opened: SQLite under a file, Redis on a dead port."""
    if request.param == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        return f"sqlite:///{blocker / 'store.sqlite3'}"
    pytest.importorskip("redis")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"  # nothing listens there


def test_a_store_that_is_down_never_pauses_a_tool(broken_url: str) -> None:
    dep = deployment_for(
        broken_url,
        plugins={**breaker(broken_url), "max_steps": {"max_steps": 5, "warn_remaining": 0}},
        enabled=("circuit_breaker",),
        store={"on_store_error": "fail_closed"},  # the breaker fails open all the same
    )
    try:
        for _ in range(2):
            rec = dep.run(scenario="outage").record()
            assert rec["tools_executed"] == 4 and rec["termination"] == "max_steps"
            (err,) = rec["errors"]
            assert err["plugin"] == "circuit_breaker" and err["on_store_error"] == "fail_open"
    finally:
        dep.close()


def test_an_mcp_server_breaker_pauses_all_of_its_tools(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]]
) -> None:
    calls: list[str] = []

    @tool(read_only=True)
    def flights(city: str) -> str:
        """Search flights."""
        calls.append("flights")
        raise ToolError("503 Service Unavailable", retryable=True)

    @tool(read_only=True)
    def hotels(city: str) -> str:
        """Search hotels."""
        calls.append("hotels")
        return "ok"

    import dataclasses

    served = [dataclasses.replace(t, server="travel") for t in (flights, hotels)]
    table = breaker(store_url)
    dep = deployment_for(store_url, plugins=table, enabled=("circuit_breaker",), tools=served)
    try:
        sc = {
            "name": "travel",
            "user": "trip",
            "model": {
                "turns": [
                    {"tool_calls": [{"name": "flights", "arguments": {"city": c}}]}
                    for c in ("a", "b", "c")
                ]
                + [{"tool_calls": [{"name": "hotels", "arguments": {"city": "a"}}]}],
                "then": "final",
                "final_text": "done",
            },
        }
        from loopwarden.models.scenario import Scenario

        rec = dep.run(scenario=Scenario.model_validate(sc)).record()
        assert calls == ["flights"] * 3  # hotels: the server is paused, so are its tools
        opened = {c["breaker"] for c in rec["circuit_breaker"]["changes"]}
        assert opened == {"tool", "server"}
        assert rec["circuit_breaker"]["skipped"][0]["breaker"] in ("tool", "server")
        assert rec["circuit_breaker"]["skipped"][0]["tool"] == "hotels"
    finally:
        dep.close()


def test_a_side_effect_the_ledger_answers_is_no_probe_outcome(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]], tmp_path: Path
) -> None:
    """A refund timed out (may have taken effect): the ledger answers its next call without
    running it, so that call's "outcome" says nothing about the upstream -- a probe it was
    given stays open instead of closing the breaker."""
    import time as _time

    runs: list[str] = []

    @tool(side_effect=True, idempotency_keys=("invoice",), timeout_s=0.2)
    def pay_invoice(invoice: str) -> str:
        """Pay an invoice (a side effect)."""
        runs.append(invoice)
        _time.sleep(1.0)
        return f"PAID {invoice}"

    dep = deployment_for(
        store_url,
        plugins={**breaker(store_url, failures=1, open_s=30.0)},
        enabled=("circuit_breaker",),
        tools=[pay_invoice],
    )
    clock = Clock()
    dep.shared.store.now = clock  # type: ignore[attr-defined]
    pay = write_scenario(tmp_path)
    try:
        first = dep.run(scenario=str(pay)).record()
        assert [c["change"] for c in first["circuit_breaker"]["changes"]] == ["opened"]
        clock.t += 30.0
        second = dep.run(scenario=str(pay))
        assert runs == ["7"]  # answered by the ledger ("may have taken effect"), not run
        assert second.record()["ledger_answers"][0]["state"] == "unknown"
        assert [c["change"] for c in second.record()["circuit_breaker"]["changes"]] == ["half_open"]
        (b,) = dep.shared.store.breakers()
        assert b.state == "half_open"  # not closed by a call that never ran
    finally:
        dep.close()


def test_a_probe_the_run_cancels_neither_closes_nor_reopens_the_breaker(
    store_url: str, clocked: Callable[..., tuple[Deployment, Clock]], tmp_path: Path
) -> None:
    @tool(read_only=True)
    def query_logistics(tracking_no: str, ctx: ToolContext) -> str:
        """Where a parcel is (the user cancels the run while it runs)."""
        ctx.cancel.cancel("user left")
        raise ConnectionError("aborted")

    dep = deployment_for(
        store_url,
        plugins=breaker(store_url, failures=1, open_s=30.0),
        enabled=("circuit_breaker",),
        tools=[query_logistics],
    )
    clock = Clock()
    dep.shared.store.now = clock  # type: ignore[attr-defined]
    store = dep.shared.store
    try:
        rule = dep.plugins.get("circuit_breaker").rule  # type: ignore[union-attr]
        store.breaker_record(TOOL, rule, "elsewhere/c", failed=True, source="*", error="timeout")
        clock.t += 30.0
        rec = dep.run(scenario=str(write_scenario(tmp_path, RECOVERED, "recovered"))).record()
        assert rec["termination"] == "cancelled"
        assert [c["change"] for c in rec["circuit_breaker"]["changes"]] == ["half_open"]
        (b,) = store.breakers()
        assert b.state == "half_open" and b.opens == 1  # the probe's lease runs out instead
    finally:
        dep.close()


# -- observability ----------------------------------------------------------------------


def test_opening_and_closing_log_alert_count_and_signal(
    store_url: str,
    clocked: Callable[..., tuple[Deployment, Clock]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dep, clock = clocked(
        store_url,
        enabled=("circuit_breaker", "metrics", "alerting"),
        tables={"alerting": {"sinks": [{"type": "log", "min_severity": "warn"}]}},
    )
    seen: list[tuple[str | None, str]] = []

    def on_change(run: Any, *, breaker: BreakerView, message: str, **_: Any) -> None:
        seen.append((breaker.changed, message))

    metrics = dep.plugins.get("metrics")
    alerting = dep.plugins.get("alerting")
    assert metrics is not None and alerting is not None
    with signals.breaker_changed.connected_to(on_change), caplog.at_level("INFO"):
        dep.run(scenario="outage")
        gauge = metrics.value("circuit_breakers_open", target="tool", breaker="query_logistics")
        assert gauge == 1.0
        clock.t += 30.0
        dep.run(scenario=str(write_scenario(tmp_path, RECOVERED, "recovered")))
    assert [c for c, _ in seen] == ["opened", "half_open", "closed"]
    assert metrics.value("circuit_breakers_open", target="tool", breaker="query_logistics") == 0
    alerts = [
        (a["kind"], a["reason"], a["severity"]) for a in alerting.sent if a["kind"] != "verdict"
    ]
    assert alerts == [("breaker", "breaker_opened", "warn"), ("breaker", "breaker_closed", "warn")]
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.name == "loopwarden.plugins.circuit_breaker" and r.levelname == "WARNING"
    ]
    assert len(logged) == 2
    assert logged[0].startswith("circuit breaker tool query_logistics (deployment-wide) opened")
    assert "closed: the probe call succeeded" in logged[1]


def test_loopwarden_breakers_lists_and_resets(
    store_url: str,
    clocked: Callable[..., tuple[Deployment, Clock]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from loopwarden.commands.cli import main as cli_main

    dep, _ = clocked(store_url)
    dep.run(scenario="outage")
    base, ns = split_url(store_url)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(
        f'[store]\nurl = "{base}"\nnamespace = "{ns}"\n'
        '[plugins]\nenabled = ["max_steps", "circuit_breaker"]\n',
        encoding="utf-8",
    )
    assert cli_main(["breakers", "--config", str(cfg), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["breakers"]
    assert (row["name"], row["state"], row["tripped"]["failures"]) == ("query_logistics", "open", 3)
    assert cli_main(["breakers", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert "query_logistics  deployment  *    open" in text
    assert cli_main(["breakers", "reset", "query_logistics", "--config", str(cfg)]) == 0
    assert "done" in capsys.readouterr().out
    assert dep.run(scenario="outage").record()["tools_executed"] > 0


# -- settings -------------------------------------------------------------------------------


def test_settings_are_validated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    for table, problem in (
        ({"failures": None, "failure_ratio": None}, "set failures or failure_ratio"),
        ({"observation": "{tool} down for {tenant}"}, "observation"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"scope": ["tenant", "tenant"]}, "distinct"),
        ({"open_s": 0}, "open_s"),
    ):
        with pytest.raises(ConfigError, match=problem):
            deployment_for(url, plugins={"circuit_breaker": table}, enabled=("circuit_breaker",))
    s = CircuitBreakerSettings()
    assert (s.failures, s.failure_ratio, s.min_sources, s.open_s, s.scope) == (5, 0.5, 2, 30.0, [])


# -- two processes, one store: the "done when" ---------------------------------------


def _cli(config: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(config.parent)}
    out = subprocess.run(
        [sys.executable, "-m", "loopwarden", "run", "--config", str(config), "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.stdout, out.stderr
    record: dict[str, Any] = json.loads(out.stdout)
    return record


#: the breaker's open_s in the two-process test, in real seconds
OPEN_S = 6.0


@pytest.mark.slow
def test_two_processes_share_the_breaker(store_url: str, tmp_path: Path) -> None:
    base, ns = split_url(store_url)
    cfg = tmp_path / "cfg.toml"
    store = store_table(store_url)
    cfg.write_text(
        '[model]\nprovider = "scripted"\n'
        f'[store]\nurl = "{store["url"]}"\nnamespace = "{ns}"\n'
        "[plugins]\n"
        'enabled = ["max_steps", "circuit_breaker", "retry_policy", "repeat_call",'
        ' "failure_streak"]\n'
        "[plugins.retry_policy]\nbackoff_s = 0.0\n"
        f"[plugins.circuit_breaker]\nopen_s = {OPEN_S}\n",
        encoding="utf-8",
    )
    first = _cli(cfg, "--scenario", "outage")
    assert first["circuit_breaker"]["changes"][0]["change"] == "opened"
    assert first["tools_executed"] >= 2
    second = _cli(cfg, "--scenario", "outage")
    assert second["tools_executed"] == 0 and second["termination"] == "circuit_open"
    assert second["circuit_breaker"]["skipped"][0]["step"] == 1
    assert second["evidence"]["tool"] == "query_logistics"
    # open_s on the real clock (long enough for the second process to start within it)
    since = datetime.fromisoformat(first["circuit_breaker"]["changes"][0]["since"])
    time.sleep(max(0.0, since.timestamp() + 1 + OPEN_S - time.time()))
    third = _cli(cfg, "--scenario", str(write_scenario(tmp_path, RECOVERED, "recovered")))
    assert third["termination"] == "final_answer" and third["tools_executed"] == 1
    assert [c["change"] for c in third["circuit_breaker"]["changes"]] == ["half_open", "closed"]
    del base


# -- through an adapter (the same engine): LangChain ----------------------------------------


def test_a_langchain_agents_call_is_skipped_by_an_open_breaker(store_url: str) -> None:
    pytest.importorskip("langchain")
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool as lc_tool

    from loopwarden.adapters.langchain import LoopwardenMiddleware

    class Chat(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    ran: list[str] = []

    @lc_tool
    def search_flights(city: str) -> str:
        """Search flights to a city."""
        ran.append(city)
        return "3 flights"

    rule = CircuitBreakerSettings(failures=1).rule()
    store = make_store(store_url)
    try:  # another process's run saw the upstream time out: the breaker is open
        opened = store.breaker_record(
            ("deployment", "*", "tool", "search_flights"),
            rule,
            "elsewhere/c",
            failed=True,
            source="*",
            error="timeout",
        )
        assert opened.changed == "opened"
    finally:
        store.close()
    dep = deployment_for(
        store_url,
        plugins={"circuit_breaker": {"failures": 1}},
        enabled=("circuit_breaker",),
        tools=[],
    )
    call = {"name": "search_flights", "args": {"city": "Oslo"}, "id": "c1"}
    model = Chat(
        messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="Sorry.")])
    )
    agent = create_agent(model, [search_flights], middleware=[LoopwardenMiddleware(dep)])
    try:
        out = agent.invoke({"messages": [HumanMessage("Flights to Oslo?")]})
    finally:
        dep.close()
    assert ran == []  # never executed
    (observation,) = [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
    assert observation.startswith("search_flights is unavailable since ")
    assert "(1 timeouts in 60 s)" in observation


def test_the_otel_plugin_adds_an_event_when_a_breaker_opens(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from support.otel import Telemetry

    from loopwarden.config import parse_config
    from loopwarden.demo import shop_tools
    from loopwarden.plugins.otel import OTel, OTelSettings

    telemetry = Telemetry()
    otel = OTel(
        OTelSettings(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    config = parse_config(
        {
            "store": {"url": f"sqlite:///{tmp_path / 'store.sqlite3'}"},
            "plugins": {
                "enabled": ["max_steps", "circuit_breaker", "otel"],
                "circuit_breaker": {"failures": 3, "scope": ["tenant"]},
            },
        },
        path="<test>",
    )
    with Deployment(config, plugins={"otel": otel}, tools=shop_tools()) as dep:
        dep.run(scenario="outage", meta={"tenant": "acme"})
    try:
        span = telemetry.one("invoke_agent")
        (event,) = [e for e in span.events if e.name == "loopwarden.circuit_breaker"]
        attrs = dict(event.attributes or {})
        assert attrs["loopwarden.breaker.change"] == "opened"
        assert attrs["loopwarden.breaker.name"] == "query_logistics"
        assert attrs["loopwarden.breaker.failures"] == 3
        assert attrs["loopwarden.breaker.scope"] == "tenant"
        assert "acme" not in json.dumps(attrs)  # names and counts leave the process, no tenant
    finally:
        telemetry.shutdown()


def test_a_real_mcp_server_that_hangs_pauses_all_of_its_tools(tmp_path: Path) -> None:
    """A stdio MCP server: its ``hang`` tool times out, which opens the server's breaker, so
    its ``lookup_order`` -- another tool of the same server -- is skipped, never called."""
    pytest.importorskip("mcp")
    from support.mcp_servers import count, stdio_table

    from loopwarden.config import parse_config

    log = tmp_path / "log"
    config = parse_config(
        {
            "mcp": {"servers": {"orders": stdio_table(log, timeout_s=1.0)}},
            "store": {"url": f"sqlite:///{tmp_path / 'store.sqlite3'}"},
            "plugins": {
                "enabled": ["max_steps", "circuit_breaker"],
                "circuit_breaker": {"failures": 1, "max_skips": None},
            },
        },
        path="<test>",
    )
    sc = tmp_path / "mcp.toml"
    sc.write_text(
        'name = "mcp"\nuser = "order 7"\n[model]\nturns = [\n'
        '  { tool_calls = [{ name = "hang", arguments = {} }] },\n'
        '  { tool_calls = [{ name = "lookup_order", arguments = { order_id = "7" } }] },\n'
        ']\nthen = "final"\nfinal_text = "done"\n',
        encoding="utf-8",
    )
    with Deployment(config) as dep:
        tool = dep.tools.get("lookup_order")
        assert tool is not None and tool.server == "orders"
        rec = dep.run(scenario=sc).record()
    assert count(log, "hang") == 1 and count(log, "lookup_order 7") == 0
    changes = {
        (c["breaker"], c["breaker_name"], c["change"]) for c in rec["circuit_breaker"]["changes"]
    }
    assert changes == {("tool", "hang", "opened"), ("server", "orders", "opened")}
    (skip,) = rec["circuit_breaker"]["skipped"]
    assert (skip["tool"], skip["breaker"], skip["breaker_name"]) == (
        "lookup_order",
        "server",
        "orders",
    )


# -- issue 43: the probe and min_sources, a slow probe, the hosts' clocks -------------------

#: one call of ``lookup`` with an argument of the run's own, then the answer
LOOKUP = """
name = "lookup-{q}"
user = "look {q} up"
[model]
turns = [
  {{ content = "looking", tool_calls = [{{ name = "lookup", arguments = {{ q = "{q}" }} }}] }},
  {{ content = "done" }},
]
then = "final"
final_text = "done"
"""


def test_one_tenant_whose_probe_fails_never_holds_a_shared_breaker_open(
    store_url: str, tmp_path: Path
) -> None:
    """Issue 43, item 3: after a real outage the upstream is back, but one tenant's own input
    (a huge export) still times out.  On main that tenant took each half-open probe and
    reopened the breaker for everyone: 0 of 10 other tenants' calls served in 5 cycles."""
    upstream = {"down": True}
    served: list[str] = []

    @tool(read_only=True)
    def lookup(q: str) -> str:
        """Look something up upstream."""
        if upstream["down"] or q == "huge-export":
            raise ToolError("upstream timed out", retryable=True)
        served.append(q)
        return f"found {q}"

    dep = deployment_for(
        store_url,
        plugins={
            **breaker(store_url, min_sources=2, open_s=30.0, max_skips=None),
            "max_steps": {"max_steps": 3, "warn_remaining": 0},
        },
        enabled=("circuit_breaker", "max_steps"),
        tools=[lookup],
    )
    clock = Clock()
    dep.shared.store.now = clock  # type: ignore[attr-defined]

    def ask(tenant: str, q: str) -> dict[str, Any]:
        path = write_scenario(tmp_path, LOOKUP.format(q=q), f"lookup-{q}")
        return dep.run(scenario=str(path), meta={"tenant": tenant}).record()

    try:
        for i in range(3):  # the outage: three tenants fail, the breaker opens
            ask(f"t{i}", f"outage-{i}")
        (b,) = dep.shared.store.breakers()
        assert b.state == "open"
        upstream["down"] = False  # the upstream is back; acme's own input still times out
        for cycle in range(5):
            clock.t += 30.0  # open_s over
            ask("acme", "huge-export")  # acme asks first, and fails
            for j in range(2):
                ask(f"other-{j}", f"c{cycle}-{j}")
        assert len(served) == 10, served  # every other tenant's call was served
        (b,) = dep.shared.store.breakers()
        assert b.state == "closed" and b.opens == 1
    finally:
        dep.close()


def test_the_half_open_rule_a_failed_probe_hands_the_next_to_another_source(
    store_url: str,
) -> None:
    store = make_store(store_url)
    clock = Clock()
    store.now = clock  # type: ignore[attr-defined]
    rule = BreakerRule(failures=2, failure_ratio=None, min_sources=2, open_s=30.0)
    try:
        for src in ("=a", "=b"):
            store.breaker_record(TOOL, rule, f"{src}/c", failed=True, source=src)
        clock.t += 30.0
        assert store.breaker_admit(TOOL, rule, "a1/c", source="=a").probe
        one = store.breaker_record(TOOL, rule, "a1/c", failed=True, source="=a")
        assert one.state == "half_open" and one.changed is None  # one source: not reopened
        assert not store.breaker_admit(TOOL, rule, "a2/c", source="=a").allows  # a waits
        assert store.breaker_admit(TOOL, rule, "b1/c", source="=b").probe  # b probes now
        two = store.breaker_record(TOOL, rule, "b1/c", failed=True, source="=b")
        assert two.changed == "reopened" and two.since == clock.t  # two sources: an outage
        clock.t += 30.0
        assert store.breaker_admit(TOOL, rule, "a3/c", source="=a").probe  # a fresh phase
        anonymous = store.breaker_record(TOOL, rule, "a3/c", failed=True, source="=a")
        assert anonymous.changed is None
        assert store.breaker_admit(TOOL, rule, "x/c").probe  # a run naming no source ...
        assert store.breaker_record(TOOL, rule, "x/c", failed=True, source="*").changed == (
            "reopened"  # ... is the deployment's own traffic: it suffices
        )
    finally:
        store.close()


def test_a_probe_slower_than_probe_timeout_s_is_the_only_probe_and_its_answer_counts(
    store_url: str, tmp_path: Path
) -> None:
    """Issue 43, item 4: a tool whose ``timeout_s`` (120 s) is longer than ``probe_timeout_s``
    (5 s).  On main a second caller took the probe while the first still ran (two probes at
    once); now the probe is held for the call's own deadline, and its success closes it."""
    release, entered = threading.Event(), threading.Event()
    calls: list[str] = []

    @tool(read_only=True, timeout_s=120)
    def lookup(q: str) -> str:
        """Look something up upstream (slow, but healthy)."""
        calls.append(q)
        if q == "first":
            entered.set()
            release.wait(30)
        return f"found {q}"

    dep = deployment_for(
        store_url,
        plugins=breaker(store_url, failures=1, open_s=30.0, probe_timeout_s=5.0, max_skips=None),
        enabled=("circuit_breaker",),
        tools=[lookup],
    )
    clock = Clock()
    store = dep.shared.store
    store.now = clock  # type: ignore[attr-defined]
    ident = ("deployment", "*", "tool", "lookup")
    rule = dep.plugins.get("circuit_breaker").rule  # type: ignore[union-attr]
    records: list[dict[str, Any]] = []
    try:
        store.breaker_record(ident, rule, "elsewhere/c", failed=True, source="*")
        clock.t += 30.0
        first = threading.Thread(
            target=lambda: records.append(
                dep.run(
                    scenario=str(write_scenario(tmp_path, LOOKUP.format(q="first"), "f"))
                ).record()
            )
        )
        first.start()
        assert entered.wait(30)  # the probe runs ...
        clock.t += 10.0  # ... past probe_timeout_s, well within its own timeout_s
        second = dep.run(scenario=str(write_scenario(tmp_path, LOOKUP.format(q="second"), "s")))
        assert calls == ["first"]  # not a second probe at once: the second call was skipped
        assert second.record()["circuit_breaker"]["skipped_calls"] == 1
        release.set()
        first.join(30)
        (rec,) = records
        assert [c["change"] for c in rec["circuit_breaker"]["changes"]] == ["half_open", "closed"]
        (b,) = store.breakers()
        assert b.state == "closed"  # the slow probe's answer counted
    finally:
        release.set()
        dep.close()


def test_a_replaced_probes_late_success_still_closes_the_breaker(store_url: str) -> None:
    """A probe with no deadline of its own past probe_timeout_s is replaced; its late answer
    is still an answer of the dependency (main discarded it)."""
    store = make_store(store_url)
    clock = Clock()
    store.now = clock  # type: ignore[attr-defined]
    rule = BreakerRule(failures=1, failure_ratio=None, open_s=10.0, probe_timeout_s=5.0)
    try:
        store.breaker_record(TOOL, rule, "a/c", failed=True, source="*")
        clock.t += 10.0
        assert store.breaker_admit(TOOL, rule, "p1/c").probe
        clock.t += 6.0
        assert store.breaker_admit(TOOL, rule, "p2/c").probe  # p1 reported nothing in time
        late = store.breaker_record(TOOL, rule, "p1/c", failed=False, source="*")
        assert late.changed == "closed" and late.state == "closed"
    finally:
        store.close()


def test_hosts_whose_clocks_differ_share_a_breaker_by_the_servers_clock(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43, item 5, on a real redis-server: a host whose clock runs two minutes fast
    (its ``time.time``, patched where the store reads it: the one thing this machine cannot
    have for real) and a host on time share a breaker.  On main the fast host's writes
    carried its own time: a breaker it opened stayed shut 120 s past ``open_s``, and the slow
    host's failures were dropped by the fast host's next write, so the outage never opened
    it.  Now both read Redis's TIME.  (A SQLite store is one host's file: one clock.)"""
    import loopwarden.store.redis as backend

    ns = "lwtest-clock-" + os.urandom(4).hex()
    on_time = open_store(redis_server, namespace=ns)
    fast_clock = types.SimpleNamespace(
        time=lambda: time.time() + 120.0, monotonic=time.monotonic, sleep=time.sleep
    )
    with monkeypatch.context() as patch:
        patch.setattr(backend, "time", fast_clock)
        fast = open_store(redis_server, namespace=ns)
    counted = BreakerRule(failures=3, failure_ratio=None, min_sources=1, window_s=60.0)
    brief = BreakerRule(failures=1, failure_ratio=None, open_s=0.2)
    shut = ("deployment", "*", "tool", "shut")
    try:
        # failures from both hosts count in one window
        fast.breaker_record(TOOL, counted, "f1/c", failed=True, source="*")
        on_time.breaker_record(TOOL, counted, "s1/c", failed=True, source="*")
        third = fast.breaker_record(TOOL, counted, "f2/c", failed=True, source="*")
        assert third.changed == "opened" and third.tripped["failures"] == 3  # type: ignore[index]
        # a breaker the fast host opens is over for the host on time after open_s
        assert fast.breaker_record(shut, brief, "f3/c", failed=True, source="*").changed
        assert not on_time.breaker_admit(shut, brief, "s2/c").allows
        time.sleep(0.3)  # past open_s (0.2 s) on the server's clock, not 120 s
        assert on_time.breaker_admit(shut, brief, "s3/c").probe
    finally:
        on_time.close()
        fast.close()
        import redis

        r = redis.Redis.from_url(redis_server)
        keys = list(r.scan_iter(match="{" + ns + "}:*"))
        if keys:
            r.delete(*keys)
        r.close()
