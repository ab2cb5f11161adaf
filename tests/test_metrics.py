"""The metrics plugin: in-process counters and histograms, and the Prometheus mirror."""

from __future__ import annotations

import logging
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from support.observability import ALWAYS_NOT_FOUND, WANDERING, repeat_guard

from loopwarden import Deployment, FakeClock, Run, RunOutcome
from loopwarden.config import Config
from loopwarden.plugins.metrics import Metrics, MetricsSettings, PrometheusUnavailable
from loopwarden.verdicts import skip, stop, warn


def _metrics(**settings: Any) -> Metrics:
    return Metrics(MetricsSettings.model_validate(settings))


def _deployment(
    make_config: Callable[..., Config], factory: Callable[..., Deployment], **metrics: Any
) -> Deployment:
    names, objects = repeat_guard()
    plugins: dict[str, Any] = {
        "enabled": ["max_steps", *names, "metrics"],
        "max_steps": {"max_steps": 10},
    }
    if metrics:
        plugins["metrics"] = metrics
    return factory(make_config(plugins=plugins), plugins=objects, clock=FakeClock())


def test_runs_guards_steps_tokens_and_budget_use_end_to_end(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    dep = _deployment(make_config, deployment_factory)
    m: Metrics = dep.plugins.get("metrics")
    runs = [dep.run(scenario=s) for s in ("refund", ALWAYS_NOT_FOUND, ALWAYS_NOT_FOUND, WANDERING)]
    records = [r.record() for r in runs]
    assert [r["termination"] for r in records] == [
        "final_answer",
        "repeat_call",
        "repeat_call",
        "max_steps",
    ]

    assert m.value("runs_total", termination="final_answer") == 1
    assert m.value("runs_total", termination="repeat_call") == 2
    assert m.value("runs_total", termination="max_steps") == 1
    assert m.total("runs_total") == 4

    # every verdict of every run was counted, by plugin, reason and kind
    verdicts = [v for r in runs for v in r.verdicts]
    assert m.total("guard_firings_total") == len(verdicts)
    loop_stops = [v for v in verdicts if v["plugin"] == "repeat_call" and v["kind"] == "stop"]
    assert len(loop_stops) == 2
    assert (
        m.value("guard_firings_total", plugin="repeat_call", reason="repeat_call", kind="stop") == 2
    )
    assert m.total("guard_firings_total", plugin="max_steps", kind="stop") == sum(
        1 for v in verdicts if v["plugin"] == "max_steps" and v["kind"] == "stop"
    )
    # agent.loop_detected: every firing of the loop detector, none of max_steps
    loop_firings = [v for v in verdicts if v["plugin"] == "repeat_call"]
    assert m.total("agent.loop_detected") == len(loop_firings)
    assert m.value("agent.loop_detected", plugin="repeat_call", reason="repeat_call") == 2

    steps = m.histogram("steps_per_run")
    assert steps.count == 4 and steps.sum == sum(r["steps"] for r in records)
    tokens = m.histogram("tokens_per_run")
    assert tokens.sum == sum(r["tokens"]["total"] for r in records)
    assert tokens.buckets[float("inf")] == 4
    ratio = m.histogram("budget_use_ratio", budget="steps")  # max_steps = 10 (shipped default)
    assert ratio.count == 4
    assert ratio.sum == pytest.approx(sum(r["steps"] / 10 for r in records))
    assert ratio.buckets[1.0] == 4  # nobody used more than the whole budget
    assert m.histogram("budget_use_ratio", budget="tokens").count == 0  # no token limit

    assert m.value("model_calls_total") == sum(r["steps"] for r in records)
    assert m.value("tokens_total", kind="prompt") == sum(r["tokens"]["prompt"] for r in records)
    assert m.value("tokens_total", kind="completion") == sum(
        r["tokens"]["completion"] for r in records
    )
    executed = sum(r["tools_executed"] for r in records)
    assert m.total("tool_calls_total", outcome="ok") == executed
    assert m.value("tool_calls_total", tool="apply_refund", outcome="ok") == 1


def test_profile_limits_drive_budget_use(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    cfg = make_config(
        profiles={"simple": {"max_steps": 5, "max_tokens": 20000, "max_seconds": 30}},
        plugins={"enabled": ["max_steps", "metrics"]},
    )
    dep = deployment_factory(cfg, clock=FakeClock())
    rec = dep.run(scenario="refund", profile="simple").record()
    m: Metrics = dep.plugins.get("metrics")
    assert m.histogram("budget_use_ratio", budget="steps").sum == pytest.approx(rec["steps"] / 5)
    assert m.histogram("budget_use_ratio", budget="tokens").sum == pytest.approx(
        rec["tokens"]["total"] / 20000
    )
    assert m.histogram("budget_use_ratio", budget="seconds").count == 1


def test_guard_firings_hook_level() -> None:
    m = _metrics(loop_detectors=["repeat_call", "stall"])
    run = Run("u", clock=FakeClock())
    m.on_guard_triggered(run, verdict=warn("w", plugin="max_steps"))
    m.on_guard_triggered(run, verdict=skip("cached", plugin="repeat_call"))
    m.on_guard_triggered(run, verdict=stop("stall", plugin="custom", soft=True))
    m.on_guard_triggered(run, verdict=stop("repeat_call", plugin="repeat_call"))
    assert m.value("guard_firings_total", plugin="max_steps", reason="warn", kind="warn") == 1
    assert m.value("guard_firings_total", plugin="repeat_call", reason="skip", kind="skip") == 1
    assert m.value("agent.loop_detected", plugin="repeat_call", reason="skip") == 1
    assert m.value("agent.loop_detected", plugin="custom", reason="stall") == 1  # by reason
    assert m.total("agent.loop_detected") == 3
    assert m.value("agent.loop_detected", plugin="max_steps", reason="warn") == 0


def test_histogram_buckets_are_cumulative() -> None:
    m = _metrics(step_buckets=[1, 5, 10])
    run = Run("u", clock=FakeClock())
    for steps in (1, 2, 5, 7, 30):
        m.on_run_stopped(
            run,
            outcome=RunOutcome(termination="final_answer"),
            record={"steps": steps, "tokens": {"total": 0}},
        )
    h = m.histogram("steps_per_run")
    assert h.buckets == {1.0: 1, 5.0: 3, 10.0: 4, float("inf"): 5}
    assert h.count == 5 and h.sum == 45 and h.mean == 9
    snap = m.snapshot()
    assert snap["steps_per_run"] == [
        {
            "labels": {},
            "count": 5,
            "sum": 45.0,
            "buckets": {"1.0": 1, "5.0": 3, "10.0": 4, "+Inf": 5},
        }
    ]
    assert snap["runs_total"] == [{"labels": {"termination": "final_answer"}, "value": 5.0}]


def test_wrong_labels_are_an_error() -> None:
    m = _metrics()
    with pytest.raises(KeyError):
        m.value("runs_total", reason="x")


def test_bad_buckets_fail_validation(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    from loopwarden import ConfigError

    with pytest.raises(ConfigError) as err:
        deployment_factory(
            make_config(plugins={"enabled": ["metrics"], "metrics": {"step_buckets": [5, 1]}})
        )
    assert "plugins.metrics.step_buckets" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Prometheus
# ---------------------------------------------------------------------------------------------


def test_prometheus_exposition(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    pytest.importorskip("prometheus_client")
    dep = _deployment(make_config, deployment_factory, prometheus=True)
    dep.run(scenario="refund")
    dep.run(scenario=ALWAYS_NOT_FOUND)
    text = dep.plugins.get("metrics").exposition()
    assert 'loopwarden_runs_total{termination="final_answer"} 1.0' in text
    assert 'loopwarden_runs_total{termination="repeat_call"} 1.0' in text
    assert (
        'loopwarden_guard_firings_total{kind="stop",plugin="repeat_call",reason="repeat_call"} 1.0'
    ) in text
    assert 'agent_loop_detected_total{plugin="repeat_call",reason="repeat_call"} 1.0' in text
    assert "loopwarden_steps_per_run_count 2.0" in text
    assert 'loopwarden_budget_use_ratio_bucket{budget="steps",le="1.0"} 2.0' in text


def test_prometheus_http_endpoint(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    pytest.importorskip("prometheus_client")
    dep = _deployment(make_config, deployment_factory, prometheus=True, prometheus_port=0)
    dep.run(scenario="refund")
    server = dep.plugins.get("metrics").prometheus.server
    port = server[0].server_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read().decode()
    assert 'loopwarden_runs_total{termination="final_answer"} 1.0' in body
    dep.close()


def test_without_prometheus_client_it_degrades_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.metrics"):
        m = _metrics(prometheus=True)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "pip install 'loopwarden[prometheus]'" in msg
    with pytest.raises(PrometheusUnavailable, match=r"loopwarden\[prometheus\]"):
        m.exposition()
    m.on_run_stopped(
        Run("u", clock=FakeClock()), outcome=RunOutcome("final_answer"), record={"steps": 1}
    )
    assert m.value("runs_total", termination="final_answer") == 1  # in-process still works


def test_exposition_when_prometheus_is_off() -> None:
    with pytest.raises(PrometheusUnavailable, match="prometheus = true"):
        _metrics().exposition()


def test_invented_tool_names_do_not_grow_the_label_set(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    tmp_path: Any,
) -> None:
    scenario = tmp_path / "inventive.toml"
    scenario.write_text(
        'name = "inventive"\nuser = "u"\n[model]\nturns = [\n'
        + "".join(f'  {{ tool_calls = [{{ name = "made_up_{i}" }}] }},\n' for i in range(4))
        + ']\nthen = "final"\n',
        encoding="utf-8",
    )
    dep = _deployment(make_config, deployment_factory)
    dep.run(scenario=str(scenario))
    m: Metrics = dep.plugins.get("metrics")
    series = m.snapshot()["tool_calls_total"]
    assert series == [{"labels": {"tool": "(unknown)", "outcome": "error"}, "value": 4.0}]


def test_budget_plugins_limits_are_read_when_the_profile_has_none(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    from loopwarden import Plugin, hookimpl

    class FakeTokenBudget(Plugin):
        @hookimpl
        def budget_limits(self, run: Run) -> dict[str, float]:
            return {"tokens": 10_000}

    class FakeTimeout(Plugin):
        @hookimpl
        def budget_limits(self) -> dict[str, float]:
            return {"seconds": 120.0, "tokens": 1}  # tokens: the earlier plugin's figure wins

    cfg = make_config(plugins={"enabled": ["max_steps", "metrics"]})
    dep = deployment_factory(
        cfg,
        plugins={"token_budget": FakeTokenBudget(), "timeout": FakeTimeout()},
        clock=FakeClock(),
    )
    rec = dep.run(scenario="refund").record()
    m: Metrics = dep.plugins.get("metrics")
    assert m.histogram("budget_use_ratio", budget="tokens").sum == pytest.approx(
        rec["tokens"]["total"] / 10_000
    )
    assert m.histogram("budget_use_ratio", budget="seconds").count == 1
