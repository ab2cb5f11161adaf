"""``loopwarden new-plugin [--minimal] NAME [DIR]``: write a plugin to start from.

The package is the smallest complete one: a settings model, a hook that stops a run, one that
warns, a ``record_fields`` field, the entry point in the group ``loopwarden.plugins``, tests
written with :mod:`loopwarden.testing` and a README.  Its tests pass as generated, so an author
starts from green and changes the checks.  NAME must be a snake_case identifier that no
built-in plugin uses; DIR (default: NAME with dashes) must not exist or be empty -- nothing is
ever overwritten.

``--minimal`` writes the smallest plugin instead: two files, ``NAME.py`` (one ``before_tool``
hook that hard-stops a listed tool, with the answer the user reads) and ``test_NAME.py``, into
DIR (default: the current directory -- beside ``config.toml``, where ``[plugins] enabled =
[..., "NAME:Class"]`` finds it without packaging).  Its tests pass as generated too; an
existing file of either name is never overwritten.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

from loopwarden._version import __version__
from loopwarden.exceptions import LoopwardenError

__all__ = ["NAME_RE", "add_arguments", "main", "render", "render_minimal", "write_package"]

#: a plugin name the scaffold accepts: the entry-point name, the config table, the stop reason
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "__DIST__"
version = "0.1.0"
description = "A loopwarden plugin: __NAME__."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["loopwarden>=__LWVERSION__"]
classifiers = ["Framework :: Pytest", "Typing :: Typed"]

[project.optional-dependencies]
test = ["pytest>=8"]

# What makes the plugin discoverable: loopwarden loads it when config.toml names
# "__NAME__" in [plugins] enabled (never merely because it is installed).
[project.entry-points."loopwarden.plugins"]
__NAME__ = "__PACKAGE__:__CLASS__"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
__PACKAGE__ = ["py.typed"]

[tool.ruff]
line-length = 100
extend-exclude = [".typecheck"]  # a wheel-layout copy of loopwarden for mypy (README)

[tool.ruff.lint]
select = ["E", "F", "I", "UP", "B"]

[tool.mypy]
strict = true

[[tool.mypy.overrides]]
# loopwarden's types are used, errors inside it are not reported: its optional modules
# import frameworks this environment may lack (loopwarden's own CI type-checks them)
module = ["loopwarden", "loopwarden.*"]
follow_imports = "silent"

[tool.pytest.ini_options]
testpaths = ["tests"]
# The testing kit's fixtures are opt-in, like pytester.
addopts = ["-p", "loopwarden.testing"]
"""

_MODULE = '''\
"""__DIST__: a loopwarden plugin (written by ``loopwarden new-plugin``; make it yours).

It watches the text that passes through tools for ``patterns`` (regular expressions; the
default matches e-mail addresses):

- ``before_tool``: a call whose arguments match is not executed -- the run stops (a hard stop:
  the text never reaches the tool); with ``stop = false`` it only warns;
- ``after_tool``: a tool result that matches raises a warning (logged, alerted, counted);
- ``record_fields``: the run record's ``__NAME___matches`` counts the run's matches.

The verdicts name the tool and the pattern, never the matched text.  Enable it once
installed::

    [plugins]
    enabled = ["max_steps", "__NAME__"]

    [plugins.__NAME__]
    stop = true
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loopwarden import Plugin, PluginSettings, Run, ToolCall, ToolResult, Verdict, hookimpl
from loopwarden.plugin import check_patterns
from pydantic import Field, field_validator

__all__ = ["__CLASS__", "__CLASS__Settings"]
__version__ = "0.1.0"

#: an e-mail address (the default pattern)
EMAIL = r"[\\w.+-]+@[\\w-]+\\.[\\w.-]+"


class __CLASS__Settings(PluginSettings):
    """``[plugins.__NAME__]``."""

    patterns: list[str] = Field(
        default_factory=lambda: [EMAIL],
        description="regular expressions of the text to catch in tool arguments and results",
    )
    stop: bool = Field(
        default=True,
        description="stop the run when a tool call's arguments match (false: warn only)",
    )

    @field_validator("patterns")
    @classmethod
    def _valid_patterns(cls, v: list[str]) -> list[str]:
        return check_patterns(v)


@dataclass
class _RunState:
    """Per-run state: how many matches this run had."""

    matches: int = 0


class __CLASS__(Plugin[__CLASS__Settings]):
    """Stops tool calls whose arguments match ``patterns``; warns on matching tool results."""

    name = "__NAME__"
    Settings = __CLASS__Settings

    def new_state(self) -> _RunState:
        return _RunState()

    def find(self, text: str) -> str | None:
        """The first pattern found in ``text``, or None."""
        return next((p for p in self.settings.patterns if re.search(p, text)), None)

    def _count(self, run: Run) -> int:
        state: _RunState = self.state(run)
        state.matches += 1
        return state.matches

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        # raw_arguments: the call's text as the model wrote it, also when it is not valid JSON
        pattern = self.find(call.raw_arguments)
        if pattern is None:
            return None
        matches = self._count(run)
        message = f"the arguments of {call.name} match a __NAME__ pattern"
        if not self.settings.stop:
            return self.warn(message, tool=call.name, pattern=pattern, matches=matches)
        return self.stop("__NAME__", message=message, tool=call.name, pattern=pattern)

    @hookimpl
    def after_tool(self, run: Run, call: ToolCall, result: ToolResult) -> Verdict | None:
        pattern = self.find(result.content)
        if pattern is None:
            return None
        matches = self._count(run)
        message = f"the result of {call.name} matches a __NAME__ pattern"
        return self.warn(message, tool=call.name, pattern=pattern, matches=matches)

    @hookimpl
    def record_fields(self, run: Run) -> dict[str, int]:
        """The run record's ``__NAME___matches``."""
        state: _RunState = self.state(run)
        return {"__NAME___matches": state.matches}
'''

_TESTS = '''\
"""Tests of __NAME__, written only against loopwarden.testing."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest
from loopwarden import ConfigError
from loopwarden.testing import (
    call_hook,
    make_tool,
    make_tool_call,
    make_tool_result,
    run_plugin,
    tool_call,
    turn,
)

from __PACKAGE__ import __CLASS__

CUSTOMER = "Jane Roe <jane.roe@example.com>, order 1001"


def tools(sent: list[dict[str, Any]]) -> list[Any]:
    """A customer lookup (its result holds an e-mail address) and a side effect that appends
    to ``sent``, so a test can tell whether it happened."""

    def send(**kwargs: Any) -> str:
        sent.append(kwargs)
        return "sent"

    return [
        make_tool("lookup_customer", CUSTOMER, read_only=True),
        make_tool("post_message", send, side_effect=True),
    ]


def test_a_clean_call_passes() -> None:
    call = make_tool_call("post_message", text="Your order 1001 has shipped.")
    assert call_hook(__CLASS__, "before_tool", call=call) is None


def test_a_call_carrying_a_match_stops_the_run() -> None:
    call = make_tool_call("post_message", text="write to jane.roe@example.com")
    verdict = call_hook(__CLASS__, "before_tool", call=call)
    assert (verdict.kind, verdict.reason, verdict.soft) == ("stop", "__NAME__", False)
    assert verdict.plugin == "__NAME__"
    assert "jane.roe" not in str(verdict.evidence)  # the verdict never repeats the match


def test_stop_false_only_warns() -> None:
    call = make_tool_call("post_message", text="jane.roe@example.com")
    verdict = call_hook(__CLASS__, "before_tool", settings={"stop": False}, call=call)
    assert verdict.kind == "warn"


def test_a_matching_result_warns() -> None:
    verdict = call_hook(
        __CLASS__,
        "after_tool",
        call=make_tool_call("lookup_customer"),
        result=make_tool_result(CUSTOMER),
    )
    assert verdict.kind == "warn"
    assert verdict.evidence["tool"] == "lookup_customer"


def test_a_bad_pattern_fails_when_the_config_loads() -> None:
    expected = r"plugins\\.__NAME__\\.patterns: .*bad regular expression"
    with pytest.raises(ConfigError, match=expected):
        call_hook(__CLASS__, "before_tool", settings={"patterns": ["("]}, call=make_tool_call("x"))


def test_in_a_scripted_run_the_side_effect_never_happens() -> None:
    sent: list[dict[str, Any]] = []
    result = run_plugin(
        __CLASS__,
        tools=tools(sent),
        turns=[
            turn("Looking the customer up.", tool_call("lookup_customer")),
            turn("Sending.", tool_call("post_message", text="jane.roe@example.com")),
        ],
    )
    assert result.termination == "__NAME__"
    assert [v.kind for v in result.verdicts] == ["warn", "stop"]
    assert result.executed == ["lookup_customer"]
    assert sent == []
    assert result.record["__NAME___matches"] == 2


def test_the_installed_entry_point_is_found_by_name() -> None:
    try:
        metadata.distribution("__DIST__")
    except metadata.PackageNotFoundError:
        pytest.skip("__DIST__ is not installed (pip install -e .)")
    send = tool_call("post_message", text="a@b.io")
    result = run_plugin("__NAME__", tools=tools([]), turns=[turn("Sending.", send)])
    (row,) = [r for r in result.deployment.plugins.describe() if r["name"] == "__NAME__"]
    assert row["source"].startswith("entry point (__DIST__ ")
'''

_README = """\
# __DIST__

A [loopwarden](https://pypi.org/project/loopwarden/) plugin, written by
`loopwarden new-plugin __NAME__`: it stops a tool call whose arguments match one of
`patterns` (regular expressions; default: an e-mail address), warns when a tool result
matches, and adds `__NAME___matches` to the run record.  Replace the checks with your own.

## Use

```bash
pip install -e '.[test]'
python -m pytest
```

```toml
# config.toml -- installing does not turn the plugin on; naming it does
[plugins]
enabled = ["max_steps", "__NAME__"]

[plugins.__NAME__]
stop = true     # false: warn only
```

`loopwarden plugins` then lists `__NAME__` with its source (`entry point (__DIST__ 0.1.0)`) and
hooks; `loopwarden config check` validates the `[plugins.__NAME__]` table.

## Files

- `src/__PACKAGE__/__init__.py` -- the settings model, the hooks, the record field
- `tests/test___NAME__.py` -- tests with `loopwarden.testing` (`call_hook`, `run_plugin`)
- `pyproject.toml` -- the entry point `__NAME__` in the group `loopwarden.plugins`

## Type-check

With loopwarden installed from a wheel (`pip install loopwarden`): `mypy src tests` (strict;
`pyproject.toml` keeps mypy silent about loopwarden's own modules).  mypy cannot see an
editable install of loopwarden (`pip install -e`: setuptools maps its package directories,
which mypy does not follow), so then check against a wheel-layout copy of the checkout:

```bash
checkout=$(python -c 'import loopwarden as lw, pathlib as p; print(p.Path(lw.__file__).parents[1])')
pip install -q --no-deps --target .typecheck "$checkout"   # the checkout `pip install -e` uses
MYPYPATH=.typecheck mypy src tests      # strict: see [tool.mypy] in pyproject.toml
```
"""


_MINIMAL_MODULE = '''\
"""__NAME__: a loopwarden plugin (``loopwarden new-plugin --minimal``; make it yours).

It stops a run before any call of a tool in ``BLOCKED`` -- a hard stop, so the call
never runs -- and tells the user so.  Enable it from the config.toml beside this file
(no packaging: ``module:attr`` entries are looked for on ``sys.path``, then in the
config file's directory)::

    [plugins]
    enabled = ["max_steps", "__NAME__:__CLASS__"]
"""

from __future__ import annotations

from loopwarden import Plugin, Run, ToolCall, Verdict, hookimpl

#: the tools this plugin refuses (put yours here)
BLOCKED = frozenset({"delete_account"})


class __CLASS__(Plugin):
    """Stops the run before a call of a tool in ``BLOCKED``."""

    name = "__NAME__"

    @hookimpl
    def before_tool(self, run: Run, call: ToolCall) -> Verdict | None:
        if call.name not in BLOCKED:
            return None
        # answer= is what the user reads (the model may already have said "doing it")
        answer = f"I did not run {call.name}: it is not allowed here; nothing changed."
        return self.stop("__NAME__", tool=call.name, answer=answer)
'''

_MINIMAL_TESTS = '''\
"""Tests of __NAME__, with loopwarden.testing (run ``python -m pytest``)."""

from __future__ import annotations

from typing import Any

from loopwarden.testing import (
    call_hook,
    make_tool,
    make_tool_call,
    run_plugin,
    tool_call,
    turn,
)

from __NAME__ import BLOCKED, __CLASS__


def test_other_calls_pass() -> None:
    call = make_tool_call("lookup_order")
    assert call_hook(__CLASS__, "before_tool", call=call) is None


def test_a_blocked_call_stops_the_run_before_it_runs() -> None:
    done: list[dict[str, Any]] = []
    name = sorted(BLOCKED)[0]
    blocked = make_tool(name, lambda **kw: done.append(kw), side_effect=True)
    turns = [turn("Doing it now.", tool_call(name))]
    result = run_plugin(__CLASS__, tools=[blocked], turns=turns)
    assert result.termination == "__NAME__"
    assert done == []  # the tool never ran
    assert result.record["final_answer"].startswith(f"I did not run {name}")
'''


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def check_name(name: str) -> None:
    """Raise :class:`LoopwardenError` unless ``name`` can be a new plugin's name."""
    from loopwarden.host import BUILTIN_PLUGINS

    if not NAME_RE.fullmatch(name) or keyword.iskeyword(name):
        raise LoopwardenError(
            f"invalid plugin name {name!r}: use a lower-case Python identifier "
            "(letters, digits, underscores; e.g. pii_guard)"
        )
    if name in BUILTIN_PLUGINS:
        raise LoopwardenError(f"{name!r} is a built-in plugin's name: choose another")


def render(name: str) -> dict[str, str]:
    """The package's files for plugin ``name``: relative path -> text."""
    check_name(name)
    package = f"loopwarden_{name}"
    major_minor = ".".join(__version__.split(".")[:2])
    values = {
        "__DIST__": "loopwarden-" + name.replace("_", "-"),
        "__PACKAGE__": package,
        "__CLASS__": _class_name(name),
        "__LWVERSION__": major_minor,
        "__NAME__": name,
    }

    def fill(template: str) -> str:
        for key, value in values.items():
            template = template.replace(key, value)
        return template

    return {
        "pyproject.toml": fill(_PYPROJECT),
        "README.md": fill(_README),
        f"src/{package}/__init__.py": fill(_MODULE),
        f"src/{package}/py.typed": "",
        f"tests/test_{name}.py": fill(_TESTS),
    }


def render_minimal(name: str) -> dict[str, str]:
    """The two files of ``--minimal`` for plugin ``name``: relative path -> text."""
    check_name(name)
    if name in sys.stdlib_module_names:
        raise LoopwardenError(
            f"{name!r} is a standard-library module's name, which the plugin's module would "
            "shadow: choose another"
        )
    values = {"__CLASS__": _class_name(name), "__NAME__": name}

    def fill(template: str) -> str:
        for key, value in values.items():
            template = template.replace(key, value)
        return template

    return {f"{name}.py": fill(_MINIMAL_MODULE), f"test_{name}.py": fill(_MINIMAL_TESTS)}


def write_package(name: str, directory: Path, *, minimal: bool = False) -> list[Path]:
    """Write the package for ``name`` into ``directory`` (absent or empty) -- or, ``minimal``,
    its two files into ``directory`` (neither may exist); the files written."""
    files = render_minimal(name) if minimal else render(name)
    if minimal:
        if directory.exists() and not directory.is_dir():
            raise LoopwardenError(f"{directory} is not a directory: nothing written")
        taken = [rel for rel in files if (directory / rel).exists()]
        if taken:
            listed = ", ".join(str(directory / rel) for rel in taken)
            raise LoopwardenError(f"already there: {listed}; nothing written")
    elif directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise LoopwardenError(f"{directory} exists and is not an empty directory: nothing written")
    written = []
    for rel, text in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the plugin's name, e.g. pii_guard")
    parser.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        default=None,
        help="where to write the package (absent or empty; default: NAME with dashes; "
        "with --minimal: the current directory)",
    )
    parser.add_argument(
        "--minimal",
        action="store_true",
        help="write the smallest plugin instead: NAME.py and test_NAME.py, to enable as "
        "NAME:Class from a config.toml in the same directory",
    )


def main(args: argparse.Namespace) -> int:
    name: str = args.name
    check_name(name)
    if args.minimal:
        directory = Path(args.directory or ".")
        written = write_package(name, directory, minimal=True)
        print(f"wrote {', '.join(str(p) for p in written)}")
        print(
            f"next: python -m pytest {directory / f'test_{name}.py'}\n"
            f"then enable it in the config.toml beside it: "
            f'[plugins] enable = ["{name}:{_class_name(name)}"]'
        )
        return 0
    directory = Path(args.directory or name.replace("_", "-"))
    written = write_package(name, directory)
    print(f"wrote {len(written)} files to {directory}/:")
    for path in written:
        print(f"  {path.relative_to(directory)}")
    print(
        f"next: pip install -e '{directory}[test]' && python -m pytest {directory}\n"
        f'then enable it in config.toml: [plugins] enable = ["{name}"]'
    )
    return 0
