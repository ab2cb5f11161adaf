"""``loopwarden budgets``: what each scope spent per window in the shared store.

``loopwarden budgets [--json]`` lists the live counters of the store (``[store] url``) with
the limits the config's ``spend_limits`` budgets set for them; ``loopwarden budgets reset
SCOPE KEY`` forgets every counter of one scope key (``budgets reset tenant acme``), e.g.
after raising a customer's allowance.
"""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal
from typing import Any

from loopwarden.commands import add_config_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=["show", "reset"],
        default="show",
        help="show (default) or reset SCOPE KEY",
    )
    parser.add_argument("scope", nargs="?", help="with reset: the scope (tenant, user, ...)")
    parser.add_argument("key", nargs="?", help="with reset: the scope's key (acme, u-17, ...)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_config_argument(parser)


def _limits(config: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(scope, window) -> the limits the config's spend_limits budgets set."""
    from loopwarden.plugins.spend_limits import SpendLimitsSettings, budget_reason
    from loopwarden.store import QUANTITIES

    table = config.plugins.tables().get("spend_limits")
    if table is None:
        return {}
    settings = SpendLimitsSettings.model_validate(table)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for b in settings.budgets:
        limits = out.setdefault((b.scope, b.window), {})
        for q in QUANTITIES:
            value = getattr(b, budget_reason(q))
            if value is not None:
                limits[q] = float(value) if isinstance(value, Decimal) else value
    return out


def main(args: argparse.Namespace) -> int:
    from loopwarden.config import load_config
    from loopwarden.sanitize import escape_controls
    from loopwarden.store import QUANTITIES, Shared, redact_url

    config = load_config(args.config)
    shared = Shared(config.store)
    try:
        store = shared.store
        if args.action == "reset":
            if not args.scope or not args.key:
                print(
                    "loopwarden budgets: reset needs SCOPE and KEY (budgets reset tenant acme)",
                    file=sys.stderr,
                )
                return 2
            n = store.reset(args.scope, args.key)
            if args.json:
                print(
                    json.dumps(
                        {
                            "store": redact_url(shared.url),
                            "scope": args.scope,
                            "key": args.key,
                            "counters_removed": n,
                        }
                    )
                )
            else:
                print(f"reset {args.scope}={args.key}: {n} counter(s) removed")
            return 0
        rows = [r.as_dict() for r in store.rows()]
    finally:
        shared.close()
    limits = _limits(config)
    for r in rows:
        r["limits"] = limits.get((r["scope"], r["window"]), {})
    if args.json:
        print(json.dumps({"store": redact_url(shared.url), "counters": rows}, ensure_ascii=False))
        return 0
    print(f"store: {redact_url(shared.url)}")
    if "spend_limits" not in config.plugins.enabled:
        where = config.path or "the config"
        print(
            f"spend_limits is not enabled in {where}: nothing counts spend per scope. Add it "
            "to [plugins] enabled and set [plugins.spend_limits] budgets (docs/shared-budgets.md)."
        )
    if not rows:
        print("(no spend recorded)")
        return 0
    head = ["scope", "key", "window", "bucket", *QUANTITIES]
    table = [head]
    for r in rows:
        # a scope key comes from a run's meta: shown on one line, escaped
        cells = [escape_controls(str(r[c])) for c in ("scope", "key", "window", "bucket")]
        for q in QUANTITIES:
            spent = r["spent"][q]
            text = f"{spent:.6f}".rstrip("0").rstrip(".") if q == "cost" else str(spent)
            if r["reserved"][q]:
                text += f" (+{r['reserved'][q]:g} reserved)"
            if q in r["limits"]:
                text += f" / {r['limits'][q]:g}"
            cells.append(text)
        table.append(cells)
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0
