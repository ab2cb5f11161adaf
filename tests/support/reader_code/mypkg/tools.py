"""Tools of the reader's own (`--tools mypkg.tools:registry`): the demo shop's, as a stand-in."""

from __future__ import annotations

from loopwarden.demo import shop_tools

registry = shop_tools()
