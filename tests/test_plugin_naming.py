"""One name per plugin, the same in tests and production (issue: plugin naming).

A plugin is named by the name it declares (its ``name``, else its ``__name__``) whichever way it
is enabled -- built in, by entry point, by ``module:attr`` -- and the testing kit names it the
same way.  That name keys its settings table; a table that configures nothing fails, naming it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Plugin, hookimpl
from loopwarden.commands.cli import main
from loopwarden.config import Config, parse_config
from loopwarden.engine.pluginmanager import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    load_plugins,
    plugin_name,
    resolve_plugin_name,
)
from loopwarden.exceptions import ConfigError, PluginLoadError
from loopwarden.testing import run_plugin, tool_call, turn

# A guard that stops on any refund and reports a setting in the evidence.
SOURCE = """
from loopwarden import Plugin, PluginSettings, hookimpl

class Settings(PluginSettings):
    tag: str = "default"

class {cls}(Plugin[Settings]):
    {declared}
    Settings = Settings

    @hookimpl
    def before_tool(self, run, call):
        if call.name == "apply_refund":
            return self.stop("no_refunds", tag=self.settings.tag)
        return None
"""

REFUND = [turn("refund it", tool_call("apply_refund", order_id="88231", reason="x"))]
RESULTS = {"apply_refund": ["OK"]}


class Site:
    """A sys.path directory where a test writes modules and 'installs' entry points."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def module(self, declared: str | None, cls: str = "Guard") -> str:
        name = f"lw_naming_{uuid.uuid4().hex[:8]}"
        decl = f"name = {declared!r}" if declared is not None else "pass"
        (self.root / f"{name}.py").write_text(
            textwrap.dedent(SOURCE).format(cls=cls, declared=decl), encoding="utf-8"
        )
        self.modules.append(name)
        importlib.invalidate_caches()
        return name

    def entry_points(self, dist: str, eps: dict[str, str]) -> None:
        info = self.root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8"
        )
        lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{k} = {v}" for k, v in eps.items())]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    s = Site(root)
    yield s
    for name in s.modules:
        sys.modules.pop(name, None)


def config(enabled: list[str], **tables: Any) -> Config:
    return parse_config({"plugins": {"enabled": enabled, **tables}}, path="<test>")


# -- built-in ------------------------------------------------------------------------------


def test_every_builtin_declares_the_name_it_is_enabled_by() -> None:
    plugins = load_plugins(config(list(BUILTIN_PLUGINS)))
    assert plugins.names == list(BUILTIN_PLUGINS)
    for name, spec in BUILTIN_PLUGINS.items():
        mod, _, attr = spec.partition(":")
        assert plugin_name(getattr(importlib.import_module(mod), attr)) == name


def test_a_builtin_has_the_same_name_in_the_kit() -> None:
    from loopwarden.plugins.repeat_call import RepeatCall

    by_class = run_plugin(RepeatCall, turns=REFUND, tool_results=RESULTS)
    by_name = run_plugin("repeat_call", turns=REFUND, tool_results=RESULTS)
    assert by_class.name == by_name.name == "repeat_call"


# -- module:attr ---------------------------------------------------------------------------


def test_module_attr_is_named_by_its_declared_name_and_its_table(site: Site) -> None:
    mod = site.module("no_refunds")
    plugins = load_plugins(config(["max_steps", f"{mod}:Guard"], no_refunds={"tag": "prod"}))
    assert plugins.names == ["max_steps", "no_refunds"]
    assert plugins.get("no_refunds").settings.tag == "prod"


def test_a_table_keyed_by_module_attr_configures_nothing(site: Site) -> None:
    ref = f"{site.module('no_refunds')}:Guard"
    with pytest.raises(ConfigError, match=r"configures nothing.*\[plugins\.no_refunds\]") as err:
        load_plugins(config(["max_steps", ref], **{ref: {"tag": "x"}}))
    assert err.value.key == f'plugins."{ref}"'


def test_an_undeclared_name_is_the_class_name_everywhere(site: Site) -> None:
    mod = site.module(None, cls="NoRefunds")
    plugins = load_plugins(config(["max_steps", f"{mod}:NoRefunds"]))
    assert plugins.names == ["max_steps", "NoRefunds"]
    assert resolve_plugin_name(f"{mod}:NoRefunds") == "NoRefunds"


def test_module_attr_cannot_take_a_builtin_name(site: Site) -> None:
    ref = f"{site.module('repeat_call')}:Guard"
    with pytest.raises(PluginLoadError, match="two plugins are named 'repeat_call'") as err:
        load_plugins(config(["max_steps", "repeat_call", ref]))
    assert ref in str(err.value) and err.value.key == "plugins.enabled[2]"


def test_two_module_attr_plugins_of_one_name_fail(site: Site) -> None:
    a, b = (f"{site.module('twin')}:Guard" for _ in range(2))
    with pytest.raises(PluginLoadError, match="two plugins are named 'twin'") as err:
        load_plugins(config(["max_steps", a, b]))
    assert a in str(err.value) and b in str(err.value)


# -- entry point ---------------------------------------------------------------------------


def test_an_entry_point_is_named_by_the_plugin_it_loads(site: Site) -> None:
    site.entry_points("lw-pii", {"pii_guard": f"{site.module('pii_guard')}:Guard"})
    plugins = load_plugins(config(["max_steps", "pii_guard"], pii_guard={"tag": "t"}))
    assert plugins.names == ["max_steps", "pii_guard"]
    assert plugins.get("pii_guard").settings.tag == "t"


def test_an_entry_point_named_otherwise_fails(site: Site) -> None:
    site.entry_points("lw-pii", {"pii": f"{site.module('pii_guard')}:Guard"})
    with pytest.raises(PluginLoadError, match="declares the name 'pii_guard'") as err:
        load_plugins(config(["max_steps", "pii"]))
    assert err.value.plugin == "pii" and err.value.key == "plugins.enabled[1]"


def test_one_class_cannot_be_enabled_under_two_entry_point_names(site: Site) -> None:
    spec = f"{site.module('pii_guard')}:Guard"
    site.entry_points("lw-pii", {"pii_guard": spec, "pii_guard_2": spec})
    assert load_plugins(config(["max_steps", "pii_guard"])).names == ["max_steps", "pii_guard"]
    with pytest.raises(PluginLoadError, match="declares the name 'pii_guard'"):
        load_plugins(config(["max_steps", "pii_guard", "pii_guard_2"]))


# -- the kit, and one name end to end ------------------------------------------------------


@pytest.mark.parametrize("how", ["class", "module:attr", "entry point"])
def test_the_kit_and_production_agree(how: str, site: Site) -> None:
    mod = site.module("no_refunds")
    site.entry_points("lw-norefunds", {"no_refunds": f"{mod}:Guard"})
    plugin: Any = {
        "class": importlib.import_module(mod).Guard,
        "module:attr": f"{mod}:Guard",
        "entry point": "no_refunds",
    }[how]
    result = run_plugin(plugin, settings={"tag": how}, turns=REFUND, tool_results=RESULTS)
    assert result.name == "no_refunds"
    assert result.record["stopped_by"] == "no_refunds"
    (verdict,) = result.verdicts
    assert verdict.plugin == "no_refunds" and verdict.evidence["tag"] == how


def test_the_kit_refuses_to_rename_a_plugin_enabled_by_reference(site: Site) -> None:
    ref = f"{site.module('no_refunds')}:Guard"
    with pytest.raises(ValueError, match="keeps its own name"):
        run_plugin(ref, name="other", turns=REFUND, tool_results=RESULTS)


def test_config_check_names_a_table_that_configures_nothing(
    site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"{site.module('no_refunds')}:Guard"
    path = tmp_path / "config.toml"
    path.write_text(
        f'[plugins]\nenabled = ["max_steps", "{ref}"]\n'
        f'[plugins.no_refunds]\ntag = "ok"\n[plugins.no_refundz]\ntag = "typo"\n',
        encoding="utf-8",
    )
    assert main(["config", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "plugins.no_refundz: configures nothing" in err
    assert "did you mean [plugins.no_refunds]?" in err


def test_a_plugin_object_in_code_keeps_the_name_it_is_given() -> None:
    class Counter(Plugin):  # type: ignore[type-arg]
        name = "counter"

        @hookimpl
        def before_model(self) -> None:
            return None

    plugins = load_plugins(config(["max_steps", "tally"]), objects={"tally": Counter()})
    assert plugins.names == ["max_steps", "tally"]  # code names it explicitly
