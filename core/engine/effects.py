"""The step machine's effects: what it asks its driver to do, and what it gets back.

The machine (:meth:`loopwarden.engine.loop.Engine.machine`) never calls a model or a tool itself: it
yields a :class:`CallModel` or a :class:`RunTool` and is sent the outcome (a ``ModelResponse``
or a ``ToolResult``, or :class:`Failed`).  Kept apart so that the drivers -- sync, async,
replay, the framework adapters -- and the machine share them without importing each other.
Public through :mod:`loopwarden.engine.loop`.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loopwarden.events import ModelRequest, ToolCall
from loopwarden.run import RunOutcome
from loopwarden.tools import ToolContext

if TYPE_CHECKING:
    from loopwarden.tools import Tool

__all__ = ["CallModel", "Effect", "Failed", "Machine", "NotStarted", "RunTool"]


@dataclass(slots=True)
class CallModel:
    """Effect: call the model with ``request``; send back a ModelResponse or Failed."""

    request: ModelRequest


@dataclass(slots=True)
class RunTool:
    """Effect: execute ``call`` with validated ``arguments``; send back a ToolResult."""

    call: ToolCall
    tool: Tool
    arguments: dict[str, Any]
    ctx: ToolContext


@dataclass(slots=True)
class Failed:
    """The effect raised ``error``."""

    error: BaseException


class NotStarted(Exception):
    """Thrown into the machine at a :class:`RunTool` its driver abandons without starting it
    (the run was cancelled while the step that yielded it ran): the tool turn releases the
    call's ledger claim -- the side effect was never made -- and lets it end the machine."""


Effect = CallModel | RunTool
#: the machine: yields effects, is sent their outcomes, returns the run's outcome
Machine = Generator[Effect, Any, RunOutcome]
