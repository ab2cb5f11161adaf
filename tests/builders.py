"""Small builders shared by the core tests (plain functions, no fixtures)."""

from __future__ import annotations

from typing import Any

from loopwarden.models.scripted import ScriptedModel
from loopwarden.scenario import ScriptConfig


def script(
    *turns: dict[str, Any],
    then: str = "final",
    final_text: str = "done",
    on_warning: str = "ignore",
) -> ScriptedModel:
    """A scripted model from turn dicts: {"content": ..., "tool_calls": [{"name", "arguments"}]}."""
    cfg = ScriptConfig.model_validate(
        {"turns": list(turns), "then": then, "final_text": final_text, "on_warning": on_warning}
    )
    return ScriptedModel(cfg)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}
