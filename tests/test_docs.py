"""Meta-tests that keep the docs and the code in step (datasette's habit).

* every hook is a hookspec, documented completely, and present in docs/hooks.md;
* docs/hooks.md and docs/plugins.md are exactly what ``python -m loopwarden.docs`` generates;
* every hook has a test (a ``test_hook_<name>`` function somewhere under tests/);
* the plugin guide's first example is a plugin in ten lines (every block of every page runs in
  tests/test_doc_blocks.py).
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

import pytest

from loopwarden import docs, hookspecs
from loopwarden.engine.pluginmanager import builtin_settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TESTS = ROOT / "tests"

HINT = "run `python -m loopwarden.docs` and commit the result"


def hookspec_names() -> list[str]:
    marker = hookspecs.PROJECT + "_spec"
    return [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, marker)
    ]


def test_hook_names_list_every_hookspec() -> None:
    assert sorted(hookspecs.HOOK_NAMES) == sorted(hookspec_names())
    assert len(set(hookspecs.HOOK_NAMES)) == len(hookspecs.HOOK_NAMES)


@pytest.mark.parametrize("hook", hookspecs.HOOK_NAMES)
def test_every_hook_is_documented_completely(hook: str) -> None:
    fn = getattr(hookspecs, hook)
    doc = docs.parse_docstring(fn.__doc__ or "")
    assert doc["summary"], f"{hook}: no description"
    params = list(inspect.signature(fn).parameters)
    assert list(doc["params"]) == params, f"{hook}: document each parameter, in order"
    assert all(doc["params"].values()), f"{hook}: a :param: without text"
    assert doc["return"], f"{hook}: say what a return value means (:return:)"
    assert doc["may_stop"], f"{hook}: say whether it may stop the run (:may stop the run:)"
    assert doc["versionadded"], f"{hook}: missing .. versionadded::"


def test_hooks_md_is_generated_and_current() -> None:
    text = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert text == docs.render_hooks(), HINT
    for hook in hookspecs.HOOK_NAMES:
        assert f"\n### {hook}\n" in text
        assert f"def {hook}(" in text


def test_hooks_md_keeps_the_phase_banners() -> None:
    sections = docs.hook_sections()
    assert [t for t, _ in sections] == [
        "Pre-flight",
        "The model turn",
        "Tool calls",
        "Post-flight",
        "Lifecycle",
    ]
    assert [h for _, hooks in sections for h in hooks] == list(hookspecs.HOOK_NAMES)


def test_plugins_md_is_generated_and_current() -> None:
    text = (DOCS / "plugins.md").read_text(encoding="utf-8")
    assert text == docs.render_plugins(), HINT
    for name in builtin_settings():
        assert f"\n## {name}\n" in text


def test_plugins_md_default_tables_are_valid_settings() -> None:
    text = docs.render_plugins()
    models = builtin_settings()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert len(blocks) == sum(m is not None for m in models.values())
    for block in blocks:
        tables = tomllib.loads(block)["plugins"]
        for name, table in tables.items():
            model = models[name]
            assert model is not None
            model.model_validate(table)  # the documented defaults are accepted as written


def test_docs_check_detects_stale_pages(tmp_path: Path) -> None:
    assert docs.main(["--check", "--out", str(DOCS)]) == 0
    assert docs.main(["--check", "--out", str(tmp_path)]) == 1
    assert docs.main(["--out", str(tmp_path)]) == 0
    assert docs.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "hooks.md").write_text("edited by hand\n", encoding="utf-8")
    assert docs.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_hook_has_a_test() -> None:
    tested: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_hook_"):
                tested.add(node.name[len("test_hook_") :])
    missing = [
        h for h in hookspecs.HOOK_NAMES if not any(t == h or t.startswith(h + "_") for t in tested)
    ]
    assert missing == [], f"write a test_hook_<name> test for: {missing}"


@pytest.mark.parametrize(
    ("rst", "md"),
    [
        ("see :func:`~loopwarden.stop`", "see `stop()`"),
        ("a :class:`loopwarden.ToolCall`", "a `loopwarden.ToolCall`"),
        ("``[plugins]\nenabled``", "`[plugins]\nenabled`"),
        ("hard stop > soft\n> skip", "hard stop > soft\n\\> skip"),
        ("Example::\n\n    code()\n\nafter", "Example:\n\n```python\ncode()\n```\n\nafter"),
        ('Output::\n\n    {"a": 1}\n', 'Output:\n\n```text\n{"a": 1}\n```'),
        ("Fragment::\n\n    return x\n", "Fragment:\n\n```text\nreturn x\n```"),
    ],
)
def test_rst_to_markdown(rst: str, md: str) -> None:
    assert docs.rst_to_markdown(rst) == md


# -- the plugin guide (its blocks run in tests/test_doc_blocks.py) ---------------------------


def guide_blocks() -> list[str]:
    text = (DOCS / "plugin-guide.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_guide_has_a_plugin_in_ten_lines() -> None:
    first = guide_blocks()[0]
    code = [ln for ln in first.splitlines() if ln.strip() and not ln.strip().startswith('"""')]
    assert len(code) <= 10


def test_the_shipped_config_points_editors_at_the_generated_schema() -> None:
    import json

    from loopwarden.config import default_config_path
    from loopwarden.docs import render_config_schema

    first = default_config_path().read_text(encoding="utf-8").splitlines()[0]
    assert first == "#:schema ./docs/config.schema.json"
    root = Path(__file__).resolve().parents[1]
    shipped = root / first.removeprefix("#:schema ./")
    assert shipped.read_text(encoding="utf-8") == render_config_schema()
    schema = json.loads(shipped.read_text(encoding="utf-8"))
    # every built-in plugin's table is described, and a typo is not allowed by the schema
    tables = schema["properties"]["plugins"]["properties"]
    assert {"max_steps", "retry_policy", "spend_limits", "run_record"} <= set(tables)
