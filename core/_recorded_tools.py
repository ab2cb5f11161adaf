"""Stand-in declarations for tools known only by name: recorded runs and framework tools.

A recording carries no tool declarations, and a framework adapter sees tools it does not
define, yet the guards need each tool's nature (read-only, deterministic, side effect,
terminal).  :func:`infer_flags` guesses it from the name, :func:`recorded_tool` builds a
:class:`~loopwarden.tools.Tool` from declared flags and the guess, and :func:`load_tool_flags`
reads declared natures from a TOML file.  Kept apart from the replay engine in
:mod:`loopwarden.replay` (which re-exports these names): it is about tool declarations, not
driving runs, and the framework adapters rely on it as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from loopwarden.exceptions import ConfigError
from loopwarden.tools import Tool

#: Tool natures inferred from names when a recording does not declare them (override them
#: with ``flags``).  Lookups of stored records are read-only and deterministic (while nothing
#: writes to them); probes of live state -- a device's status, a speed test, the clock -- are
#: read-only but not deterministic (their answer may change between two identical calls);
#: toggles and restarts change the world but are legitimately repeated (on, then off), so they
#: are not idempotent side effects; every other tool is taken as a side effect, idempotent per
#: full arguments; a hand-off to a human is terminal.
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
TERMINAL_NAMES = re.compile(r"(^|_)transfer_to_human", re.IGNORECASE)
FLAG_NAMES = ("read_only", "deterministic", "side_effect", "terminal")


class _AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")


def infer_flags(name: str) -> dict[str, bool]:
    """A recorded tool's nature guessed from its name (see :data:`LOOKUP_PREFIXES`)."""
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


def recorded_tool(name: str, flags: Mapping[str, Any] | None = None) -> Tool:
    """A stand-in declaration for a tool seen in a recording (or run by a framework): its
    nature from ``flags`` -- a ``[tools.<name>]`` table: the booleans of :data:`FLAG_NAMES`,
    ``retryable`` and ``idempotency_keys`` -- the rest inferred from its name
    (:func:`infer_flags`)."""
    nature = infer_flags(name)
    flags = flags or {}
    declared = {k: bool(v) for k, v in flags.items() if k in FLAG_NAMES and v is not None}
    # a declared nature is consistent: read-only means no side effect, and the reverse
    if declared.get("read_only") and "side_effect" not in declared:
        declared["side_effect"] = False
    if declared.get("side_effect") and "read_only" not in declared:
        declared["read_only"] = False
    nature.update(declared)
    keys = flags.get("idempotency_keys")
    return Tool(
        name=name,
        func=lambda **kw: None,
        description=f"recorded tool {name}",
        args_model=_AnyArgs,
        read_only=nature["read_only"],
        deterministic=nature["deterministic"],
        side_effect=nature["side_effect"],
        terminal=nature["terminal"],
        retryable=(Exception,) if flags.get("retryable") else (),
        idempotency_keys=tuple(keys) if keys is not None else None,
    )


def load_tool_flags(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read declared tool natures from a TOML file: its ``[tools.NAME]`` tables, the shape of
    ``config.toml``'s (:class:`loopwarden.config.ToolNature`), so a deployment's config file
    serves as well; other tables are ignored."""
    from pydantic import ValidationError

    from loopwarden.config import ToolNature, load_toml, validation_error

    p = Path(path)
    data = load_toml(p)
    tools = data.get("tools")
    if not isinstance(tools, dict):
        raise ConfigError("needs [tools.NAME] tables", path=p, key="tools")
    out: dict[str, dict[str, Any]] = {}
    for name, table in tools.items():
        if not isinstance(table, dict):
            raise ConfigError("must be a table", path=p, key=f"tools.{name}")
        try:
            nature = ToolNature.model_validate(table)
        except ValidationError as exc:
            raise validation_error(exc, path=str(p), prefix=f"tools.{name}") from None
        out[str(name)] = nature.model_dump(exclude_none=True)
    return out
