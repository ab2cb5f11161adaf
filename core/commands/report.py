"""``loopwarden report [FILE.jsonl]``: summarise run records, and advise what to fix.

Prints the termination distribution, steps / tokens / cost percentiles, duplicate-call and
stall rates, the top repeated call signatures and advice (raise a budget, or fix the prompt
and tool descriptions, naming the tools most involved).  Corrupt or truncated lines are
skipped and counted.  ``--json`` prints the same as JSON; ``--plot FILE.png`` draws tokens per
step across runs (needs the optional extra ``loopwarden[plot]``).

Without a file it reads where the config's ``run_record`` plugin writes (``--config``); when
nothing is there yet it prints commands that record a run and report it, which work as given.

Exit codes: 0 a report was printed; 1 the file holds no valid record; 2 bad input (no such
file, matplotlib missing for ``--plot``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
from typing import TYPE_CHECKING

from loopwarden.commands import add_config_argument

if TYPE_CHECKING:
    from pathlib import Path

    from loopwarden.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file",
        nargs="?",
        metavar="FILE.jsonl",
        help="run records, one JSON object per line (default: where the config's run_record "
        "plugin writes: its [plugins.run_record] path, else runs.jsonl in the data directory)",
    )
    add_config_argument(parser)
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

    config = None
    if args.file is None:
        from loopwarden.config import load_config

        config = load_config(args.config)
        path = records_file(config)
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
        if config is not None:
            print(no_records_hint(config, args.config), file=sys.stderr)
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


def records_file(config: Config) -> Path:
    """Where ``config``'s run_record plugin appends: its ``path`` (relative to the current
    directory, as the plugin takes it), else ``runs.jsonl`` in the data directory."""
    from loopwarden.paths import configured_records_path

    return configured_records_path(config.plugins.tables().get("run_record"))


def no_records_hint(config: Config, given: str | None) -> str:
    """Commands that write the missing records file and report it, runnable as printed:
    with ``run_record`` already enabled a run writes it; else the run enables it through
    ``LOOPWARDEN_PLUGINS`` (naming it twice would be an error)."""
    from loopwarden.config import default_config_path
    from loopwarden.host import resolve_names

    flag = f" --config {shlex.quote(given)}" if given else ""
    names, blocked = resolve_names(config)
    shipped = config.path == str(default_config_path())
    where = "the shipped config" if shipped else str(config.path)
    if "run_record" in blocked:
        return (
            f"  The run_record plugin writes run records, and {where} blocks it: remove "
            '"run_record" from [plugins] blocked (or LOOPWARDEN_BLOCK_PLUGINS), run, then '
            "report; or pass a records file: loopwarden report FILE."
        )
    if "run_record" in names:
        why = f"The run_record plugin is enabled in {where}; no run has written yet."
        run = f"loopwarden run{flag} --scenario refund"
    else:
        why = (
            f"Runs write records only with the run_record plugin, which {where} does not "
            'enable (to keep every run\'s record, add "run_record" to [plugins] enabled in '
            "your config.toml)."
        )
        run = f"LOOPWARDEN_PLUGINS=run_record loopwarden run{flag} --scenario refund"
    return (
        f"  {why} Record a run, then report it:\n"
        f"    {run}\n"
        f"    loopwarden report{flag}\n"
        "  or pass a records file: loopwarden report FILE."
    )
