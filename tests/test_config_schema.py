"""``loopwarden config schema``: a JSON Schema of the whole config file.

The schema is checked with ``jsonschema`` -- the reference validator that editors' JSON Schema
support behaves like -- rather than with our own models, so a schema that only our pydantic
models understand would fail here.
"""

from __future__ import annotations

import copy
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from loopwarden.commands.cli import main as cli
from loopwarden.commands.schema import config_schema
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.engine.pluginmanager import check_tables, load_plugins
from loopwarden.exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLUGIN_SOURCE = """
from loopwarden import Plugin, PluginSettings, hookimpl
from pydantic import Field

class CapSettings(PluginSettings):
    cap: int = Field(default=3, ge=1, description="how many")

class Cap(Plugin[CapSettings]):
    '''Caps something, for the schema test.'''
    name = "cap"
    Settings = CapSettings

    @hookimpl
    def before_model(self):
        return None
"""


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return config_schema(None)


def validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


def shipped() -> dict[str, Any]:
    return load_toml(default_config_path())


def test_the_schema_is_a_valid_draft_2020_12_schema(schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert "path" not in schema["properties"]  # not a TOML key


def test_the_shipped_config_validates(schema: dict[str, Any]) -> None:
    errors = list(validator(schema).iter_errors(shipped()))
    assert errors == []


def test_the_repository_config_toml_validates(schema: dict[str, Any]) -> None:
    root_config = Path(__file__).resolve().parent.parent / "config.toml"
    with root_config.open("rb") as fh:
        data = tomllib.load(fh)
    assert list(validator(schema).iter_errors(data)) == []


def test_builtin_plugin_settings_are_described(schema: dict[str, Any]) -> None:
    plugins = schema["properties"]["plugins"]["properties"]
    assert plugins["max_steps"]["$ref"] == "#/$defs/MaxStepsSettings"
    steps = schema["$defs"]["MaxStepsSettings"]["properties"]["max_steps"]
    assert steps["type"] == "integer" and steps["minimum"] == 1 and steps["default"] == 165
    assert steps["description"]


def _mutate(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(shipped())
    *head, last = path.split(".")
    node = data
    for key in head:
        node = node.setdefault(key, {})
    node[last] = value
    return data


CASES = [
    # (dotted key, value, valid?)
    ("model.timeout_s", 30, True),
    ("model.provider", "scripted", True),
    ("model.provider", "anthropic", False),
    ("model.temperatur", 0.2, False),  # unknown key
    ("run.warning_role", "developer", True),
    ("run.warning_role", "assistant", False),
    ("run.max_observation_chars", 0, False),
    ("profiles.tiny", {"max_steps": 2}, True),
    ("profiles.tiny", {"max_steps": "two"}, False),
    ("shop.db_path", "shop.sqlite3", True),
    ("plugins.max_steps.max_steps", 4, True),
    ("plugins.max_steps.max_steps", 0, False),
    ("plugins.max_steps.max_stepz", 4, False),
    ("plugins.enabled", ["max_steps", "max_steps"], False),
    ("plugins.enabled", ["max_steps", ""], False),
    ("plugins.blocked", ["something"], True),
    ("nonsense", {"x": 1}, False),
]


@pytest.mark.parametrize(("key", "value", "valid"), CASES)
def test_schema_and_loader_agree(schema: dict[str, Any], key: str, value: Any, valid: bool) -> None:
    data = _mutate(key, value)
    schema_ok = validator(schema).is_valid(data)
    try:
        cfg = parse_config(data, path="<test>")
        load_plugins(cfg)
        check_tables(cfg)
        loader_ok = True
    except ConfigError:
        loader_ok = False
    assert (schema_ok, loader_ok) == (valid, valid)


def test_tables_of_unknown_plugins_are_left_to_the_loader(schema: dict[str, Any]) -> None:
    # An installed third-party plugin the schema was not built for must not be flagged.
    assert validator(schema).is_valid(_mutate("plugins.someone_elses", {"limit": 3}))


def _site_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / f"{name}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:Cap"


def test_a_configs_own_plugins_are_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _site_module(tmp_path, monkeypatch, "lwschema_cap")
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        textwrap.dedent(f"""
        [plugins]
        enabled = ["max_steps", "{spec}"]
        [plugins.cap]  # keyed by the plugin's name, not by "{spec}"
        cap = 5
    """),
        encoding="utf-8",
    )
    schema = config_schema(cfg)
    entry = schema["properties"]["plugins"]["properties"]["cap"]
    assert "Caps something" in entry["description"] and "module:attr" in entry["description"]
    v = validator(schema)
    with cfg.open("rb") as fh:
        data = tomllib.load(fh)
    assert v.is_valid(data)
    data["plugins"]["cap"]["cap"] = 0
    assert not v.is_valid(data)
    sys.modules.pop("lwschema_cap", None)


def test_schema_command_reads_the_local_config_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _site_module(tmp_path, monkeypatch, "lwschema_local")
    (tmp_path / "config.toml").write_text(f'[plugins]\nenabled = ["{spec}"]\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert cli(["config", "schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "cap" in printed["properties"]["plugins"]["properties"]  # keyed by its name
    sys.modules.pop("lwschema_local", None)


def test_blocked_plugins_are_not_imported_for_the_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _site_module(tmp_path, monkeypatch, "lwschema_blocked")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[plugins]\nenabled = ["{spec}"]\nblocked = ["{spec}"]\n', encoding="utf-8")
    schema = config_schema(cfg)
    assert "cap" not in schema["properties"]["plugins"]["properties"]
    assert "lwschema_blocked" not in sys.modules


def test_schema_command_prints_the_schema(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    schema: dict[str, Any],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./config.toml: the shipped default, built-ins only
    assert cli(["config", "schema"]) == 0
    # the command adds the demo's [shop] table, which the core keeps as written
    from loopwarden.demo import ShopConfig

    printed = json.loads(capsys.readouterr().out)
    assert printed == config_schema(None, tables={"shop": ShopConfig})
    assert schema["properties"]["shop"]["additionalProperties"] is True
    assert printed["properties"]["shop"] == {"$ref": "#/$defs/ShopConfig"}
    out = tmp_path / "schema.json"
    assert cli(["config", "schema", "--config", str(default_config_path()), "-o", str(out)]) == 0
    written = json.loads(out.read_text(encoding="utf-8"))
    assert validator(written).is_valid(shipped())


def test_check_command_names_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["config", "check", str(default_config_path())]) == 0
    assert ": OK (" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[plugins]\nenabled = ["max_steps"]\n[plugins.max_steps]\nmax_steps = 0\n', encoding="utf-8"
    )
    assert cli(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: plugins.max_steps.max_steps:" in err
    assert "greater than or equal to 1" in err
