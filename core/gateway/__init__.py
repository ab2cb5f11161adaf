"""Guard any agent with no code change: the OpenAI-compatible gateway and the client wrapper.

Two front ends over the same engine, plugins, config and store as the in-process loop:

- ``loopwarden gateway`` (:mod:`loopwarden.gateway.serve`, the ASGI application in
  :mod:`loopwarden.gateway.app`): point an agent's ``base_url`` at it;
- :func:`loopwarden.wrap` (:mod:`loopwarden.gateway.wrap`): ``wrap(OpenAI())`` judges the
  client's own chat completions in process, through the SDK's transport.

Both hand each request to :class:`~loopwarden.gateway.exchange.Gate`, which rebuilds the run
from the wire (:mod:`loopwarden.gateway.exchange`), reads and writes the wire shape in one
place (:mod:`loopwarden.gateway.chat`) and keeps a conversation between requests in the
shared store (:mod:`loopwarden.gateway.state`).  docs/gateway.md is the guide.

May import: the public vocabulary, the deployment, the engine, the store, the models, the
tools and the config; never the adapters, the demo, the commands, recorded traffic, the
reports or the test kit (import-linter: "front ends are independent").
"""

from __future__ import annotations

from typing import Any

__all__ = ["Gate", "GatewayApp", "wrap"]


def __getattr__(name: str) -> Any:
    """The gateway's names, imported on first use (the ASGI app imports httpx)."""
    if name == "Gate":
        from loopwarden.gateway.exchange import Gate

        return Gate
    if name == "GatewayApp":
        from loopwarden.gateway.app import GatewayApp

        return GatewayApp
    if name == "wrap":
        from loopwarden.gateway.wrap import wrap

        return wrap
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
