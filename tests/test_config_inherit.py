"""A config file that builds on another (``extends``): the merge, its errors, ``config show``
and ``config check``'s warning about a short file that extends nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loopwarden import ConfigError, Deployment
from loopwarden.commands import cli
from loopwarden.commands.config import effective_values, few_guards, show_text
from loopwarden.config import default_config_path, load_config
from loopwarden.config.inherit import key_lines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SHIPPED = load_config(default_config_path())


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def shipped_line(key: str) -> int:
    """The line of a dotted key in the shipped file (so tests follow its edits)."""
    return key_lines(default_config_path().read_text(encoding="utf-8"))[tuple(key.split("."))]


# -- the merge ---------------------------------------------------------------------------------


def test_a_child_over_the_defaults_changes_only_the_keys_it_writes(tmp_path: Path) -> None:
    p = write(
        tmp_path / "c.toml",
        'extends = "defaults"\n[plugins.timeout]\nmax_seconds = 300.0\n'
        '[plugins.failure_streak]\nneutral_tools = ["noop"]\n',
    )
    cfg = load_config(p)
    timeout = cfg.plugins.tables()["timeout"]
    shipped_timeout = SHIPPED.plugins.tables()["timeout"]
    assert timeout["max_seconds"] == 300.0
    # the rest of the table is inherited, key by key
    assert {k: v for k, v in timeout.items() if k != "max_seconds"} == {
        k: v for k, v in shipped_timeout.items() if k != "max_seconds"
    }
    # an array replaces the parent's whole
    assert cfg.plugins.tables()["failure_streak"]["neutral_tools"] == ["noop"]
    # everything else: the shipped values
    assert cfg.plugins.enabled == SHIPPED.plugins.enabled
    assert cfg.model == SHIPPED.model and cfg.store == SHIPPED.store
    assert cfg.extends == "defaults" and cfg.path == str(p)


def test_a_profile_merges_key_by_key_too(tmp_path: Path) -> None:
    p = write(tmp_path / "c.toml", 'extends = "defaults"\n[profiles.simple]\nmax_steps = 9\n')
    simple = load_config(p).profiles["simple"]
    assert simple.max_steps == 9
    assert simple.max_tokens == SHIPPED.profiles["simple"].max_tokens
    assert simple.description == SHIPPED.profiles["simple"].description


def test_a_chain_of_files_relative_to_each_file(tmp_path: Path) -> None:
    write(
        tmp_path / "base" / "company.toml",
        'extends = "defaults"\n[model]\nname = "gpt-4o"\n[plugins.cost_budget]\nmax_cost = 3.0\n',
    )
    write(
        tmp_path / "teams" / "team.toml",
        'extends = "../base/company.toml"\n[plugins.cost_budget]\nmax_cost = 1.0\n'
        "[run]\nmax_observation_chars = 5000\n",
    )
    leaf = write(
        tmp_path / "teams" / "prod" / "config.toml",
        'extends = "../team.toml"\n[run]\nmode = "shadow"\n',
    )
    cfg = load_config(leaf)
    assert cfg.model.name == "gpt-4o"  # the grandparent
    assert cfg.plugins.tables()["cost_budget"]["max_cost"] == 1.0  # the parent wins over it
    assert cfg.run.max_observation_chars == 5000 and cfg.run.mode == "shadow"
    assert cfg.plugins.tables()["cost_budget"]["currency"] == "USD"  # the shipped file


def test_a_file_without_extends_stays_a_complete_config(tmp_path: Path) -> None:
    p = write(tmp_path / "c.toml", "[plugins.timeout]\nmax_seconds = 300.0\n")
    cfg = load_config(p)
    assert cfg.plugins.enabled == []  # what it leaves out is off, as before
    assert cfg.plugins.tables() == {"timeout": {"max_seconds": 300.0}}
    assert cfg.extends is None


# -- [plugins] enable / disable --------------------------------------------------------------


def test_enable_appends_and_disable_removes(tmp_path: Path) -> None:
    p = write(
        tmp_path / "c.toml",
        'extends = "defaults"\n[plugins]\nenable = ["spend_limits", "repeat_call"]\n'
        'disable = ["stall"]\n',
    )
    enabled = load_config(p).plugins.enabled
    expected = [n for n in SHIPPED.plugins.enabled if n != "stall"] + ["spend_limits"]
    assert enabled == expected  # repeat_call, already enabled, keeps its place


def test_enabled_in_a_child_replaces_the_list(tmp_path: Path) -> None:
    p = write(
        tmp_path / "c.toml", 'extends = "defaults"\n[plugins]\nenabled = ["max_steps", "timeout"]\n'
    )
    assert load_config(p).plugins.enabled == ["max_steps", "timeout"]


def test_edits_in_a_chain_apply_in_turn(tmp_path: Path) -> None:
    write(tmp_path / "a.toml", 'extends = "defaults"\n[plugins]\ndisable = ["stall"]\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n[plugins]\nenable = ["stall"]\n')
    enabled = load_config(tmp_path / "b.toml").plugins.enabled
    assert enabled == [n for n in SHIPPED.plugins.enabled if n != "stall"] + ["stall"]


def test_disabling_a_plugin_that_is_not_enabled_names_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path / "c.toml", 'extends = "defaults"\n[plugins]\ndisable = ["stal"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.path == str(p) and info.value.key == "plugins.disable"
    assert "'stal'" in str(info.value) and "did you mean 'stall'" in str(info.value)


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('[plugins]\nenable = ["x"]\n', "plugins.enable", "extends nothing"),
        (
            'extends = "defaults"\n[plugins]\nenabled = ["max_steps"]\nenable = ["stall"]\n',
            "plugins.enable",
            "one or the other",
        ),
        ('extends = "defaults"\n[plugins]\nenable = "stall"\n', "plugins.enable", "list"),
        (
            'extends = "defaults"\n[plugins]\nenable = ["stall"]\ndisable = ["stall"]\n',
            "plugins.disable",
            "both enabled and disabled",
        ),
    ],
)
def test_bad_plugin_edits_are_errors(tmp_path: Path, text: str, key: str, words: str) -> None:
    p = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.path == str(p) and info.value.key == key
    assert words in str(info.value)


# -- errors name the file and key ------------------------------------------------------------


def test_a_cycle_is_an_error_naming_the_files(tmp_path: Path) -> None:
    write(tmp_path / "a.toml", 'extends = "b.toml"\n')
    write(tmp_path / "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "a.toml")
    err = info.value
    assert err.key == "extends" and err.path is not None and err.path.endswith("b.toml")
    assert "extends it back" in str(err)
    assert "a.toml -> " in str(err) and "b.toml -> " in str(err)


def test_a_file_extending_itself_is_a_cycle(tmp_path: Path) -> None:
    p = write(tmp_path / "a.toml", 'extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="extends it back"):
        load_config(p)


def test_a_missing_parent_names_the_child_and_the_parent(tmp_path: Path) -> None:
    p = write(tmp_path / "c.toml", 'extends = "nowhere/base.toml"\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    err = info.value
    assert err.path == str(p) and err.key == "extends"
    assert "base.toml" in err.message and "does not exist" in err.message


@pytest.mark.parametrize("value", ["3", '""', '["defaults"]'])
def test_extends_must_name_a_file(tmp_path: Path, value: str) -> None:
    p = write(tmp_path / "c.toml", f"extends = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.path == str(p) and info.value.key == "extends"


def test_an_unknown_key_in_a_child_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "base.toml", 'extends = "defaults"\n[run]\nmode = "shadow"\n')
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n\n[run]\nmood = "calm"\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    err = info.value
    assert err.path == str(p) and err.key == "run.mood"
    assert "unknown key" in str(err) and "(line 4)" in str(err)


def test_a_bad_value_in_a_parent_is_named_with_the_parents_file(tmp_path: Path) -> None:
    parent = write(tmp_path / "base.toml", 'extends = "defaults"\n[model]\ntimeout_s = -1\n')
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n[run]\nmode = "shadow"\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert Path(str(info.value.path)).resolve() == parent.resolve()
    assert info.value.key == "model.timeout_s" and "(line 3)" in str(info.value)


def test_check_names_the_parent_that_wrote_a_bad_plugin_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # plugin tables are validated when the plugins load, after the merge
    write(tmp_path / "base.toml", 'extends = "defaults"\n[plugins.timeout]\nmax_seconds = -1\n')
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n[run]\nmode = "shadow"\n')
    assert cli.main(["config", "check", str(p)]) == 2
    err = capsys.readouterr().err
    assert "base.toml: plugins.timeout.max_seconds:" in err and "(line 3)" in err
    assert "c.toml" not in err


def test_a_deployment_names_the_parent_that_wrote_a_bad_plugin_setting(tmp_path: Path) -> None:
    """Not only ``config check``: loading the plugins (``loopwarden run``, ``Deployment``)
    names the parent file and line too."""
    write(tmp_path / "base.toml", 'extends = "defaults"\n[plugins.timeout]\nmax_seconds = -1\n')
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n[run]\nmode = "shadow"\n')
    with pytest.raises(ConfigError) as info:
        Deployment(load_config(p))
    assert info.value.path == str(tmp_path / "base.toml")
    assert info.value.key == "plugins.timeout.max_seconds" and "(line 3)" in str(info.value)


def test_a_merge_that_breaks_a_rule_across_files_is_an_error(tmp_path: Path) -> None:
    # the child shortens the TTL below the shipped lease: the store's rule still holds
    p = write(tmp_path / "c.toml", 'extends = "defaults"\n[store]\nledger_ttl_s = 60.0\n')
    with pytest.raises(ConfigError, match="ledger_ttl_s"):
        load_config(p)


def test_a_parent_that_is_not_valid_toml_is_named(tmp_path: Path) -> None:
    parent = write(tmp_path / "base.toml", "[run\n")
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.path == str(parent) and "not valid TOML" in str(info.value)


# -- loopwarden config show ------------------------------------------------------------------


def test_show_names_the_file_and_line_of_each_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path / "c.toml",
        'extends = "defaults"\n\n[plugins.timeout]\nmax_seconds = 300.0\n[plugins]\n'
        'disable = ["stall"]\n',
    )
    text = show_text("c.toml")
    lines = text.splitlines()
    assert lines[0] == "# the effective config of c.toml, extending defaults"
    assert "plugins.timeout.max_seconds = 300.0  # c.toml:4" in lines
    grace = SHIPPED.plugins.tables()["timeout"]["grace_s"]
    assert (
        f"plugins.timeout.grace_s = {grace!r}  # defaults:{shipped_line('plugins.timeout.grace_s')}"
        in lines
    )
    enabled = [n for n in SHIPPED.plugins.enabled if n != "stall"]
    assert f"plugins.enabled = {json.dumps(enabled)}  # c.toml:6" in lines
    # a setting no file writes: the model's default
    assert 'gateway.host = "127.0.0.1"  # built-in' in lines
    # the text is itself a complete config, with the same effective values
    again = load_config(write(tmp_path / "again.toml", text))
    assert again.extends is None
    assert effective_values(again) == effective_values(load_config(tmp_path / "c.toml"))


def test_show_fills_in_plugin_defaults_as_built_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "c.toml", '[plugins]\nenabled = ["max_steps"]\n')
    lines = show_text("c.toml").splitlines()
    assert lines[0] == "# the effective config of c.toml"
    assert "plugins.max_steps.max_steps = 165  # built-in" in lines
    # the shipped profiles are built into a file that extends nothing: from the shipped file
    line = shipped_line("profiles.simple.max_steps")
    assert f"profiles.simple.max_steps = 15  # defaults:{line}" in lines


def test_show_prints_a_plugin_it_cannot_load_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path / "c.toml",
        'extends = "defaults"\n[plugins]\nenable = ["no_such_module:X"]\n[plugins.X]\na = 1\n',
    )
    lines = show_text("c.toml").splitlines()
    assert "plugins.X.a = 1  # c.toml:5" in lines  # config check says why it cannot load
    assert any(
        line.startswith("plugins.enabled = [") and "no_such_module:X" in line for line in lines
    )


def test_show_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "base.toml", 'extends = "defaults"\n[model]\nname = "gpt-4o"\n')
    p = write(tmp_path / "c.toml", 'extends = "base.toml"\n[run]\nmode = "shadow"\n')
    assert cli.main(["config", "show", "--config", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["files"][0] == str(p) and out["files"][-1] == "defaults"
    assert out["files"][1].endswith("base.toml")
    assert out["config"]["model"]["name"] == "gpt-4o"
    assert out["sources"]["model.name"].endswith("base.toml:3")
    assert out["sources"]["run.mode"] == f"{p}:3"
    assert out["sources"]["model.provider"] == f"defaults:{shipped_line('model.provider')}"
    assert "extends" not in out["config"]


def test_show_of_a_bad_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write(tmp_path / "c.toml", 'extends = "gone.toml"\n')
    assert cli.main(["config", "show", "--config", str(p)]) == 2
    err = capsys.readouterr().err
    assert str(p) in err and "extends" in err and "gone.toml" in err


# -- loopwarden config check ------------------------------------------------------------------


def test_check_warns_about_a_short_file_that_extends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write(tmp_path / "c.toml", "[plugins.max_steps]\nmax_steps = 20\n")
    assert cli.main(["config", "check", str(p)]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "extends nothing" in err and 'extends = "defaults"' in err
    assert "repeat_call" in err  # what is off is named
    n = len(SHIPPED.plugins.enabled)
    assert f"enables 1 of the {n} plugins" in err  # the essential max_steps runs anyway
    assert "max_steps," not in err.split("enables")[1]


@pytest.mark.parametrize(
    "text",
    [
        'extends = "defaults"\n[plugins.max_steps]\nmax_steps = 20\n',  # builds on the shipped
        # a complete file that enables most of the shipped list
        "[plugins]\nenabled = "
        + json.dumps([n for n in SHIPPED.plugins.enabled if n not in ("stall", "metrics")])
        + "\n",
    ],
)
def test_check_does_not_warn_about_a_file_that_keeps_the_guards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    p = write(tmp_path / "c.toml", text)
    assert cli.main(["config", "check", str(p)]) == 0
    assert "extends nothing" not in capsys.readouterr().err


def test_the_shipped_config_is_not_warned_about() -> None:
    assert few_guards(SHIPPED) is None


# -- the repository's config.toml --------------------------------------------------------------


def test_editing_the_repository_config_toml_leaves_the_shipped_default_alone(
    tmp_path: Path,
) -> None:
    top = Path(__file__).resolve().parent.parent / "config.toml"
    copy = write(tmp_path / "config.toml", top.read_text(encoding="utf-8"))
    before = default_config_path().read_bytes()
    with copy.open("a", encoding="utf-8") as fh:
        fh.write("\n[plugins.max_steps]\nmax_steps = 7\n")
    cfg = load_config(copy)
    assert cfg.plugins.tables()["max_steps"]["max_steps"] == 7
    assert default_config_path().read_bytes() == before
    assert load_config(default_config_path()).plugins.tables()["max_steps"]["max_steps"] == 165


# -- where keys are written -------------------------------------------------------------------


def test_key_lines_follow_tables_dotted_keys_and_multi_line_values() -> None:
    text = (
        "a = 1\n"  # 1
        "[t]\n"  # 2
        "s = '''\n"  # 3
        "x = 2\n"  # 4  inside a string
        "'''\n"  # 5
        "arr = [\n"  # 6
        '  "[not.a.table]",  # ]\n'  # 7
        "]\n"  # 8
        'd.e = "#"  # comment\n'  # 9
        '"q.k" = { in = 1 }\n'  # 10
        "[[many]]\n"  # 11
        "v = 3\n"  # 12
    )
    assert tomllib.loads(text)  # valid TOML
    assert key_lines(text) == {
        ("a",): 1,
        ("t",): 2,
        ("t", "s"): 3,
        ("t", "arr"): 6,
        ("t", "d", "e"): 9,
        ("t", "q.k"): 10,
        ("many",): 11,
        ("many", "v"): 12,
    }
