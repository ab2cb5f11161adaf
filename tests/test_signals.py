"""Signals observe and never decide: what they carry, and that a failing receiver is harmless."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loopwarden import Deployment, Plugin, hookimpl, signals
from loopwarden.config import default_config_path, load_config, parse_config
from loopwarden.demo import shop_tools
from loopwarden.testing import ScriptedModel, script, tool_call


class Nag(Plugin):
    name = "nag"

    @hookimpl
    def after_tool(self, run: Any) -> Any:
        return self.warn("careful")


def test_one_run_sends_the_documented_signals_in_order() -> None:
    dep = Deployment(parse_config({}), plugins={"nag": Nag()}, tools=shop_tools())
    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(name: str) -> Any:
        def rec(sender: Any, **kw: Any) -> None:
            seen.append((name, kw))

        return rec

    receivers = {s.name: receiver(s.name) for s in signals.ALL}
    model = ScriptedModel(
        script([{"tool_calls": [tool_call("query_order", order_id="88231")]}, {"content": "ok"}])
    )
    with (
        signals.run_started.connected_to(receivers["run-started"]),
        signals.model_responded.connected_to(receivers["model-responded"]),
        signals.tool_finished.connected_to(receivers["tool-finished"]),
        signals.guard_triggered.connected_to(receivers["guard-triggered"]),
        signals.step_finished.connected_to(receivers["step-finished"]),
        signals.run_stopped.connected_to(receivers["run-stopped"]),
    ):
        run = dep.run("q", model=model)
    names = [n for n, _ in seen]
    assert names == [
        "run-started",
        "model-responded",
        "tool-finished",
        "guard-triggered",
        "step-finished",
        "model-responded",
        "run-stopped",
    ]
    tool_kw = seen[2][1]
    assert tool_kw["call"].name == "query_order" and tool_kw["result"].ok
    assert seen[3][1]["verdict"].plugin == "nag" and seen[3][1]["hook"] == "after_tool"
    assert seen[-1][1]["record"] == run.record()
    assert seen[-1][1]["outcome"].termination == "final_answer"


def test_a_failing_receiver_never_breaks_the_run(caplog: pytest.LogCaptureFixture) -> None:
    def broken(sender: Any, **kw: Any) -> None:
        raise RuntimeError("alert sink down")

    dep = Deployment(parse_config({}), tools=shop_tools())
    with (
        caplog.at_level(logging.ERROR, logger="loopwarden.signals"),
        signals.step_finished.connected_to(broken),
    ):
        for _ in range(2):
            run = dep.run(
                "q",
                model=ScriptedModel(
                    script([{"tool_calls": [tool_call("get_current_time")]}, {"content": "ok"}])
                ),
            )
            assert run.record()["termination"] == "final_answer"
    failures = [
        r
        for r in caplog.records
        if "alert sink down" in (r.exc_text or "") or "receiver" in r.getMessage()
    ]
    assert len(failures) == 1  # logged once, not once per send


def test_deployment_connect_only_sees_its_own_runs() -> None:
    a = Deployment(parse_config({}), tools=shop_tools())
    b = Deployment(parse_config({}), tools=shop_tools())
    got: list[str] = []
    a.connect(signals.run_stopped, lambda sender, **kw: got.append(sender.user))
    try:
        a.run("from a", model=ScriptedModel(script([{"content": "x"}])))
        b.run("from b", model=ScriptedModel(script([{"content": "x"}])))
    finally:
        a.close()
    a.run("after close", model=ScriptedModel(script([{"content": "x"}])))
    assert got == ["from a"]


def test_one_failing_observer_does_not_starve_the_next() -> None:
    dep = Deployment(parse_config({}), tools=shop_tools())
    got: list[str] = []

    def broken(sender: Any, **kw: Any) -> None:
        raise RuntimeError("sink down")

    dep.connect(signals.run_stopped, broken)
    dep.connect(signals.run_stopped, lambda sender, **kw: got.append(kw["outcome"].termination))
    try:
        dep.run("q", model=ScriptedModel(script([{"content": "x"}])))
    finally:
        dep.close()
    assert got == ["final_answer"]


def test_an_unclosed_deployment_is_collected_and_its_receivers_go_with_it() -> None:
    import gc
    import weakref

    before = len(signals.run_stopped.receivers)
    dep = Deployment(
        load_config(default_config_path()), tools=shop_tools()
    )  # with its observer plugins
    dep.connect(signals.run_stopped, lambda sender, **kw: None)
    assert len(signals.run_stopped.receivers) == before + 1
    ref = weakref.ref(dep)
    del dep
    gc.collect()
    assert ref() is None
    other = Deployment(parse_config({}), tools=shop_tools())
    # the orphaned receiver removes itself
    other.run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert len(signals.run_stopped.receivers) == before


def test_a_send_calls_one_router_however_many_deployments_listen() -> None:
    """Each deployment used to connect a receiver of its own to every signal it observed: a
    send called all of them, and all but one found the run was not theirs."""
    before = len(signals.run_stopped.receivers)
    deps = [Deployment(parse_config({}), tools=shop_tools()) for _ in range(30)]
    got: dict[int, list[str]] = {i: [] for i in range(30)}
    for i, dep in enumerate(deps):
        dep.connect(signals.run_stopped, lambda sender, i=i, **kw: got[i].append(sender.run_id))
    assert len(signals.run_stopped.receivers) == before + (before == 0)
    run = deps[7].run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert got[7] == [run.run_id]
    assert all(not seen for i, seen in got.items() if i != 7)
    for dep in deps[:-1]:
        dep.close()
    deps[-1].run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert len(got[29]) == 1  # the others closed, the last one still hears its runs
    deps[-1].close()
    assert len(signals.run_stopped.receivers) == before


@pytest.mark.slow
def test_a_deployment_collected_meanwhile_takes_only_its_own_receivers() -> None:
    import gc

    keep = Deployment(parse_config({}), tools=shop_tools())
    heard: list[str] = []
    keep.connect(signals.run_stopped, lambda sender, **kw: heard.append(sender.run_id))
    for _ in range(5):
        gone = Deployment(parse_config({}), tools=shop_tools())
        gone.connect(signals.run_stopped, lambda sender, **kw: heard.append("wrong"))
        del gone
        gc.collect()
    run = keep.run("q", model=ScriptedModel(script([{"content": "x"}])))
    assert heard == [run.run_id]
    keep.close()


def test_a_receiver_beside_the_router_is_called_and_the_router_still_routes() -> None:
    """send() calls the deployments' router directly while it is a signal's only receiver;
    a receiver connected beside it (any sender, or this run only) is called too."""
    from support.calls import play, shipped_deployment

    dep = shipped_deployment()
    try:
        seen: list[str] = []

        def anyone(sender: Any, **kw: Any) -> None:
            seen.append("any")

        play(dep, 2)
        metrics: Any = dep.plugins.get("metrics")
        assert metrics.value("model_calls_total") == 3  # the router alone
        with signals.tool_finished.connected_to(anyone):
            play(dep, 2)
        assert seen == ["any", "any"]
        assert metrics.value("model_calls_total") == 6
        assert metrics.value("tool_calls_total", tool="lookup", outcome="ok") == 4
        play(dep, 1)  # disconnected again: the router alone
        assert seen == ["any", "any"]
        assert metrics.value("tool_calls_total", tool="lookup", outcome="ok") == 5
    finally:
        dep.close()


def test_a_failing_dispatcher_is_reported_and_never_raises(caplog: Any) -> None:
    from blinker import Namespace

    sig = Namespace().signal("lone")

    class Boom:
        def __call__(self, sender: Any, **kw: Any) -> None:
            raise RuntimeError("boom")

    boom = Boom()
    sig.connect(boom, weak=False)
    signals.set_dispatcher(sig, boom)
    signals.send(sig, object())  # logged once, not raised
    assert "receiver" in caplog.text and "boom" in caplog.text
