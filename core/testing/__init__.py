"""Test helpers for plugin authors -- loopwarden's ``pytester``.

Everything a plugin's tests need, public and stable: builders for a run and for every hook
payload, the fake clock, the scripted model, recorders of hook calls and of signals, and a
harness that drives a plugin through a short scripted run.  Nothing here needs pytest; the
fixtures for pytest are opt-in (see below).

Unit-test one hook::

    from loopwarden.testing import call_hook, make_run, make_tool_call

    def test_refuses_refunds():
        verdict = call_hook(NoRefunds(), "before_tool",
                            call=make_tool_call("apply_refund", order_id="88231", reason="x"))
        assert verdict.kind == "stop" and verdict.reason == "forbidden_tool"

Drive it through a scripted run (the real loop; tools are yours, or scripted results)::

    from loopwarden.testing import make_tool, run_plugin, tool_call, turn

    refunds = []
    refund = make_tool("apply_refund", lambda **kw: refunds.append(kw), side_effect=True)
    result = run_plugin(NoRefunds, tools=[refund],
                        turns=[turn("Refunding.", tool_call("apply_refund", order_id="1001"))])
    assert result.termination == "forbidden_tool"
    assert refunds == []

A deployment of your own plays a script through a scripted model --
``make_deployment(model=ScriptedModel(script([...])))``, one per run (it keeps its place);
``Deployment(model=script(...))`` fails when it is built, naming that call.

pytest fixtures (``lw_clock``, ``lw_signals``, ``lw_hooks``, ``lw_deployment``) are active only
when asked for, like pytester: ``pytest -p loopwarden.testing``, or
``pytest_plugins = ["loopwarden.testing"]`` in the root ``conftest.py``, or
``loopwarden_testing = true`` in the pytest ini options.

May import: anything a plugin author's test needs -- the public vocabulary, deployments, the
engine's plugin manager, the scripted model and the store; never the commands, the docs
generator, the demo or the adapters.  Nothing of the library imports the test kit
(import-linter forbids it to the engine, the plugins, the demo and the adapters).
"""

from loopwarden.clock import FakeClock
from loopwarden.models.scripted import ScriptedModel
from loopwarden.testing.builders import (
    make_outcome,
    make_request,
    make_response,
    make_run,
    make_tool,
    make_tool_call,
    make_tool_result,
    script,
    tool_call,
    turn,
)
from loopwarden.testing.harness import (
    PluginRun,
    VerdictRecord,
    call_hook,
    make_deployment,
    run_plugin,
)
from loopwarden.testing.recorders import HookCall, HookRecorder, SignalRecord, SignalRecorder

__all__ = [
    "FakeClock",
    "HookCall",
    "HookRecorder",
    "PluginRun",
    "ScriptedModel",
    "SignalRecord",
    "SignalRecorder",
    "VerdictRecord",
    "call_hook",
    "make_deployment",
    "make_outcome",
    "make_request",
    "make_response",
    "make_run",
    "make_tool",
    "make_tool_call",
    "make_tool_result",
    "run_plugin",
    "script",
    "tool_call",
    "turn",
]

#: pytest loads the fixtures only when this module is registered as a plugin (opt-in)
pytest_plugins = ["loopwarden.testing.fixtures"]
