"""A real headless Chromium for the console's browser tests, and the console as a subprocess.

The browser is Debian's ``chromium`` (``.ci/run`` installs it), driven by Playwright for
Python, which is told where it is (``executable_path``): Playwright's own browser downloads are
never used.  Without Chromium or Playwright the browser tests are skipped -- except in CI
(``CI=true``), where that is a failure: they must run there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: the flags a sandboxless CI container needs, and no traffic of Chromium's own
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip locally; fail in CI, where the browser tests must run."""
    if in_ci():
        pytest.fail(f"CI: {reason}; the browser tests must run in CI (.ci/run installs it)")
    pytest.skip(reason)


def chromium_path() -> str | None:
    """Debian's chromium (``LOOPWARDEN_CHROMIUM`` names another binary)."""
    named = os.environ.get("LOOPWARDEN_CHROMIUM")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextmanager
def launch_chromium() -> Iterator[Any]:
    """A headless Chromium browser (a Playwright ``Browser``), closed afterwards."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("Playwright for Python is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    if path is None:
        unavailable("no chromium on PATH or at LOOPWARDEN_CHROMIUM (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Console:
    """``loopwarden console`` running as a subprocess: its URL, its output, its end.

    Its output goes to a file (``log``), not a pipe nobody drains while the tests run.
    """

    def __init__(
        self, args: list[str], env: dict[str, str], log: Path, timeout: float = 30.0
    ) -> None:
        self.args = args
        self.log = log
        with log.open("w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loopwarden", "console", *args],
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        self.url = self._wait_for_url(timeout)

    def output(self) -> str:
        return self.log.read_text("utf-8", errors="replace")

    def _wait_for_url(self, timeout: float) -> str:
        """The ``console: http://...`` line it prints on start (the base URL, query cut)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if line.startswith("console: http"):
                    return line.split(" ", 1)[1].strip().split("?", 1)[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(
            f"loopwarden console {' '.join(self.args)} printed no URL:\n{self.output()}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
