"""Prices and context windows of any model: the configured table, then genai-prices, and a
model nobody prices runs unpriced (noted, recorded) unless ``unknown_model = "error"``.

Expected prices come from genai-prices' own ``calc_price`` for the same usage, never from a
hard-coded number: the package's snapshot may change, the agreement must not.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage as GUsage
from genai_prices import calc_price
from support.budgets import config, scenario
from support.stores import deployment_for, make_store

from loopwarden import ConfigError, Deployment, ModelResponse, signals
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.models.scripted import ScriptedModel
from loopwarden.models.windows import context_window, known_window
from loopwarden.plugins.cost_budget import run_cost
from loopwarden.store import QUANTITIES, cost_units
from loopwarden.testing import tool_call, turn

PACKAGE_MODEL = "gpt-4.1-mini"  # not in the shipped [plugins.cost_budget.prices]
UNKNOWN = "my-local-vllm-model"
TWO_TURNS = [
    turn("查订单", tool_call("query_order", order_id="88231")),
    turn("查政策", tool_call("search_knowledge", query="退货")),
]


class _Renamed:
    """A model whose responses name another model (``response.model``), as servers may."""

    def __init__(self, inner: ScriptedModel, reported: str) -> None:
        self.inner, self.name, self.reported = inner, inner.name, reported

    def complete(self, request: Any) -> ModelResponse:
        response = self.inner.complete(request)
        response.model = self.reported
        return response


def _play(
    dep: Deployment, model_name: str, reported: str | None = None, **run: Any
) -> tuple[Any, list[ModelResponse]]:
    """Run a two-tool scenario answered by a scripted model called ``model_name`` (whose
    responses call it ``reported``); returns the run and every response it got."""
    sc = scenario(TWO_TURNS, then="final")
    model: Any = ScriptedModel(sc.model, name=model_name, estimator=dep.estimator)
    if reported is not None:
        model = _Renamed(model, reported)
    seen: list[ModelResponse] = []

    def on_response(sender: Any, response: ModelResponse, **extra: Any) -> None:
        seen.append(response)

    with signals.model_responded.connected_to(on_response):
        result = dep.run(scenario=sc, model=model, **run)
    return result, seen


def _package_cost(model: str, responses: list[ModelResponse]) -> Decimal:
    total = Decimal(0)
    for r in responses:
        assert r.usage is not None
        u = GUsage(
            input_tokens=r.usage.prompt,
            output_tokens=r.usage.completion,
            cache_read_tokens=r.usage.cached,
        )
        total += calc_price(u, model).total_price
    return total


# -- prices ------------------------------------------------------------------------------------


def test_a_model_the_table_lacks_is_priced_by_genai_prices() -> None:
    dep = Deployment(config("cost_budget"), tools=shop_tools())
    run, seen = _play(dep, PACKAGE_MODEL)
    rec = run.record()
    assert rec["termination"] == "final_answer" and len(seen) == 3
    expected = _package_cost(PACKAGE_MODEL, seen)
    assert expected > 0
    assert run_cost(run) == expected and isinstance(run_cost(run), Decimal)
    assert rec["cost"] == float(expected) and rec["cost_currency"] == "USD"
    assert rec["cost_known"] is True and rec["cost_source"] == "genai-prices"
    assert rec["model"] == PACKAGE_MODEL


def test_the_configured_table_overrides_the_package() -> None:
    table = {"prices": {PACKAGE_MODEL: {"input": 100, "output": 1000}}}
    dep = Deployment(config("cost_budget", cost_budget=table), tools=shop_tools())
    run, seen = _play(dep, PACKAGE_MODEL)
    expected = sum(
        (Decimal(r.usage.prompt) * 100 + Decimal(r.usage.completion) * 1000) / Decimal(1_000_000)
        for r in seen
        if r.usage is not None
    )
    assert run_cost(run) == expected
    assert run_cost(run) != _package_cost(PACKAGE_MODEL, seen)
    assert run.record()["cost_source"] == "prices"


def test_the_package_is_not_used_for_another_currency() -> None:
    # genai-prices is in USD: a budget in EUR prices only what its own table says
    table = {"currency": "EUR", "unknown_model": "error"}
    dep = Deployment(config("cost_budget", cost_budget=table), tools=shop_tools())
    run, _ = _play(dep, PACKAGE_MODEL)
    rec = run.record()
    assert rec["termination"] == "max_cost" and rec["evidence"]["rule"] == "unpriced_model"


def test_a_max_cost_stop_of_a_package_priced_model_shows_the_package_price() -> None:
    dep = Deployment(
        config("cost_budget", cost_budget={"max_cost": "0.0001", "warn_at": None}),
        tools=shop_tools(),
    )
    rec = _play(dep, PACKAGE_MODEL)[0].record()
    assert rec["termination"] == "max_cost" and rec["stopped_by"] == "cost_budget"
    price = rec["evidence"]["price"]
    assert price["source"] == "genai-prices" and price["model"] == PACKAGE_MODEL
    mp = calc_price(GUsage(input_tokens=0, output_tokens=0), PACKAGE_MODEL).model_price
    assert Decimal(str(price["input"])) == mp.input_mtok


# -- a model nobody prices ---------------------------------------------------------------------


def test_an_unknown_model_runs_unpriced_with_a_note_and_an_unknown_cost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a tiny max_cost: it cannot be enforced for an unpriced run, so it must not stop it
    dep = Deployment(
        config("cost_budget", cost_budget={"max_cost": "0.000001"}), tools=shop_tools()
    )
    with caplog.at_level(logging.WARNING, logger="loopwarden"):
        first = _play(dep, UNKNOWN)[0].record()
        second = _play(dep, UNKNOWN)[0].record()
    assert first["termination"] == second["termination"] == "final_answer"
    assert first["final_answer_present"] is True
    assert first["cost"] == 0.0 and first["cost_known"] is False
    assert first["cost_source"] is None and first["model"] == UNKNOWN
    notes = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "loopwarden.plugins.cost_budget"
    ]
    assert len(notes) == 1  # once per model, not per run
    text = notes[0].getMessage()
    assert UNKNOWN in text and "[model]" in text and "[plugins.cost_budget.prices]" in text


def test_token_budgets_still_apply_to_an_unpriced_run() -> None:
    cfg = config(
        "cost_budget",
        "token_budget",
        token_budget={"max_total_tokens": 300, "warn_at": None},
    )
    dep = Deployment(cfg, tools=shop_tools())
    sc = scenario([turn("查订单", tool_call("query_order", order_id="88231"))])  # repeats
    model = ScriptedModel(sc.model, name=UNKNOWN, estimator=dep.estimator)
    rec = dep.run(scenario=sc, model=model).record()
    assert rec["termination"] == "max_tokens" and rec["stopped_by"] == "token_budget"
    assert rec["cost_known"] is False


def test_unknown_model_error_is_a_config_error_at_start_up() -> None:
    data = {
        "model": {"name": UNKNOWN},
        "plugins": {"enabled": ["cost_budget"], "cost_budget": {"unknown_model": "error"}},
    }
    dep = Deployment(parse_config(data, path="<test>"), tools=shop_tools())
    with pytest.raises(ConfigError, match=r"plugins\.cost_budget\.prices") as err:
        dep.model  # noqa: B018 - what `loopwarden run` does first
    assert UNKNOWN in str(err.value)
    dep.check_model(PACKAGE_MODEL)  # priced by the package: accepted
    dep.close()


def test_the_cli_notes_an_unpriced_model(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopwarden.commands.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[model]\nname = "{UNKNOWN}"\n[plugins]\nenabled = ["cost_budget"]\n', encoding="utf-8"
    )
    assert main(["config", "check", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and UNKNOWN in err and "[plugins.cost_budget.prices]" in err


# -- context windows ---------------------------------------------------------------------------


def test_a_package_known_model_gets_the_package_window() -> None:
    model = "grok-3"
    assert known_window(model) is None  # not in the hand table
    package = calc_price(GUsage(input_tokens=0, output_tokens=0), model).model.context_window
    assert package is not None
    assert context_window(model) == (package, "genai-prices")
    assert context_window(model, 4096) == (4096, "model.context_window")  # declared wins
    dep = Deployment(
        parse_config({"model": {"name": model}, "plugins": {"enabled": ["token_budget"]}}),
        tools=shop_tools(),
    )
    tb = dep.plugins.get("token_budget")
    assert tb.max_context == int(package * 0.8) and "genai-prices" in tb.context_source


def test_base_url_picks_the_provider_and_a_wrong_one_does_not_crash() -> None:
    deepseek = calc_price(
        GUsage(input_tokens=0, output_tokens=0),
        "deepseek-chat",
        provider_api_url="https://api.deepseek.com",
    ).model.context_window
    assert context_window("deepseek-chat", base_url="https://api.deepseek.com") == (
        deepseek,
        "genai-prices",
    )
    # a local server the package does not know: the name alone decides
    local = context_window(PACKAGE_MODEL, base_url="http://127.0.0.1:9/v1")
    assert local == context_window(PACKAGE_MODEL)
    assert context_window(UNKNOWN, base_url="http://127.0.0.1:9/v1")[1] == "default"


# -- spend_limits prices the same way ----------------------------------------------------------


def test_spend_limits_prices_the_run_model_like_cost_budget(store_url: str) -> None:
    budget = [{"scope": "deployment", "window": "total", "max_cost": 100.0}]
    with deployment_for(
        store_url, plugins={"spend_limits": {"budgets": budget}}, enabled=("spend_limits",)
    ) as dep:
        run, seen = _play(dep, PACKAGE_MODEL, reported="gpt-4o")
    assert run.outcome.termination == "final_answer"
    store = make_store(store_url)
    row = store.rows()[0]
    store.close()
    # each call charged at genai-prices' price of the run's model, not at the table's price
    # of "gpt-4o", which is what the responses call themselves
    assert [r.model for r in seen] == ["gpt-4o"] * 3
    expected = sum(cost_units(_package_cost(PACKAGE_MODEL, [r])) for r in seen)
    assert expected > 0
    assert row.committed[QUANTITIES.index("cost")] == expected


# -- the command line and the report -----------------------------------------------------------


def test_cli_run_of_an_unpriced_model_notes_it_and_runs(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from support.openai_stub import completion, serve

    from loopwarden.commands.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with serve() as (stub, url):
        stub.push(completion("done", usage={"prompt_tokens": 50, "completion_tokens": 5}))
        cfg = tmp_path / "c.toml"
        cfg.write_text(
            f'[model]\nname = "{UNKNOWN}"\nbase_url = "{url}"\n'
            '[plugins]\nenabled = ["max_steps", "cost_budget"]\n',
            encoding="utf-8",
        )
        assert main(["run", "hello", "--json", "--config", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "loopwarden run: note:" in out.err and "[plugins.cost_budget.prices]" in out.err
    rec = json.loads(out.out)
    assert rec["termination"] == "final_answer" and rec["final_answer"] == "done"
    assert rec["cost_known"] is False and rec["model"] == UNKNOWN


def test_report_counts_unpriced_runs_apart() -> None:
    from loopwarden.report import analyse, format_text

    priced = {"termination": "final_answer", "cost": 0.5, "cost_known": True, "model": "a"}
    old = {"termination": "final_answer", "cost": 0.7, "model": "a"}  # before cost_known
    unpriced = {"termination": "final_answer", "cost": 0.0, "cost_known": False, "model": UNKNOWN}
    report = analyse([priced, old, unpriced, dict(unpriced)])
    assert report["unpriced"] == {"runs": 2, "models": {UNKNOWN: 2}}
    assert report["cost"]["p50"] == pytest.approx(0.6)  # the unpriced 0.0s left out
    text = format_text(report)
    assert "unpriced runs: 2" in text and f"{UNKNOWN} (2)" in text
