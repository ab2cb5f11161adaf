"""run_record: append every run's record (the fields of docs/contracts.md) to a JSONL file.

One JSON object per line, appended when the run stops.  Appends are whole lines: each record
is encoded first (as strict UTF-8 JSON, see :func:`encode_line`) and written with one
``write`` on a file opened with ``O_APPEND``, under a lock shared by the deployment's
concurrent runs and an ``flock`` shared with other processes -- so a crash mid-write can only
leave a partial *last* line, never damage an earlier record.  Before every append, under
those locks, the plugin checks that the file ends in a newline and starts a new line if not
(a writer killed mid-line); ``loopwarden report`` skips the fragment and counts it.  No file
descriptor is held between appends.  A record that cannot be written (a full disk, no
descriptors left, a path that is a directory, a FIFO or a device) is reported three ways: a
log line, the ``record-failed`` signal (``metrics`` counts it as
``record_write_failures_total``) and an entry in the run's ``errors``.

Always added: ``started_at`` and ``ended_at``, the run's start and the record's write as
wall-clock epoch seconds (floats) -- real times even when the run's clock is a FakeClock (the
demo's, a test's) -- so the console and ``report`` can place a run in time.

Optional additions (the contract's fields are never changed, only added to):

``trajectory = true``     the run as trajectory steps (``trajectory``: content, tool calls,
                          observations), in the trajectory-file format
``steps_detail = true``   per model call: ``steps_detail`` [{``step``, ``prompt``,
                          ``completion``, ``total``, ``context_tokens``, ``tool_calls``,
                          ``final``}] -- what ``loopwarden report --plot`` draws, with the
                          record's ``verdicts``

Secrets in tool arguments, observations and evidence are masked (``redact_keys``).  The file
defaults to ``runs.jsonl`` in loopwarden's data directory (``LOOPWARDEN_DATA_DIR``), never the
current directory; a relative ``path`` is taken relative to the current directory.  The file
holds conversations and tool results, so it is created owner-only (0600), and so is every
directory the plugin creates for it (0700); a file or directory that exists keeps its mode.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, PositiveInt

from loopwarden import Plugin, PluginSettings, signals
from loopwarden.exceptions import ConfigError
from loopwarden.paths import ensure_private_dir, open_private, records_path
from loopwarden.redaction import DEFAULT_REDACT_KEYS, Redactor, model_api_key
from loopwarden.sanitize import json_line, jsonable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: appends are serialised per process only
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from loopwarden.events import ModelRequest, ModelResponse
    from loopwarden.run import DeploymentView, Run

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
    fsync: bool = Field(default=False, description="fsync after every record (durable, slower)")


class JsonlAppender:
    """Appends whole JSON lines to one file, safely across threads and processes.

    No file descriptor is held between appends: each :meth:`append` opens the file, takes an
    exclusive ``flock`` (where the platform has one), starts a new line if the file does not
    end in one -- a writer killed mid-line left a fragment, which ``report`` then counts as
    corrupt instead of losing this record with it -- writes the record with one ``write``
    and closes the file.  Only regular files are written: a FIFO, a device or ``/dev/full`` is
    refused without blocking.  Never raises from :meth:`append`: a failure is logged (once
    until a write succeeds again), counted in ``failed`` and returned as its reason.
    """

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self.written = 0
        self.failed = 0
        #: the reason of the latest failure (None after a success)
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._reported = False

    def append(self, obj: Mapping[str, Any]) -> bool:
        """Encode ``obj`` as one line and append it; True when written (else the reason is in
        ``last_error``)."""
        try:
            data = encode_line(obj)
        except (TypeError, ValueError, RecursionError) as exc:
            return self._fail(f"cannot encode the record: {exc}")
        with self._lock:
            try:
                _append_line(self.path, data, self.fsync)
            except OSError as exc:
                return self._fail(exc.strerror or str(exc) if exc.errno else str(exc))
            self.written += 1
            self.last_error = None
            if self._reported:
                self._reported = False
                log.info("run_record: writing to %s again", self.path)
        return True

    def _fail(self, reason: str) -> bool:
        self.failed += 1
        self.last_error = reason
        if not self._reported:
            self._reported = True
            log.warning(
                "run_record: cannot append to %s: %s (further failures are not "
                "logged until a write succeeds)",
                self.path,
                reason,
            )
        return False

    def close(self) -> None:
        """Nothing to release (no descriptor is held between appends); kept for callers."""


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """One record as a line of strict JSON in UTF-8 (see :func:`loopwarden.sanitize.jsonable`:
    lone surrogates replaced, NaN and huge numbers as strings; no character that any line
    splitter could break the line at, nor a control a terminal would run:
    :func:`loopwarden.sanitize.json_line`)."""
    return (json_line(jsonable(obj), allow_nan=False) + "\n").encode("utf-8")


_OPEN_FLAGS = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def _append_line(path: Path, data: bytes, fsync: bool) -> None:
    ensure_private_dir(path.parent)  # 0700 where it creates one: records hold conversations
    fd = open_private(path, _OPEN_FLAGS)  # 0600; non-blocking: a FIFO never hangs the run
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file: {path}")
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or its process dies
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            log.warning(
                "run_record: %s ends with a truncated line (an interrupted write?); "
                "starting a new line",
                path,
            )
            data = b"\n" + data
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def check_writable(path: Path) -> str | None:
    """Why records could not be appended to ``path`` (None when they could); creates
    nothing.  For ``loopwarden config check``."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == path:
        if not path.is_file():
            return "not a regular file"
        if not os.access(path, os.W_OK):
            return "not writable"
        return None
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"cannot create files in {probe}"
    return None


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

    def connect(self, deployment: DeploymentView) -> None:
        if self.redactor is not None:
            self.redactor.add_literal(model_api_key(deployment))
        if self.settings.steps_detail:
            deployment.connect(signals.model_responded, self.on_model_responded)
        deployment.connect(signals.run_stopped, self.on_run_stopped)

    def close(self) -> None:
        self.appender.close()

    def check_config(self, *, path: str | None = None) -> None:
        """For ``loopwarden config check``: fail when records could not be written to the
        configured file (a missing parent that cannot be created, a file in the way, a FIFO
        or a device, no permission).  Creates nothing."""
        problem = check_writable(self.path)
        if problem is not None:
            raise ConfigError(
                f"records cannot be written to {self.path}: {problem}",
                path=path,
                key="plugins.run_record.path",
                expected="a writable regular file (or a directory to create it in)",
            )

    def on_model_responded(
        self, run: Run, *, request: ModelRequest, response: ModelResponse, **_: Any
    ) -> None:
        steps: list[dict[str, Any]] = self.state(run)
        if len(steps) >= self.settings.max_steps_detail:
            return
        usage = response.usage
        steps.append(
            {
                "step": run.step,
                "prompt": usage.prompt if usage is not None else None,
                "completion": usage.completion if usage is not None else None,
                "total": usage.total if usage is not None else None,
                "context_tokens": request.estimated_tokens,
                "tool_calls": len(response.tool_calls),
                "final": request.final,
            }
        )

    def build(self, run: Run, record: Mapping[str, Any]) -> dict[str, Any]:
        """The line to write: the record plus the configured additions, redacted."""
        out = dict(record)
        # wall-clock times, not the run's clock (a FakeClock in the demo and in tests)
        out.setdefault("started_at", round(run.wall_started_at, 6))
        out.setdefault("ended_at", round(time.time(), 6))
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
        try:
            line = self.build(run, record)
        except Exception as exc:  # a record that cannot even be built is still reported
            written = self.appender._fail(f"cannot build the record: {type(exc).__name__}: {exc}")
        else:
            written = self.appender.append(line)
        if not written:
            # Reported where the caller looks: the run's own record (``errors``), a log line
            # (the appender's) and the ``record-failed`` signal (counted by ``metrics``).
            error = f"record not written to {self.path}: {self.appender.last_error}"
            run.errors.append({"plugin": self.name, "hook": "run_stopped", "error": error})
            signals.send(signals.record_failed, run, path=str(self.path), error=error)
