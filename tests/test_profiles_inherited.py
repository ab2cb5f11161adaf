"""The shipped profiles are built in; a config file adds or replaces them (issue 34, item 3).

A deployment's own ``config.toml`` replaces the shipped file, but not its ``[profiles]``:
``profile = "support"`` works in any file, a file's ``[profiles.<name>]`` adds a profile, and
one named like a shipped profile replaces it whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwarden import Deployment
from loopwarden.commands.cli import main
from loopwarden.config import load_config, shipped_profiles
from loopwarden.exceptions import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_custom_config_names_a_shipped_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, '[run]\nprofile = "support"\n[plugins]\nenabled = ["max_steps"]\n')
    assert main(["config", "check", str(path)]) == 0, capsys.readouterr().err
    with Deployment(load_config(path)) as dep:
        limits = dep.limits(None)
    support = shipped_profiles()["support"]
    assert (limits.name, limits.max_steps, limits.max_tokens) == (
        "support",
        support["max_steps"],
        support["max_tokens"],
    )


def test_a_file_adds_profiles_and_replaces_a_shipped_one_whole(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[profiles.support]\nmax_steps = 50\n[profiles.night]\nmax_seconds = 30\n",
    )
    config = load_config(path)
    assert set(shipped_profiles()) | {"night"} == set(config.profiles)
    with Deployment(config) as dep:
        support, night, simple = dep.limits("support"), dep.limits("night"), dep.limits("simple")
    assert support.max_steps == 50 and support.max_tokens is None  # replaced, not merged
    assert night.max_seconds == 30
    assert simple.max_steps == shipped_profiles()["simple"]["max_steps"]


def test_an_unknown_profile_still_fails_naming_the_known_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, '[run]\nprofile = "suport"\n')
    with pytest.raises(ConfigError, match="unknown profile 'suport'") as err:
        load_config(path)
    assert err.value.key == "run.profile"
