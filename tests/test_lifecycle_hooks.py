"""The lifecycle hooks (on_configure, validate_model, budget_limits, record_fields,
on_unconfigure), the typed stash, and verdicts a hook cannot honour."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loopwarden import (
    Config,
    ConfigError,
    Deployment,
    Plugin,
    PluginLoadError,
    Run,
    Stash,
    StashKey,
    hookimpl,
)
from loopwarden.demo import shop_tools
from loopwarden.run import PLUGIN_FIELD_DEFAULTS

MakeConfig = Callable[..., Config]
MakeDeployment = Callable[..., Deployment]


def _config(make_config: MakeConfig, *names: str) -> Config:
    return make_config(plugins={"enabled": ["max_steps", *names]})


def test_hook_on_configure_and_on_unconfigure_bracket_the_deployment(
    make_config: MakeConfig,
) -> None:
    seen: list[tuple[str, object]] = []

    class Lifecycle(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def on_configure(self, deployment: Deployment) -> None:
            seen.append(("configure", deployment))

        @hookimpl
        def on_unconfigure(self, deployment: Deployment) -> None:
            seen.append(("unconfigure", deployment))

    dep = Deployment(_config(make_config), plugins={"life": Lifecycle()}, tools=shop_tools())
    assert seen == [("configure", dep)]
    assert dep.plugins.describe()[-1]["hooks"] == ["on_configure", "on_unconfigure"]
    dep.close()
    assert seen == [("configure", dep), ("unconfigure", dep)]


def test_hook_on_unconfigure_and_on_configure_call_a_0_1_plugins_close_and_connect(
    make_config: MakeConfig,
) -> None:
    seen: list[str] = []

    class Old(Plugin):  # type: ignore[type-arg]
        def connect(self, deployment: Deployment) -> None:
            seen.append("connect")

        def close(self) -> None:
            seen.append("close")

    with Deployment(_config(make_config), plugins={"old": Old()}, tools=shop_tools()) as dep:
        assert seen == ["connect"]
        assert dep.plugins.describe()[-1]["hooks"] == ["on_configure", "on_unconfigure"]
    assert seen == ["connect", "close"]


def test_a_plugin_without_lifecycle_methods_registers_no_lifecycle_hook(
    make_config: MakeConfig,
    deployment_factory: MakeDeployment,
) -> None:
    class OnlyStart(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def on_start(self, run: Run) -> None:
            return None

    dep = deployment_factory(_config(make_config), plugins={"only": OnlyStart()})
    assert dep.plugins.describe()[-1]["hooks"] == ["on_start"]
    assert "only" not in dep.plugins.call_order("on_configure")


def test_a_plain_object_with_a_0_1_connect_fails_loudly(make_config: MakeConfig) -> None:
    class Plain:
        @hookimpl
        def on_start(self, run: Run) -> None:
            return None

        def connect(self, deployment: Deployment) -> None:  # no longer called
            raise AssertionError

    with pytest.raises(PluginLoadError, match="implement the hook on_configure") as err:
        Deployment(_config(make_config), plugins={"plain": Plain()}, tools=shop_tools())
    assert err.value.plugin == "plain"


def test_hook_validate_model_refuses_a_model(
    make_config: MakeConfig, deployment_factory: MakeDeployment
) -> None:
    class OnlyGpt(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def validate_model(self, model: str, path: str | None) -> None:
            if not model.startswith("gpt-"):
                raise ConfigError(f"unsupported model {model!r}", path=path)

    checked: list[str] = []

    class Legacy(Plugin):  # type: ignore[type-arg]
        def check_model(self, model: str, *, path: str | None = None) -> None:
            checked.append(model)

    dep = deployment_factory(_config(make_config), plugins={"gpt": OnlyGpt(), "old": Legacy()})
    dep.check_model("gpt-4o")
    assert checked == ["gpt-4o"]  # the 0.1 spelling is still called
    with pytest.raises(ConfigError, match="unsupported model 'llama'"):
        dep.check_model("llama")


def test_hook_validate_model_of_the_cost_budget(
    make_config: MakeConfig, deployment_factory: MakeDeployment
) -> None:
    cfg = make_config(
        plugins={"enabled": ["max_steps", "cost_budget"], "cost_budget": {"unknown_model": "error"}}
    )
    dep = deployment_factory(cfg)
    with pytest.raises(ConfigError, match="no price for model 'no-such-model'"):
        dep.check_model("no-such-model")


def test_hook_budget_limits_of_the_builtins(
    make_config: MakeConfig, deployment_factory: MakeDeployment
) -> None:
    cfg = make_config(
        plugins={
            "enabled": ["max_steps", "token_budget", "timeout"],
            "max_steps": {"max_steps": 7},
            "timeout": {"max_seconds": 30},
        }
    )
    dep = deployment_factory(cfg)
    run, _ = dep.prepare("hi", scenario="refund")
    limits = dep.hooks.budget_limits(run)
    assert limits["steps"] == 7 and limits["seconds"] == 30
    assert limits["tokens"] == dep.plugins.get("token_budget").settings.max_total_tokens


class Tagger(Plugin):  # type: ignore[type-arg]
    """Counts tool calls in the stash and adds the count to the run record."""

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.calls = StashKey[int]()

    @hookimpl
    def after_tool(self, run: Run) -> None:
        run.stash[self.calls] = run.stash.get(self.calls, 0) + 1

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, Any]:
        return {"tagger_calls": run.stash.get(self.calls, 0), "tags": ("a", "b")}


def test_hook_record_fields_adds_fields_and_keeps_the_counters(
    make_config: MakeConfig,
    deployment_factory: MakeDeployment,
) -> None:
    dep = deployment_factory(_config(make_config), plugins={"tagger": Tagger()})
    rec = dep.run(scenario="refund").record()
    assert rec["tagger_calls"] == rec["tool_calls"] > 0
    assert rec["tags"] == ["a", "b"]  # made JSON-serialisable
    # the plugins' fields are there, at their defaults, with their plugins not enabled
    assert {k: rec[k] for k in PLUGIN_FIELD_DEFAULTS} == PLUGIN_FIELD_DEFAULTS
    # ... which are the contract's values of a record without those plugins
    expected = {
        "duplicate_calls": 0,
        "oscillation_hits": 0,
        "stall_rounds": 0,
        "cost": 0.0,
        "cost_currency": None,
    }
    assert {k: rec[k] for k in expected} == expected
    assert type(rec["cost"]) is float
    assert rec["errors"] == []


def test_hook_record_fields_failures_are_recorded_not_raised(
    make_config: MakeConfig,
    deployment_factory: MakeDeployment,
) -> None:
    class Broken(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def record_fields(self) -> dict[str, Any]:
            raise RuntimeError("boom")

    class Usurper(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def record_fields(self) -> dict[str, Any]:
            return {"termination": "final_answer", "extra": 1}

    dep = deployment_factory(
        _config(make_config), plugins={"broken": Broken(), "usurper": Usurper(), "tagger": Tagger()}
    )
    rec = dep.run(scenario="refund").record()
    assert rec["tagger_calls"] > 0  # the others' fields are kept
    assert "extra" not in rec and rec["termination"] != "running"
    errors = {e["plugin"]: e["error"] for e in rec["errors"]}
    assert errors["broken"] == "RuntimeError: boom"
    assert "cannot be replaced: ['termination']" in errors["usurper"]


def test_the_detector_counters_reach_the_record(
    make_config: MakeConfig, deployment_factory: MakeDeployment
) -> None:
    cfg = make_config(plugins={"enabled": ["max_steps", "repeat_call"]})
    rec = deployment_factory(cfg).run(scenario="repeat-then-recover").record()
    assert rec["termination"] == "final_answer" and rec["duplicate_calls"] == 1


def test_stash_is_typed_and_per_run() -> None:
    key, other = StashKey[int](), StashKey[str]()
    stash = Stash()
    assert key not in stash and stash.get(key, None) is None
    assert stash.setdefault(key, 1) == 1 and stash.setdefault(key, 5) == 1
    stash[other] = "x"
    assert (stash[key], stash[other], len(stash)) == (1, "x", 2)
    del stash[key]
    with pytest.raises(KeyError):
        stash[key]
    assert Run("a").stash is not Run("b").stash


@pytest.mark.parametrize("hook", ["on_start", "before_model", "after_response", "after_tool"])
def test_a_skip_where_it_cannot_be_honoured_fails_closed(
    hook: str,
    make_config: MakeConfig,
    deployment_factory: MakeDeployment,
) -> None:
    def skip_here(self: Plugin, run: Run) -> Any:  # type: ignore[type-arg]
        return self.skip("not here")

    skipper = type("Skipper", (Plugin,), {hook: hookimpl(skip_here)})
    dep = deployment_factory(_config(make_config), plugins={"skipper": skipper()})
    rec = dep.run(scenario="refund").record()
    assert (rec["termination"], rec["stopped_by"]) == ("plugin_error", "skipper")
    assert rec["evidence"]["hook"] == hook
