"""Stand-in declarations for tools known only by name: recorded runs and framework tools.

A recording carries no tool declarations, and a framework adapter sees tools it does not
define.  A stand-in's nature is what is *declared* for it -- a ``[tools.<name>]`` table, or a
framework's own metadata -- and nothing else: a tool nobody declared runs every time it is
called, is never skipped as a repeat and never answered from the side-effect ledger.  Its name
may still weigh a loop detector's evidence: :func:`infer_flags` guesses a nature from it, and
a name that reads as a lookup or a probe marks the stand-in ``likely_read_only`` (its calls do
not count as changes of the world between two repeats).  :func:`recorded_tool` builds the
:class:`~loopwarden.tools.Tool` (:func:`loopwarden.traffic.replay.load_tool_flags` reads declared
natures from a TOML file).  Kept apart from the replay engine in :mod:`loopwarden.traffic.replay`
(which re-exports these names): it is about tool declarations, and the MCP client and the
framework adapters rely on it as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from loopwarden.tools import Tool

#: What a tool's name suggests about its nature -- a guess that only weighs detectors' evidence
#: (see the module docstring; declare a nature with ``[tools.<name>]`` to change execution).
#: Lookups of stored records read as read-only and deterministic; probes of live state -- a
#: device's status, a speed test, the clock -- as read-only but not deterministic; toggles and
#: restarts as repeatable actions; a hand-off to a human as terminal; anything else as a side
#: effect.
LOOKUP_PREFIXES = (
    "get_",
    "find_",
    "search_",
    "list_",
    "query_",
    "lookup_",
    "read_",
    "fetch_",
    "calculate",
    "think",
)
PROBE = re.compile(
    r"^(check_|can_|run_|test_|ping_|measure_)|(status|usage|time|now|speed)"
    r"(_|$)",
    re.IGNORECASE,
)
REPEATABLE_ACTION = re.compile(r"^(toggle_|reboot_|restart_|reseat_|reset_|retry_)", re.IGNORECASE)
TERMINAL_NAMES = re.compile(
    r"(^|_)(transfer_to_(human|agent|person|operator)|hand_?off_to_|escalate_to_(human|agent))",
    re.IGNORECASE,
)
#: waits: calling one again is how an agent lets time pass (a guess for detectors only)
WAIT_NAMES = re.compile(r"^(sleep|wait)(_|$)|(^|_)wait_(for|until)(_|$)", re.IGNORECASE)
FLAG_NAMES = ("read_only", "deterministic", "side_effect", "terminal")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def infer_flags(name: str) -> dict[str, bool]:
    """What a tool's name suggests about its nature (see :data:`LOOKUP_PREFIXES`): a guess,
    never a declaration -- :func:`recorded_tool` uses only its ``read_only``."""
    lname = name.lower()
    terminal = bool(TERMINAL_NAMES.search(lname))
    if terminal:
        return {"read_only": False, "deterministic": False, "side_effect": True, "terminal": True}
    if PROBE.search(lname):
        return {"read_only": True, "deterministic": False, "side_effect": False, "terminal": False}
    if lname.startswith(LOOKUP_PREFIXES):
        return {"read_only": True, "deterministic": True, "side_effect": False, "terminal": False}
    if REPEATABLE_ACTION.search(lname):
        return {"read_only": False, "deterministic": False, "side_effect": False, "terminal": False}
    return {"read_only": False, "deterministic": False, "side_effect": True, "terminal": False}


def repeatable_by_name(name: str) -> bool:
    """Whether ``name`` reads as a hand-off to a human or a wait: tools whose repeats are
    expected, not loop evidence (a guess that only weighs detectors' evidence)."""
    return bool(TERMINAL_NAMES.search(name) or WAIT_NAMES.search(name))


def recorded_tool(name: str, flags: Mapping[str, Any] | None = None) -> Tool:
    """A stand-in declaration for a tool seen in a recording (or run by a framework).

    Its nature is ``flags`` -- a ``[tools.<name>]`` table: the booleans of
    :data:`FLAG_NAMES`, ``retryable`` and ``idempotency_keys`` -- and nothing else: a flag left
    out is not asserted (``declared`` is False when no flag is given at all).  The name guess
    (:func:`infer_flags`) only sets ``likely_read_only``, for detectors, when the table says
    neither ``read_only`` nor ``side_effect``."""
    flags = flags or {}
    declared = {k: bool(v) for k, v in flags.items() if k in FLAG_NAMES and v is not None}
    # a declared nature is consistent: read-only means no side effect, and the reverse
    if declared.get("read_only") and "side_effect" not in declared:
        declared["side_effect"] = False
    if declared.get("side_effect") and "read_only" not in declared:
        declared["read_only"] = False
    keys = flags.get("idempotency_keys")
    guessed = "read_only" not in declared and not declared.get("side_effect")
    return Tool(
        name=name,
        func=lambda **kw: None,
        description=f"recorded tool {name}",
        args_model=_AnyArgs,
        read_only=declared.get("read_only", False),
        deterministic=declared.get("deterministic", False),
        side_effect=declared.get("side_effect", False),
        terminal=declared.get("terminal", False),
        retryable=(Exception,) if flags.get("retryable") else (),
        idempotency_keys=tuple(keys) if keys is not None else None,
        declared=bool(declared) or keys is not None,
        likely_read_only=guessed and infer_flags(name)["read_only"],
        likely_repeatable=not declared and repeatable_by_name(name),
    )
