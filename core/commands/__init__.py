"""Subcommands of the ``loopwarden`` CLI: each module has ``add_arguments`` and ``main``.

May import: everything -- the command line sits on top of the package; nothing but
``loopwarden``'s entry point (and the docs generator, for the config schema) imports it.
"""

from __future__ import annotations

import argparse


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="deployment config (default: ./config.toml if present, else the shipped default)",
    )


def whole_number(text: str) -> int:
    """argparse type: a whole number >= 0 (a bad value is a usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
