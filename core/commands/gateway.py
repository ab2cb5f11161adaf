"""``loopwarden gateway``: an OpenAI-compatible gateway that guards any agent pointed at it.

``loopwarden gateway --upstream https://api.openai.com/v1`` serves ``/v1/chat/completions``
(judged) and every other path (forwarded) on ``[gateway] host`` / ``port`` (127.0.0.1:8787 by
default); agents set ``base_url = "http://127.0.0.1:8787/v1"``.  ``loopwarden gateway demo``
plays the built-in scenarios with the real ``openai`` client over HTTP through a gateway in
front of a scripted upstream, offline, and prints ``loopwarden demo``'s table.  Needs the
``gateway`` extra (``pip install 'loopwarden[gateway]'``); docs/gateway.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=["serve", "demo"],
        default="serve",
        help="serve (default), or demo: the built-in scenarios through a local gateway",
    )
    parser.add_argument("--upstream", default=None, help="the upstream's base URL")
    parser.add_argument("--host", default=None, help="the address to bind ([gateway] host)")
    parser.add_argument("--port", type=int, default=None, help="the port ([gateway] port)")
    parser.add_argument("--workers", type=int, default=1, help="processes (they share the store)")
    parser.add_argument(
        "--state",
        choices=["store", "memory"],
        default="store",
        help="where conversations live between requests: the shared store (default) or this "
        "process (one worker only)",
    )
    parser.add_argument("--stream", action="store_true", help="demo: the client streams")
    add_config_argument(parser)


def main(args: argparse.Namespace) -> int:
    from loopwarden.exceptions import ConfigError

    try:
        import uvicorn
    except ImportError:
        print(
            "loopwarden gateway: needs the gateway extra: pip install 'loopwarden[gateway]'",
            file=sys.stderr,
        )
        return 2
    if args.action == "demo":
        from loopwarden.commands.gatewaydemo import main as demo_main

        return demo_main(args.config, stream=args.stream)
    from loopwarden.config import load_config
    from loopwarden.gateway import serve

    try:
        config = load_config(args.config)
        upstream = serve.upstream_of(config, args.upstream)
    except ConfigError as exc:
        print(f"loopwarden gateway: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1 and args.state == "memory":
        print("loopwarden gateway: --state memory serves one worker only", file=sys.stderr)
        return 2
    host = args.host or config.gateway.host
    port = args.port if args.port is not None else config.gateway.port
    os.environ[serve.ENV_CONFIG] = args.config or ""
    os.environ[serve.ENV_UPSTREAM] = upstream
    os.environ[serve.ENV_STATE] = args.state
    print(f"loopwarden gateway on http://{host}:{port}/v1 -> {upstream}", file=sys.stderr)
    uvicorn.run(
        "loopwarden.gateway.serve:factory",
        factory=True,
        host=host,
        port=port,
        workers=args.workers,
        log_level="warning",
        loop="auto",
        http="auto",
        access_log=False,
    )
    return 0
