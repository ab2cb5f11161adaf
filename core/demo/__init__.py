"""The demo: a customer-service shop with six tools, the scenarios it plays, and the runner
behind ``loopwarden demo`` and ``bench/quality.py``.

Nothing in the core depends on it: a :class:`~loopwarden.Deployment` without tools has none,
and the test kit's defaults are neutral.  The command line wires it in -- ``loopwarden run``
and ``loopwarden demo`` play the built-in scenarios against the shop.

* :mod:`loopwarden.demo.shop` -- the shop (an embedded SQLite database), its tools and its
  ``[shop]`` table;
* :mod:`loopwarden.demo.runner` -- each scenario played guarded and unguarded;
* :mod:`loopwarden.demo.traffic` -- synthetic conversations over the shop, played unguarded
  (``loopwarden demo --trajectories FILE``), and :mod:`loopwarden.demo.trajectories`, which
  records runs as trajectories and writes the file;
* ``scenarios/`` -- the built-in scenario files
  (:func:`loopwarden.models.scenario.builtin_scenarios`).

The runner's names are importable from here, loaded on first use (the runner brings the
whole deployment machinery with it).

May import: the public vocabulary, deployments, the engine, the models, the store and the
recorded-traffic tools; never the commands, the docs generator, the adapters or the test kit.
Only the commands (and :mod:`loopwarden.tools`' old ``shop`` path) import it -- the engine
never does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopwarden.demo.shop import (
    SYSTEM_PROMPT,
    Shop,
    ShopConfig,
    shop_config,
    shop_tools,
    with_shop_prompt,
)

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.demo.runner import (
        DEMO_NOW,
        NATURAL_ENDS,
        UNGUARDED_CAP,
        Pair,
        Pricer,
        Progress,
        Totals,
        find_scenarios,
        judge,
        observer_names,
        play,
        play_all,
        stop_step,
        unguarded_config,
        unguarded_deployment,
        without_observers,
    )
    from loopwarden.tools import ToolRegistry

_RUNNER = frozenset(
    {
        "DEMO_NOW",
        "NATURAL_ENDS",
        "UNGUARDED_CAP",
        "Pair",
        "Pricer",
        "Progress",
        "Totals",
        "find_scenarios",
        "judge",
        "play",
        "play_all",
        "stop_step",
        "unguarded_config",
        "unguarded_deployment",
        "observer_names",
        "without_observers",
    }
)

__all__ = [
    "DEMO_NOW",
    "NATURAL_ENDS",
    "SYSTEM_PROMPT",
    "UNGUARDED_CAP",
    "Pair",
    "Pricer",
    "Progress",
    "Shop",
    "ShopConfig",
    "Totals",
    "config_tools",
    "find_scenarios",
    "judge",
    "observer_names",
    "play",
    "play_all",
    "shop_config",
    "shop_tools",
    "stop_step",
    "unguarded_config",
    "unguarded_deployment",
    "with_shop_prompt",
    "without_observers",
]


def config_tools(config: Config) -> ToolRegistry:
    """The shop's tools on the database named by the deployment's ``[shop] db_path`` (what
    ``loopwarden run`` gives the model)."""
    return Shop(shop_config(config).db_path).tools()


def __getattr__(name: str) -> Any:
    if name in _RUNNER:
        from loopwarden.demo import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'loopwarden.demo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_RUNNER})
