"""The budget and cap plugins' shared settings (plugins/_budgets.py: BudgetSettings).

One definition of ``warn_at`` and of the check of the configurable texts: every plugin that
inherits it keeps the same bounds and default, and rejects a text with an unknown field when
the config loads -- naming the key -- instead of failing in the middle of a run.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from loopwarden.engine.pluginmanager import builtin_settings
from loopwarden.plugins._budgets import BudgetSettings

BUDGET_PLUGINS = (
    "conversation_limits",
    "cost_budget",
    "spend_limits",
    "timeout",
    "token_budget",
    "tool_calls",
)


def settings(name: str) -> type[BudgetSettings]:
    model = builtin_settings()[name]
    assert model is not None and issubclass(model, BudgetSettings), name
    return model


def test_the_budget_plugins_share_one_settings_base() -> None:
    sharing = sorted(
        n for n, m in builtin_settings().items() if m is not None and issubclass(m, BudgetSettings)
    )
    assert sharing == sorted(BUDGET_PLUGINS)


@pytest.mark.parametrize("name", BUDGET_PLUGINS)
def test_warn_at_has_one_default_and_one_range(name: str) -> None:
    model = settings(name)
    assert model.model_validate({}).warn_at == 0.8
    assert model.model_validate({"warn_at": None}).warn_at is None
    assert model.model_validate({"warn_at": 1}).warn_at == 1
    for bad in (0, -0.1, 1.01):
        with pytest.raises(ValidationError, match="warn_at"):
            model.model_validate({"warn_at": bad})


def _texts(name: str) -> list[str]:
    """The settings whose default is a ``str.format`` template."""
    model = settings(name)
    return [
        key
        for key, info in model.model_fields.items()
        if isinstance(info.default, str) and "{" in info.default
    ]


@pytest.mark.parametrize(
    ("name", "key"), [(name, key) for name in BUDGET_PLUGINS for key in _texts(name)]
)
def test_a_text_with_an_unknown_field_fails_at_load_naming_its_key(name: str, key: str) -> None:
    model = settings(name)
    assert isinstance(getattr(model.model_validate({}), key), str)  # the default is valid
    with pytest.raises(ValidationError, match=rf"{key}: bad template field 'nope'"):
        model.model_validate({key: "over budget: {nope}"})


@pytest.mark.parametrize("name", BUDGET_PLUGINS)
def test_every_checked_text_is_a_setting(name: str) -> None:
    model = settings(name)
    assert model.templates, "a budget plugin has texts to check"
    assert set(model.templates) <= set(_texts(name))
