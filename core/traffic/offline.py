"""Offline runs -- the demo, the benchmark, replays of recorded runs -- leave pure observers
out: they are judged by their verdicts, which observers cannot change, and no alert webhook
should fire (nor log fill the terminal) for runs that never served a user."""

from __future__ import annotations

from loopwarden.config import Config

__all__ = ["observer_names", "without_observers"]


def observer_names(config: Config) -> list[str]:
    """The plugins ``config`` loads that implement no run hook: pure observers (logging,
    metrics, alerting, run records), which subscribe to signals and can never change a run."""
    from loopwarden.host import load_plugins

    return [lp.name for lp in load_plugins(config) if lp.observer]


def without_observers(config: Config) -> tuple[Config, list[str]]:
    """``config`` with its pure observers blocked, and their names.

    Offline runs -- the demo, the benchmark, replays of recorded runs -- are judged by their
    verdicts, which observers cannot change; leaving them out keeps alert webhooks from
    firing and logs from filling the terminal for runs that never served a user.
    """
    names = observer_names(config)
    if not names:
        return config, []
    data = config.plugins.model_dump()
    data["blocked"] = [
        *config.plugins.blocked,
        *[n for n in names if n not in config.plugins.blocked],
    ]
    return config.model_copy(update={"plugins": config.plugins.model_validate(data)}), names
