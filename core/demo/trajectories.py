"""The demo's runs as recorded trajectories: what ``loopwarden demo --trajectories FILE`` writes.

The file has the trajectory format of docs/contracts.md -- the one ``loopwarden replay`` and
``loopwarden calibrate`` read -- so a fresh clone can try both on traffic the project makes
itself.  A run's steps come from its messages (content, tool calls, observations) and the usage
the model reported for each call, observed through the ``model_responded`` signal (observation
only: recording never changes a run).  Writing is deterministic: the same runs give the same
bytes, ``.gz`` included (no timestamp or file name in the gzip header).
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loopwarden import signals
from loopwarden.events import Usage
from loopwarden.exceptions import ConfigError
from loopwarden.run import Run

__all__ = ["UsageTape", "run_steps", "usage_tape", "write_trajectories"]

#: per run id, the usage of each model call in order (None where the model reported none)
UsageTape = dict[str, list["Usage | None"]]


@contextmanager
def usage_tape() -> Iterator[UsageTape]:
    """Record the usage of every model response while active, keyed by run id."""
    tape: UsageTape = {}

    def receiver(sender: Any, **extra: Any) -> None:
        response = extra.get("response")
        run_id = getattr(sender, "run_id", None)
        if run_id is not None:
            tape.setdefault(str(run_id), []).append(getattr(response, "usage", None))

    with signals.model_responded.connected_to(receiver):
        yield tape


def _arguments(raw: Any) -> Any:
    """A call's arguments as recorded: the JSON object when the text is one, else the text."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def run_steps(run: Run, usages: list[Usage | None]) -> list[dict[str, Any]]:
    """The trajectory steps of ``run``'s own model calls (in a conversation its messages open
    with the earlier runs': those are left out), each with the usage reported for it."""
    assistant = [i for i, m in enumerate(run.messages) if m.get("role") == "assistant"]
    own = assistant[len(assistant) - run.step :] if run.step else []
    steps: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for m in run.messages[own[0] :] if own else ():
        role = m.get("role")
        if role == "assistant":
            calls = m.get("tool_calls") or ()
            current = {
                "content": m.get("content"),
                "tool_calls": [
                    {
                        "name": tc["function"]["name"],
                        "arguments": _arguments(tc["function"]["arguments"]),
                    }
                    for tc in calls
                ],
                "observations": [],
            }
            k = len(steps)
            u = usages[k] if k < len(usages) else None
            current["usage"] = (
                None
                if u is None
                else {"prompt_tokens": u.prompt, "completion_tokens": u.completion}
            )
            steps.append(current)
        elif role == "tool" and current is not None:
            current["observations"].append(m.get("content"))
    return steps


def write_trajectories(path: str | Path, trajectories: Iterable[dict[str, Any]]) -> int:
    """Write one trajectory per line to ``path`` (gzip-compressed when its name ends
    ``.gz``), replacing the file only once every line is written; returns the count.

    A directory that does not exist or cannot be written is a :class:`ConfigError` naming
    the file (exit 2)."""
    p = Path(path)
    lines = [json.dumps(t, ensure_ascii=False) + "\n" for t in trajectories]
    data = "".join(lines).encode("utf-8")
    if p.name.lower().endswith(".gz"):
        data = gzip.compress(data, compresslevel=9, mtime=0)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the trajectory file: {exc.strerror or exc}",
            path=p,
            key="--trajectories",
        ) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(
            f"cannot write the trajectory file: {exc.strerror or exc}",
            path=p,
            key="--trajectories",
        ) from None
    return len(lines)
