"""The README's and the guides' examples are code: the plugin example runs, the TOML examples
load."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from loopwarden.config import parse_config
from loopwarden.pluginmanager import load_plugins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str, text: str = README) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def doc(name: str) -> str:
    return "\n" + (ROOT / "docs" / name).read_text(encoding="utf-8")


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_plugin_example_and_its_tests_run() -> None:
    guide = doc("writing-a-plugin.md")
    code = blocks(
        section("A plugin in ten lines", guide) + section("Write a plugin", guide), "python"
    )
    assert code[0] in section("A plugin in ten lines")  # the README shows the same ten lines
    assert len(code[0].strip().splitlines()) <= 10
    module = types.ModuleType("lw_readme")
    sys.modules[module.__name__] = module
    try:
        for block in code:
            exec(compile(block, "README.md", "exec"), module.__dict__)
        tests = {k: v for k, v in module.__dict__.items() if k.startswith("test_")}
        assert len(tests) == 2
        for fn in tests.values():
            fn()
    finally:
        del sys.modules[module.__name__]


def test_the_alerting_example_is_a_valid_plugin_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # the example's callable sink names the reader's own module; stand one in
    pkg, mod = types.ModuleType("mypackage"), types.ModuleType("mypackage.alerts")
    mod.page = lambda alert: None  # type: ignore[attr-defined]
    pkg.alerts = mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mypackage", pkg)
    monkeypatch.setitem(sys.modules, "mypackage.alerts", mod)
    (toml,) = blocks(section("Observability", doc("observability.md")), "toml")
    data: dict[str, Any] = tomllib.loads(toml)
    cfg = parse_config({"plugins": {"enabled": ["alerting"], **data["plugins"]}}, path="README")
    plugins = load_plugins(cfg)
    assert "alerting" in plugins.names
    plugins.get("alerting").close()
