"""The README's ten-line plugin, where the docs enable it as the reader's own module."""

from __future__ import annotations

from typing import Any

from loopwarden import Plugin, hookimpl


class NoRefunds(Plugin):
    name = "no_refunds"

    @hookimpl
    def before_tool(self, run: Any, call: Any) -> Any:
        if call.name == "apply_refund":
            return self.stop(
                "forbidden_tool",
                tool=call.name,
                answer="I can't issue refunds here; nothing was refunded.",
            )
        return None
