"""The alerting plugin: severities, sinks (real HTTP), de-duplication, rate limit, threshold."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support import observability
from support.observability import (
    ALWAYS_NOT_FOUND,
    comparable,
    refused_url,
    repeat_guard,
    webhook_server,
)

from loopwarden import (
    ConfigError,
    Deployment,
    FakeClock,
    ModelError,
    ModelRequest,
    ModelResponse,
    PluginLoadError,
    Run,
    RunOutcome,
)
from loopwarden.config import Config
from loopwarden.demo import shop_tools
from loopwarden.plugins.alerting import Alerting, AlertingSettings, WebhookSink
from loopwarden.verdicts import Verdict, skip, stop, warn


def _deployment(
    make_config: Callable[..., Config],
    factory: Callable[..., Deployment],
    alerting: dict[str, Any] | None,
    *,
    clock: FakeClock | None = None,
    max_steps: dict[str, Any] | None = None,
) -> Deployment:
    names, objects = repeat_guard()
    enabled = ["max_steps", *names] + (["alerting"] if alerting is not None else [])
    plugins: dict[str, Any] = {"enabled": enabled}
    if max_steps:
        plugins["max_steps"] = max_steps
    if alerting:
        plugins["alerting"] = alerting
    return factory(make_config(plugins=plugins), plugins=objects, clock=clock or FakeClock())


def _alerting(**settings: Any) -> Alerting:
    plugin = Alerting(AlertingSettings.model_validate(settings))
    plugin.name = "alerting"
    return plugin


def _fire(
    plugin: Alerting, run: Run, verdict: Verdict, step: int = 1, hook: str = "before_tool"
) -> None:
    plugin.on_guard_triggered(run, verdict=verdict, hook=hook, step=step)


def _finish(plugin: Alerting, run: Run, termination: str) -> None:
    plugin.on_run_stopped(run, outcome=RunOutcome(termination=termination), record={})


@pytest.fixture
def collected() -> Iterator[list[dict[str, Any]]]:
    observability.COLLECTED.clear()
    observability.GATE.clear()
    observability.STARTED.clear()
    yield observability.COLLECTED
    observability.GATE.set()
    observability.COLLECTED.clear()


# ---------------------------------------------------------------------------------------------
# Done when: one JSON alert over real HTTP
# ---------------------------------------------------------------------------------------------


def test_always_not_found_delivers_one_json_alert_to_a_local_webhook(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    with webhook_server() as server:
        dep = _deployment(
            make_config,
            deployment_factory,
            {
                "sinks": [
                    {
                        "type": "webhook",
                        "url": server.url,
                        "min_severity": "soft_stop",
                        "timeout_s": 5.0,
                    }
                ],
            },
        )
        run = dep.run(scenario=ALWAYS_NOT_FOUND)
        dep.close()  # delivers what is queued
        record = run.record()
        assert record["termination"] == "repeat_call"
        assert len(server.bodies) == 1
        alert = server.bodies[0]
        assert server.content_types == ["application/json"]
    assert alert["reason"] == "repeat_call" and alert["plugin"] == "repeat_call"
    assert alert["severity"] == ("soft_stop" if record["soft"] else "hard_stop")
    assert alert["run_id"] == run.run_id
    assert alert["scenario"] == "always-not-found"
    assert alert["kind"] == "verdict" and alert["verdict"] == "stop"
    assert alert["soft"] is record["soft"]
    assert isinstance(alert["step"], int) and alert["step"] >= 1
    assert isinstance(alert["message"], str) and alert["message"]
    assert alert["evidence"] == record["evidence"]
    assert alert["suppressed"] == 0 and alert["source"] == "loopwarden"


def test_webhook_uses_httpx_or_httpx2() -> None:
    from loopwarden.plugins.alerting import WebhookSinkConfig

    sink = WebhookSink(WebhookSinkConfig(url="http://127.0.0.1:9/x"))
    assert sink.http_library in ("httpx", "httpx2")
    assert sink.label == "webhook(127.0.0.1:9)"


@pytest.mark.parametrize("dead", ["refused", "hangs"])
def test_a_dead_webhook_leaves_the_run_record_unchanged(
    dead: str,
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A short step budget that warns early: a warning and a stop, two alerts to fail on.
    steps = {"max_steps": 6, "warn_remaining": 4}
    baseline = (
        _deployment(make_config, deployment_factory, None, max_steps=steps)
        .run(scenario=ALWAYS_NOT_FOUND)
        .record()
    )
    with webhook_server(hang=True) as hanging:
        url = refused_url() if dead == "refused" else hanging.url
        dep = _deployment(
            make_config,
            deployment_factory,
            {
                "sinks": [
                    {"type": "webhook", "url": url, "min_severity": "warn", "timeout_s": 0.3}
                ],
                "dedup_window_s": 0,
                "close_timeout_s": 30,
            },
            max_steps=steps,
        )
        with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.alerting"):
            run = dep.run(scenario=ALWAYS_NOT_FOUND)
            record = run.record()
            dep.close()
    assert comparable(record) == comparable(baseline)
    assert record["errors"] == []
    plugin = dep.plugins.get("alerting")
    sink = plugin.sinks[0]
    assert sink.delivered == 0 and sink.failures == len(plugin.sent) >= 2
    failures = [
        r
        for r in caplog.records
        if "alert sink webhook" in r.getMessage() and "failed" in r.getMessage()
    ]
    assert len(failures) == 1  # logged once, however many alerts failed


def test_a_webhook_that_recovers_is_logged_again_once(caplog: pytest.LogCaptureFixture) -> None:
    with webhook_server() as server:
        plugin = _alerting(
            sinks=[{"type": "webhook", "url": server.url, "min_severity": "warn", "timeout_s": 2}],
            dedup_window_s=0,
        )
        sink = plugin.sinks[0]
        assert isinstance(sink, WebhookSink)
        good = sink.url
        run = Run("u", clock=FakeClock(), run_id="r1")
        with caplog.at_level(logging.INFO, logger="loopwarden.plugins.alerting"):
            sink.url = refused_url()
            _fire(plugin, run, stop("repeat_call", plugin="a"))
            _fire(plugin, run, stop("repeat_call", plugin="b"))
            assert plugin.flush(10)
            sink.url = good
            _fire(plugin, run, stop("repeat_call", plugin="c"))
            assert plugin.flush(10)
            plugin.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in messages) == 1
    assert sum("delivers again" in m for m in messages) == 1
    assert [b["plugin"] for b in server.bodies] == ["c"]
    assert sink.failures == 2 and sink.delivered == 1


# ---------------------------------------------------------------------------------------------
# Severity routing and sinks
# ---------------------------------------------------------------------------------------------


def test_severity_routing_by_minimum(caplog: pytest.LogCaptureFixture) -> None:
    plugin = _alerting(
        sinks=[
            {"type": "log", "logger": "loopwarden.alerts.all", "min_severity": "warn"},
            {"type": "log", "logger": "loopwarden.alerts.stops", "min_severity": "soft_stop"},
            {"type": "log", "logger": "loopwarden.alerts.pager", "min_severity": "hard_stop"},
        ],
        dedup_window_s=0,
    )
    run = Run("u", clock=FakeClock(), run_id="r-route", scenario="sc")
    with caplog.at_level(logging.DEBUG, logger="loopwarden.alerts"):
        _fire(plugin, run, warn("2 steps left", plugin="max_steps"))
        _fire(plugin, run, skip("cached", plugin="repeat_call", message="dup"))
        _fire(plugin, run, stop("stall", plugin="stall", soft=True))
        _fire(plugin, run, stop("repeat_call", plugin="repeat_call"))
    got: dict[str, list[str]] = {}
    for r in caplog.records:
        got.setdefault(r.name.rsplit(".", 1)[1], []).append(r.alert["severity"])  # type: ignore[attr-defined]
    assert got == {
        "all": ["warn", "warn", "soft_stop", "hard_stop"],
        "stops": ["soft_stop", "hard_stop"],
        "pager": ["hard_stop"],
    }
    levels = {r.alert["severity"]: r.levelno for r in caplog.records}  # type: ignore[attr-defined]
    assert levels == {
        "warn": logging.WARNING,
        "soft_stop": logging.WARNING,
        "hard_stop": logging.ERROR,
    }
    reasons = [a["reason"] for a in plugin.sent]
    assert reasons == ["warn", "skip", "stall", "repeat_call"]


def test_alert_below_every_sink_is_not_counted_by_the_rules() -> None:
    plugin = _alerting(sinks=[{"type": "log", "min_severity": "hard_stop"}], rate_limit=1)
    run = Run("u", clock=FakeClock(), run_id="r")
    for _ in range(5):
        _fire(plugin, run, warn("careful", plugin="max_steps"))
    _fire(plugin, run, stop("max_steps", plugin="max_steps"))
    assert [a["reason"] for a in plugin.sent] == ["max_steps"]


def test_stderr_sink(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = _alerting(sinks=[{"type": "stderr", "min_severity": "hard_stop"}])
    run = Run("u", clock=FakeClock(), run_id="r-err", scenario="always-not-found")
    _fire(
        plugin, run, stop("repeat_call", plugin="repeat_call", message="same call 3 times"), step=3
    )
    err = capsys.readouterr().err
    assert err == (
        "loopwarden alert: [hard_stop] repeat_call by repeat_call run=r-err "
        "scenario=always-not-found step=3: same call 3 times\n"
    )


def test_callable_sink_by_module_attr(collected: list[dict[str, Any]]) -> None:
    plugin = _alerting(
        sinks=[
            {"type": "callable", "target": "support.observability:collect", "min_severity": "warn"}
        ]
    )
    run = Run("u", clock=FakeClock(), run_id="r-call")
    _fire(plugin, run, stop("oscillation", plugin="oscillation", cycle=["a", "b"]), step=4)
    assert plugin.flush(10)
    plugin.close()
    assert len(collected) == 1
    assert collected[0]["reason"] == "oscillation"
    assert collected[0]["evidence"] == {"cycle": ["a", "b"]}
    assert collected[0]["message"] == "oscillation: hard_stop (oscillation) in run r-call at step 4"


def test_a_failing_callable_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    plugin = _alerting(
        sinks=[
            {"type": "callable", "target": "support.observability:explode", "min_severity": "warn"}
        ],
        dedup_window_s=0,
    )
    run = Run("u", clock=FakeClock(), run_id="r")
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.alerting"):
        for i in range(3):
            _fire(plugin, run, stop("repeat_call", plugin=f"p{i}"))
        assert plugin.flush(10)
        plugin.close()
    assert plugin.sinks[0].failures == 3
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "RuntimeError: sink is down" in msgs[0]


def test_a_full_queue_drops_and_says_so_once(
    collected: list[dict[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = _alerting(
        sinks=[
            {
                "type": "callable",
                "target": "support.observability:blocked",
                "min_severity": "warn",
                "queue_size": 1,
            }
        ],
        dedup_window_s=0,
    )
    sink = plugin.sinks[0]
    run = Run("u", clock=FakeClock(), run_id="r")
    with caplog.at_level(logging.WARNING, logger="loopwarden.plugins.alerting"):
        _fire(plugin, run, stop("r", plugin="p0"))
        # the worker holds the first alert: the queue is empty
        assert observability.STARTED.wait(10)
        _fire(plugin, run, stop("r", plugin="p1"))  # fills the queue
        _fire(plugin, run, stop("r", plugin="p2"))  # dropped
        _fire(plugin, run, stop("r", plugin="p3"))  # dropped
        observability.GATE.set()
        assert plugin.flush(10)
        plugin.close()
    assert [a["plugin"] for a in collected] == ["p0", "p1"]
    assert sink.dropped == 2  # type: ignore[attr-defined]
    drops = [r for r in caplog.records if "falling behind" in r.getMessage()]
    assert len(drops) == 1


def test_bad_sink_settings_fail_before_any_run(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    with pytest.raises(ConfigError) as err:
        deployment_factory(
            make_config(
                plugins={
                    "enabled": ["alerting"],
                    "alerting": {"sinks": [{"type": "webhook", "url": "ftp://x"}]},
                }
            )
        )
    assert "plugins.alerting.sinks.0.webhook.url" in str(err.value)
    with pytest.raises(ConfigError) as err:
        deployment_factory(
            make_config(
                plugins={"enabled": ["alerting"], "alerting": {"sinks": [{"type": "pager"}]}}
            )
        )
    assert "plugins.alerting.sinks.0" in str(err.value)
    with pytest.raises(PluginLoadError) as perr:
        deployment_factory(
            make_config(
                plugins={
                    "enabled": ["alerting"],
                    "alerting": {"sinks": [{"type": "callable", "target": "no_such_mod_xyz:f"}]},
                }
            )
        )
    assert "alerting" in str(perr.value) and "no_such_mod_xyz" in str(perr.value)
    with pytest.raises(ConfigError) as err:
        deployment_factory(
            make_config(plugins={"enabled": ["alerting"], "alerting": {"message": "{nope}"}})
        )
    assert "plugins.alerting" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Rules on the run's clock
# ---------------------------------------------------------------------------------------------


def test_deduplication_per_reason_and_plugin_over_a_window_on_the_run_clock() -> None:
    clock = FakeClock(1000.0)
    plugin = _alerting(sinks=[{"type": "log", "min_severity": "warn"}], dedup_window_s=300)
    run = Run("u", clock=clock, run_id="r")
    _fire(plugin, run, stop("repeat_call", plugin="repeat_call"))  # t=0: sent
    clock.advance(10)
    _fire(plugin, run, stop("repeat_call", plugin="repeat_call"))  # t=10: duplicate
    _fire(plugin, run, stop("repeat_call", plugin="custom_guard"))  # other plugin: sent
    _fire(plugin, run, stop("stall", plugin="repeat_call"))  # other reason: sent
    clock.advance(289.9)
    _fire(plugin, run, stop("repeat_call", plugin="repeat_call"))  # t=299.9: duplicate
    clock.advance(0.1)
    _fire(plugin, run, stop("repeat_call", plugin="repeat_call"))  # t=300: sent again
    sent = [(a["reason"], a["plugin"], a["suppressed"]) for a in plugin.sent]
    assert sent == [
        ("repeat_call", "repeat_call", 0),
        ("repeat_call", "custom_guard", 0),
        ("stall", "repeat_call", 0),
        ("repeat_call", "repeat_call", 2),
    ]
    assert plugin.limiter.suppressed == 2


def test_rate_limit_over_a_window_on_the_run_clock() -> None:
    clock = FakeClock()
    plugin = _alerting(
        sinks=[{"type": "log", "min_severity": "warn"}],
        dedup_window_s=0,
        rate_limit=2,
        rate_window_s=60,
    )
    run = Run("u", clock=clock, run_id="r")
    for name in ("a", "b", "c"):
        _fire(plugin, run, stop("x", plugin=name))
    clock.advance(59)
    _fire(plugin, run, stop("x", plugin="d"))
    clock.advance(1)  # the first two leave the window
    _fire(plugin, run, stop("x", plugin="c"))
    _fire(plugin, run, stop("x", plugin="e"))
    _fire(plugin, run, stop("x", plugin="f"))
    assert [(a["plugin"], a["suppressed"]) for a in plugin.sent] == [
        ("a", 0),
        ("b", 0),
        ("c", 1),
        ("e", 0),
    ]


def test_threshold_more_than_n_of_the_last_m_runs() -> None:
    clock = FakeClock()
    plugin = _alerting(
        sinks=[{"type": "log", "min_severity": "warn"}],
        threshold_runs=2,
        threshold_window=4,
        dedup_window_s=0,
    )
    run = Run("u", clock=clock, run_id="r", scenario="sc")

    def thresholds() -> list[dict[str, Any]]:
        return [a for a in plugin.sent if a["reason"] == "loop_rate"]

    for t in ("repeat_call", "final_answer", "stall"):
        _finish(plugin, run, t)
    assert thresholds() == []  # 2 of 3: not more than 2
    _finish(plugin, run, "max_steps")
    assert thresholds() == []  # 2 of 4
    _finish(plugin, run, "oscillation")  # window: final, stall, max, osc -> 2
    assert thresholds() == []
    _finish(plugin, run, "repeat_call")  # stall, max, osc, repeat -> 3 of 4
    (alert,) = thresholds()
    assert alert["plugin"] == "alerting" and alert["severity"] == "hard_stop"
    assert alert["kind"] == "threshold"
    assert alert["evidence"] == {
        "loop_runs": 3,
        "runs": 4,
        "window": 4,
        "threshold": 2,
        "reasons": {"oscillation": 1, "repeat_call": 1, "stall": 1},
    }
    assert alert["message"].startswith("3 of the last 4 runs stopped on a loop guard")
    _finish(plugin, run, "final_answer")  # max, osc, repeat, final -> 2: no alert
    assert len(thresholds()) == 1


def test_threshold_alert_end_to_end_is_deduplicated_on_the_run_clock(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    clock = FakeClock()
    dep = _deployment(
        make_config,
        deployment_factory,
        {
            "sinks": [{"type": "log", "min_severity": "hard_stop"}],
            "threshold_runs": 2,
            "threshold_window": 5,
            "dedup_window_s": 600,
        },
        clock=clock,
    )
    plugin = dep.plugins.get("alerting")
    for _ in range(5):
        dep.run(scenario=ALWAYS_NOT_FOUND)
        clock.advance(60)
    loop_rate = [a for a in plugin.sent if a["reason"] == "loop_rate"]
    assert len(loop_rate) == 1 and loop_rate[0]["evidence"]["loop_runs"] == 3
    clock.advance(600)
    dep.run(scenario=ALWAYS_NOT_FOUND)
    loop_rate = [a for a in plugin.sent if a["reason"] == "loop_rate"]
    assert len(loop_rate) == 2
    assert loop_rate[1]["suppressed"] == 2  # runs 4 and 5 were over the threshold too


def test_a_failed_model_alerts_as_a_core_hard_stop(
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    class Down:
        name = "down"

        def complete(self, request: ModelRequest) -> ModelResponse:
            raise ModelError("503 upstream unavailable", status=503, kind="server")

    dep = deployment_factory(
        make_config(plugins={"enabled": ["max_steps", "alerting"]}), clock=FakeClock()
    )
    run = dep.run("hello", model=Down(), run_id="r-down")
    assert run.record()["termination"] == "model_error"
    (alert,) = dep.plugins.get("alerting").sent
    assert alert["reason"] == "model_error" and alert["plugin"] == "loopwarden"
    assert alert["severity"] == "hard_stop" and alert["kind"] == "run"
    assert "503" in alert["message"]


def test_evidence_is_redacted_in_alerts() -> None:
    plugin = _alerting(sinks=[{"type": "log", "min_severity": "warn"}])
    run = Run("u", clock=FakeClock(), run_id="r")
    _fire(
        plugin,
        run,
        stop(
            "repeat_call",
            plugin="repeat_call",
            arguments={"order_id": "1", "api_key": "sk-abcdefghijklmnopq"},
        ),
    )
    assert plugin.sent[0]["evidence"] == {"arguments": {"order_id": "1", "api_key": "[REDACTED]"}}


def test_shipped_config_alerts_to_the_log_only(
    shipped_config: Config,
    deployment_factory: Callable[..., Deployment],
) -> None:
    dep = deployment_factory(shipped_config)
    plugin = dep.plugins.get("alerting")
    assert plugin is not None
    assert [(s.kind, s.min_rank) for s in plugin.sinks] == [("log", 1)]


def test_a_successful_hand_off_is_a_normal_ending_not_an_alert() -> None:
    from loopwarden import Deployment, load_config
    from loopwarden.config import default_config_path

    seen: list[dict[str, Any]] = []
    dep = Deployment(load_config(default_config_path()), tools=shop_tools())
    alerting = dep.plugins.get("alerting")
    original = alerting.dispatch
    alerting.dispatch = lambda run, alert: (seen.append(alert), original(run, alert))
    try:
        rec = dep.run(scenario="transfer-loop").record()
    finally:
        dep.close()
    assert rec["termination"] == "terminal_tool"
    assert [a["reason"] for a in seen] == []
