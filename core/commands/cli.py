"""The ``loopwarden`` command line.

Each subcommand lives in its own module under ``loopwarden.commands`` and is imported only when
it runs, so ``loopwarden --help`` stays fast.  Exit codes: 0 success, 1 a check that failed
its purpose, 2 bad input (config, scenario, arguments) -- always with a message, never a
traceback; ``run`` also exits 3 when the run could not be carried out (``model_error``,
``plugin_error``, ``store_unavailable``) and 130 / 143 after SIGINT / SIGTERM (see
:mod:`loopwarden.commands.run`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterator, Sequence

from loopwarden._version import __version__

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("loopwarden.commands.run", "run one agent loop: a question, or --scenario FILE"),
    "demo": ("loopwarden.commands.demo", "play every built-in scenario guarded and unguarded"),
    "replay": ("loopwarden.commands.replay", "feed recorded real runs through the guards"),
    "calibrate": (
        "loopwarden.commands.calibrate",
        "propose limits from the successful runs of recorded files (100+), as a config",
    ),
    "report": ("loopwarden.commands.report", "summarise a run-record JSONL file with advice"),
    "plugins": ("loopwarden.commands.plugins", "list enabled plugins in call order"),
    "config": (
        "loopwarden.commands.config",
        "check a config file, show its effective values, or print its JSON Schema",
    ),
    "scenarios": ("loopwarden.commands.scenarios", "list the built-in scenarios"),
    "new-plugin": (
        "loopwarden.commands.new_plugin",
        "write a plugin package to start from: settings, hooks, entry point, tests, README",
    ),
    "budgets": (
        "loopwarden.commands.budgets",
        "shared budgets: spend, reservations and limits per scope and window; `budgets set "
        "SCOPE KEY --max-cost N`, `budgets reset SCOPE KEY`",
    ),
    "ledger": (
        "loopwarden.commands.ledger",
        "the side-effect ledger: calls executed once; `ledger forget KEY`",
    ),
    "paths": (
        "loopwarden.commands.paths",
        "where loopwarden keeps run records, the store, the ledger and the demo shop",
    ),
    "gateway": (
        "loopwarden.commands.gateway",
        "an OpenAI-compatible gateway that guards any agent pointed at it; `gateway demo`",
    ),
    "breakers": (
        "loopwarden.commands.breakers",
        "fleet-wide circuit breakers per tool and MCP server; `breakers reset TOOL`",
    ),
    "console": (
        "loopwarden.commands.console",
        "a web page over the run records and the shared store: runs, stops, budgets, breakers",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopwarden",
        description="Keeps LLM agent loops from running away: the model proposes, the runtime "
        "decides.",
    )
    parser.add_argument("--version", action="version", version=f"loopwarden {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_mod, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text, add_help=False)
    return parser


def _setup_logging(level: str) -> None:
    """Send loopwarden's log records at ``level`` and above to stderr (the CLI's choice)."""
    import logging

    logger = logging.getLogger("loopwarden")
    for old in [h for h in logger.handlers if h.get_name() == "loopwarden-cli"]:
        logger.removeHandler(old)
    if level == "off":
        logger.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name("loopwarden-cli")
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def _tolerant_output() -> None:
    """Never fail on printing: a character the terminal cannot encode (or a lone surrogate
    that slipped through) is written as an escape instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if callable(reconfigure):
            with contextlib.suppress(ValueError, OSError):  # a stream that cannot change
                reconfigure(errors="backslashreplace")


@contextlib.contextmanager
def _escaped_output() -> Iterator[None]:
    """While a command runs, everything it prints on stdout and stderr -- tables, records,
    errors, log lines -- goes through :class:`~loopwarden.sanitize.TerminalStream`: a tool
    name, an id or a message the model made up cannot run an escape sequence (OSC, CSI, BEL)
    or a bidi override on the operator's terminal."""
    from loopwarden.sanitize import TerminalStream

    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = TerminalStream(sys.stdout), TerminalStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script (a command's output is escaped: see
    :func:`_escaped_output`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] in ("-h", "--help") or args[0] == "--version":
        parser.parse_args(args or ["--help"])  # fixed text: no need to load the escaping
        return 0
    with _escaped_output():
        return _command(parser, args)


def _command(parser: argparse.ArgumentParser, args: list[str]) -> int:
    """Run the command ``args`` names (``args[0]``)."""
    name = args[0]
    if name not in COMMANDS:
        parser.error(f"unknown command {name!r} (choose from {', '.join(COMMANDS)})")
    module = importlib.import_module(COMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"loopwarden {name}", description=COMMANDS[name][1])
    module.add_arguments(sub)
    sub.add_argument(
        "--log-level",
        default="error",
        type=str.lower,
        choices=["debug", "info", "warning", "error", "off"],
        help="log records shown on stderr (the logging and alerting plugins log every guard "
        "verdict at warning; default: error)",
    )
    ns = sub.parse_args(args[1:])
    _setup_logging(ns.log_level)
    _tolerant_output()
    from loopwarden.exceptions import LoopwardenError

    try:
        return int(module.main(ns) or 0)
    except LoopwardenError as exc:
        print(f"loopwarden {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"loopwarden {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path given on the command line that cannot be read or written
        print(
            f"loopwarden {name}: error: {exc.strerror or exc}"
            + (f": {exc.filename}" if exc.filename else ""),
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
