"""Plugin discovery, ordering, blocking and start-up conflicts.

Entry points are tested through real ``importlib.metadata`` discovery: each test writes a tiny
``*.dist-info`` (METADATA + entry_points.txt) and the plugin's module into a directory on
``sys.path`` -- an installed distribution in every way that matters, without pip.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Plugin, PluginLoadError, hookimpl
from loopwarden.commands.cli import main as cli
from loopwarden.config import Config, parse_config
from loopwarden.demo import shop_tools
from loopwarden.engine.pluginmanager import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    check_tables,
    installed_entry_points,
    load_plugins,
    resolve_names,
)
from loopwarden.exceptions import ConfigError
from loopwarden.testing import (
    make_deployment,
    make_run,
    make_tool_call,
    run_plugin,
    tool_call,
    turn,
)

_counter = itertools.count()

# A third-party plugin module: it records the order in which plugins see before_model into
# the run, and marks its import so tests can tell whether it was ever imported.
GUARD_SOURCE = """
from loopwarden import Plugin, PluginSettings, hookimpl
from pydantic import Field

IMPORTED = True

class GuardSettings(PluginSettings):
    note: str = Field(default="", description="a warning to give on the first step")

class Guard(Plugin[GuardSettings]):
    '''A test guard from a third-party package.'''
    name = "__PLUGIN__"
    Settings = GuardSettings

    @hookimpl
    def before_model(self, run, request):
        run.state.setdefault("order", []).append(self.name)
        if self.settings.note and run.step == 0:
            return self.warn(self.settings.note)
        return None
"""


def make_config(**plugins: Any) -> Config:
    return parse_config({"plugins": plugins}, path="<test>")


class Site:
    """A directory on sys.path where tests 'install' distributions and modules."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def module(
        self, source: str = GUARD_SOURCE, name: str | None = None, plugin: str | None = None
    ) -> str:
        """Write a module; returns its (unique) name.  The guard in it is the plugin named
        ``plugin`` (default: the module's name)."""
        name = name or f"lwtest_plugin_{next(_counter)}"
        source = source.replace("__PLUGIN__", plugin or name)
        (self.root / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        self.modules.append(name)
        importlib.invalidate_caches()
        return name

    def dist(self, dist: str, version: str, entry_points: dict[str, str]) -> None:
        """Write ``<dist>-<version>.dist-info`` declaring ``entry_points`` in our group."""
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", encoding="utf-8"
        )
        lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        importlib.invalidate_caches()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    root = tmp_path / "site-packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    s = Site(root)
    yield s
    for name in s.modules:
        sys.modules.pop(name, None)


@pytest.fixture
def installed_guard(site: Site) -> tuple[str, str]:
    """An installed distribution 'lw-guard 1.2.3' with entry point 'guard'; (ep, module)."""
    mod = site.module(plugin="guard")
    site.dist("lw-guard", "1.2.3", {"guard": f"{mod}:Guard"})
    return "guard", mod


# -- names, order, sources -----------------------------------------------------------------


def test_config_order_is_the_call_order_of_every_hook(site: Site) -> None:
    a, b, c = (site.module() for _ in range(3))
    for order in ([a, b, c], [c, a, b]):
        plugins = load_plugins(make_config(enabled=["max_steps", *(f"{m}:Guard" for m in order)]))
        assert plugins.names == ["max_steps", *order]  # each is named by the name it declares
        # read back from pluggy, not from our own list
        assert plugins.call_order("before_model") == ["max_steps", *order]


def test_plugins_run_in_the_configured_position(
    installed_guard: tuple[str, str], site: Site
) -> None:
    ep, _ = installed_guard
    mod = site.module()
    spec = f"{mod}:Guard"
    for order in ([ep, spec], [spec, ep]):
        result = run_plugin(
            ep,
            enabled=order,
            turns=[turn("hi", tool_call("query_order", order_id="88231"))],
            tools=shop_tools(),
        )
        names = [mod if n == spec else n for n in order]
        assert result.run.state["order"] == names * 2  # two model calls, same order each


def test_essential_plugin_is_loaded_first_when_left_out() -> None:
    names, blocked = resolve_names(make_config(enabled=[]))
    assert names == ["max_steps"]
    assert blocked == []


@pytest.mark.parametrize("via", ["config", "env"])
def test_essential_plugin_cannot_be_blocked(via: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if via == "env":
        monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", "max_steps")
        cfg = make_config()
    else:
        cfg = make_config(blocked=["max_steps"])
    with pytest.raises(ConfigError, match="'max_steps' is essential"):
        load_plugins(cfg)


def test_a_name_listed_twice_fails() -> None:
    with pytest.raises(ConfigError, match="listed twice"):
        load_plugins(make_config(enabled=["max_steps", "max_steps"]))


def test_entry_point_is_loaded_by_name_with_its_distribution(
    installed_guard: tuple[str, str],
) -> None:
    ep, mod = installed_guard
    plugins = load_plugins(make_config(enabled=["max_steps", ep]))
    (row,) = [r for r in plugins.describe() if r["name"] == ep]
    assert row == {
        "position": 2,
        "name": ep,
        "source": "entry point (lw-guard 1.2.3)",
        "spec": f"{mod}:Guard",
        "hooks": ["before_model"],
        "essential": False,
    }


def test_an_installed_entry_point_is_not_imported_unless_named(
    installed_guard: tuple[str, str],
) -> None:
    ep, mod = installed_guard
    assert ep in installed_entry_points()
    load_plugins(make_config(enabled=["max_steps"]))
    assert mod not in sys.modules


def test_module_attr_works_without_installing(site: Site) -> None:
    mod = site.module(plugin="careful_guard")
    spec = f"{mod}:Guard"
    plugins = load_plugins(make_config(enabled=[spec], careful_guard={"note": "careful"}))
    (row,) = [r for r in plugins.describe() if r["name"] == "careful_guard"]
    assert row["source"] == "module:attr" and row["spec"] == spec
    assert plugins.get("careful_guard").settings.note == "careful"
    assert spec not in installed_entry_points()


def test_extra_plugins_from_the_environment_come_last(
    installed_guard: tuple[str, str], site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep, _ = installed_guard
    mod = site.module()
    monkeypatch.setenv("LOOPWARDEN_PLUGINS", f" {ep} ,{mod}:Guard")
    plugins = load_plugins(make_config(enabled=["max_steps"]))
    assert plugins.names == ["max_steps", ep, mod]


def test_disabling_autoload_ignores_entry_points_but_not_module_attr(
    installed_guard: tuple[str, str], site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    ep, mod = installed_guard
    monkeypatch.setenv("LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert installed_entry_points() == {}
    with pytest.raises(PluginLoadError, match="LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD is set") as err:
        load_plugins(make_config(enabled=[ep]))
    assert err.value.plugin == ep
    assert mod not in sys.modules
    mod = site.module()
    assert load_plugins(make_config(enabled=[f"{mod}:Guard"])).names == ["max_steps", mod]


# -- blocking before import ----------------------------------------------------------------


@pytest.mark.parametrize("via", ["config", "env"])
def test_a_blocked_entry_point_is_never_imported(
    via: str, installed_guard: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ep, mod = installed_guard
    if via == "env":
        monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", ep)
        cfg = make_config(enabled=["max_steps", ep], **{ep: {"note": "x"}})
    else:
        cfg = make_config(enabled=["max_steps", ep], blocked=[ep], **{ep: {"note": "x"}})
    plugins = load_plugins(cfg)
    assert plugins.names == ["max_steps"]
    assert mod not in sys.modules


def test_a_blocked_module_attr_plugin_is_never_imported(site: Site) -> None:
    mod = site.module()
    spec = f"{mod}:Guard"
    plugins = load_plugins(make_config(enabled=[spec], blocked=[spec]))
    assert plugins.names == ["max_steps"]
    assert mod not in sys.modules


def test_a_blocked_plugin_keeps_its_table_without_complaint() -> None:
    cfg = make_config(
        enabled=["max_steps"], blocked=["not_installed"], not_installed={"whatever": 1}
    )
    assert load_plugins(cfg).names == ["max_steps"]


# -- settings --------------------------------------------------------------------------------


def test_a_plugin_table_is_validated_by_its_settings_model(site: Site) -> None:
    mod = site.module()
    with pytest.raises(ConfigError) as err:
        load_plugins(make_config(enabled=[f"{mod}:Guard"], **{mod: {"noet": "typo"}}))
    assert err.value.key == f"plugins.{mod}.noet"
    assert err.value.path == "<test>"
    assert "unknown key" in str(err.value)


def test_a_table_for_an_unknown_plugin_fails() -> None:
    with pytest.raises(ConfigError, match="configures nothing") as err:
        load_plugins(make_config(enabled=["max_steps"], max_stpes={"max_steps": 3}))
    assert err.value.key == "plugins.max_stpes"
    assert "did you mean [plugins.max_steps]?" in str(err.value)


def test_a_table_for_a_ready_object_fails_but_a_class_gets_it() -> None:
    class Counter(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_model(self) -> None:
            return None

    cfg = make_config(enabled=["max_steps", "counter"], counter={"anything": 1})
    with pytest.raises(ConfigError, match="plugin object built in code"):
        load_plugins(cfg, objects={"counter": Counter()})
    # a class is constructed by the loader with its (validated) table
    with pytest.raises(ConfigError, match="unknown key") as err:
        load_plugins(cfg, objects={"counter": Counter})
    assert err.value.key == "plugins.counter.anything"
    ok = load_plugins(make_config(enabled=["max_steps", "counter"]), objects={"counter": Counter})
    assert ok.get("counter").name == "counter"


def test_check_tables_validates_builtins_that_are_switched_off(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = site.module(plugin="demo_guard")
    monkeypatch.setitem(BUILTIN_PLUGINS, "demo_guard", f"{mod}:Guard")
    good = make_config(enabled=["max_steps"], demo_guard={"note": "hi"})
    assert check_tables(good) == ["demo_guard"]
    bad = make_config(enabled=["max_steps"], demo_guard={"note": 3})
    with pytest.raises(ConfigError) as err:
        check_tables(bad)
    assert err.value.key == "plugins.demo_guard.note"


# -- conflicts fail at start-up, naming the plugin ---------------------------------------------


def test_two_distributions_with_one_entry_point_name_fail(site: Site) -> None:
    site.dist("lw-one", "1.0", {"dup": f"{site.module()}:Guard"})
    site.dist("lw-two", "2.0", {"dup": f"{site.module()}:Guard"})
    with pytest.raises(PluginLoadError) as err:
        load_plugins(make_config(enabled=["dup"]))
    assert err.value.plugin == "dup"
    assert "lw-one 1.0" in str(err.value) and "lw-two 2.0" in str(err.value)
    # an unrelated config is not affected by the clash
    assert load_plugins(make_config(enabled=["max_steps"])).names == ["max_steps"]


def test_an_entry_point_named_like_a_builtin_fails(site: Site) -> None:
    site.dist("lw-squatter", "0.1", {"max_steps": f"{site.module()}:Guard"})
    with pytest.raises(PluginLoadError, match="built in and also declared") as err:
        load_plugins(make_config(enabled=["max_steps"]))
    assert "lw-squatter 0.1" in str(err.value)


def _load(*plugins: tuple[str, Any]) -> Any:
    return load_plugins(
        make_config(enabled=["max_steps", *(n for n, _ in plugins)]), objects=dict(plugins)
    )


def test_a_plugin_that_implements_no_hook_fails() -> None:
    class Idle(Plugin):  # type: ignore[type-arg]
        pass

    with pytest.raises(PluginLoadError, match="implements no hook") as err:
        _load(("idle", Idle()))
    assert err.value.plugin == "idle"


def test_a_signal_only_observer_is_accepted() -> None:
    class Observer(Plugin):  # type: ignore[type-arg]
        def connect(self, deployment: Any) -> None:
            pass

    assert _load(("observer", Observer())).get("observer") is not None


def test_a_misspelled_hook_fails_naming_plugin_and_hook() -> None:
    class Typo(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def befor_tool(self, run: Any, call: Any) -> None:
            return None

    with pytest.raises(PluginLoadError) as err:
        _load(("typo", Typo()))
    assert err.value.plugin == "typo"
    assert "unknown hook 'befor_tool'" in str(err.value)
    assert "did you mean 'before_tool'?" in str(err.value)


def test_a_hook_without_hookimpl_fails() -> None:
    class Unmarked(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def on_start(self) -> None:
            return None

        def before_tool(self, run: Any, call: Any) -> None:
            return None

    with pytest.raises(PluginLoadError, match=r"defines before_tool\(\) without @hookimpl"):
        _load(("unmarked", Unmarked()))


def test_an_async_hook_fails() -> None:
    class Async(Plugin):  # type: ignore[type-arg]
        @hookimpl
        async def before_model(self, run: Any) -> None:
            return None

    with pytest.raises(PluginLoadError, match="'async def'; hooks are synchronous"):
        _load(("async", Async()))


def test_a_wrong_argument_name_fails_naming_the_plugin() -> None:
    class Wrong(Plugin):  # type: ignore[type-arg]
        @hookimpl
        def before_tool(self, run: Any, tool_call: Any) -> None:
            return None

    with pytest.raises(PluginLoadError, match="tool_call") as err:
        _load(("wrong", Wrong()))
    assert err.value.plugin == "wrong"


def _marked(tryfirst: bool = False, trylast: bool = False) -> Plugin:  # type: ignore[type-arg]
    class Marked(Plugin):  # type: ignore[type-arg]
        @hookimpl(tryfirst=tryfirst, trylast=trylast)
        def before_tool(self, call: Any) -> None:
            return None

    return Marked()


class _Plain(Plugin):  # type: ignore[type-arg]
    @hookimpl
    def before_tool(self, call: Any) -> None:
        return None


def test_tryfirst_on_the_plugin_listed_first_is_fine() -> None:
    plugins = _load(("first", _marked(tryfirst=True)), ("second", _Plain()), ("third", _Plain()))
    assert plugins.call_order("before_tool") == ["first", "second", "third"]


def test_tryfirst_on_a_later_plugin_fails_naming_it() -> None:
    with pytest.raises(PluginLoadError, match="tryfirst/trylast on before_tool") as err:
        _load(("first", _Plain()), ("second", _Plain()), ("third", _marked(tryfirst=True)))
    assert err.value.plugin == "third"


def test_trylast_on_an_early_plugin_fails_naming_it() -> None:
    with pytest.raises(PluginLoadError) as err:
        _load(("first", _marked(trylast=True)), ("second", _Plain()), ("third", _Plain()))
    assert err.value.plugin == "first"
    plugins = _load(("first", _Plain()), ("last", _marked(trylast=True)))
    assert plugins.call_order("before_tool") == ["first", "last"]


def test_the_same_object_under_two_names_fails() -> None:
    obj = _Plain()
    with pytest.raises(PluginLoadError, match="same object"):
        _load(("one", obj), ("two", obj))


# -- calling ----------------------------------------------------------------------------------


class Boom(Plugin):  # type: ignore[type-arg]
    """Raises in before_tool when its name is in run.meta['explode']."""

    @hookimpl
    def before_tool(self, run: Any) -> None:
        if self.name in run.meta.get("explode", ()):
            raise RuntimeError(f"{self.name} exploded")


def test_a_raising_plugin_is_blamed_by_name_even_with_shared_code() -> None:
    with make_deployment(
        {"plugins": {"enabled": ["max_steps", "calm", "loud"]}},
        plugins={"calm": Boom, "loud": Boom},
        tools=shop_tools(),
    ) as dep:
        run = make_run(deployment=dep, meta={"explode": ["loud"]})
        res = dep.hooks.before_tool(run, make_tool_call("query_order", order_id="1", run=run))
    assert res.stop is not None
    assert (res.stop.reason, res.stop.plugin) == ("plugin_error", "loud")
    assert "loud exploded" in (res.stop.message or "")


def test_tracing_writes_hook_calls_to_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOOPWARDEN_TRACE_PLUGINS", "1")
    result = run_plugin(
        _Plain,
        name="plain",
        turns=[turn("x", tool_call("query_order", order_id="88231"))],
        tools=shop_tools(),
    )
    err = capsys.readouterr().err
    assert result.termination == "final_answer"
    for hook in ("on_start", "before_model", "before_tool", "after_tool", "on_stop"):
        assert re.search(rf"^\[loopwarden trace\] +{hook} \[hook\]$", err, re.M), hook
    assert all(ln.startswith("[loopwarden trace] ") for ln in err.splitlines())
    monkeypatch.delenv("LOOPWARDEN_TRACE_PLUGINS")
    run_plugin(_Plain, name="plain", tools=shop_tools())
    assert "[loopwarden trace]" not in capsys.readouterr().err


# -- the plugins command -------------------------------------------------------------------


def _write_config(tmp_path: Path, body: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return str(path)


def test_plugins_command_shows_position_source_and_hooks(
    installed_guard: tuple[str, str], site: Site, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ep, mod = installed_guard
    mod3 = site.module()
    spec = f"{mod3}:Guard"
    cfg = _write_config(
        tmp_path,
        f"""
        [plugins]
        enabled = ["max_steps", "{ep}", "{spec}", "gone"]
        blocked = ["gone"]
    """,
    )
    assert cli(["plugins", "--config", cfg]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = next(ln for ln in lines if f" {ep} " in ln)
    assert row.split()[0] == "2"
    assert "entry point (lw-guard 1.2.3)" in row and row.endswith("before_model")
    assert f"-> {mod}:Guard" in out
    row3 = next(ln for ln in lines if f" {mod3} " in ln)  # named by the name it declares
    assert row3.split()[0] == "3" and "module:attr" in row3
    assert f"-> {spec}" in out
    assert "blocked (never imported): gone (config)" in out

    assert cli(["plugins", "--json", "--config", cfg]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["plugins"]] == ["max_steps", ep, mod3]
    assert data["plugins"][1]["source"] == "entry point (lw-guard 1.2.3)"
    assert data["blocked"] == [{"name": "gone", "by": "config"}]


def test_plugins_command_reports_load_errors_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write_config(
        tmp_path,
        """
        [plugins]
        enabled = ["no_such_plugin"]
    """,
    )
    assert cli(["plugins", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "plugin 'no_such_plugin': cannot resolve" in err
    assert "Traceback" not in err


def test_blocking_a_module_name_also_blocks_its_module_attr_entries(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loopwarden.engine.pluginmanager import is_blocked, resolve_names

    assert is_blocked("sidefx:P", ["sidefx"]) and is_blocked("pkg.sub:P", ["pkg"])
    assert not is_blocked("sidefxx:P", ["sidefx"]) and not is_blocked("other", ["sidefx"])
    marker = tmp_path / "imported"
    (tmp_path / "sidefx.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from loopwarden import hookimpl\n"
        "class P:\n    @hookimpl\n    def before_model(self): pass\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("LOOPWARDEN_BLOCK_PLUGINS", "sidefx")
    cfg = parse_config({"plugins": {"enabled": ["max_steps", "sidefx:P"]}}, path="<t>")
    names, _ = resolve_names(cfg)
    assert names == ["max_steps"]
    load_plugins(cfg)
    assert not marker.exists()
