"""``loopwarden replay FILE.jsonl``: what the guards would have done to recorded real runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="trajectory JSONL (the format of docs/contracts.md)")
    parser.add_argument("--profile", help="a profile from [profiles] for every replayed run")
    parser.add_argument(
        "--tools",
        metavar="FILE",
        help="declared tool natures: a TOML file of [tools.NAME] tables "
        "(read_only / deterministic / side_effect / terminal / retryable / "
        "idempotency_keys), e.g. the deployment's config.toml (default: "
        "inferred from the tool names)",
    )
    parser.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the size of the system prompt (policy text, tool schemas) the "
        "recordings leave out: requests without recorded usage.prompt_tokens "
        "are sized with N tokens in place of the configured system prompt "
        "(default: the configured system prompt, estimated)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one result per trajectory, then the summary, as JSON lines "
        "(with --summary: only the summary, one JSON object)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="print only the summary, not one line per trajectory"
    )
    parser.add_argument(
        "--limit", type=_count, default=None, metavar="N", help="replay only the first N"
    )
    parser.add_argument(
        "--carry-state",
        metavar="PLUGINS",
        default="",
        help="experimental: comma-separated plugins whose state carries over "
        "from one run of a conversation to the next (conversation-scoped "
        "detection; by default every run starts afresh)",
    )
    parser.add_argument(
        "--observers",
        action="store_true",
        help="keep the observer plugins (logging, metrics, alerting, records); "
        "by default a replay leaves them out: they cannot change a verdict, "
        "and recorded runs should not page anyone",
    )
    add_config_argument(parser)


def _count(text: str) -> int:
    """argparse type: a whole number >= 0 (a bad value is a usage error, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def print_summary(summary: dict[str, Any]) -> None:
    """The summary as aligned ``key  value`` lines."""
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        text = json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)
        print(f"{k:<{width}}  {text}")


def main(args: argparse.Namespace) -> int:
    import itertools
    import time
    from pathlib import Path

    from loopwarden.config import load_config
    from loopwarden.deployment import Deployment
    from loopwarden.exceptions import ConfigError
    from loopwarden.replay import (
        iter_trajectories,
        load_tool_flags,
        replay_config,
        replay_trajectory,
        summarize,
    )

    path = Path(args.file)
    if not path.is_file():
        raise ConfigError("file not found", path=path)
    if args.system_prompt_tokens is not None and args.system_prompt_tokens < 0:
        raise ConfigError("must be a token count >= 0", key="--system-prompt-tokens")
    config = replay_config(load_config(args.config), observers=args.observers)
    if args.profile:
        config.profile(args.profile)  # validates the name
        config = config.model_copy(
            update={"run": config.run.model_copy(update={"profile": args.profile})}
        )
    flags = load_tool_flags(args.tools) if args.tools else None
    carry = [n.strip() for n in args.carry_state.split(",") if n.strip()]
    started = time.perf_counter()
    results, bad = [], 0
    with Deployment(config) as dep:
        for _lineno, traj in itertools.islice(iter_trajectories(path), args.limit):
            if traj is None:
                bad += 1
                continue
            r = replay_trajectory(
                dep, traj, flags, carry, system_prompt_tokens=args.system_prompt_tokens
            )
            results.append(r)
            if args.summary:
                continue
            if args.json:
                print(json.dumps(r.as_dict(), ensure_ascii=False))
            else:
                fw, st = r.first_warning, r.stop
                warn = "-" if fw is None else "@{step} {plugin}".format(**fw)
                stop = "-" if st is None else "@{step} {reason} ({plugin})".format(**st)
                print(f"{r.id:<48} steps {r.steps:>3}  warn {warn:<24} stop {stop}")
    summary = summarize(results)
    summary["profile"] = config.run.profile
    summary["system_prompt_tokens"] = args.system_prompt_tokens
    if carry:
        summary["carry_state"] = carry
    summary["unreadable_lines"] = bad
    summary["seconds"] = round(time.perf_counter() - started, 2)
    if args.json and args.summary:
        print(json.dumps(summary, ensure_ascii=False))
    elif args.json:
        print(json.dumps({"summary": summary}, ensure_ascii=False))
    else:
        if not args.summary:
            print()
        print_summary(summary)
    if bad:
        print(f"loopwarden replay: skipped {bad} unreadable line(s)", file=sys.stderr)
    return 0
