"""The path one tool call takes through the package's modules: hops, reversals, sideways hops.

Deterministic (a trace, not a timing).  The workload is ``overhead.py``'s: the shipped
config.toml with its limits raised, the trivial cooperative tool, the instant model, a sync
run of three tool-call steps.  One tool call is the second step: everything between the second
and the third model call -- the response checked and parsed, ``after_response``, ``before_tool``,
the tool executed, ``after_tool``, ``step_finished``, the next request and ``before_model``.

``sys.setprofile`` sees every Python call and return.  A **hop** is a call from a function of
one ``loopwarden`` module into a function of another (the caller is the nearest ``loopwarden``
frame on the stack; code outside the package is transparent); resuming a generator counts as a
call.  A **reversal** is a hop into a module already on the path; a **sideways** hop goes from
one module of ``loopwarden.engine`` to another.  ``--walk`` counts returns too (the module that
runs after each call and return, repeats merged), which shows back-and-forth.  Plugins are
transparent unless ``--plugins``: what the engine does, not what the defence lines do.

    python bench/hops.py [--walk] [--plugins] [--path] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as W

from loopwarden import Deployment
from loopwarden.config import default_config_path, load_toml, parse_config
from loopwarden.tools import ToolRegistry, tool

ENGINE = "loopwarden.engine."
PLUGINS = "loopwarden.plugins"


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _nearest(frame: FrameType | None) -> str | None:
    while frame is not None:
        name = _module(frame)
        if name.startswith("loopwarden"):
            return name
        frame = frame.f_back
    return None


def trace(steps: int = 3) -> tuple[list[tuple[str, str]], list[str]]:
    """The hops (caller module, callee module) and the walk of the second step's tool call."""
    data = W.bench_config_data(load_toml(default_config_path()))
    tools = ToolRegistry([tool(read_only=True, deterministic=True, name="lookup")(W.lookup_ctx)])
    dep = Deployment(parse_config(data, path=str(default_config_path())), tools=tools)
    hops: list[tuple[int, str, str]] = []
    walk: list[str] = []
    marks: list[int] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" and event != "return":
            return
        if event == "call":
            if frame.f_code.co_name == "complete" and _module(frame) == W.__name__:
                marks.append(len(walk))
            name = _module(frame)
            if name.startswith("loopwarden"):
                caller = _nearest(frame.f_back)
                if caller is not None and caller != name:
                    hops.append((len(walk), caller, name))
        now = _nearest(frame if event == "call" else frame.f_back)
        if now is not None and (not walk or walk[-1] != now):
            walk.append(now)

    try:
        dep.run(W.USER, model=W.WorkloadModel(steps))  # warm: imports, caches
        model = W.WorkloadModel(steps)
        sys.setprofile(profile)
        try:
            dep.run(W.USER, model=model)
        finally:
            sys.setprofile(None)
    finally:
        dep.close()
    first, last = marks[1], marks[2]
    return [(a, b) for i, a, b in hops if first <= i <= last], walk[first : last + 1]


def count(path: list[str]) -> dict[str, int]:
    """Hops, modules, reversals and sideways hops of a walk (a list of modules)."""
    seen: set[str] = set()
    reversals = sideways = 0
    for i, name in enumerate(path):
        if i and name in seen:
            reversals += 1
        if i and name.startswith(ENGINE) and path[i - 1].startswith(ENGINE):
            sideways += 1
        seen.add(name)
    return {
        "hops": max(len(path) - 1, 0),
        "modules": len(seen),
        "reversals": reversals,
        "sideways": sideways,
    }


def count_hops(hops: list[tuple[str, str]]) -> dict[str, int]:
    """Hops, modules, reversals and sideways hops of a list of calls between modules."""
    seen: set[str] = set()
    reversals = 0
    for caller, callee in hops:
        seen.add(caller)
        if callee in seen:
            reversals += 1
        seen.add(callee)
    sideways = sum(1 for a, b in hops if a.startswith(ENGINE) and b.startswith(ENGINE))
    return {"hops": len(hops), "modules": len(seen), "reversals": reversals, "sideways": sideways}


def _merged(path: list[str]) -> list[str]:
    return [m for i, m in enumerate(path) if i == 0 or path[i - 1] != m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--walk", action="store_true", help="count returns too")
    ap.add_argument("--plugins", action="store_true", help="count the plugins' modules too")
    ap.add_argument("--path", action="store_true", help="print the path")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    hops, walk = trace()
    if not args.plugins:
        hops = [(a, b) for a, b in hops if not a.startswith(PLUGINS) and not b.startswith(PLUGINS)]
        walk = _merged([m for m in walk if not m.startswith(PLUGINS)])
    figures = count(walk) if args.walk else count_hops(hops)
    short = len("loopwarden.")
    if args.path:
        if args.walk:
            print(" -> ".join(m[short:] for m in walk))
        else:
            print("\n".join(f"{a[short:]} -> {b[short:]}" for a, b in hops))
    if args.json:
        print(json.dumps(figures))
    else:
        print(", ".join(f"{v} {k}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
