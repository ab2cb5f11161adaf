"""pytest fixtures of :mod:`loopwarden.testing` (loaded only when that plugin is asked for).

``pytest -p loopwarden.testing`` (or ``pytest_plugins = ["loopwarden.testing"]``, or
``loopwarden_testing = true`` in the ini options) registers :mod:`loopwarden.testing`, whose
``pytest_plugins`` pulls in this module.  Kept apart so that importing the testing kit never
imports pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from loopwarden.clock import FakeClock
from loopwarden.deployment import Deployment
from loopwarden.testing import HookRecorder, SignalRecorder, make_deployment


@pytest.fixture
def lw_clock() -> FakeClock:
    """A :class:`~loopwarden.FakeClock` at 0: move it with ``advance(seconds)``."""
    return FakeClock()


@pytest.fixture
def lw_signals() -> Iterator[SignalRecorder]:
    """A :class:`~loopwarden.testing.SignalRecorder` of every signal sent during the test."""
    with SignalRecorder() as rec:
        yield rec


@pytest.fixture
def lw_deployment(tmp_path: Path) -> Iterator[Callable[..., Deployment]]:
    """Build deployments (``lw_deployment(config_mapping, **kwargs)``), closed after the test.

    They have the ``tools`` given (default: none) and, unless the config names a store, a
    shared store of their own under ``tmp_path``.
    """
    made: list[Deployment] = []

    def make(config: Any = None, **kwargs: Any) -> Deployment:
        if config is None or isinstance(config, Mapping):
            config = dict(config or {})
            config.setdefault(
                "store", {"url": f"sqlite:///{tmp_path / f'store{len(made)}'}.sqlite3"}
            )
        dep = make_deployment(config, **kwargs)
        made.append(dep)
        return dep

    yield make
    for dep in made:
        dep.close()


@pytest.fixture
def lw_hooks() -> Iterator[Callable[[Any], HookRecorder]]:
    """Start a :class:`~loopwarden.testing.HookRecorder` on a deployment: ``lw_hooks(dep)``;
    recording stops after the test."""
    recorders: list[HookRecorder] = []

    def record(target: Any) -> HookRecorder:
        rec = HookRecorder(target)
        recorders.append(rec)
        return rec

    yield record
    for rec in reversed(recorders):
        rec.finish_recording()
