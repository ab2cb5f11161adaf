"""Scenario files: what the scripted model plays (TOML, see docs/contracts.md).

::

    name = "always-not-found"
    user = "查询订单 99999 的状态"
    [model]
    turns = [ { content = "...",
                tool_calls = [{ name = "query_order", arguments = { order_id = "99999" } }] } ]
    then = "repeat_last"     # "repeat_last" | "cycle" | "final"
    on_warning = "ignore"    # "ignore" | "final"
    final_text = "..."
    [tools.query_order]
    results = ["NOT_FOUND: ..."]      # in order, the last one repeats; an entry may be
                                      # { error = "...", retryable = true }
    # error = { message = "...", retryable = true }
    # delay_s = 5.0

Compatible extensions: ``description``, ``profile`` (a profile name from the config),
``[expect]`` (what the scenario should end as, for tests and benchmarks: ``termination``,
``onset`` -- the step at which its loop becomes established -- and ``healthy``), and, for
tools the deployment does not have, ``read_only`` / ``deterministic`` / ``side_effect`` /
``terminal`` / ``description`` in the tool's table -- or ``declared = false``: a tool whose
nature nobody declared, as a framework's or an MCP server's.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from loopwarden.clock import MAX_DURATION_S
from loopwarden.exceptions import ConfigError, ScenarioError, load_toml, validation_error

__all__ = ["Scenario", "builtin_scenarios", "load_scenario", "scenario_path"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScriptedCall(_Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class Turn(_Strict):
    content: str | None = None
    tool_calls: list[ScriptedCall] = Field(default_factory=list)


class ScriptConfig(_Strict):
    turns: list[Turn] = Field(default_factory=list)
    then: Literal["repeat_last", "cycle", "final"] = "final"
    on_warning: Literal["ignore", "final"] = "ignore"
    final_text: str = "OK."


class ToolError_(_Strict):
    error: str
    retryable: bool = False


class ErrorSpec(_Strict):
    message: str
    retryable: bool = False


class ToolScript(_Strict):
    results: list[str | ToolError_] | None = None
    error: ErrorSpec | str | None = None
    # a duration as the config's Seconds: finite, 0 to MAX_DURATION_S (a scenario file is no
    # config table: the models read nothing of the config at run time)
    delay_s: float = Field(default=0.0, ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    # for tools the deployment does not have
    description: str | None = None
    read_only: bool | None = None
    deterministic: bool | None = None
    side_effect: bool | None = None
    terminal: bool | None = None
    #: false: the tool's nature is not declared at all (a framework's or an MCP server's tool
    #: nobody described) -- it runs every time it is called and the flags above may not be set
    declared: bool | None = None

    @field_validator("results")
    @classmethod
    def _non_empty(cls, v: list[Any] | None) -> list[Any] | None:
        if v is not None and not v:
            raise ValueError("results must not be empty (leave it out to run the real tool)")
        return v

    @model_validator(mode="after")
    def _undeclared_has_no_flags(self) -> ToolScript:
        flags = ("read_only", "deterministic", "side_effect", "terminal")
        if self.declared is False and any(getattr(self, k) is not None for k in flags):
            raise ValueError("declared = false: a tool whose nature is undeclared has no flags")
        return self


class Expect(_Strict):
    termination: str | list[str] | None = None
    onset: int | None = None
    healthy: bool | None = None
    kind: str | None = None


class Scenario(_Strict):
    name: str
    user: str
    description: str | None = None
    profile: str | None = None
    model: ScriptConfig = Field(default_factory=ScriptConfig)
    tools: dict[str, ToolScript] = Field(default_factory=dict)
    expect: Expect = Field(default_factory=Expect)
    path: str | None = Field(default=None, exclude=True)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file and the key."""
    p = Path(path)
    try:
        data = load_toml(p)
    except ConfigError as exc:
        raise ScenarioError(exc.message, path=exc.path, key=exc.key) from None
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        err = validation_error(exc, path=str(p))
        raise ScenarioError(err.message, path=err.path, key=err.key) from None
    return sc.model_copy(update={"path": str(p)})


def scenarios_dir() -> Path:
    """Where the built-in scenarios live: package data of the demo (``loopwarden.demo``),
    found without importing it."""
    return Path(str(resources.files("loopwarden") / "demo" / "scenarios"))


def builtin_scenarios() -> list[Path]:
    """The scenario files shipped as package data, by name."""
    return sorted(scenarios_dir().glob("*.toml"))


def scenario_path(name_or_path: str) -> Path:
    """A path as given, or the built-in scenario of that name.

    A name that is neither a file nor a built-in scenario is a :class:`ScenarioError` that
    lists the built-in scenarios and suggests the closest name (not the package's path).
    """
    p = Path(name_or_path)
    if p.exists() or p.suffix == ".toml" or "/" in name_or_path or "\\" in name_or_path:
        return p
    builtin = scenarios_dir() / f"{name_or_path}.toml"
    if builtin.is_file():
        return builtin
    names = sorted(f.stem for f in scenarios_dir().glob("*.toml"))
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ScenarioError(
        f"no scenario {name_or_path!r}: {hint}built-in scenarios: {', '.join(names)} "
        "(or give the path of a scenario file, e.g. ./my-scenario.toml)"
    )
