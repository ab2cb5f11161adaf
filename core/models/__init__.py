"""Models: anything with ``complete(request)`` (and optionally ``acomplete``).

Built in: :class:`~loopwarden.models.openai_chat.OpenAIChatModel` (any OpenAI-compatible
chat-completions endpoint, on the ``openai`` package, imported lazily) and
:class:`~loopwarden.models.scripted.ScriptedModel` (plays a scenario file, offline).

May import: the lowest layer only (events, exceptions, redaction, clock) -- never the
config at run time (type-only), the run, the store, the tools, the engine or a plugin; the
config (for context windows), the run (for token estimates), the engine, the deployment and
the budget plugins import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from loopwarden.events import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from loopwarden.config import ModelConfig

__all__ = ["AsyncModel", "Model", "endpoint", "model_from_config", "output_limit"]


@runtime_checkable
class Model(Protocol):
    """A chat model the loop can call."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request.  Raise :class:`~loopwarden.ModelError` for a failed call."""


@runtime_checkable
class AsyncModel(Protocol):
    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """Answer one request asynchronously."""


def output_limit(model: object) -> int | None:
    """The most output tokens each call of ``model`` asks for: its ``max_output_tokens``
    (the built-in client's, from ``[model] max_output_tokens``), None when it sets none.

    The loop puts it on every :class:`~loopwarden.events.ModelRequest`, so that the budget
    plugins reserve what the model may really answer with -- not a guess below the cap the
    client sends (a plugin may lower it in ``before_model``; the client sends the request's).
    """
    value = getattr(model, "max_output_tokens", None)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def endpoint(model: object) -> str | None:
    """The URL ``model`` calls: its ``base_url`` (the built-in client's, an ``openai``
    client's), None for a model that names none (the scripted model, a framework's stand-in).
    Runs carry it (:attr:`loopwarden.run.Run.model_url`) for telemetry's ``server.*``."""
    url = getattr(model, "base_url", None)
    text = str(url) if url is not None else ""
    return text if text.startswith(("http://", "https://")) else None


def model_from_config(config: ModelConfig) -> Model:
    """The OpenAI-compatible client for ``[model]`` (the scripted model needs a scenario)."""
    from loopwarden.models.openai_chat import OpenAIChatModel

    return OpenAIChatModel.from_config(config)
