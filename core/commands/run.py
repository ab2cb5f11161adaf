"""``loopwarden run``: one agent loop, against the configured model or a scenario.

Exit codes (scripts rely on them):

* 0 -- the run was carried out: the model answered, or a guard stopped it (any stop reason
  that a plugin decided, ``timeout`` included);
* 3 -- the run could not be carried out (:data:`loopwarden.reasons.NOT_CARRIED_OUT_REASONS`):
  ``model_error`` (a 401 for a bad key included), ``plugin_error``, ``store_unavailable`` (the
  shared store that budgets and the side-effect ledger need cannot be reached), or an
  internal ``error``;
* 2 -- bad input: config, scenario, arguments, a missing API key (nothing was run);
``--stream`` prints the model's text as it arrives (and a line for each tool call, verdict
and cut answer), then the same summary; with ``--json`` the stream goes to stderr and stdout
holds only the record.  The record of a streamed run is the unstreamed run's.

* 130 / 143 -- interrupted by SIGINT / SIGTERM: the run is cancelled (the model call in flight
  is abandoned, a blocking tool too), ends with a ``cancelled`` record (printed, and written by
  ``run_record``), then the command exits.  A second signal interrupts at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from loopwarden.commands import add_config_argument
from loopwarden.reasons import NOT_CARRIED_OUT_REASONS
from loopwarden.sanitize import escape_controls

if TYPE_CHECKING:
    from pathlib import Path

    from loopwarden.clock import CancelToken
    from loopwarden.deployment import Deployment
    from loopwarden.engine.streaming import StreamEvent
    from loopwarden.run import Run
    from loopwarden.tools import ToolRegistry

#: the run was carried out (an answer, or a guard's stop)
EXIT_OK = 0
#: bad input: nothing was run
EXIT_BAD_INPUT = 2
#: the run could not be carried out (the model or a plugin failed)
EXIT_NOT_CARRIED_OUT = 3
#: terminations that mean the run could not be carried out (one definition, in reasons)
NOT_CARRIED_OUT = frozenset(NOT_CARRIED_OUT_REASONS)
#: the exit code after each signal (128 + its number, the shell's convention)
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}


def exit_code(record: dict[str, Any]) -> int:
    """The exit code for a finished run's record (see the module doc)."""
    return EXIT_NOT_CARRIED_OUT if record.get("termination") in NOT_CARRIED_OUT else EXIT_OK


@contextlib.contextmanager
def cancel_on_signals(cancel: CancelToken, received: list[int]) -> Iterator[None]:
    """While the block runs, SIGINT / SIGTERM cancel the run (``received`` notes which); a
    second signal raises KeyboardInterrupt at once.  Outside the main thread: no change."""

    def handler(signum: int, _frame: Any) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        cancel.cancel(reason=signal.Signals(signum).name)

    previous: dict[int, Any] = {}
    try:
        for sig in SIGNAL_EXIT:
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("question", nargs="?", help="the user's message (live model)")
    parser.add_argument(
        "--scenario",
        metavar="FILE",
        help="play a scenario file (or a built-in scenario's name) offline",
    )
    parser.add_argument(
        "--tools",
        metavar="MODULE:ATTR",
        help="the tools to give the model: a ToolRegistry, a list of tools, or a function "
        "returning one; MODULE is looked for on sys.path, then beside the config file, as "
        "[plugins] enabled is (default: the demo shop at [shop] db_path)",
    )
    parser.add_argument("--profile", help="a profile from [profiles] (steps, tokens, seconds)")
    parser.add_argument("--json", action="store_true", help="print the run record as JSON")
    parser.add_argument(
        "--stream",
        action="store_true",
        help="print the model's text as it arrives, and each tool call and verdict "
        "(to stderr with --json); guards act mid-stream",
    )
    parser.add_argument(
        "--meta",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=_meta_item,
        help="a scope key of the run (tenant=acme, user=u-17); repeatable",
    )
    add_config_argument(parser)


def _meta_item(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def load_tools(spec: str, search: Path | None = None) -> ToolRegistry:
    """The tools ``--tools MODULE:ATTR`` names: a :class:`~loopwarden.tools.ToolRegistry`, a
    tool, an iterable of tools, or a function of no arguments returning one of those.  The
    module is looked for as ``[plugins] enabled`` looks for a plugin: on ``sys.path``, then in
    ``search`` (the config file's directory, :func:`~loopwarden.host.find.import_beside`).
    Any failure is a :class:`~loopwarden.ConfigError` (exit 2) naming the spec."""
    from loopwarden.exceptions import ConfigError
    from loopwarden.host.find import import_beside
    from loopwarden.tools import Tool, ToolRegistry

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--tools {spec}: {why}")

    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise bad("expected MODULE:ATTR, e.g. mypackage.tools:registry")
    try:
        obj: Any = import_beside(mod_name, search)
    except (Exception, SystemExit) as exc:  # module code may do anything
        raise bad(f"cannot import {mod_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise bad(f"{mod_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not isinstance(obj, (Tool, ToolRegistry)):
        try:
            obj = obj()
        except Exception as exc:
            raise bad(f"calling {attr}() failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, ToolRegistry):
        return obj
    if isinstance(obj, Tool):
        return ToolRegistry([obj])
    items = list(obj) if isinstance(obj, (list, tuple, set, frozenset)) else None
    if items is None or not all(isinstance(t, Tool) for t in items):
        raise bad(
            f"expected a ToolRegistry, a tool, a list of tools or a function returning one, "
            f"got {type(obj).__name__}"
        )
    return ToolRegistry(items)


def print_summary(record: dict[str, Any], out: TextIO | None = None) -> None:
    """A short human-readable account of one run record."""
    one = escape_controls  # a field on one line: a line break in it is shown, not run
    lines = [
        f"termination: {one(str(record['termination']))}" + (" (soft)" if record["soft"] else ""),
        f"stopped by:  {one(str(record['stopped_by'] or '-'))}",
        f"steps: {record['steps']}   tool calls: {record['tool_calls']}   "
        f"tokens: {record['tokens']['total']}   cost: {_cost_text(record)}",
    ]
    shadow = record.get("shadow_stop")
    if isinstance(shadow, dict):
        # the run went on: say what enforcing the shadowed guards would have done
        lines.append(
            f"shadow: {one(str(shadow.get('plugin')))} would have stopped the run at step "
            f"{shadow.get('step')} ({one(str(shadow.get('reason')))}, "
            f"{'soft' if shadow.get('soft') else 'hard'}); not enforced"
        )
    effects = record.get("shadow_effects") or ()
    if effects:
        lines.append(
            f"shadow: {len(effects)} other change(s) not enforced (see shadow_effects in --json)"
        )
    for w in record["warnings"]:
        lines.append(f"warning at step {w['step']} from {one(w['plugin'])}: {one(w['message'])}")
    if record.get("evidence"):
        lines.append(f"evidence: {json.dumps(record['evidence'], ensure_ascii=False)}")
    for a in record.get("ledger_answers") or ():
        # a repeated run differs from the first: say which calls a record answered, and why
        where = "another run" if a.get("source") == "shared" else "earlier in this run"
        lines.append(
            f"not executed at step {a['step']}: {one(str(a['tool']))} -- answered from the "
            f"side-effect ledger ({where}, state {one(str(a['state']))}): {one(str(a['why']))}"
        )
    for r in record.get("tool_retries") or ():
        lines.append(
            f"retried at step {r['step']}: {one(str(r['tool']))} took {r['attempts']} attempts "
            f"({', '.join(map(str, r['errors']))}), waited {r['waited_s']:g} s"
        )
    lines.append("")
    lines.append(str(record["final_answer"] or "(no answer)"))
    print("\n".join(lines), file=out or sys.stdout)


def _cost_text(record: dict[str, Any]) -> str:
    """The run's cost, or n/a with the reason when it was not measured."""
    if "cost" in (record.get("unmeasured") or ()):
        return "n/a (cost_budget is off)"
    if record.get("cost_known") is False:
        return f"n/a (no price for model {escape_controls(str(record.get('model')))})"
    return str(record["cost"])


class EventPrinter:
    """Prints the events of a streamed run: the text as it arrives, everything else -- tool
    calls, skips, verdicts, a cut answer -- on a line of its own."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.fresh_line = True

    def _write(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.fresh_line = text.endswith("\n")

    def _line(self, text: str) -> None:
        self._write(("" if self.fresh_line else "\n") + text + "\n")

    def show(self, event: StreamEvent) -> None:
        from loopwarden.engine import streaming as st

        if isinstance(event, st.TextDelta):
            self._write(event.text)
        elif isinstance(event, st.ToolCallProposed):
            self._line(f"-> {event.call.name} {event.call.raw_arguments}")
        elif isinstance(event, st.ToolCallSkipped):
            self._line(f"   ({event.call.name} not executed: {event.why}, {event.by})")
        elif isinstance(event, st.VerdictIssued):
            v = event.verdict
            what = getattr(v, "reason", None) or v.kind
            shadow = " (shadow)" if event.shadow else ""
            self._line(f"[{v.plugin}: {what} in {event.hook}{shadow}] {v.message or ''}".rstrip())
        elif isinstance(event, st.ResponseCut):
            self._line(f"[answer cut after ~{event.tokens} tokens: {event.reason}]")
        elif isinstance(event, st.RunEnd):
            self._line("")
        self.out.flush()


def _execute(deployment: Deployment, stream: TextIO | None, *args: Any, **kwargs: Any) -> Run:
    """Run to the end; with ``stream``, streamed, each event printed there as it happens."""
    if stream is None:
        return deployment.run(*args, **kwargs)
    from loopwarden.engine.streaming import RunEnd

    printer = EventPrinter(stream)
    for event in deployment.stream(*args, **kwargs):
        printer.show(event)
        if isinstance(event, RunEnd):
            return event.run
    raise AssertionError("a stream always ends with RunEnd")  # pragma: no cover


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.deployment import Deployment
    from loopwarden.exceptions import ConfigError

    if not args.scenario and not args.question:
        print(
            "loopwarden run: give a question, or --scenario FILE (see `loopwarden scenarios`)",
            file=sys.stderr,
        )
        return 2
    if args.scenario and args.question:
        print("loopwarden run: give a question or --scenario, not both", file=sys.stderr)
        return 2
    from loopwarden.clock import CancelToken

    meta = dict(args.meta) or None
    from loopwarden import demo

    config = load_config(args.config)
    if args.tools:
        from loopwarden.host.find import config_dir

        tools = load_tools(args.tools, config_dir(config))
    else:  # the demo's tools (its scenarios script the rest), and its system prompt
        config = demo.with_shop_prompt(config)
        tools = demo.config_tools(config)
    deployment = Deployment(config, tools=tools)
    window, source = config.model.window()
    if source == "default":
        print(
            f"loopwarden run: note: the context window of model {config.model.name!r} is "
            f"unknown; assuming {window} tokens (set [model] context_window in "
            f"{config.path})",
            file=sys.stderr,
        )
    cancel = CancelToken()
    received: list[int] = []
    stream = (sys.stderr if args.json else sys.stdout) if args.stream else None
    try:
        with cancel_on_signals(cancel, received):
            if args.scenario:
                run = _execute(
                    deployment,
                    stream,
                    scenario=args.scenario,
                    profile=args.profile,
                    cancel=cancel,
                    meta=meta,
                )
            else:
                try:
                    deployment.model  # noqa: B018 - builds the client, checks the key
                except ConfigError as exc:
                    print(exc.message, file=sys.stderr)
                    return EXIT_BAD_INPUT
                from loopwarden.plugins.cost_budget import unpriced_note

                note = unpriced_note(deployment, config.model.name)
                if note is not None:
                    print(f"loopwarden run: note: {note}", file=sys.stderr)
                run = _execute(
                    deployment,
                    stream,
                    args.question,
                    profile=args.profile,
                    cancel=cancel,
                    meta=meta,
                )
    finally:
        deployment.close()
    record = run.record()
    if args.json:
        print(json.dumps(record, ensure_ascii=False))
    else:
        print_summary(record)
    if received:
        return SIGNAL_EXIT[signal.Signals(received[0])]
    return exit_code(record)
