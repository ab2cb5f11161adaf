"""Bad input gives a clear message and exit 2, never a traceback (item 10).

Encodings other than UTF-8, deeply nested TOML, plugins that raise while being imported,
read, validated or connected, output paths that cannot be written, a bad ``--limit``, and a
``run_record`` path that cannot take records (``config check`` says so; a FIFO never hangs).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from loopwarden.commands.cli import main
from loopwarden.config import default_config_path
from loopwarden.models.scenario import scenario_path

SHIPPED = default_config_path().read_text(encoding="utf-8")
NON_ASCII = SHIPPED.replace("[run]\n", '[run]\nfallback_answer = "抱歉，暂时无法完成"\n', 1)
REFUND = scenario_path("refund").read_text(encoding="utf-8")


def _exit2(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize("encoding", ["gbk", "utf-16"])
def test_a_config_not_in_utf8(
    encoding: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(NON_ASCII.encode(encoding))
    err = _exit2(["config", "check", str(path)], capsys, str(path), "not UTF-8")
    assert ("UTF-16" in err) == (encoding == "utf-16")


@pytest.mark.parametrize("encoding", ["gbk", "utf-16"])
def test_a_scenario_not_in_utf8(
    encoding: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "refund.toml"
    path.write_bytes(REFUND.encode(encoding))
    _exit2(["run", "--scenario", str(path)], capsys, str(path), "not UTF-8")


def test_deeply_nested_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    _exit2(["config", "check", str(path)], capsys, str(path), "nested too deeply")


PLUGINS = {
    "connect": """
from loopwarden import Plugin, hookimpl
class P(Plugin):
    name = "p"
    def connect(self, deployment):
        raise RuntimeError("connect exploded")
    @hookimpl
    def before_model(self, run, request):
        return None
""",
    "validator": """
from pydantic import field_validator
from loopwarden import Plugin, PluginSettings, hookimpl
class S(PluginSettings):
    x: int = 1
    @field_validator("x")
    @classmethod
    def _check(cls, v):
        raise TypeError("validator exploded")
class P(Plugin):
    name = "p"
    Settings = S
    @hookimpl
    def before_model(self, run, request):
        return None
""",
    "attribute": """
def __getattr__(name):
    raise RuntimeError("attribute access exploded")
""",
    "object attribute": """
class Hostile:
    def __getattr__(self, name):
        raise RuntimeError("attribute access exploded")
P = Hostile()
""",
    "SystemExit": "raise SystemExit(3)\n",
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
}


@pytest.mark.parametrize("command", [["config", "check"], ["run", "--scenario", "refund"]])
@pytest.mark.parametrize("kind", list(PLUGINS))
def test_a_plugin_that_raises(
    kind: str,
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = f"hostile_{uuid.uuid4().hex[:8]}"  # a fresh module: failed imports are retried
    (tmp_path / f"{module}.py").write_text(PLUGINS[kind], encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "config.toml"
    # the plugin is named by the name it declares ("p"): its table is [plugins.p]
    table = "\n[plugins.p]\nx = 2\n" if kind == "validator" else ""
    config.write_text(
        f'[plugins]\nenabled = ["max_steps", "{module}:P"]\n{table}', encoding="utf-8"
    )
    argv = (
        ["config", "check", str(config)]
        if command[0] == "config"
        else [*command, "--config", str(config)]
    )
    # a bad table is pointed at by its key; anything else names the reference that loaded it
    _exit2(argv, capsys, str(config), "plugins.p" if kind == "validator" else f"{module}:P")


@pytest.mark.parametrize(
    "argv",
    [
        ["config", "schema", "--output", "{bad}/schema.json"],
        ["report", "{records}", "--plot", "{bad}/tokens.png"],
        ["demo", "--only", "refund", "-q", "--db-dir", "{bad}/dbs"],
    ],
)
def test_an_output_path_that_cannot_be_written(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    records = tmp_path / "runs.jsonl"
    records.write_text(
        '{"run_id": "a", "termination": "final_answer", "steps": 1}\n', encoding="utf-8"
    )
    argv = [a.format(bad=blocker, records=records) for a in argv]
    _exit2(argv, capsys, str(blocker))


@pytest.mark.parametrize("limit", ["-1", "x"])
def test_replay_limit_must_be_a_count(
    limit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "steps": []}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["replay", str(path), "--limit", limit])
    assert exc.value.code == 2
    assert "--limit" in capsys.readouterr().err


def _record_config(tmp_path: Path, path: str | Path) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(
        '[plugins]\nenabled = ["max_steps", "run_record"]\n'
        f'[plugins.run_record]\npath = "{path}"\n',
        encoding="utf-8",
    )
    return config


@pytest.mark.parametrize("where", ["/etc/passwd/runs.jsonl", "/dev/full", "fifo", "a directory"])
def test_config_check_fails_on_a_record_path_that_cannot_be_written(
    where: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if where == "fifo":
        path: str | Path = tmp_path / "runs.fifo"
        os.mkfifo(path)
    elif where == "a directory":
        path = tmp_path / "records"
        path.mkdir()
    else:
        path = where
    config = _record_config(tmp_path, path)
    _exit2(["config", "check", str(config)], capsys, "plugins.run_record.path", str(path))


def test_config_check_accepts_a_record_path_it_can_create(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "new" / "dir" / "runs.jsonl"
    assert main(["config", "check", str(_record_config(tmp_path, path))]) == 0
    assert "OK" in capsys.readouterr().out
    assert not path.parent.exists()  # checking creates nothing
