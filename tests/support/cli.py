"""``loopwarden`` run as a real subprocess, for tests that check its exit code and output."""

from __future__ import annotations

import subprocess
import sys


def loopwarden(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m loopwarden ARGV``; ``timeout`` only guards the test against a hang."""
    return subprocess.run(
        [sys.executable, "-m", "loopwarden", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
