"""loopwarden's pytest entry point (group ``pytest11``): listed, but inert unless asked.

Installing loopwarden makes pytest list this plugin in its header and accept
``-p no:loopwarden``, but it registers no fixture and no hook that changes a test session.
The testing kit's fixtures come only on request, like pytester's:

* ``pytest -p loopwarden.testing``;
* ``pytest_plugins = ["loopwarden.testing"]`` in the root ``conftest.py``;
* ``loopwarden_testing = true`` under ``[tool.pytest.ini_options]`` (the option this module
  adds, so ``pytest --help`` shows how to switch the kit on).

Why not point the entry point at :mod:`loopwarden.testing` itself: every installed ``pytest11``
plugin is loaded into every test session, so its fixtures would appear in projects that never
asked for them; and pytest refuses to register one module under two names, so
``-p loopwarden.testing`` would then fail.  This module stays a separate, inert object.
"""

from __future__ import annotations

from typing import Any

INI_OPTION = "loopwarden_testing"


def pytest_addoption(parser: Any) -> None:
    parser.addini(
        INI_OPTION,
        type="bool",
        default=False,
        help="activate loopwarden.testing's fixtures (lw_clock, lw_signals, lw_hooks, "
        "lw_deployment); same as -p loopwarden.testing",
    )


def pytest_configure(config: Any) -> None:
    if config.getini(INI_OPTION):
        config.pluginmanager.import_plugin("loopwarden.testing")


def pytest_report_header(config: Any) -> str | None:
    if config.pluginmanager.has_plugin("loopwarden.testing"):
        from loopwarden import __version__

        return f"loopwarden {__version__}: testing kit active"
    return None
