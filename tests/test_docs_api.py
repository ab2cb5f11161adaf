"""docs/api.md: generated from the code, current, and complete for what plugin authors use
(issue 21.4)."""

from __future__ import annotations

import dataclasses
import importlib
import shutil
from pathlib import Path

import pytest

from loopwarden import docs
from loopwarden.docs import api as _docs_api

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"

TOOLCALL = [
    *("name", "arguments", "raw_arguments", "id", "step", "index", "fingerprint", "tool"),
    *("error", "error_detail", "timeout", "delay_s", "idempotency_key", "retry", "read_only"),
    *("side_effect", "deterministic", "declared", "may_change_state", "signature"),
]


def _classes() -> list[type]:
    out = []
    for _, module, names in _docs_api.SECTIONS:
        mod = importlib.import_module(module)
        out += [getattr(mod, n) for n in names if isinstance(getattr(mod, n), type)]
    return out


def test_api_md_is_generated_and_current() -> None:
    assert API.read_text(encoding="utf-8") == docs.render_api(), (
        "run `python -m loopwarden.docs` and commit the result"
    )


def test_check_fails_on_a_stale_api_md(tmp_path: Path) -> None:
    for name in docs.PAGES:
        shutil.copy(ROOT / "docs" / name, tmp_path / name)
    assert docs.main(["--check", "--out", str(tmp_path)]) == 0
    page = tmp_path / "api.md"
    page.write_text(page.read_text(encoding="utf-8").replace("raw_arguments", "raw"), "utf-8")
    assert docs.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_toolcall_member_is_documented() -> None:
    members = {m.name: m for m in _docs_api.members(_docs_api_cls("ToolCall"))}
    assert sorted(members) == sorted(TOOLCALL)
    text = API.read_text(encoding="utf-8")
    for name in TOOLCALL:
        assert members[name].doc, f"ToolCall.{name}: no description"
        assert f"`{name}" in text


def _docs_api_cls(name: str) -> type:
    return next(c for c in _classes() if c.__name__ == name)


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_listed_class_member_has_a_description(cls: type) -> None:
    undocumented = [m.name for m in _docs_api.members(cls) if not m.doc]
    assert undocumented == [], f"{cls.__name__}: add a #: comment or a docstring"
    if dataclasses.is_dataclass(cls):
        public = [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]
        assert public == [m.name for m in _docs_api.members(cls) if m.kind == "field"]


def test_the_testing_kit_and_fixtures_are_in_the_reference() -> None:
    text = API.read_text(encoding="utf-8")
    for name in (
        "run_plugin(plugin: Any, *, turns",
        "call_hook(",
        "### PluginRun",
        "make_tool_call(name: str, arguments: Mapping[str, Any] | str | None = None, /",
        "raw JSON text",
        "lw_deployment(tmp_path: Path)",
        "lw_hooks()",
        "lw_clock()",
        "lw_signals()",
        "render_note(template: str, /, **fields: Any) -> Note",
        "stop(reason: str, *, soft: bool = False",
    ):
        assert name in text, name
    assert "0x" not in text  # no object addresses: the page must be stable


def test_hooks_md_links_the_api_reference() -> None:
    assert "(api.md)" in (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")


def _public_names() -> set[str]:
    import loopwarden
    import loopwarden.plugin
    import loopwarden.testing

    names = {*loopwarden.__all__, *loopwarden.plugin.__all__, *loopwarden.testing.__all__}
    return names - {"__version__"}


def test_every_public_name_has_a_section() -> None:
    text = docs.render_api()
    missing = sorted(n for n in _public_names() if f"\n### {n}\n" not in text)
    assert missing == [], f"docs/api.md has no section for {missing}: add them to SECTIONS"


def test_a_public_name_without_a_section_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import loopwarden

    monkeypatch.setattr(loopwarden, "__all__", [*loopwarden.__all__, "Unlisted"])
    with pytest.raises(AssertionError, match="Unlisted"):
        test_every_public_name_has_a_section()


def test_every_run_attribute_has_a_type() -> None:
    from loopwarden.run import Run

    untyped = [m.name for m in _docs_api.members(Run) if m.kind == "attribute" and not m.type]
    assert untyped == [], "annotate them where __init__ sets them: self.x: T = ..."


def test_plugin_name_is_described_as_the_loader_names_it() -> None:
    (name,) = [m for m in _docs_api.members(_docs_api_cls("Plugin")) if m.name == "name"]
    assert "entry point" in name.doc and "declares" in name.doc
