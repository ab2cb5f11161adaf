"""``loopwarden report [FILE.jsonl]``: summarise run records, and advise what to fix.

Prints the termination distribution, steps / tokens / cost percentiles, duplicate-call and
stall rates, the top repeated call signatures and advice (raise a budget, or fix the prompt
and tool descriptions, naming the tools most involved).  Corrupt or truncated lines are
skipped and counted.  ``--json`` prints the same as JSON; ``--plot FILE.png`` draws tokens per
step across runs (needs the optional extra ``loopwarden[plot]``).

Exit codes: 0 a report was printed; 1 the file holds no valid record; 2 bad input (no such
file, matplotlib missing for ``--plot``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        metavar="FILE.jsonl",
        help="run records, one JSON object per line (default: runs.jsonl in the data "
        "directory, where the run_record plugin writes by default)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw tokens per step across runs, guard firings marked"
    )
    parser.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="N",
        help="how many repeated signatures and tools to list (default 5)",
    )


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from loopwarden.report import Thresholds, analyse, format_text, load_records, plot
    from loopwarden.sanitize import escape_tree

    if args.file is None:
        from loopwarden.paths import records_path

        path = records_path()
    else:
        path = Path(args.file)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "loopwarden report: --plot needs matplotlib, which is not installed: "
            "pip install 'loopwarden[plot]'",
            file=sys.stderr,
        )
        return 2
    if not path.is_file():
        print(f"loopwarden report: no such file: {path}", file=sys.stderr)
        if args.file is None:
            print(
                "  Runs write their records there when the run_record plugin is enabled (it is "
                "in the shipped config.toml's [plugins] enabled; [plugins.run_record] path "
                "moves the file); try `loopwarden demo` or `loopwarden run --scenario refund`, "
                "or pass a records file: loopwarden report FILE.",
                file=sys.stderr,
            )
        return 2
    try:
        loaded = load_records(path)
    except OSError as exc:
        print(f"loopwarden report: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    report = analyse(
        loaded.records, skipped=loaded.skipped, thresholds=Thresholds(top=max(1, args.top))
    )
    report["file"] = str(path)
    if loaded.skipped:
        where = ", ".join(str(n) for n in loaded.skipped_lines)
        print(
            f"loopwarden report: skipped {loaded.skipped} corrupt line"
            f"{'s' if loaded.skipped != 1 else ''} of {path} (line {where})",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        # every field on one line of its own: a line break in a tool name is shown, not run
        print(format_text(escape_tree(report), source=escape_tree(str(path))))
    if not loaded.records:
        print(f"loopwarden report: no valid run record in {path}", file=sys.stderr)
        return 1
    if args.plot:
        try:
            note = plot(loaded.records, args.plot)
        except OSError as exc:
            print(
                f"loopwarden report: cannot write {args.plot}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
        print(f"loopwarden report: {note}: {args.plot}", file=sys.stderr)
    return 0
