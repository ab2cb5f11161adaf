"""Models: anything with ``complete(request)`` (and optionally ``acomplete``).

Built in: :class:`~loopwarden.models.openai_chat.OpenAIChatModel` (any OpenAI-compatible
chat-completions endpoint, on the ``openai`` package, imported lazily) and
:class:`~loopwarden.models.scripted.ScriptedModel` (plays a scenario file, offline).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from loopwarden.events import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from loopwarden.config import ModelConfig

__all__ = ["AsyncModel", "Model", "model_from_config"]


@runtime_checkable
class Model(Protocol):
    """A chat model the loop can call."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request.  Raise :class:`~loopwarden.ModelError` for a failed call."""


@runtime_checkable
class AsyncModel(Protocol):
    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request asynchronously."""


def model_from_config(config: ModelConfig) -> Model:
    """The OpenAI-compatible client for ``[model]`` (the scripted model needs a scenario)."""
    from loopwarden.models.openai_chat import OpenAIChatModel

    return OpenAIChatModel.from_config(config)
