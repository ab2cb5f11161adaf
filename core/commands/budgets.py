"""``loopwarden budgets``: what each scope spent per window in the shared store, and its limits.

``loopwarden budgets [--json]`` lists the live counters of the store (``[store] url``): what
was spent, what calls in progress hold reserved, and the limit -- the config's
``spend_limits`` budget, or an operator's override.  ``loopwarden budgets set SCOPE KEY
[--window W] --max-cost 80`` overrides a limit at run time for every process on the store,
from its next call (``--max-tokens``, ``--max-runs``, ``--max-model-calls``,
``--max-tool-calls``; ``config`` as a value hands that limit back to the config);
``loopwarden budgets clear SCOPE KEY [--window W]`` removes the override.  ``loopwarden
budgets reset SCOPE KEY`` forgets every counter of one scope key (``budgets reset tenant
acme``).  Every change is recorded in the store's change log -- who, when, before and after
-- which ``loopwarden budgets log`` lists.
"""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from loopwarden.commands import add_config_argument
from loopwarden.commands._ops import add_by_argument, cell, print_changes, print_table, when
from loopwarden.store.admin import Change, LimitOverride, limits_dict

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.store import OperatedStore

#: the changes ``budgets log`` lists
BUDGET_ACTIONS = ("set_limits", "clear_limits", "reset_budget")
#: option -> quantity
_OPTIONS = {
    "max_runs": "runs",
    "max_model_calls": "model_calls",
    "max_tool_calls": "tool_calls",
    "max_tokens": "tokens",
    "max_cost": "cost",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=["show", "set", "clear", "reset", "log"],
        default="show",
        help="show (default); set / clear / reset SCOPE KEY; log",
    )
    parser.add_argument("scope", nargs="?", help="the scope (tenant, user, ...)")
    parser.add_argument("key", nargs="?", help="the scope's key (acme, u-17, ...)")
    parser.add_argument(
        "--window",
        default=None,
        help="with set / clear: the budget's window (needed when the config has several "
        "for the scope)",
    )
    for option, quantity in _OPTIONS.items():
        parser.add_argument(
            "--" + option.replace("_", "-"),
            dest=option,
            default=None,
            metavar="N" if quantity != "cost" else "AMOUNT",
            help=f"with set: the {quantity.replace('_', ' ')} limit ('config': the config's)",
        )
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_by_argument(parser)
    add_config_argument(parser)


def _limits(config: Config) -> dict[tuple[str, str], dict[str, Any]]:
    """(scope, window) -> the limits the config's spend_limits budgets set (the lowest, where
    several budgets share a scope and window)."""
    from loopwarden.plugins.spend_limits import configured_limits

    return configured_limits(config.plugins.tables().get("spend_limits"))


def _fail(text: str) -> int:
    print(f"loopwarden budgets: {text}", file=sys.stderr)
    return 2


def _number(value: object) -> str:
    """An amount as people write it (a cost's trailing zeros dropped)."""
    return f"{value:.6f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def _amount(q: str, text: str) -> int | None:
    """A ``--max-*`` value in store units; None for ``config``.  Raises ValueError."""
    from loopwarden.store import cost_units

    if text.strip().lower() == "config":
        return None
    if q == "cost":
        try:
            value = Decimal(text)
        except InvalidOperation:
            raise ValueError(f"--max-cost takes an amount (12.50), not {text!r}") from None
        if not value.is_finite() or value <= 0:
            raise ValueError(f"--max-cost must be more than 0, not {text!r}")
        return cost_units(value)
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"--max-{q.replace('_', '-')} takes a whole number > 0, not {text!r}")
    return int(text)


def _window(
    args: argparse.Namespace, config: Config, needed: bool = True
) -> tuple[str | None, str | None]:
    """The window ``set`` / ``clear`` mean: ``--window``, else the only one the config has
    for the scope.  ``(window, None)`` or ``(None, error)``."""
    windows = sorted(w for s, w in _limits(config) if s == args.scope)
    where = config.path or "the config"
    if args.window is not None:
        if args.window not in windows and needed:
            have = f"its windows: {', '.join(windows)}" if windows else "it has none"
            return None, (
                f"{where} has no spend_limits budget for scope {args.scope!r} in window "
                f"{args.window!r} ({have}); an override changes a configured budget"
            )
        return args.window, None
    if len(windows) == 1:
        return windows[0], None
    if not windows:
        if not needed:
            return None, None
        return None, (
            f"{where} has no spend_limits budget for scope {args.scope!r}: nothing to override"
        )
    return None, f"scope {args.scope!r} has budgets in {', '.join(windows)}: name one (--window)"


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.store import Shared, operated, redact_url

    if args.action in ("set", "clear", "reset") and (not args.scope or not args.key):
        return _fail(f"{args.action} needs SCOPE and KEY (budgets {args.action} tenant acme)")
    given = {o: v for o in _OPTIONS if (v := getattr(args, o)) is not None}
    if given and args.action != "set":
        return _fail("--max-* options go with set")
    if args.action == "set" and not given:
        return _fail("set needs at least one limit (--max-cost 80, --max-tokens 2000000, ...)")
    try:
        updates = {_OPTIONS[o]: _amount(_OPTIONS[o], v) for o, v in given.items()}
    except ValueError as exc:
        return _fail(str(exc))
    config = load_config(args.config)
    window: str | None = None
    if args.action in ("set", "clear"):
        window, error = _window(args, config, needed=args.action == "set")
        if error:
            return _fail(error)
    shared = Shared(config.store)
    url = redact_url(shared.url)
    try:
        store = operated(shared.store)
        if args.action == "set" and window is not None:  # _window gave one, or an error
            old, new = store.set_limits(args.scope, args.key, window, updates, by=args.by)
            return _print_override(url, "set", args, window, old, new, config)
        if args.action == "clear":
            return _clear(store, url, args, window)
        if args.action == "reset":
            n = store.reset(args.scope, args.key)
            store.log_change(
                "reset_budget",
                {"scope": args.scope, "key": args.key},
                {"counters": n},
                None,
                by=args.by,
            )
            if args.json:
                out = {"store": url, "scope": args.scope, "key": args.key, "counters_removed": n}
                print(json.dumps(out))
            else:
                print(f"reset {args.scope}={args.key}: {n} counter(s) removed")
            return 0
        if args.action == "log":
            changes = [c for c in store.changes(1000) if c.action in BUDGET_ACTIONS]
            print_changes(changes, args.json, url, _describe)
            return 0
        rows = [r.as_dict() for r in store.rows()]
        overrides = store.overrides()
    finally:
        shared.close()
    return _show(config, url, rows, overrides, args.json)


def _print_override(
    url: str,
    verb: str,
    args: argparse.Namespace,
    window: str,
    old: LimitOverride | None,
    new: LimitOverride | None,
    config: Config,
) -> int:
    before, after = (limits_dict(o.limits) if o else None for o in (old, new))
    configured = _limits(config).get((args.scope, window), {})
    if args.json:
        out = {
            "store": url,
            "scope": args.scope,
            "key": args.key,
            "window": window,
            "old": before,
            "new": after,
            "config": configured,
        }
        print(json.dumps(out))
        return 0
    target = f"{cell(args.scope)}={cell(args.key)} ({window})"
    print(f"{verb} {target}: override {_show_limits(before)} -> {_show_limits(after)}")
    print(f"  config: {_show_limits(configured)}; in force for every process on {url}")
    return 0


def _clear(store: OperatedStore, url: str, args: argparse.Namespace, window: str | None) -> int:
    windows = (
        [window]
        if window is not None
        else [o.window for o in store.overrides() if (o.scope, o.key) == (args.scope, args.key)]
    )
    cleared = {w: store.clear_limits(args.scope, args.key, w, by=args.by) for w in windows}
    if args.json:
        out = {
            "store": url,
            "scope": args.scope,
            "key": args.key,
            "cleared": {w: limits_dict(o.limits) if o else None for w, o in cleared.items()},
        }
        print(json.dumps(out))
        return 0
    done = {w: o for w, o in cleared.items() if o is not None}
    if not done:
        print(f"no override for {cell(args.scope)}={cell(args.key)}: nothing cleared")
        return 0
    for w, o in done.items():
        print(
            f"cleared {cell(args.scope)}={cell(args.key)} ({w}): was "
            f"{_show_limits(limits_dict(o.limits))}; the config's limits apply again"
        )
    return 0


def _show_limits(limits: dict[str, Any] | None) -> str:
    if not limits:
        return "none"
    return ", ".join(f"{q} {_number(v)}" for q, v in limits.items())


def _describe(c: Change) -> str:
    t = c.target
    if c.action == "reset_budget":
        n = (c.old or {}).get("counters", "?")
        return f"{t.get('scope')}={t.get('key')}: {n} counter(s) removed"
    return (
        f"{t.get('scope')}={t.get('key')} ({t.get('window')}): "
        f"{_show_limits(c.old)} -> {_show_limits(c.new)}"
    )


def _show(
    config: Config,
    url: str,
    rows: list[dict[str, Any]],
    overrides: list[LimitOverride],
    as_json: bool,
) -> int:
    from loopwarden.store import QUANTITIES

    limits = _limits(config)
    over = {(o.scope, o.key, o.window): o for o in overrides}
    for r in rows:
        r["limits"] = dict(limits.get((r["scope"], r["window"]), {}))
        o = over.get((r["scope"], r["key"], r["window"]))
        r["overridden"] = sorted(limits_dict(o.limits) or {}) if o else []
        if o is not None:
            r["limits"].update(limits_dict(o.limits) or {})
    if as_json:
        out = {"store": url, "counters": rows, "overrides": [o.as_dict() for o in overrides]}
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(f"store: {url}")
    if "spend_limits" not in config.plugins.enabled:
        where = config.path or "the config"
        print(
            f"spend_limits is not enabled in {where}: nothing counts spend per scope. Add it "
            "to [plugins] enabled and set [plugins.spend_limits] budgets (docs/shared-budgets.md)."
        )
    if not rows:
        print("(no spend recorded)")
    else:
        head = ["scope", "key", "window", "bucket", *QUANTITIES]
        table = [head]
        for r in rows:
            cells = [cell(r[c]) for c in ("scope", "key", "window", "bucket")]
            for q in QUANTITIES:
                text = _number(r["spent"][q])
                if r["reserved"][q]:
                    text += f" +{_number(r['reserved'][q])} reserved"
                if q in r["limits"]:
                    mark = "*" if q in r["overridden"] else ""
                    text += f" / {_number(r['limits'][q])}{mark}"
                cells.append(text)
            table.append(cells)
        print_table(table)
        print("spent +reserved (calls in progress) / limit; * an operator's override")
    if overrides:
        print("overrides (loopwarden budgets clear SCOPE KEY to remove):")
        print_table(
            [["scope", "key", "window", "limits", "set", "by"]]
            + [
                [
                    cell(o.scope),
                    cell(o.key),
                    o.window,
                    _show_limits(limits_dict(o.limits)),
                    when(o.set_at),
                    cell(o.set_by),
                ]
                for o in overrides
            ]
        )
    return 0
