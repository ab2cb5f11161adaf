"""``loopwarden gateway``: the ASGI application under uvicorn (the ``gateway`` extra).

One process serves many connections on one event loop; ``--workers N`` starts N processes
(uvicorn's), which share nothing but the store -- every conversation's state lives there
(:mod:`loopwarden.gateway.state`), so any worker serves any step.  Each worker builds its
application with :func:`factory` from the environment the command sets.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from loopwarden.exceptions import ConfigError

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.gateway.app import GatewayApp

__all__ = ["build_app", "factory", "upstream_of"]

ENV_CONFIG = "LOOPWARDEN_GATEWAY_CONFIG"
ENV_UPSTREAM = "LOOPWARDEN_GATEWAY_UPSTREAM"
ENV_STATE = "LOOPWARDEN_GATEWAY_STATE"


def upstream_of(config: Config, given: str | None = None) -> str:
    """The upstream's base URL: ``given``, ``[gateway] upstream``, ``[model] base_url``,
    ``OPENAI_BASE_URL`` -- else a :class:`ConfigError` that says how to set one."""
    url = (
        given
        or config.gateway.upstream
        or config.model.base_url
        or os.environ.get("OPENAI_BASE_URL")
    )
    if not url:
        raise ConfigError(
            "the gateway needs an upstream: --upstream URL, or [gateway] upstream in the config "
            '(e.g. "https://api.openai.com/v1")',
            path=config.path,
        )
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"gateway upstream {url!r} is not an http(s) URL", path=config.path)
    return url


def build_app(config_path: str | None, upstream: str | None, state: str = "store") -> GatewayApp:
    """The application for one deployment file (the command's and each worker's)."""
    from loopwarden.config import load_config
    from loopwarden.deployment import Deployment
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import open_state

    config = load_config(config_path)
    url = upstream_of(config, upstream)
    dep = Deployment(config)
    return GatewayApp(dep, url, open_state(config.store, memory=state == "memory"))


def factory() -> GatewayApp:
    """uvicorn's application factory for ``--workers`` (settings from the environment)."""
    return build_app(
        os.environ.get(ENV_CONFIG) or None,
        os.environ.get(ENV_UPSTREAM) or None,
        os.environ.get(ENV_STATE) or "store",
    )
