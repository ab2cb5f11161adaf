"""Every code block in README.md and docs/*.md runs, by its kind.

The blocks are found by :mod:`support.docblocks` (fenced and 4-space indented), so a block
added to any page is checked without touching this file.  The rules:

* ``python``: the blocks of one page run in order in ONE fresh interpreter, as one module, the
  way a reader pastes a page into a session (a later block may use an earlier one's names);
  the ``test_*`` functions they define are then called.  The cwd is a scratch directory with
  the repository's ``config.toml`` (the docs' ``"config.toml"``), and the reader's own modules
  the docs name (``mypackage``, ``mypkg``, ``my_guards``, the guide's published ``tool_cap``)
  are stand-ins from ``tests/support/reader_code`` (and :data:`PRELUDE`).  A block made only
  of signature stubs (``def f(...): ...``, the generated references) is compiled, not run.
* ``toml``: a config fragment is merged into a config that enables every plugin it configures
  (the shipped list, plus its own tables) and must pass ``loopwarden config check``; a scenario
  file (a top-level ``user``) must load and play; a ``# pyproject.toml`` fragment must parse
  and name its entry points as ``module:attr``.
* ``sh`` / ``bash`` / ``console`` and indented blocks: command lines.  The shell blocks of one
  page run in order in one scratch directory that is also the data directory.  Every
  ``loopwarden`` command is parsed by the CLI's own argparse and run offline, expecting exit 0
  (a live model is the local OpenAI-compatible stub, via ``[model] base_url``; the files the
  commands read are made from the built-in scenarios: see :data:`RECORDED`).  A synopsis line
  (``[--json]``, ``A | B``) runs without and with its optional parts; ``demo`` without
  ``--only`` runs one scenario, its doc line being parsed as written.  A ``console`` block's
  ``$`` lines are run and the output it shows must be their output (``...`` stands for any
  lines).  ``pip``, ``venv``, ``pytest``, ``mypy`` and ``bench/`` lines are checked, not run:
  their paths, extras and modules exist (CI runs the README's set-up as written, see
  tests/test_setup_commands.py; tests/test_new_plugin_package.py runs the plugin package's).
* ``json``: parsed.  ``text``: output samples, diagrams and code fragments, not run (show a
  command's output as a ``console`` block and it is checked).  A fence without a language
  fails: give it one.
* ``<!-- not run: REASON -->`` directly above a block: Python is compiled, TOML parsed, shell
  checked with ``bash -n`` and its loopwarden commands parsed.  A marker without a reason fails.
"""

from __future__ import annotations

import ast
import contextlib
import gzip
import importlib.util
import inspect
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.docblocks import Block, blocks, doc_files
from support.openai_stub import completion, serve

from loopwarden.commands import cli
from loopwarden.config import default_config_path, load_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
READER_CODE = Path(__file__).resolve().parent / "support" / "reader_code"
ALL = [b for path in doc_files(ROOT) for b in blocks(path)]

PYTHON = {"python", "py"}
TOML = {"toml"}
SHELL = {"sh", "bash", "shell", "console", "indented"}
JSON = {"json"}
TEXT = {"text"}


def _ids(items: list[Block]) -> list[str]:
    return [b.id for b in items]


def _of(kinds: set[str]) -> list[Block]:
    return [b for b in ALL if b.lang in kinds]


def _pages(kinds: set[str]) -> dict[str, list[Block]]:
    pages: dict[str, list[Block]] = {}
    for b in _of(kinds):
        pages.setdefault(b.id.rsplit(":", 1)[0], []).append(b)
    return pages


# -- every block has a kind, every marker a reason -----------------------------------------


def test_the_extractor_finds_fenced_and_indented_blocks() -> None:
    readme = [b for b in ALL if b.path.name == "README.md"]
    assert {"python", "indented"} <= {b.lang for b in readme}
    assert any("loopwarden demo" in b.text for b in readme if b.lang == "indented")
    assert len(ALL) > 80


@pytest.mark.parametrize("block", ALL, ids=_ids(ALL))
def test_every_block_has_a_kind_this_test_runs(block: Block) -> None:
    known = PYTHON | TOML | SHELL | JSON | TEXT
    assert block.lang in known, (
        f"{block.id}: a code block needs a language this test knows ({sorted(known)}); "
        "`text` for output and diagrams"
    )


def test_not_run_markers_give_a_reason() -> None:
    bare = [b.id for b in ALL if b.not_run is not None and not b.not_run.strip()]
    assert bare == [], "write <!-- not run: REASON --> above these blocks"


# -- python -----------------------------------------------------------------------------------

_DRIVER = r"""
import ast, json, sys, types
blocks = json.loads(sys.stdin.read())
module = types.ModuleType("doc_example")
sys.modules[module.__name__] = module
for b in blocks:
    code = compile("\n" * (b["line"] - 1) + b["text"], b["path"], "exec")
    if not b["run"]:
        continue
    exec(code, module.__dict__)
    print("\x00block", b["line"], flush=True)
for name, fn in list(module.__dict__.items()):
    if name.startswith("test_") and callable(fn) and getattr(fn, "__module__", "") == "doc_example":
        fn()
        print("\x00passed", name, flush=True)
"""


#: ast.parse from several threads at once can fail on CPython 3.11 with "SystemError: AST
#: constructor recursion depth mismatch" (python/cpython#106905): the pages' threads take turns
_AST_LOCK = threading.Lock()


def is_stub(code: str) -> bool:
    """A block of signature stubs only: every statement a def/class whose body is ``...``."""
    with _AST_LOCK:
        tree = ast.parse(code)

    def stub(node: ast.stmt) -> bool:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = [n for n in node.body if not _docstring(n)]
            return len(body) == 1 and _ellipsis(body[0])
        if isinstance(node, ast.ClassDef):
            return all(stub(n) or _docstring(n) or _ellipsis(n) for n in node.body)
        return False

    return bool(tree.body) and all(stub(n) for n in tree.body)


def _ellipsis(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and (node.value.value is Ellipsis)
    )


def _docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and (isinstance(node.value.value, str))
    )


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reader's working directory: the repository's config.toml, and the data directory."""
    (tmp_path / "config.toml").write_text(
        (ROOT / "config.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(READER_CODE))
    return tmp_path


PY_PAGES = _pages(PYTHON)

#: the last lines a page's Python prints, where the page says what they are
PRINTS: dict[str, list[str]] = {
    "docs/real-traffic.md": ["max_turns None"],
    "docs/adapters.md": [
        "repeat_call True",
        "Here is the last information I found: NOT_FOUND: order 99 does not exist",
        "None False 1",
        "Your refund is on its way.",
        "repeat_call repeat_call True True",
        "I could not find order 99.",
    ],
}


#: how many ``test_*`` examples a page's blocks define (each is called, and must pass)
TESTS = {"docs/plugin-guide.md": 4}

#: code run before a page's blocks: what a page assumes the reader has already written
PRELUDE: dict[str, str] = {
    # the reference's kit examples test the README's ten-line plugin
    "docs/api.md": "from my_guards import NoRefunds\n",
}


def _run_page(page: str, where: Path, url: str) -> subprocess.CompletedProcess[str]:
    """Run ``page``'s Python blocks in a fresh interpreter in ``where`` (see the module doc)."""
    prelude = {"path": "<prelude>", "line": 1, "text": PRELUDE.get(page, ""), "run": True}
    payload = [prelude] + [
        {
            "path": str(b.path),
            "line": b.line,
            "text": b.text,
            "run": b.not_run is None and not is_stub(b.text),
        }
        for b in PY_PAGES[page]
    ]
    _reader_config(where, url)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(READER_CODE), str(ROOT / "tests")]),
        LOOPWARDEN_DATA_DIR=str(where),
        OPENAI_API_KEY="sk-test",  # a live model: the stub
    )
    return subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(payload),
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def python_pages(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every page's Python, started at once (each page is its own interpreter; the adapters'
    imports dominate, and two cores run them side by side)."""
    with serve() as (stub, url), ThreadPoolExecutor(max_workers=len(PY_PAGES)) as pool:
        stub.route = lambda payload: completion("Your parcel is on its way.")
        yield {
            page: pool.submit(_run_page, page, tmp_path_factory.mktemp("page"), url)
            for page in sorted(PY_PAGES)
        }


@pytest.mark.parametrize("page", sorted(PY_PAGES))
def test_python_blocks_run(
    page: str, python_pages: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    proc = python_pages[page].result()
    assert proc.returncode == 0, f"{page}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    ran = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("\x00block")]
    expected = 1 + sum(b.not_run is None and not is_stub(b.text) for b in PY_PAGES[page])
    assert len(ran) == expected
    passed = [ln for ln in proc.stdout.splitlines() if ln.startswith("\x00passed")]
    assert len(passed) >= TESTS.get(page, 0), passed
    if page in PRINTS:
        printed = [ln for ln in proc.stdout.splitlines() if not ln.startswith("\x00")]
        assert printed[-len(PRINTS[page]) :] == PRINTS[page]


def test_signature_stubs_are_told_apart_from_examples() -> None:
    assert is_stub("def f(x: int) -> None: ...\n")
    assert is_stub("class C:\n    def __init__(self, a: A) -> None: ...\n")
    assert not is_stub("def f():\n    return 1\n")
    assert not is_stub("x = 1\n")


# -- toml -------------------------------------------------------------------------------------

TOML_BLOCKS = _of(TOML)


def _toml_kind(block: Block, data: dict[str, Any]) -> str:
    first = block.text.lstrip().splitlines()[0] if block.text.strip() else ""
    if "pyproject.toml" in first or {"project", "tool", "build-system"} & set(data):
        return "pyproject"
    if "user" in data:
        return "scenario"
    return "config"


def enabling(text: str, data: dict[str, Any]) -> str:
    """``text`` with a ``[plugins] enabled`` list that turns on every plugin it configures
    (the shipped list first), unless it has its own list or builds on another config
    (``extends``: it inherits a list, and ``enable`` / ``disable`` edit it)."""
    plugins = data.get("plugins", {})
    if "enabled" in plugins or "extends" in data:
        return text
    shipped = load_config(default_config_path()).plugins.enabled
    tables = [k for k, v in plugins.items() if isinstance(v, dict)]
    enabled = [*shipped, *(t for t in tables if t not in shipped)]
    line = f"enabled = {json.dumps(enabled)}\n"
    if re.search(r"(?m)^\[plugins\]\s*$", text):
        return re.sub(r"(?m)^\[plugins\]\s*$", "[plugins]\n" + line.rstrip("\n"), text, count=1)
    return text + "\n[plugins]\n" + line


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=_ids(TOML_BLOCKS))
def test_toml_blocks_are_valid(
    block: Block, scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tomllib.loads(block.text)
    kind = _toml_kind(block, data)
    if block.not_run is not None:
        return
    if kind == "pyproject":
        for group in data.get("project", {}).get("entry-points", {}).values():
            for target in group.values():
                assert re.fullmatch(r"[\w.]+:[\w.]+", target), target
        from loopwarden import pytest_plugin

        ini = data.get("tool", {}).get("pytest", {}).get("ini_options", {})
        for key in (k for k in ini if k.startswith("loopwarden")):  # an ini option we register
            assert f'"{key}"' in inspect.getsource(pytest_plugin), f"{block.id}: {key}"
        return
    path = scratch / f"{kind}-{block.line}.toml"
    if kind == "scenario":
        path.write_text(block.text, encoding="utf-8")
        code, out, err = run_cli(["run", "--scenario", str(path), "--json"], capsys)
    else:
        path.write_text(enabling(block.text, data), encoding="utf-8")
        code, out, err = run_cli(["config", "check", str(path)], capsys)
    assert code == 0, f"{block.id}: {err or out}"


def test_a_typo_in_a_config_fragment_fails(
    scratch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "[plugins.max_steps]\nmax_step = 12\n"
    path = scratch / "typo.toml"
    path.write_text(enabling(text, tomllib.loads(text)), encoding="utf-8")
    code, _, err = run_cli(["config", "check", str(path)], capsys)
    assert code == 2 and "max_step" in err


# -- shell ------------------------------------------------------------------------------------

PROGRAMS = {"loopwarden", "python", "python3", "pip", "pytest", "mypy", ".", "source", "cd"}
SH_PAGES = _pages(SHELL)
#: the recorded runs the docs' commands read, made from these built-in scenarios
RECORDED = {
    "runs.jsonl": ["always-not-found", "refund", "repeat-then-recover", "oscillation"],
    "records.jsonl": ["always-not-found", "refund"],
    "a.jsonl": ["refund", "all-tools-fail", "retry-storm"],
}


def _record(path: Path, scenarios: list[str]) -> None:
    """Run records with trajectories (``run_record`` with ``trajectory = true``)."""
    config = path.with_suffix(".config.toml")
    config.write_text(
        '[plugins]\nenabled = ["max_steps", "repeat_call", "oscillation", "run_record"]\n'
        f"[plugins.run_record]\npath = {json.dumps(str(path))}\ntrajectory = true\n"
        "steps_detail = true\n",
        encoding="utf-8",
    )
    # made in a module-scoped fixture, before conftest's per-test restore of the logger that
    # cli.main configures: restore it here, or later tests' caplog sees nothing below ERROR
    logger = logging.getLogger("loopwarden")
    level, handlers = logger.level, list(logger.handlers)
    try:
        for name in scenarios:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                code = cli.main(["run", "--scenario", name, "--config", str(config)])
            assert code == 0, out.getvalue()
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded runs the docs' commands read (made once: :data:`RECORDED`)."""
    where = tmp_path_factory.mktemp("recorded")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOPWARDEN_DATA_DIR", str(where))
        for name, scenarios in RECORDED.items():
            _record(where / name, scenarios)
    # a reader's traffic: calibrate proposes nothing from fewer than 100 successful runs
    runs = (where / "runs.jsonl").read_text(encoding="utf-8").splitlines()
    healthy = [json.loads(ln) for ln in runs if json.loads(ln)["termination"] == "final_answer"]
    many = list(runs)
    for i in range(100 // len(healthy) + 1):
        for record in healthy:
            many.append(json.dumps({**record, "run_id": f"{record['run_id']}-{i}"}))
    (where / "runs.jsonl").write_text("\n".join(many) + "\n", encoding="utf-8")
    for plain in ("runs.jsonl", "records.jsonl"):
        (where / (plain + ".gz")).write_bytes(gzip.compress((where / plain).read_bytes()))
    (where / "b.jsonl.gz").write_bytes(gzip.compress((where / "runs.jsonl").read_bytes()))
    return where


@pytest.fixture
def reader_files(scratch: Path, recorded: Path) -> Path:
    for name in [*RECORDED, "runs.jsonl.gz", "records.jsonl.gz", "b.jsonl.gz"]:
        (scratch / name).write_bytes((recorded / name).read_bytes())
    return scratch


def _reader_config(where: Path, url: str) -> None:
    """The repository's config.toml in ``where``, its live model the stub at ``url``."""
    text = (ROOT / "config.toml").read_text(encoding="utf-8")
    line = f"base_url = {json.dumps(url)}"
    if re.search(r"(?m)^\[model\]\s*$", text):
        text = re.sub(r"(?m)^\[model\]\s*$", f"[model]\n{line}", text, count=1)
    else:  # the file lists no [model] of its own (it extends the shipped defaults)
        text += f"\n[model]\n{line}\n"
    (where / "config.toml").write_text(text, encoding="utf-8")


@contextlib.contextmanager
def live_model(cwd: Path) -> Iterator[None]:
    """The "live model" of the docs' commands: the OpenAI-compatible stub, as [model] base_url."""
    with serve() as (stub, url):
        stub.route = lambda payload: completion("Your parcel is on its way.")
        _reader_config(cwd, url)
        yield


def transcript(block: Block) -> list[tuple[str, list[str] | None]]:
    """The block's command lines, each with the output a ``console`` block shows after it
    (None for other blocks)."""
    if block.lang != "console":
        return [(line, None) for line in logical_lines(block)]
    pairs: list[tuple[str, list[str] | None]] = []
    for raw in block.text.splitlines():
        if raw.startswith("$ "):
            pairs.append((raw[2:], []))
        elif pairs:
            shown = pairs[-1][1]
            assert shown is not None
            shown.append(raw.rstrip())
    return pairs


def matches(out: list[str], shown: list[str]) -> bool:
    """``out`` is the ``shown`` output; a line ``...`` in it stands for any lines."""
    out = [ln.rstrip() for ln in out]
    while shown and not shown[-1]:
        shown = shown[:-1]
    while out and not out[-1]:
        out = out[:-1]
    if "..." not in shown:
        return out == shown
    at = shown.index("...")
    head, tail = shown[:at], shown[at + 1 :]
    return (
        out[: len(head)] == head
        and len(out) >= len(head) + len(tail)
        and (matches(out[len(head) :][-len(tail) :] if tail else [], tail))
    )


def logical_lines(block: Block) -> list[str]:
    """The block's command lines: continuations joined, ``$`` prompts and comments removed."""
    out: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
    return out


def split_commands(line: str) -> list[list[str]]:
    """``a && b`` -> [[a...], [b...]]; comments dropped; quotes removed."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="&;>")
    lex.whitespace_split = True
    lex.commenters = "#"
    words = list(lex)
    commands: list[list[str]] = [[]]
    for w in words:
        if w in ("&&", ";"):
            commands.append([])
        else:
            commands[-1].append(w)
    return [c for c in commands if c]


def synopsis_forms(words: list[str]) -> list[list[str]]:
    """A usage synopsis as commands: ``a | b`` alternatives of one command; ``[opt]`` groups
    left out, and put in when they hold no placeholder (an upper-case word)."""
    head, rest = words[:1], words[1:]
    alternatives: list[list[str]] = [[]]
    for w in rest:
        if w == "|":
            alternatives.append([])
        else:
            alternatives[-1].append(w)
    forms: list[list[str]] = []
    for alt in alternatives:
        bare: list[str] = []
        full: list[str] = []
        group: list[str] | None = None
        for w in alt:
            if w.startswith("[") and group is None:
                group = []
                w = w[1:]
            if group is not None:
                closing = w.endswith("]")
                group.append(w.rstrip("]"))
                if closing:
                    if not any(re.fullmatch(r"[A-Z]+", g) for g in group):
                        full += group
                    group = None
                continue
            bare.append(w)
            full.append(w)
        forms.append(head + bare)
        if full != bare:
            forms.append(head + full)
    return forms


def parse_only(argv: list[str]) -> None:
    """Parse ``loopwarden ARGV`` with the CLI's own argparse (a doc line that cannot run here
    must at least be a valid command)."""
    import argparse
    import importlib

    name = argv[0]
    assert name in cli.COMMANDS, f"no command {name!r}"
    module = importlib.import_module(cli.COMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"loopwarden {name}", exit_on_error=False)
    module.add_arguments(sub)
    sub.add_argument("--log-level")
    try:
        sub.parse_args(argv[1:])
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"`loopwarden {shlex.join(argv)}` does not parse: {exc}") from exc


class Shell:
    """Runs a page's command lines in order, in one directory, as a reader would."""

    def __init__(self, cwd: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
        self.cwd = cwd
        self.capsys = capsys
        self.where = where
        self.venv = False
        #: what the last loopwarden command printed on stdout
        self.last_out = ""

    def run(self, words: list[str]) -> None:
        env: dict[str, str] = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        prog = words[0]
        assert prog in PROGRAMS, f"{self.where}: a command this test does not know: {words}"
        getattr(self, "_" + {".": "source"}.get(prog, prog))(words[1:], env)

    # the programs
    def _loopwarden(self, args: list[str], env: dict[str, str]) -> None:
        if "|" in args or any(a.startswith("[") for a in args):
            forms = synopsis_forms(["loopwarden", *args])
            for form in forms:
                self._loopwarden(form[1:], env)
            return
        redirect = None
        if ">" in args:
            at = args.index(">")
            args, redirect = args[:at], args[at + 1]
        parse_only(args)
        if args[0] == "demo" and "--only" not in args:
            args = [*args, "--only", "always-not-found", "--quiet"]  # the whole demo: 40 s
        if args[0] == "run" and "--scenario" not in args:
            env.setdefault("OPENAI_API_KEY", "sk-test")  # a live model: the stub (live_model)
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            code, out, err = run_cli(args, self.capsys)
        assert code == 0, f"{self.where}: `loopwarden {shlex.join(args)}` exited {code}: {err}"
        self.last_out = out
        if redirect is not None:
            (self.cwd / redirect).write_text(out, encoding="utf-8")

    def _python(self, args: list[str], env: dict[str, str]) -> None:
        if args[:2] == ["-m", "venv"]:
            self.venv = True
        elif args[:2] == ["-m", "pytest"]:
            self._pytest(args[2:], env)
        elif args[:2] == ["-m", "pip"]:
            self._pip(args[2:], env)
        elif args and args[0].startswith("bench/"):
            assert (ROOT / args[0]).is_file(), f"{self.where}: no {args[0]}"
        else:
            raise AssertionError(f"{self.where}: python {shlex.join(args)}: not checked")

    _python3 = _python

    def _source(self, args: list[str], env: dict[str, str]) -> None:
        assert args == [".venv/bin/activate"] and self.venv, f"{self.where}: {args}"

    def _cd(self, args: list[str], env: dict[str, str]) -> None:
        (target,) = args
        assert (self.cwd / target).is_dir(), f"{self.where}: cd {target}: no such directory"
        self.cwd = self.cwd / target
        os.chdir(self.cwd)

    def _path(self, arg: str, holding: str = "") -> Path:
        """A path as the docs mean it (holding the file ``holding``): from the scratch
        directory, else the repository (set-up commands run in the clone)."""
        for base in (self.cwd, ROOT):
            if (base / arg / holding).exists():
                return base / arg
        raise AssertionError(f"{self.where}: no {arg} (from {self.cwd.name} or the repository)")

    def _pip(self, args: list[str], env: dict[str, str]) -> None:
        assert args[0] == "install", f"{self.where}: pip {args}"
        options_with_value = {"--target", "-t"}
        skip = False
        for arg in args[1:]:
            if skip:
                skip = False
                continue
            if arg in options_with_value:
                skip = True
                continue
            if arg.startswith("-"):
                assert arg in {"-e", "-q", "--no-deps", "--no-build-isolation"}, arg
                continue
            if arg.startswith("loopwarden["):  # an extra of loopwarden itself
                project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                extras = arg[len("loopwarden[") : -1].split(",")
                assert set(extras) <= set(project["project"]["optional-dependencies"]), arg
                continue
            target, _, extras_part = arg.partition("[")
            path = self._path(target, "pyproject.toml")
            pyproject = tomllib.loads((path / "pyproject.toml").read_text(encoding="utf-8"))
            for extra in filter(None, extras_part.rstrip("]").split(",")):
                assert extra in pyproject["project"].get("optional-dependencies", {}), arg

    def _pytest(self, args: list[str], env: dict[str, str]) -> None:
        it = iter(args)
        for arg in it:
            if arg == "-p":
                __import__(next(it))  # a plugin module that imports
            elif arg == "-n":  # pytest-xdist's worker count
                assert next(it) == "auto" and importlib.util.find_spec("xdist"), self.where
            elif not arg.startswith("-"):
                self._path(arg.split("::")[0])

    def _mypy(self, args: list[str], env: dict[str, str]) -> None:
        for key, value in env.items():
            if key == "MYPYPATH":
                assert value == ".typecheck", f"{self.where}: MYPYPATH={value}"
        for arg in args:
            if not arg.startswith("-"):
                self._path(arg)


@pytest.mark.parametrize("page", sorted(SH_PAGES))
def test_command_lines_run(
    page: str, reader_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shell = Shell(reader_files, capsys, page)
    with live_model(reader_files):
        for block in SH_PAGES[page]:
            if block.not_run is not None:
                check_only(block)
                continue
            for line, shown in transcript(block):
                shell.where = f"{page} (block at line {block.line}): {line.strip()}"
                for words in split_commands(line):
                    shell.run(words)
                if shown is not None:  # a console block: the output it shows is the output
                    assert matches(shell.last_out.splitlines(), shown), (
                        f"{shell.where}: the output differs from the doc's:\n{shell.last_out}"
                    )


def check_only(block: Block) -> None:
    """A block that is not run: valid shell (``bash -n``), and its loopwarden commands parse."""
    proc = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    assert proc.returncode == 0, f"{block.id}: {proc.stderr}"
    for line in logical_lines(block):
        for words in split_commands(line):
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                words = words[1:]
            if words and words[0] == "loopwarden":
                parse_only(words[1:])


def test_synopsis_forms() -> None:
    assert synopsis_forms(["loopwarden", "report", "[records.jsonl]"]) == [
        ["loopwarden", "report"],
        ["loopwarden", "report", "records.jsonl"],
    ]
    assert synopsis_forms(["loopwarden", "demo", "[--json]", "[--only", "NAME]"]) == [
        ["loopwarden", "demo"],
        ["loopwarden", "demo", "--json"],
    ]
    assert synopsis_forms(["loopwarden", "plugins", "|", "config", "check", "[FILE]"]) == [
        ["loopwarden", "plugins"],
        ["loopwarden", "config", "check"],
    ]


def test_a_doc_command_that_does_not_parse_fails() -> None:
    with pytest.raises(AssertionError, match="does not parse"):
        parse_only(["replay", "runs.jsonl", "--sumary"])


# -- json and text ----------------------------------------------------------------------------


def test_json_blocks_parse() -> None:
    # one test for all (the docs hold none today: a parametrized test would be skipped)
    for block in _of(JSON):
        try:
            json.loads(block.text)
        except ValueError as exc:
            raise AssertionError(f"{block.id}: {exc}") from None


@pytest.mark.parametrize("block", _of(TEXT), ids=_ids(_of(TEXT)))
def test_hooks_named_in_text_diagrams_exist(block: Block) -> None:
    from loopwarden.hookspecs import HOOK_NAMES

    named = set(re.findall(r"\b((?:on|before|after)_[a-z_]+)\(", block.text))
    assert named <= set(HOOK_NAMES), f"{block.id}: no such hook: {sorted(named - set(HOOK_NAMES))}"


def test_console_output_matching() -> None:
    assert matches(["a", "b", "c", ""], ["a", "b", "c"])
    assert matches(["a", "b", "c", "d"], ["a", "...", "d"])
    assert not matches(["a", "b"], ["a", "c"])
    assert not matches(["a"], ["a", "...", "d"])


def test_a_console_block_shows_the_output_of_the_current_code() -> None:
    consoles = [b for b in _of({"console"}) if "$ loopwarden demo" in b.text]
    assert consoles, "docs/real-traffic.md shows the demo's output as a console block"
