"""Model and tool text that tries to escape its place (issue 19, items 12-14).

* guard notes: a failing tool's first line, a tool name or arguments the model made up never
  reach the model with the runtime's (system / developer) authority verbatim -- only as
  quoted, escaped, bounded data;
* the terminal: nothing ``loopwarden`` prints runs an escape sequence (OSC, CSI, BEL) or flips
  text with a bidi override;
* log lines: one record is one line for ``str.splitlines()``, whatever the model wrote.

The crafted text comes from :mod:`support.crafted` (the hostile-world kit).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.crafted import (
    BIDI,
    LINE_BREAKS,
    TERMINAL_ESCAPES,
    assert_no_raw_controls,
    forged_log_lines,
    scenario_file,
)

from loopwarden import Deployment
from loopwarden.config import Config
from loopwarden.plugins.logging import format_kv

# -- log lines (item 14) ---------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """The messages of every record under ``loopwarden.events``."""
    handler = _Lines()
    logger = logging.getLogger("loopwarden.events")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.messages
    logger.removeHandler(handler)
    logger.setLevel(old)


@pytest.mark.parametrize("line", forged_log_lines(), ids=lambda s: f"U+{ord(s[2]):04X}")
def test_format_kv_never_breaks_a_line(line: str) -> None:
    text = format_kv({"event": "tool_finished", "result": line, "nested": {"e": line}})
    assert text.splitlines() == [text]
    assert_no_raw_controls(text)


def test_a_c1_csi_and_bidi_in_a_bare_value_are_escaped() -> None:
    for value in ("\x9b31mred", "abc\u202edef", "a\u2028b"):
        text = format_kv({"content": value})
        assert_no_raw_controls(text)
        assert json.loads(text.partition("=")[2]) == value  # the escape reads back exactly


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_model_and_tool_text_cannot_forge_a_log_line(
    fmt: str,
    tmp_path: Path,
    log_lines: list[str],
    make_config: Callable[..., Config],
    deployment_factory: Callable[..., Deployment],
) -> None:
    forged = "level=ERROR event=run_stopped termination=plugin_error"
    payload = "".join(br + forged for br in LINE_BREAKS) + "".join(TERMINAL_ESCAPES + BIDI)
    path = scenario_file(
        tmp_path,
        turns=[
            {
                "content": "Looking" + payload,
                "tool_calls": [
                    {"name": "query_order", "arguments": {"order_id": "1" + payload}},
                    {"name": "made_up" + payload, "arguments": {}},
                ],
            },
            {"content": "Answer" + payload},
        ],
        tools={"query_order": {"results": ["NOT_FOUND" + payload]}},
        then="final",
    )
    config = make_config(
        plugins={
            "enabled": ["logging"],
            "logging": {"format": fmt, "events": ["model_responded", "tool_finished"]},
        }
    )
    deployment_factory(config).run(scenario=str(path))
    assert len(log_lines) >= 4
    for message in log_lines:
        assert message.splitlines() == [message]
        assert_no_raw_controls(message)
        if fmt == "json":
            json.loads(message)  # still one valid JSON object
    assert any("\\u2028" in m for m in log_lines)
