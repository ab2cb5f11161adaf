"""max_steps: N allows exactly N model calls (the soft stop's final turn included); essential."""

from __future__ import annotations

import pytest
from support.budgets import FINAL, config, request, response, scenario

from loopwarden import ConfigError, Deployment, Limits, Stop, Warn
from loopwarden.demo import shop_tools
from loopwarden.engine.pluginmanager import ESSENTIAL_PLUGINS, load_plugins
from loopwarden.models.scripted import ScriptedModel
from loopwarden.plugins.max_steps import MaxSteps, MaxStepsSettings
from loopwarden.testing import make_run, tool_call, turn

# -- hook level --------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2, 5, 10])
def test_before_model_boundaries(limit: int) -> None:
    plugin = MaxSteps(MaxStepsSettings(max_steps=limit))
    run = make_run()
    # calls 1 .. N-1 are normal
    for made in range(limit - 1):
        run.step = made
        assert plugin.before_model(run, request(run, 100)) is None
    # call N is the final turn: soft stop
    run.step = limit - 1
    v = plugin.before_model(run, request(run, 100))
    assert isinstance(v, Stop) and v.soft and v.reason == "max_steps"
    assert v.plugin == "max_steps"
    assert v.evidence["limit"] == limit and v.evidence["steps"] == limit - 1
    # call N+1 is refused outright
    run.step = limit
    v = plugin.before_model(run, request(run, 100))
    assert isinstance(v, Stop) and not v.soft and v.reason == "max_steps"


def test_profile_overrides_the_setting() -> None:
    plugin = MaxSteps(MaxStepsSettings(max_steps=10))
    run = make_run(limits=Limits(name="simple", max_steps=3))
    run.step = 2
    v = plugin.before_model(run, request(run, 100))
    assert isinstance(v, Stop) and v.soft
    assert v.evidence["limit"] == 3 and v.evidence["source"] == "profile simple"


@pytest.mark.parametrize("warn_remaining", [1, 2, 3])
def test_warns_once_when_k_calls_are_left(warn_remaining: int) -> None:
    limit = 10
    plugin = MaxSteps(MaxStepsSettings(max_steps=limit, warn_remaining=warn_remaining))
    run = make_run()
    warnings = {}
    for step in range(1, limit):
        run.step = step
        v = plugin.after_response(run, response())
        if v is not None:
            warnings[step] = v
    assert list(warnings) == [limit - warn_remaining]
    w = warnings[limit - warn_remaining]
    assert isinstance(w, Warn)
    assert w.message.startswith(f"You have {warn_remaining} step(s) left")
    assert w.evidence == {
        "limit": limit,
        "remaining": warn_remaining,
        "steps": limit - warn_remaining,
        "source": "plugins.max_steps",
    }


def test_no_warning_for_a_final_answer_or_when_switched_off() -> None:
    run = make_run()
    run.step = 8
    assert MaxSteps().after_response(run, response(tools=0)) is None
    assert MaxSteps(MaxStepsSettings(warn_remaining=0)).after_response(run, response()) is None


def test_warning_text_is_configurable_and_checked() -> None:
    s = MaxStepsSettings(message="只剩 {remaining} 步（上限 {limit}）", max_steps=10)
    run = make_run()
    run.step = 8
    v = MaxSteps(s).after_response(run, response())
    assert isinstance(v, Warn) and v.message == "只剩 2 步（上限 10）"
    with pytest.raises(ConfigError, match=r"plugins\.max_steps.*message"):
        load_plugins(config("max_steps", max_steps={"message": "{steps_left}"}))


# -- end to end: the scripted model counts the calls -------------------------------------------


def _run_with_limit(limit: int, natural_turns: int | None) -> tuple[ScriptedModel, object]:
    """A run with max_steps = limit, whose model finishes by itself after ``natural_turns``
    tool turns (None: never)."""
    turns = [
        turn(f"step {i}", tool_call("search_knowledge", query=f"q{i}"))
        for i in range(natural_turns if natural_turns is not None else 1)
    ]
    sc = scenario(turns, then="final" if natural_turns is not None else "cycle", final_text=FINAL)
    dep = Deployment(config("max_steps", max_steps={"max_steps": limit}), tools=shop_tools())
    model = ScriptedModel(sc.model, estimator=dep.estimator)
    run = dep.run(scenario=sc, model=model)
    return model, run


@pytest.mark.parametrize("limit", [1, 2, 3, 6])
def test_a_run_that_never_finishes_makes_exactly_n_calls(limit: int) -> None:
    model, run = _run_with_limit(limit, None)
    rec = run.record()  # type: ignore[attr-defined]
    assert model.calls == limit
    assert rec["steps"] == limit
    assert rec["termination"] == "max_steps" and rec["soft"] is True
    assert rec["stopped_by"] == "max_steps"
    assert rec["final_answer"] == FINAL and rec["final_answer_present"] is True
    # the final turn was tool-less
    assert model.requests[-1].tool_choice == "none" and model.requests[-1].final
    assert all(not r.final for r in model.requests[:-1])


def test_boundaries_end_to_end_n_minus_1_n_n_plus_1() -> None:
    limit = 5
    # The model would answer by itself at call N-1: the cap is never touched.
    model, run = _run_with_limit(limit, limit - 2)
    assert model.calls == limit - 1
    assert run.record()["termination"] == "final_answer"  # type: ignore[attr-defined]
    # ... at call N: that call is the final turn anyway -> max_steps, soft, N calls.
    model, run = _run_with_limit(limit, limit - 1)
    assert model.calls == limit
    rec = run.record()  # type: ignore[attr-defined]
    assert rec["termination"] == "max_steps" and rec["soft"]
    assert rec["final_answer"] == FINAL
    # ... at call N+1: still exactly N calls.
    model, run = _run_with_limit(limit, limit)
    assert model.calls == limit
    assert run.record()["termination"] == "max_steps"  # type: ignore[attr-defined]


def test_warning_reaches_the_model_in_the_next_request() -> None:
    model, run = _run_with_limit(10, None)
    rec = run.record()  # type: ignore[attr-defined]
    assert rec["warnings"] == [
        {
            "step": 8,
            "plugin": "max_steps",
            "message": "You have 2 step(s) left. Wrap up: answer from what you know.",
        }
    ]
    assert model.requests[8].notes == [rec["warnings"][0]["message"]]  # request 9
    assert not model.requests[7].notes


# -- essential: configured, never disabled -----------------------------------------------------


def test_max_steps_is_essential() -> None:
    assert MaxSteps.essential is True
    assert "max_steps" in ESSENTIAL_PLUGINS


def test_loaded_even_when_not_enabled_and_called_first() -> None:
    plugins = load_plugins(config("terminal_tool", "tool_calls"))
    assert plugins.names[0] == "max_steps"
    assert plugins.call_order("before_model")[0] == "max_steps"


def test_an_unlisted_max_steps_still_caps_the_run() -> None:
    sc = scenario([turn(None, tool_call("search_knowledge", query="x"))], then="cycle")
    dep = Deployment(config("tool_calls", max_steps={"max_steps": 3}), tools=shop_tools())
    model = ScriptedModel(sc.model, estimator=dep.estimator)
    run = dep.run(scenario=sc, model=model)
    assert model.calls == 3 and run.record()["stopped_by"] == "max_steps"


def test_cannot_be_blocked_in_config() -> None:
    cfg = config("max_steps")
    cfg = cfg.model_copy(
        update={"plugins": cfg.plugins.model_copy(update={"blocked": ["max_steps"]})}
    )
    with pytest.raises(ConfigError, match="essential"):
        load_plugins(cfg)


def test_cannot_be_blocked_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", "tool_calls,max_steps")
    with pytest.raises(ConfigError, match="essential"):
        load_plugins(config("max_steps", "tool_calls"))


def test_other_plugins_can_be_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", "tool_calls")
    assert load_plugins(config("max_steps", "tool_calls")).names == ["max_steps"]
