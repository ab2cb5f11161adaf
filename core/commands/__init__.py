"""Subcommands of the ``loopwarden`` CLI: each module has ``add_arguments`` and ``main``."""

from __future__ import annotations

import argparse


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="deployment config (default: ./config.toml if present, else the shipped default)",
    )
