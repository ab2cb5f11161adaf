"""A callable alert sink (docs/observability.md's `mypackage.alerts:page`): keeps what it got."""

from __future__ import annotations

from typing import Any

paged: list[Any] = []


def page(alert: Any) -> None:
    paged.append(alert)
