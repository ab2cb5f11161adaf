"""Shared fixtures: an isolated data directory, configs built in code, deployments."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.openai_stub import Stub, serve

from loopwarden import Deployment
from loopwarden.config import Config, default_config_path, load_toml, parse_config
from loopwarden.demo import shop_tools

# the shared-store fixtures: store_url (SQLite and Redis), redis_server
pytest_plugins = ["support.stores"]

# The suite starts hundreds of Python processes (the CLI, bench scripts, pytest in pytest):
# under PYTHONDONTWRITEBYTECODE each would compile every module it imports again, and pytest
# would rewrite the asserts of every plugin package again.  Bytecode is cached for this
# session and the processes it starts (xdist's workers included: they start after this).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a test of ten seconds or more (run first; CI runs it; -m 'not slow' skips it)",
    )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: two workers per core.  Much of the suite waits -- on the processes it
    starts, on local servers, on benches that run for wall-clock seconds -- so one worker per
    core leaves the cores idle.  ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 2 * (os.cpu_count() or 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first (in their own order), so that ``-n auto`` starts them at once
    instead of leaving one to run alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _isolated_data_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets its own demo-shop database directory."""
    d = tmp_path_factory.mktemp("lwdata")
    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(d))
    for var in (
        "LOOPWARDEN_PLUGINS",
        "LOOPWARDEN_BLOCK_PLUGINS",
        "LOOPWARDEN_DISABLE_PLUGIN_AUTOLOAD",
        "LOOPWARDEN_TRACE_PLUGINS",
    ):
        monkeypatch.delenv(var, raising=False)
    return d


_LOGGER_BASELINE = (
    logging.getLogger("loopwarden").level,
    list(logging.getLogger("loopwarden").handlers),
)


@pytest.fixture(autouse=True)
def _restore_loopwarden_logger() -> Iterator[None]:
    """``loopwarden.commands.cli.main`` configures the "loopwarden" logger, as a command line should
    (level, a stderr handler); undo it so that no test sees another test's CLI settings --
    including a module- or session-scoped fixture's, set up before this snapshot could be
    taken: each test starts from the logger as it was when the session began."""
    logger = logging.getLogger("loopwarden")
    level, handlers = _LOGGER_BASELINE
    logger.setLevel(level)
    logger.handlers[:] = handlers
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


@pytest.fixture
def shipped_config() -> Config:
    """The default config.toml, as shipped."""
    path = default_config_path()
    return parse_config(load_toml(path), path=str(path))


@pytest.fixture
def make_config() -> Callable[..., Config]:
    """Build a Config from keyword tables: make_config(plugins={"enabled": [...]})."""

    def make(**tables: Any) -> Config:
        return parse_config(tables, path="<test>")

    return make


@pytest.fixture
def deployment_factory() -> Iterator[Callable[..., Deployment]]:
    """Build deployments that are closed after the test (with the demo shop's tools unless
    ``tools`` is given: most tests here play its scenarios)."""
    made: list[Deployment] = []

    def make(config: Config | None = None, **kwargs: Any) -> Deployment:
        kwargs.setdefault("tools", shop_tools())
        dep = Deployment(config if config is not None else parse_config({}), **kwargs)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        dep.close()


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    """A local OpenAI-compatible server: ``(stub, base_url)`` (see tests/support/openai_stub.py)."""
    with serve() as served:
        yield served


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Captured output and log lines may hold lone surrogates (the hostile-input tests log
    what a model made up): escape them, so that pytest-xdist can send the report from its
    worker (strict UTF-8) instead of crashing the worker."""
    outcome: Any = yield
    report = outcome.get_result()
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
