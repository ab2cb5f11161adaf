"""The facade's direct dispatch matches pluggy's, and yields to pluggy when it must."""

from __future__ import annotations

from typing import Any

import pytest

from loopwarden import Deployment, hookimpl, warn
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.testing import HookRecorder, ScriptedModel, script, tool_call


class Tag:
    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag, self.log = tag, log

    @hookimpl
    def before_tool(self, call: Any) -> Any:  # takes only some of the hook's arguments
        self.log.append(f"{self.tag}:{call.name}")
        return warn(f"{self.tag} saw {call.name}", plugin=self.tag)


def deployment(**plugins: Any) -> Deployment:
    return Deployment(parse_config({}, path="<t>"), plugins=plugins, tools=shop_tools())


def model() -> Any:
    return ScriptedModel(
        script([{"tool_calls": [tool_call("get_current_time")]}, {"content": "ok"}])
    )


def test_direct_dispatch_calls_in_config_order_with_only_the_arguments_asked_for() -> None:
    log: list[str] = []
    dep = deployment(b=Tag("b", log), a=Tag("a", log))
    assert dep.hooks._plan("before_tool") is not None  # the fast path is in use
    run = dep.run("q", model=model())
    assert log == ["b:get_current_time", "a:get_current_time"]
    assert [w["plugin"] for w in run.warnings] == ["b", "a"]


def test_a_non_verdict_is_blamed_on_its_plugin() -> None:
    class Sloppy:
        @hookimpl
        def after_response(self) -> str:
            return "stop please"

    run = deployment(sloppy=Sloppy()).run("q", model=model())
    rec = run.record()
    assert rec["termination"] == "plugin_error" and rec["stopped_by"] == "sloppy"


def test_a_recorder_sees_every_call_because_dispatch_then_goes_through_pluggy() -> None:
    log: list[str] = []
    dep = deployment(t=Tag("t", log))
    with HookRecorder(dep) as rec:
        assert dep.hooks._plan("before_tool") is None
        dep.run("q", model=model())
    assert [c.call.name for c in rec.getcalls("before_tool")] == ["get_current_time"]
    assert dep.hooks._plan("before_tool") is not None  # back on the fast path
    assert log == ["t:get_current_time"]


def test_plugins_registered_later_are_called() -> None:
    log: list[str] = []
    dep = deployment(first=Tag("first", log))
    dep.run("q", model=model())
    dep.plugins.pm.register(Tag("late", log), name="late")
    dep.run("q", model=model())
    assert log == ["first:get_current_time", "late:get_current_time", "first:get_current_time"]


def test_a_wrapper_keeps_pluggy_dispatch_for_its_hook() -> None:
    seen: list[str] = []

    class Timing:
        @hookimpl(wrapper=True)
        def before_tool(self, call: Any) -> Any:
            seen.append("before")
            result = yield
            seen.append(f"after {len(result)} verdicts")
            return result

    log: list[str] = []
    dep = deployment(t=Tag("t", log), timing=Timing())
    assert dep.hooks._plan("before_tool") is None
    assert dep.hooks._plan("after_tool") is not None
    dep.run("q", model=model())
    assert seen == ["before", "after 1 verdicts"] and log == ["t:get_current_time"]


@pytest.mark.parametrize(
    "hook", ["on_start", "before_model", "after_response", "before_tool", "after_tool"]
)
def test_an_exception_is_blamed_on_its_plugin_on_both_paths(hook: str) -> None:
    def boom(self: Any, run: Any) -> None:
        raise RuntimeError("bad plugin")

    Bad = type("Bad", (), {hook: hookimpl(boom)})
    for monitored in (False, True):
        dep = deployment(ok=Tag("ok", []), bad=Bad())
        if monitored:
            recorder = HookRecorder(dep)
        run = dep.run("q", model=model())
        if monitored:
            recorder.finish_recording()
        rec = run.record()
        assert (rec["termination"], rec["stopped_by"]) == ("plugin_error", "bad"), monitored
        assert rec["evidence"]["hook"] == hook


def test_helpers_without_a_plugin_name_are_attributed_to_their_plugin() -> None:
    from loopwarden import stop

    class Plain:
        @hookimpl
        def after_tool(self) -> Any:
            return stop("plain_stop")

    rec = deployment(plain=Plain()).run("q", model=model()).record()
    assert (rec["termination"], rec["stopped_by"]) == ("plain_stop", "plain")
