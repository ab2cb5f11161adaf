"""Config files: validation, clear errors naming file and key, profiles, file discovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwarden import ConfigError, Deployment
from loopwarden.config import default_config_path, find_config, load_config, parse_config
from loopwarden.engine.pluginmanager import load_plugins


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_the_shipped_config_is_valid_and_loads_its_plugins() -> None:
    cfg = load_config(default_config_path())
    plugins = load_plugins(cfg)
    assert plugins.names[0] == "max_steps"
    assert plugins.names == [n for n in cfg.plugins.enabled if n in plugins.names]


def test_top_level_config_toml_is_the_deployments_own_file_over_the_shipped_default() -> None:
    top = Path(__file__).resolve().parent.parent / "config.toml"
    assert not top.is_symlink() and top.resolve() != default_config_path().resolve()
    ours, shipped = load_config(top), load_config(default_config_path())
    assert ours.extends == "defaults"
    assert ours.model_dump() == shipped.model_dump()  # it lists nothing of its own (yet)


def test_a_string_where_a_step_limit_belongs_names_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, '[plugins.max_steps]\nmax_steps = "ten"\n')
    with pytest.raises(ConfigError) as info:
        Deployment(load_config(p))
    err = info.value
    assert err.path == str(p) and err.key == "plugins.max_steps.max_steps"
    assert "integer" in str(err) and "'ten'" in str(err)


def test_profile_values_are_validated_too(tmp_path: Path) -> None:
    p = write(tmp_path, '[profiles.simple]\nmax_steps = "ten"\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert info.value.key == "profiles.simple.max_steps"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[model]\nnmae = 'x'\n", "model.nmae"),
        ("[run]\nwarning_role = 'robot'\n", "run.warning_role"),
        ("[plugins.max_steps]\nmax_stepz = 3\n", "plugins.max_steps.max_stepz"),
        ("[plugins.max_steps]\nmax_steps = 0\n", "plugins.max_steps.max_steps"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[run]\nprofile = 'huge'\n", "run.profile"),
        ("[run.texts]\nunknown_tool = 'no {such_field}'\n", "run.texts"),
        ("[plugins.not_a_plugin]\nx = 1\n", "plugins.not_a_plugin"),
    ],
)
def test_unknown_and_bad_keys_are_errors(tmp_path: Path, text: str, key: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        Deployment(load_config(p))
    assert info.value.key == key, str(info.value)
    assert str(p) in str(info.value)


def test_malformed_toml_and_missing_file(tmp_path: Path) -> None:
    p = write(tmp_path, "[model\nname = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


def test_profiles_set_run_limits(make_config: object) -> None:
    cfg = parse_config(
        {"profiles": {"simple": {"max_steps": 3, "max_tokens": 100, "max_seconds": 2.5}}},
        path="<t>",
    )
    dep = Deployment(cfg)
    limits = dep.limits("simple")
    assert (limits.name, limits.max_steps, limits.max_tokens, limits.max_seconds) == (
        "simple",
        3,
        100,
        2.5,
    )
    with pytest.raises(ConfigError, match="unknown profile"):
        dep.limits("galactic")


def test_a_profile_caps_the_steps_of_a_run() -> None:
    cfg = parse_config({"profiles": {"tiny": {"max_steps": 2}}}, path="<t>")
    run = Deployment(cfg).run(scenario="refund", profile="tiny")
    rec = run.record()
    assert rec["termination"] == "max_steps" and rec["steps"] == 2 and rec["profile"] == "tiny"


def test_config_discovery_prefers_explicit_then_cwd_then_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_config() == default_config_path()
    (tmp_path / "config.toml").write_text("", encoding="utf-8")
    assert find_config() == Path("config.toml")
    assert find_config(tmp_path / "x.toml") == tmp_path / "x.toml"


def test_essential_plugin_cannot_be_blocked_or_left_out(tmp_path: Path) -> None:
    p = write(tmp_path, "[plugins]\nenabled = []\nblocked = ['max_steps']\n")
    with pytest.raises(ConfigError, match="essential"):
        Deployment(load_config(p))
    p = write(tmp_path, "[plugins]\nenabled = []\n")
    assert Deployment(load_config(p)).plugins.names == ["max_steps"]


def test_an_unknown_plugin_name_names_file_key_and_a_suggestion(tmp_path: Path) -> None:
    from loopwarden import PluginLoadError

    p = write(tmp_path, '[plugins]\nenabled = ["max_steps", "repeat_cal"]\n')
    with pytest.raises(PluginLoadError) as info:
        Deployment(load_config(p))
    err = info.value
    assert (err.path, err.key, err.plugin) == (str(p), "plugins.enabled[1]", "repeat_cal")
    assert "did you mean 'repeat_call'?" in str(err)


def test_a_bad_table_of_a_switched_off_built_in_fails_before_any_run(tmp_path: Path) -> None:
    p = write(
        tmp_path, "[plugins]\nenabled = []\n[plugins.repeat_call]\nrepeat_hint = 'x {nope}'\n"
    )
    with pytest.raises(ConfigError) as info:
        Deployment(load_config(p))
    assert info.value.key == "plugins.repeat_call" and "nope" in str(info.value)
