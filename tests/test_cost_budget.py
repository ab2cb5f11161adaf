"""cost_budget: Decimal prices per model, run_cost(run), the ladder, and failing closed."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from support.budgets import config, request, response, scenario

from loopwarden import ConfigError, Conversation, Deployment, ModelResponse, Stop, Warn, signals
from loopwarden.config import parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.pluginmanager import load_plugins
from loopwarden.models.scripted import ScriptedModel
from loopwarden.plugins.cost_budget import (
    RUN_COST,
    CostBudget,
    CostBudgetSettings,
    ModelPrice,
    run_cost,
)
from loopwarden.testing import make_run, tool_call, turn

# One currency unit per prompt token, nothing for output, nothing reserved: the ladder's
# arithmetic in whole numbers.
UNIT = {"input": 1_000_000, "output": 0}


def plugin(**settings: Any) -> CostBudget:
    settings.setdefault("prices", {"scripted": UNIT})
    settings.setdefault("reserve_output_tokens", 0)
    return CostBudget(CostBudgetSettings.model_validate(settings))


def started(p: CostBudget, model: str = "scripted") -> Any:
    run = make_run()
    run.model_name = model  # priced by the run's (configured) model
    assert p.on_start(run) is None
    return run


# -- prices and Decimal arithmetic -------------------------------------------------------------


def test_price_per_million_tokens_with_cached_input() -> None:
    price = ModelPrice(input=Decimal("0.15"), cached_input=Decimal("0.075"), output=Decimal("0.60"))
    assert price.cost(1_000_000, 0) == Decimal("0.15")
    assert price.cost(1_000_000, 1_000_000, cached=1_000_000) == Decimal("0.675")
    assert price.cost(1000, 500, cached=400) == Decimal("0.00042")  # 600*.15+400*.075+500*.6
    # cached input without a cached price costs the input price
    assert ModelPrice(input=Decimal(1), output=Decimal(0)).cost(10, 0, cached=10) == Decimal(
        "0.00001"
    )


def test_toml_floats_become_exact_decimals() -> None:
    plugins = load_plugins(
        config(
            "cost_budget",
            cost_budget={"max_cost": 0.3, "prices": {"scripted": {"input": 0.1, "output": 0.2}}},
        )
    )
    s = plugins.get("cost_budget").settings
    assert s.max_cost == Decimal("0.3")
    assert s.prices["scripted"].cost(1_000_000, 1_000_000) == Decimal("0.3")  # not 0.30000000004


def test_bad_settings_fail_at_load_time() -> None:
    with pytest.raises(ConfigError, match=r"plugins\.cost_budget\.prices\.scripted\.output"):
        load_plugins(config("cost_budget", cost_budget={"prices": {"scripted": {"input": 1}}}))
    with pytest.raises(ConfigError, match=r"plugins\.cost_budget\.unknown_model"):
        load_plugins(config("cost_budget", cost_budget={"unknown_model": "maybe"}))
    with pytest.raises(ConfigError, match=r"plugins\.cost_budget.*warning"):
        load_plugins(config("cost_budget", cost_budget={"warning": "{euros}"}))


# -- fail closed at start-up -------------------------------------------------------------------


def test_an_unpriced_model_is_refused_before_any_call_when_unknown_model_is_error() -> None:
    sc = scenario([turn(None, tool_call("query_order", order_id="88231"))])
    dep = Deployment(
        config("cost_budget", cost_budget={"unknown_model": "error"}), tools=shop_tools()
    )
    model = ScriptedModel(sc.model, name="mystery-model", estimator=dep.estimator)
    rec = dep.run(scenario=sc, model=model).record()
    assert model.calls == 0  # nothing was spent
    assert rec["termination"] == "max_cost" and rec["soft"] is False
    assert rec["stopped_by"] == "cost_budget"
    assert rec["evidence"]["rule"] == "unpriced_model"
    assert rec["evidence"]["model"] == "mystery-model"
    assert "scripted" in rec["evidence"]["priced_models"]
    assert rec["final_answer_present"] is False and rec["final_answer"]  # the fallback
    assert rec["cost_known"] is False and rec["cost_source"] is None


def test_unknown_model_free_runs_at_no_cost() -> None:
    sc = scenario([turn(None, tool_call("query_order", order_id="88231"))], then="final")
    dep = Deployment(
        config("cost_budget", cost_budget={"unknown_model": "free"}), tools=shop_tools()
    )
    model = ScriptedModel(sc.model, name="mystery-model", estimator=dep.estimator)
    rec = dep.run(scenario=sc, model=model).record()
    assert rec["termination"] == "final_answer"
    assert rec["cost"] == 0 and rec["cost_currency"] == "USD"
    # the operator declared such models free: the cost is known (zero)
    assert rec["cost_known"] is True and rec["cost_source"] == "free"


def test_model_names_match_case_insensitively() -> None:
    p = plugin(prices={"GPT-4o-mini": UNIT})
    assert p.price_of("gpt-4o-mini") == ModelPrice.model_validate(UNIT)  # the table's
    assert p.configured_price("gpt-4o") is None and p.price_of(None) is None
    assert p.price_of("my-private-model") is None  # neither the table nor genai-prices


# -- run_cost ----------------------------------------------------------------------------------


def test_run_cost_is_the_exact_sum_of_every_response() -> None:
    sc = scenario(
        [
            turn("查订单", tool_call("query_order", order_id="88231")),
            turn("查政策", tool_call("search_knowledge", query="退货")),
        ],
        then="final",
    )
    dep = Deployment(config("cost_budget"), tools=shop_tools())
    seen: list[ModelResponse] = []

    def on_response(sender: Any, response: ModelResponse, **extra: Any) -> None:
        seen.append(response)

    with signals.model_responded.connected_to(on_response):
        run = dep.run(scenario=sc)
    expected = sum(
        (Decimal(r.usage.prompt) * Decimal("0.15") + Decimal(r.usage.completion) * Decimal("0.60"))
        / Decimal(1_000_000)
        for r in seen
        if r.usage is not None
    )
    assert len(seen) == 3
    assert run_cost(run) == expected and isinstance(run_cost(run), Decimal)
    rec = run.record()
    assert rec["cost"] == float(expected) and rec["cost_currency"] == "USD"


def test_a_response_is_priced_by_the_configured_model_not_the_name_it_returns() -> None:
    # The server names its own model: trusting that name would let it pick its own price
    # (cheaper than the budget assumes), and an odd value ("model": 7) would crash pricing.
    p = plugin(prices={"scripted": UNIT, "free-model": {"input": 0, "output": 0}})
    run = started(p)
    p.before_model(run, request(run, 10))
    run.step = 1
    p.after_response(run, response(prompt=10, model="free-model"))
    assert run_cost(run) == 10
    for odd in (7, None, ["x"], "unpriced-snapshot"):
        p.after_response(run, response(prompt=10, model=odd))
    assert run_cost(run) == 50 and run.errors == []


def test_unreported_usage_is_priced_from_the_estimate() -> None:
    p = plugin()
    run = started(p)
    p.before_model(run, request(run, 123))
    p.after_response(run, response(usage=False))
    assert run_cost(run) == 123


# -- the ladder: boundaries N-1, N, N+1 --------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "rung"), [(4, None), (5, None), (6, "soft"), (9, "soft"), (10, "soft"), (11, "hard")]
)
def test_before_model_boundaries(prompt: int, rung: str | None) -> None:
    # max_cost 10, a token costs 1: this call costs `prompt`, the next one (no growth yet) as
    # much again.  Soft once both no longer fit (> 5), hard once this one does not (> 10).
    p = plugin(max_cost=10, warn_at=None)
    run = started(p)
    v = p.before_model(run, request(run, prompt))
    if rung is None:
        assert v is None
        return
    assert isinstance(v, Stop) and v.reason == "max_cost" and v.soft is (rung == "soft")
    assert v.evidence["limit"] == Decimal(10) and v.evidence["currency"] == "USD"
    assert v.evidence["projected"] == Decimal(prompt)
    assert v.evidence["model"] == "scripted"


def test_spent_money_counts() -> None:
    p = plugin(max_cost=10, warn_at=None)
    run = started(p)
    run.stash[RUN_COST] = Decimal("8.5")
    v = p.before_model(run, request(run, 1))  # 9.5 now, 10.5 with the next one
    assert isinstance(v, Stop) and v.soft
    run.stash[RUN_COST] = Decimal("9.5")
    v = p.before_model(run, request(run, 1))  # 10.5: does not fit
    assert isinstance(v, Stop) and not v.soft


def test_reserved_output_is_priced_in() -> None:
    p = plugin(
        max_cost=10,
        warn_at=None,
        reserve_output_tokens=2,
        prices={"scripted": {"input": 1_000_000, "output": 1_000_000}},
    )
    run = started(p)
    v = p.before_model(run, request(run, 9))  # 9 + 2 reserved = 11 > 10
    assert isinstance(v, Stop) and not v.soft and v.evidence["reserved_output"] == 2


def test_warns_once_at_70_percent() -> None:
    p = plugin(max_cost=100, warn_at=0.7)
    run = started(p)
    assert p.before_model(run, request(run, 34)) is None  # after the next call: 68
    v = p.before_model(run, request(run, 35))  # growth 1: 35 + 36 = 71 >= 70
    assert isinstance(v, Warn)
    assert v.message == (
        "This run has spent 71% of its cost budget (71.00 of 100.00 USD). "
        "Plan the remaining work within it."
    )
    assert p.before_model(run, request(run, 35)) is None


def test_reconcile_stops_when_the_real_bill_passed_the_budget() -> None:
    p = plugin(max_cost=10)
    run = started(p)
    p.before_model(run, request(run, 1))
    assert p.after_response(run, response(prompt=9)) is None
    v = p.after_response(run, response(prompt=1))
    assert isinstance(v, Stop) and not v.soft and v.evidence["reconciled"] is True
    assert run_cost(run) == 10


def test_end_to_end_a_long_run_soft_stops_within_budget() -> None:
    sc = scenario(
        [turn(f"第 {i} 次检索", tool_call("search_knowledge", query=f"q{i}")) for i in range(30)],
        then="cycle",
    )
    dep = Deployment(
        config("cost_budget", max_steps={"max_steps": 50}, cost_budget={"max_cost": "0.002"}),
        tools=shop_tools(),
    )
    rec = dep.run(scenario=sc).record()
    assert rec["termination"] == "max_cost" and rec["soft"] is True
    assert rec["stopped_by"] == "cost_budget"
    assert rec["final_answer_present"] is True
    assert 0 < rec["cost"] <= 0.002
    assert [w["plugin"] for w in rec["warnings"]] == ["cost_budget"]
    assert rec["evidence"]["currency"] == "USD"
    assert rec["evidence"]["projected_with_next"] > 0.002


def test_an_unpriced_configured_model_is_a_config_error_before_any_run(
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from loopwarden.commands.cli import main
    from loopwarden.exceptions import ConfigError

    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[model]\nname = "qwen-plus"\n[plugins]\nenabled = ["cost_budget"]\n'
        '[plugins.cost_budget]\nunknown_model = "error"\n',
        encoding="utf-8",
    )
    assert main(["config", "check", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "plugins.cost_budget.prices" in err and "qwen-plus" in err and str(cfg) in err
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert main(["run", "hello", "--config", str(cfg)]) == 2
    assert "qwen-plus" in capsys.readouterr().err
    # configured otherwise: free
    cfg.write_text(
        '[model]\nname = "qwen-plus"\n[plugins]\nenabled = ["cost_budget"]\n'
        '[plugins.cost_budget]\nunknown_model = "free"\n',
        encoding="utf-8",
    )
    assert main(["config", "check", str(cfg)]) == 0
    with pytest.raises(ConfigError):
        Deployment(
            parse_config(
                {
                    "model": {"name": "mystery"},
                    "plugins": {
                        "enabled": ["cost_budget"],
                        "cost_budget": {"unknown_model": "error"},
                    },
                }
            ),
            tools=shop_tools(),
        ).check_model("mystery")


def test_conversation_limits_add_up_the_runs_cost_budget_spend() -> None:
    # conversation_limits reads each run's spend through run_cost(): the second run of a
    # conversation whose first run spent the conversation's max_cost stops before its
    # first model call would add more.
    sc = scenario([turn(None, tool_call("query_order", order_id="88231"))], then="final")
    first_cost = Deployment(config("cost_budget"), tools=shop_tools()).run(scenario=sc)
    limit = run_cost(first_cost)
    assert limit > 0
    cfg = config(
        "cost_budget",
        "conversation_limits",
        conversation_limits={"max_turns": None, "max_cost": str(limit), "warn_at": None},
    )
    dep = Deployment(cfg, tools=shop_tools())
    conv = Conversation()
    first = dep.run(scenario=sc, conversation=conv).record()
    second = dep.run(scenario=sc, conversation=conv).record()
    assert first["termination"] == "final_answer" and first["cost"] == float(limit)
    assert second["termination"] == "max_cost"
    assert second["stopped_by"] == "conversation_limits"
    assert second["evidence"]["scope"] == "conversation"
    assert second["evidence"]["spent"] == float(limit)


def test_conversation_limits_warn_of_a_cost_limit_and_stop_at_it() -> None:
    # max_cost is a Decimal and warn_at a float: the warning's threshold used to multiply them
    # (a TypeError: every run of such a conversation ended as plugin_error at its first call)
    sc = scenario([turn(None, tool_call("query_order", order_id="88231"))], then="final")
    one_run = run_cost(Deployment(config("cost_budget"), tools=shop_tools()).run(scenario=sc))
    cfg = config(
        "cost_budget",
        "conversation_limits",
        conversation_limits={"max_turns": None, "max_cost": str(one_run * 3), "warn_at": 0.5},
    )
    dep = Deployment(cfg, tools=shop_tools())
    conv = Conversation()
    records = [dep.run(scenario=sc, conversation=conv).record() for _ in range(4)]
    assert [r["termination"] for r in records] == [
        "final_answer",
        "final_answer",
        "final_answer",
        "max_cost",
    ]
    warnings = [w for r in records for w in r["warnings"]]
    assert [w["plugin"] for w in warnings] == ["conversation_limits"]  # once per conversation
    assert "of its" in warnings[0]["message"]
    assert records[3]["stopped_by"] == "conversation_limits"
    assert records[3]["evidence"]["scope"] == "conversation"
