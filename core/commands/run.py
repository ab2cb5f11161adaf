"""``loopwarden run``: one agent loop, against the configured model or a scenario."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", nargs="?", help="the user's message (live model)")
    parser.add_argument("--scenario", metavar="FILE",
                        help="play a scenario file (or a built-in scenario's name) offline")
    parser.add_argument("--profile", help="a profile from [profiles] (steps, tokens, seconds)")
    parser.add_argument("--json", action="store_true", help="print the run record as JSON")
    parser.add_argument("--meta", metavar="KEY=VALUE", action="append", default=[],
                        type=_meta_item,
                        help="a scope key of the run (tenant=acme, user=u-17); repeatable")
    add_config_argument(parser)


def _meta_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def print_summary(record: dict[str, Any], out: TextIO | None = None) -> None:
    """A short human-readable account of one run record."""
    lines = [
        f"termination: {record['termination']}" + (" (soft)" if record["soft"] else ""),
        f"stopped by:  {record['stopped_by'] or '-'}",
        f"steps: {record['steps']}   tool calls: {record['tool_calls']}   "
        f"tokens: {record['tokens']['total']}   cost: {record['cost']}",
    ]
    for w in record["warnings"]:
        lines.append(f"warning at step {w['step']} from {w['plugin']}: {w['message']}")
    if record.get("evidence"):
        lines.append(f"evidence: {json.dumps(record['evidence'], ensure_ascii=False)}")
    lines.append("")
    lines.append(str(record["final_answer"] or "(no answer)"))
    print("\n".join(lines), file=out or sys.stdout)


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.deployment import Deployment
    from loopwarden.exceptions import ConfigError

    if not args.scenario and not args.question:
        print("loopwarden run: give a question, or --scenario FILE (see `loopwarden scenarios`)",
              file=sys.stderr)
        return 2
    if args.scenario and args.question:
        print("loopwarden run: give a question or --scenario, not both", file=sys.stderr)
        return 2
    meta = dict(args.meta) or None
    config = load_config(args.config)
    deployment = Deployment(config)
    window, source = config.model.window()
    if source == "default":
        print(f"loopwarden run: note: the context window of model {config.model.name!r} is "
              f"unknown; assuming {window} tokens (set [model] context_window in "
              f"{config.path})", file=sys.stderr)
    try:
        if args.scenario:
            run = deployment.run(scenario=args.scenario, profile=args.profile, meta=meta)
        else:
            try:
                deployment.model  # noqa: B018 - builds the client, checks the key
            except ConfigError as exc:
                print(exc.message, file=sys.stderr)
                return 2
            run = deployment.run(args.question, profile=args.profile, meta=meta)
    finally:
        deployment.close()
    record = run.record()
    if args.json:
        print(json.dumps(record, ensure_ascii=False))
    else:
        print_summary(record)
    return 0
