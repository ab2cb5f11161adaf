"""``loopwarden console``: a web page over the run records and the shared store.

Serves the overview, runs, one run's timeline, budgets and breakers on
``http://127.0.0.1:8377/`` with the standard library's HTTP server (see
:mod:`loopwarden.console`).  Safe by default: it binds 127.0.0.1; another address needs a
token (``--token`` or ``LOOPWARDEN_CONSOLE_TOKEN``); it only reads, unless started with
``--allow-resets``, which lets a confirmed form reset a breaker.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from loopwarden.commands import add_config_argument, whole_number

#: the environment variable a token may come from
TOKEN_ENV = "LOOPWARDEN_CONSOLE_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records",
        metavar="PATH",
        default=None,
        help="the run-record JSONL file (default: where the config's run_record plugin writes)",
    )
    add_config_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="the address to bind (127.0.0.1)")
    parser.add_argument(
        "--port", type=whole_number, default=8377, help="the port (8377; 0: a free one)"
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"the token every request must carry (also from {TOKEN_ENV}); needed to bind "
        "anything but a loopback address",
    )
    parser.add_argument(
        "--allow-resets",
        action="store_true",
        help="let the breakers page reset a breaker (confirmed); read-only without it",
    )
    parser.add_argument("--open", action="store_true", help="open the page in a browser")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def main(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from loopwarden.config import load_config
    from loopwarden.console.assemble import BACKGROUND_INDEX_BYTES, console_from_config
    from loopwarden.console.server import make_server
    from loopwarden.store import Shared

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not _loopback(args.host) and token is None:
        print(
            f"loopwarden console: refusing to bind {args.host} without a token: anyone who "
            f"can reach it would read the run records. Pass --token TOKEN (or set {TOKEN_ENV}), "
            "or bind 127.0.0.1.",
            file=sys.stderr,
        )
        return 2
    config = load_config(args.config)
    shared = Shared(config.store)
    records = Path(args.records).expanduser() if args.records else None
    console = console_from_config(
        config,
        shared,
        records=records,
        token=token,
        allow_resets=args.allow_resets,
        background_over=BACKGROUND_INDEX_BYTES,  # answer at once, say "indexing N%"
    )
    if not console.index.records.is_file():
        print(
            f"loopwarden console: no run records yet at {console.index.records} -- the page "
            "fills as runs are recorded (`loopwarden demo` keeps a sample; your own runs "
            "record with the run_record plugin enabled)",
            file=sys.stderr,
        )
    try:
        server = make_server(console, args.host, args.port)
    except OSError as exc:
        print(
            f"loopwarden console: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        shared.close()
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")
    print(f"console: {url}", flush=True)
    if args.open:
        import webbrowser

        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        console.index.close()
        shared.close()
    return 0
