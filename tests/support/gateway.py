"""Real servers for the gateway's tests: uvicorn on free local ports, in threads.

:func:`serve` runs any ASGI application under a real uvicorn server on 127.0.0.1 and returns
its base URL; :func:`scripted_upstream` serves the built-in scenarios
(:class:`loopwarden.gateway.scripted.ScriptedUpstream`); :func:`gateway` puts a
:class:`loopwarden.gateway.app.GatewayApp` in front of an upstream.  Each server stops when
the ``contextlib.ExitStack`` it was entered on closes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from loopwarden.models.scenario import Scenario, load_scenario, scenario_path

SCENARIOS = (
    "always-not-found",
    "refund",
    "oscillation",
    "never-finish",
    "repeat-then-recover",
    "transfer-loop",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(app: Any, port: int | None = None) -> Iterator[str]:
    """``app`` under uvicorn on 127.0.0.1 in a thread; yields ``http://127.0.0.1:PORT``."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def scenarios(names: tuple[str, ...] = SCENARIOS) -> dict[str, Scenario]:
    return {n: load_scenario(scenario_path(n)) for n in names}
