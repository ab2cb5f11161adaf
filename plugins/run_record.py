"""run_record: append every run's record (DESIGN's fields) to a JSONL file.

One JSON object per line, appended when the run stops.  Appends are whole lines: each record
is encoded first and written with one ``write`` on a file opened with ``O_APPEND``, under a
lock shared by the deployment's concurrent runs -- so a crash mid-write can only leave a
partial *last* line, never damage an earlier record.  When the file is opened and its last
line has no newline (such a crash), the plugin starts on a new line; ``loopwarden report``
skips the partial line and says so.

Optional additions (DESIGN's fields are never changed, only added to):

``trajectory = true``     the run as trajectory steps (``trajectory``: content, tool calls,
                          observations), in the trajectory-file format
``steps_detail = true``   per model call: ``steps_detail`` [{``step``, ``prompt``,
                          ``completion``, ``total``, ``context_tokens``, ``tool_calls``,
                          ``final``}] -- what ``loopwarden report --plot`` draws, with the
                          record's ``verdicts``

Secrets in tool arguments, observations and evidence are masked (``redact_keys``).  The file
defaults to ``runs.jsonl`` in loopwarden's data directory (``LOOPWARDEN_DATA_DIR``), never the
current directory; a relative ``path`` is taken relative to the current directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PositiveInt

from loopwarden import Plugin, PluginSettings, signals
from loopwarden.paths import records_path
from loopwarden.redaction import DEFAULT_REDACT_KEYS, Redactor, model_api_key

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.events import ModelRequest, ModelResponse
    from loopwarden.run import Run

__all__ = ["JsonlAppender", "RunRecord", "RunRecordSettings", "default_records_path"]

log = logging.getLogger("loopwarden.plugins.run_record")


def default_records_path() -> Path:
    """``runs.jsonl`` in loopwarden's data directory (``LOOPWARDEN_DATA_DIR`` overrides it)."""
    return records_path()


class RunRecordSettings(PluginSettings):
    path: str | None = Field(
        default=None,
        description="the JSONL file records are appended to (default: runs.jsonl in the data "
        "directory, LOOPWARDEN_DATA_DIR)",
    )
    trajectory: bool = Field(default=False, description="add the run's full trajectory")
    steps_detail: bool = Field(
        default=False,
        description="add per-step tokens (steps_detail), for `loopwarden report --plot`",
    )
    max_steps_detail: PositiveInt = Field(
        default=1000, description="per-step entries kept per run (the first ones)"
    )
    redact: bool = Field(default=True, description="mask secrets (redact_keys) in the record")
    redact_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_KEYS),
        description="field names whose values are masked at any depth",
    )
    fsync: bool = Field(
        default=False, description="fsync after every record (durable, slower)"
    )


class JsonlAppender:
    """Appends whole JSON lines to one file, safely across threads (see the module docstring).

    Never raises from :meth:`append`: a failure is logged once and reported as False.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.written = 0
        self.failed = 0
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._reported = False

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size > 0:
                with self.path.open("rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    last = fh.read(1)
                if last != b"\n":
                    log.warning("run_record: %s ends with a truncated line (an interrupted "
                                "write?); starting a new line", self.path)
                    _write_all(fd, b"\n")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def append(self, obj: Mapping[str, Any]) -> bool:
        """Encode ``obj`` as one line and append it with one write; True when written."""
        try:
            data = (json.dumps(obj, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        except (TypeError, ValueError) as exc:
            self._fail(exc)
            return False
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = self._open()
                _write_all(self._fd, data)
                if self.fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                self._close_fd()
                self._fail(exc)
                return False
            self.written += 1
            if self._reported:
                self._reported = False
                log.info("run_record: writing to %s again", self.path)
        return True

    def _fail(self, exc: BaseException) -> None:
        self.failed += 1
        if not self._reported:
            self._reported = True
            log.warning("run_record: cannot append to %s: %s (further failures are not "
                        "logged until a write succeeds)", self.path, exc)

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._close_fd()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class RunRecord(Plugin[RunRecordSettings]):
    """Appends each finished run's record to a JSONL file (optionally with its trajectory
    and per-step tokens)."""

    name = "run_record"
    Settings = RunRecordSettings

    def __init__(self, settings: RunRecordSettings | None = None) -> None:
        super().__init__(settings)
        s = self.settings
        self.path = Path(s.path).expanduser() if s.path else default_records_path()
        self.appender = JsonlAppender(self.path, fsync=s.fsync)
        self.redactor = Redactor(s.redact_keys) if s.redact else None

    def new_state(self) -> list[dict[str, Any]]:
        return []  # the per-step entries of steps_detail

    def connect(self, deployment: Deployment) -> None:
        if self.redactor is not None:
            self.redactor.add_literal(model_api_key(deployment))
        if self.settings.steps_detail:
            deployment.connect(signals.model_responded, self.on_model_responded)
        deployment.connect(signals.run_stopped, self.on_run_stopped)

    def close(self) -> None:
        self.appender.close()

    def on_model_responded(self, run: Run, *, request: ModelRequest, response: ModelResponse,
                           **_: Any) -> None:
        steps: list[dict[str, Any]] = self.state(run)
        if len(steps) >= self.settings.max_steps_detail:
            return
        usage = response.usage
        steps.append({
            "step": run.step,
            "prompt": usage.prompt if usage is not None else None,
            "completion": usage.completion if usage is not None else None,
            "total": usage.total if usage is not None else None,
            "context_tokens": request.estimated_tokens,
            "tool_calls": len(response.tool_calls),
            "final": request.final,
        })

    def build(self, run: Run, record: Mapping[str, Any]) -> dict[str, Any]:
        """The line to write: the record plus the configured additions, redacted."""
        out = dict(record)
        if self.settings.steps_detail:
            out["steps_detail"] = list(self.state(run))
        if self.settings.trajectory:
            out["trajectory"] = run.trajectory()
        if self.redactor is not None:
            red = self.redactor
            for step in out.get("trajectory") or ():
                for call in step["tool_calls"]:  # raw JSON text: parse so nested keys are found
                    args = call.get("arguments")
                    if isinstance(args, str):
                        call["arguments"] = red.json_text(args)
            out = red(out)
        return out

    def on_run_stopped(self, run: Run, *, record: Mapping[str, Any], **_: Any) -> None:
        self.appender.append(self.build(run, record))
