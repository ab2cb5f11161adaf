"""docs/configuration.md's two deployments: the example files load with the effective values
the page states, and the ``loopwarden config show`` output it prints is the program's."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from loopwarden.commands import cli
from loopwarden.config import default_config_path, load_config
from loopwarden.host import load_plugins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
EXAMPLES = ROOT / "examples" / "deployments"
SHIPPED = load_config(default_config_path())


def _console_blocks() -> dict[str, list[str]]:
    """The page's ``console`` blocks of ``config show``: the command -> the lines shown."""
    text = DOC.read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        command, *lines = body.rstrip("\n").split("\n")
        if "config show" in command:
            out[command.removeprefix("$ ").strip()] = lines
    return out


@pytest.mark.parametrize("name", ["strict", "lenient"])
def test_the_page_shows_the_example_files_as_they_are(name: str) -> None:
    """The ``toml`` block of each example is the file (its comments and schema line aside)."""
    text = DOC.read_text(encoding="utf-8")
    link = f"(../examples/deployments/{name}.toml)"
    after = text[text.index(link) :]
    block = re.search(r"```toml\n(.*?)```", after, re.S)
    assert block is not None
    assert tomllib.loads(block.group(1)) == tomllib.loads(
        (EXAMPLES / f"{name}.toml").read_text(encoding="utf-8")
    )


@pytest.mark.parametrize("name", ["strict", "lenient"])
def test_the_show_output_on_the_page_is_the_programs(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command = f"loopwarden config show --config examples/deployments/{name}.toml"
    shown = _console_blocks()[command]
    monkeypatch.chdir(ROOT)
    assert cli.main(command.split()[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    # every line the page shows is printed, in the page's order ("..." stands for any lines)
    at = 0
    for line in shown:
        if line == "...":
            continue
        assert line in printed[at:], f"{name}: not printed (in this order): {line}"
        at = printed.index(line, at) + 1


def test_strict_runs_with_the_values_the_page_states() -> None:
    cfg = load_config(EXAMPLES / "strict.toml")
    tables = cfg.plugins.tables()
    profile = cfg.profile(None)
    assert profile is not None
    assert (profile.max_steps, profile.max_tokens, profile.max_seconds) == (35, 305000, 600.0)
    assert cfg.plugins.enabled == [*SHIPPED.plugins.enabled, "spend_limits"]
    assert str(tables["cost_budget"]["max_cost"]) == "0.5"
    assert tables["repeat_call"]["soft"] is False
    assert tables["repeat_call"]["stop_at_repeat"] == 2  # the third identical call
    assert (tables["failure_streak"]["stop_after"], tables["failure_streak"]["warn_after"]) == (
        2,
        1,
    )
    assert tables["failure_streak"]["same_call_stop_after"] == 2
    # what the file does not write is the shipped default
    assert (
        cfg.model == SHIPPED.model
        and cfg.store == SHIPPED.store
        and cfg.run.texts == (SHIPPED.run.texts)
    )
    assert tables["stall"] == SHIPPED.plugins.tables()["stall"]
    assert len(load_plugins(cfg)) == len(cfg.plugins.enabled)  # every table is valid


def test_lenient_runs_with_the_values_the_page_states() -> None:
    cfg = load_config(EXAMPLES / "lenient.toml")
    tables = cfg.plugins.tables()
    profile = cfg.profile(None)
    assert profile is not None
    assert (profile.max_steps, profile.max_tokens, profile.max_seconds) == (250, 8000000, 3600.0)
    assert cfg.plugins.enabled == [
        n for n in SHIPPED.plugins.enabled if n not in ("no_progress", "stall")
    ]
    assert tables["repeat_call"]["stop_at_repeat"] == 7 and tables["repeat_call"]["soft"] is True
    assert (tables["failure_streak"]["stop_after"], tables["failure_streak"]["warn_after"]) == (
        6,
        4,
    )
    assert cfg.model == SHIPPED.model and cfg.store == SHIPPED.store
    assert len(load_plugins(cfg)) == len(cfg.plugins.enabled)


@pytest.mark.parametrize(
    "path", [EXAMPLES / "strict.toml", EXAMPLES / "lenient.toml", ROOT / "config.toml"]
)
def test_editors_accept_a_short_file_with_the_published_schema(path: Path) -> None:
    """docs/config.schema.json (what the files' ``#:schema`` line points TOML editors at)
    knows ``extends`` and ``[plugins] enable`` / ``disable``, and still refuses a typo."""
    import jsonschema

    schema = json.loads((ROOT / "docs" / "config.schema.json").read_text(encoding="utf-8"))
    check = jsonschema.Draft202012Validator(schema)
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert list(check.iter_errors(data)) == []
    assert list(check.iter_errors({**data, "extend": "defaults"}))  # a typo is flagged
    bad = {**data, "plugins": {"enable": "spend_limits"}}  # not a list
    assert list(check.iter_errors(bad))
