"""Config that means what it says (issue 33): the loader refuses what the JSON Schema of
``loopwarden config schema`` refuses -- a string or a boolean where a number is expected, a
number where a boolean is -- naming the key (exit 2), and every duration is bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib
from pydantic import BaseModel, ValidationError
from support.cli import loopwarden

from loopwarden.clock import MAX_DURATION_S
from loopwarden.commands.schema import config_schema
from loopwarden.config import parse_config
from loopwarden.config.values import _kinds
from loopwarden.engine.pluginmanager import builtin_settings
from loopwarden.exceptions import ConfigError


@pytest.fixture(scope="module")
def schema() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(config_schema())


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("max_steps", "max_steps", '"12"'),
        ("repeat_call", "stop_at_repeat", "true"),  # would be 1: stop at the first repeat
        ("conversation_limits", "soft", "1"),
    ],
)
def test_the_issues_wrong_types_are_refused_by_config_check(
    tmp_path: Path, schema: jsonschema.Draft202012Validator, table: str, key: str, value: str
) -> None:
    """Each of the issue's three values: the schema refuses it, and so does ``config check``,
    with exit 2 and a message naming the key."""
    enabled = json.dumps(sorted({"max_steps", table}))
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f"[plugins]\nenabled = {enabled}\n[plugins.{table}]\n{key} = {value}\n",
        encoding="utf-8",
    )
    data = tomllib.loads(cfg.read_text(encoding="utf-8"))
    assert list(schema.iter_errors(data)), "the schema accepts it"
    proc = loopwarden("config", "check", "--config", str(cfg))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"plugins.{table}.{key}" in proc.stderr and "Traceback" not in proc.stderr


def _scalar_fields(model: type[BaseModel]) -> list[tuple[str, frozenset[Any]]]:
    out = []
    for name, field in model.model_fields.items():
        kinds = _kinds(field.annotation)
        if kinds and object not in kinds:
            out.append((field.alias or name, kinds))
    return out


def _wrong_values(kinds: frozenset[Any]) -> list[Any]:
    return [1, 0, "true"] if kinds == {bool} else [True, False, "12"]


def test_every_plugin_setting_refuses_what_the_schema_refuses(
    schema: jsonschema.Draft202012Validator,
) -> None:
    """A sweep of every scalar setting of every built-in plugin: each wrong-typed value is
    refused by the schema and by the settings model the loader validates with, at that key."""
    checked = 0
    for name, model in builtin_settings().items():
        if model is None:
            continue
        for key, kinds in _scalar_fields(model):
            for bad in _wrong_values(kinds):
                doc = {"plugins": {"enabled": [name], name: {key: bad}}}
                assert list(schema.iter_errors(doc)), (name, key, bad)
                with pytest.raises(ValidationError) as err:
                    model.model_validate({key: bad})
                assert any(e["loc"][:1] == (key,) for e in err.value.errors()), (name, key, bad)
                checked += 1
    assert checked > 100  # the sweep saw the settings (a broken walk would pass vacuously)


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"model": {"timeout_s": True}}, "model.timeout_s"),
        ({"model": {"max_retries": "2"}}, "model.max_retries"),
        ({"store": {"ledger": 1}}, "store.ledger"),
        ({"profiles": {"simple": {"max_steps": "5"}}}, "profiles.simple.max_steps"),
        ({"tools": {"pay": {"side_effect": 1}}}, "tools.pay.side_effect"),
    ],
)
def test_core_tables_refuse_what_the_schema_refuses(
    schema: jsonschema.Draft202012Validator, doc: dict[str, Any], key: str
) -> None:
    assert list(schema.iter_errors(doc))
    with pytest.raises(ConfigError) as err:
        parse_config(doc, path="<test>")
    assert err.value.key == key


def test_numbers_of_either_kind_still_load() -> None:
    """An integer where a float is expected (and a float where an integer is, when whole)
    is a number, as in the schema: the shipped config's style keeps loading."""
    cfg = parse_config(
        {
            "model": {"timeout_s": 30},
            "profiles": {"simple": {"max_seconds": 60, "max_steps": 5}},
            "plugins": {"enabled": ["max_steps", "timeout"], "timeout": {"max_seconds": 120}},
        },
        path="<test>",
    )
    assert cfg.model.timeout_s == 30.0


# -- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"plugins": {"timeout": {"max_seconds": 1e10}}}, "plugins.timeout.max_seconds"),
        ({"plugins": {"timeout": {"grace_s": float("inf")}}}, "plugins.timeout.grace_s"),
        (
            {"plugins": {"retry_policy": {"max_backoff_s": 1e12}}},
            "plugins.retry_policy.max_backoff_s",
        ),
        ({"model": {"timeout_s": 1e10}}, "model.timeout_s"),
        ({"store": {"ledger_ttl_s": float("inf")}}, "store.ledger_ttl_s"),
        ({"profiles": {"long": {"max_seconds": 1e10}}}, "profiles.long.max_seconds"),
        (
            {"mcp": {"servers": {"s": {"command": "x", "timeout_s": 1e10}}}},
            "mcp.servers.s.timeout_s",
        ),
    ],
)
def test_every_duration_is_bounded_when_the_config_loads(
    tmp_path: Path, doc: dict[str, Any], key: str
) -> None:
    """A duration past MAX_DURATION_S (1e9 s) or infinite is an error naming its key,
    from ``config check`` (exit 2) -- never a timer that overflows later."""
    enabled = sorted({"max_steps", *doc.get("plugins", {})})
    doc = {**doc, "plugins": {"enabled": enabled, **doc.get("plugins", {})}}
    cfg = tmp_path / "config.json.toml"
    cfg.write_text(_toml(doc), encoding="utf-8")
    proc = loopwarden("config", "check", "--config", str(cfg))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert key in proc.stderr and "Traceback" not in proc.stderr
    assert MAX_DURATION_S < 1e10


def _toml(doc: dict[str, Any], prefix: str = "") -> str:
    """A small TOML writer for the tables above (floats as TOML spells them)."""

    def value(v: Any) -> str:
        if isinstance(v, float):
            return "inf" if v == float("inf") else repr(v)
        return json.dumps(v)

    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict):
            tables.append((k, v))
        else:
            lines.append(f"{k} = {value(v)}")
    out = (f"[{prefix}]\n" if prefix and lines else "") + "".join(ln + "\n" for ln in lines)
    for k, v in tables:
        out += _toml(v, f"{prefix}.{k}" if prefix else k)
    return out
