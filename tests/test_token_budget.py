"""token_budget: max_context and max_total_tokens, reserved before a call, reconciled after;
and the estimator it relies on (CJK-aware; tiktoken only when cached offline)."""

from __future__ import annotations

import hashlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.budgets import config, request, response, scenario

from loopwarden import ConfigError, Deployment, Limits, Stop, Warn
from loopwarden.models import tokens as tokens_mod
from loopwarden.models.tokens import (
    estimate_message,
    estimate_text,
    get_estimator,
    reset_tiktoken,
    tiktoken_cache_file,
    tiktoken_estimator,
)
from loopwarden.plugins.token_budget import TokenBudget, TokenBudgetSettings
from loopwarden.testing import make_run, tool_call, turn

C, R = 8000, 1000  # max_context and reserved output in the boundary tests


def plugin(**settings: Any) -> TokenBudget:
    settings.setdefault("max_context", C)
    settings.setdefault("reserve_output_tokens", R)
    return TokenBudget(TokenBudgetSettings(**settings))


# -- max_context: boundaries N-1, N, N+1 -------------------------------------------------------


@pytest.mark.parametrize(
    ("request_size", "rung"),
    [
        (C - 1, "soft"),  # this call fits (with its reserve): it becomes the final turn
        (C, "soft"),
        (C + 1, "hard"),  # this call itself does not fit
    ],
)
def test_context_hard_boundary(request_size: int, rung: str) -> None:
    run = make_run()
    v = plugin(warn_at=None).before_model(run, request(run, request_size - R))
    assert isinstance(v, Stop) and v.reason == "max_context"
    assert v.soft is (rung == "soft")
    assert v.evidence["limit"] == C and v.evidence["projected"] == request_size
    assert v.evidence["estimate"] == request_size - R and v.evidence["reserved_output"] == R


@pytest.mark.parametrize(("next_size", "stops"), [(C - 1, False), (C, False), (C + 1, True)])
def test_context_soft_boundary_on_the_projected_next_call(next_size: int, stops: bool) -> None:
    # First call: no growth seen yet, so the next request is projected as this prompt plus
    # this call's reserved output, plus the next call's own reserve.
    run = make_run()
    v = plugin(warn_at=None).before_model(run, request(run, next_size - 2 * R))
    if stops:
        assert isinstance(v, Stop) and v.soft and v.reason == "max_context"
        assert v.evidence["projected_with_next"] == next_size
    else:
        assert v is None


def test_projection_follows_the_observed_growth() -> None:
    p = plugin(warn_at=None)
    run = make_run()
    assert p.before_model(run, request(run, 1000)) is None
    run.step = 1
    # the prompt grew by 3000 (a big observation): the next one is expected to grow as much
    v = p.before_model(run, request(run, 4000))  # next: 4000 + 3000 + 1000 = 8000 -> fits
    assert v is None
    run.step = 2
    v = p.before_model(run, request(run, 4001))  # growth 1: next = 4001 + 1000 + 1000 fits
    assert v is None
    run.step = 3
    v = p.before_model(run, request(run, 5501))  # growth 1500: next 5501+1500+1000 > 8000
    assert isinstance(v, Stop) and v.soft
    assert v.evidence["growth"] == 1500 and v.evidence["projected_with_next"] == 8001


def test_a_final_turn_is_never_made_final_again_but_can_be_refused() -> None:
    run = make_run()
    assert plugin(warn_at=None).before_model(run, request(run, C - 2 * R + 1, final=True)) is None
    v = plugin(warn_at=None).before_model(run, request(run, C - R + 1, final=True))
    assert isinstance(v, Stop) and not v.soft


def test_request_max_output_tokens_is_the_reserve() -> None:
    run = make_run()
    v = plugin(warn_at=None).before_model(run, request(run, C - 100 + 1, max_output=100))
    assert isinstance(v, Stop) and not v.soft and v.evidence["reserved_output"] == 100


# -- warnings ----------------------------------------------------------------------------------


def test_context_warns_once_when_the_next_request_passes_70_percent() -> None:
    p = plugin(warn_at=0.7)  # -> 5600
    run = make_run()
    assert p.before_model(run, request(run, 5600 - 2 * R - 1)) is None  # next: 5599
    v = p.before_model(run, request(run, 5600 - 2 * R))  # next: growth 1 -> 5600
    assert isinstance(v, Warn)
    assert v.message.startswith("The conversation is at 70% of its context budget")
    assert v.evidence["threshold"] == 0.7
    assert p.before_model(run, request(run, 5600 - 2 * R)) is None  # once


def test_total_warning_text_is_configurable() -> None:
    p = plugin(max_total_tokens=10_000, total_warning="已用 {percent}%（{used}/{limit}）")
    run = make_run()
    run.usage.prompt = 5000
    v = p.before_model(run, request(run, 100))  # 5000 + 1100 + 2100 = 8200 >= 7000
    assert isinstance(v, Warn) and v.message == "已用 82%（8200/10000）"


def test_bad_template_fails_at_load_time() -> None:
    from loopwarden.engine.pluginmanager import load_plugins

    with pytest.raises(ConfigError, match=r"plugins\.token_budget.*context_warning"):
        load_plugins(config("token_budget", token_budget={"context_warning": "{tokens}"}))


# -- max_total_tokens: reserve, then reconcile -------------------------------------------------


# limit 10,000; a prompt of 1,100 with 1,000 reserved: this call needs 2,100; the next one
# (no growth seen yet) 1,100 + 1,000 + 1,000 = 3,100 more.  Hard past 7,900 spent (this call
# does not fit), soft past 4,800 (this call fits, the next would not).
@pytest.mark.parametrize(
    ("spent", "rung"),
    [(4799, None), (4800, None), (4801, "soft"), (7899, "soft"), (7900, "soft"), (7901, "hard")],
)
def test_total_boundaries(spent: int, rung: str | None) -> None:
    p = plugin(max_context=100_000, max_total_tokens=10_000, warn_at=None)
    run = make_run()
    run.usage.prompt = spent
    v = p.before_model(run, request(run, 1100))
    if rung is None:
        assert v is None
        return
    assert isinstance(v, Stop) and v.reason == "max_tokens" and v.soft is (rung == "soft")
    assert v.evidence["spent"] == spent and v.evidence["limit"] == 10_000
    assert v.evidence["projected"] == spent + 2100
    assert v.evidence["projected_with_next"] == spent + 5200


def test_profile_max_tokens_overrides_max_total_tokens() -> None:
    p = plugin(max_context=100_000, max_total_tokens=1_000_000, warn_at=None)
    run = make_run(limits=Limits(name="simple", max_tokens=3000))
    v = p.before_model(run, request(run, 1500))
    assert isinstance(v, Stop) and v.reason == "max_tokens"
    assert v.evidence["max_total_tokens"] == 3000
    assert v.evidence["total_source"] == "profile simple"


def test_reconcile_stops_when_real_usage_passed_the_limit() -> None:
    p = plugin(max_context=100_000, max_total_tokens=10_000)
    run = make_run()
    p.before_model(run, request(run, 100))
    run.usage.prompt, run.usage.completion = 9000, 999  # billed: 9,999
    assert p.after_response(run, response()) is None
    run.usage.completion += 1  # 10,000: nothing more can be spent
    v = p.after_response(run, response())
    assert isinstance(v, Stop) and not v.soft and v.reason == "max_tokens"
    assert v.evidence["reconciled"] is True
    # a final answer is not stopped (the run ends anyway)
    assert p.after_response(run, response(tools=0)) is None


def test_unreported_usage_is_counted_from_the_estimates() -> None:
    p = plugin(max_context=100_000, max_total_tokens=10_000)
    run = make_run()
    p.before_model(run, request(run, 4000))
    p.after_response(run, response(usage=False, content="x" * 40))
    assert p.spent(run) == 4000 + 10 + estimate_text("query_order") + estimate_text(
        '{"order_id": "88231"}'
    )


# -- the estimator: CJK and English ------------------------------------------------------------


def test_cjk_counts_one_token_per_character_english_about_four_characters() -> None:
    assert estimate_text("退货退款") == 4
    assert estimate_text("返品・返金") == 5  # kana and full-width punctuation too
    assert estimate_text("환불") == 2
    assert estimate_text("refund") == 2  # 6 characters -> ceil(6/4)
    assert estimate_text("abcdefgh") == 2
    assert estimate_text("订单 88231") == 2 + 2  # 2 CJK + " 88231" (6 chars)
    assert estimate_text("") == 0
    assert estimate_message({"role": "user", "content": "退货"}) == 2 + tokens_mod.MESSAGE_OVERHEAD


def _flood(observation: str, max_context: int) -> dict[str, Any]:
    sc = scenario(
        [turn("查一下", tool_call("search_knowledge", query="退货"))],
        then="final",
        tools={"search_knowledge": {"results": [observation]}},
    )
    dep = Deployment(
        config("token_budget", token_budget={"max_context": max_context, "warn_at": None})
    )
    return dep.run(scenario=sc).record()


def test_the_same_length_in_chinese_weighs_four_times_english() -> None:
    chinese = "七天无理由退货政策说明" * 300  # 3,300 characters -> 3,300 tokens
    english = ("Seven-day no-reason returns! " * 114)[:3300]  # 3,300 characters -> 825 tokens
    assert _flood(chinese, 4000)["termination"] == "max_context"
    assert _flood(english, 4000)["termination"] == "final_answer"


# -- tiktoken: used only when its encoding is cached; never downloads --------------------------


@pytest.fixture
def tiktoken_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A fake tiktoken module and an empty cache directory; records every get_encoding."""
    calls: list[str] = []

    class FakeEncoding:
        def encode(self, text: str, disallowed_special: Any = ()) -> list[int]:
            return [0] * len(text.split())

    def get_encoding(name: str) -> FakeEncoding:
        calls.append(name)
        return FakeEncoding()

    fake = types.ModuleType("tiktoken")
    fake.get_encoding = get_encoding  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    reset_tiktoken()
    yield {"calls": calls, "dir": tmp_path}
    reset_tiktoken()


def test_without_a_cached_encoding_tiktoken_is_never_asked(tiktoken_env: dict[str, Any]) -> None:
    assert tiktoken_estimator() is None
    assert get_estimator("auto") is estimate_text
    with pytest.raises(ConfigError, match="token_estimator"):
        get_estimator("tiktoken")
    assert tiktoken_env["calls"] == []  # get_encoding would have downloaded


def test_a_corrupt_cache_file_is_not_used(tiktoken_env: dict[str, Any]) -> None:
    path = tiktoken_cache_file()
    assert path is not None and path.parent == tiktoken_env["dir"]
    path.write_bytes(b"not the encoding")
    assert tiktoken_estimator() is None
    assert tiktoken_env["calls"] == []  # tiktoken would re-download a corrupt file


def test_a_cached_encoding_is_used(
    tiktoken_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tiktoken_cache_file()
    assert path is not None
    data = b"fake ranks"
    path.write_bytes(data)
    url, _ = tokens_mod._TIKTOKEN_FILES["o200k_base"]
    assert path.name == hashlib.sha1(url.encode()).hexdigest()  # tiktoken's cache key
    monkeypatch.setitem(
        tokens_mod._TIKTOKEN_FILES, "o200k_base", (url, hashlib.sha256(data).hexdigest())
    )
    est = get_estimator("auto")
    assert est is not estimate_text
    assert est("three words here") == 3 and est("") == 0
    assert get_estimator("tiktoken") is est
    assert tiktoken_env["calls"] == ["o200k_base"]  # loaded once per process


def test_caching_switched_off_means_unavailable(
    tiktoken_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    assert tiktoken_cache_file() is None
    assert tiktoken_estimator() is None


def test_tiktoken_not_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # import fails
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    path = tiktoken_cache_file()
    assert path is not None
    path.write_bytes(b"x")
    url, _ = tokens_mod._TIKTOKEN_FILES["o200k_base"]
    monkeypatch.setitem(
        tokens_mod._TIKTOKEN_FILES, "o200k_base", (url, hashlib.sha256(b"x").hexdigest())
    )
    reset_tiktoken()
    try:
        assert get_estimator("auto") is estimate_text
    finally:
        reset_tiktoken()


def test_cache_location_follows_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", "/somewhere")
    path = tiktoken_cache_file()
    assert path is not None and str(path.parent) == "/somewhere"
