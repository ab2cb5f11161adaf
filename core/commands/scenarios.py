"""``loopwarden scenarios``: the built-in scenario files."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", action="store_true", help="print file paths only")


def main(args: argparse.Namespace) -> int:
    from loopwarden.models.scenario import builtin_scenarios, load_scenario

    for path in builtin_scenarios():
        if args.paths:
            print(path)
            continue
        sc = load_scenario(path)
        expect = sc.expect.termination or "-"
        print(f"{sc.name:<22} expect {expect!s:<16} {sc.description or ''}")
    return 0
