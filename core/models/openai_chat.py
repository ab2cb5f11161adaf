"""An OpenAI-compatible chat-completions client on the ``openai`` package.

Works against any ``base_url`` that speaks chat completions (OpenAI, DashScope, DeepSeek,
vLLM, Ollama, ...).  The API key comes from the environment variable the config names
(``[model] api_key_env``).  ``usage`` is read from every response; a response without usage
is estimated with the project's estimator and marked so.  Failures after the client's own
retries (timeouts, 429, 5xx, connection errors) raise :class:`~loopwarden.ModelError`.

``openai`` is imported when the first client is built, never by ``import loopwarden``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.exceptions import ConfigError, ModelError
from loopwarden.tokens import estimate_text

if TYPE_CHECKING:
    from loopwarden.config import ModelConfig

__all__ = ["OpenAIChatModel", "missing_key_message"]


def missing_key_message(env: str) -> str:
    return (
        f"No API key: set the environment variable {env} (or point [model] api_key_env in "
        "config.toml at the variable that holds it), and [model] base_url for a non-OpenAI "
        "endpoint such as DashScope, DeepSeek, vLLM or Ollama. To see loopwarden work offline "
        "without any key, play a scenario with the scripted model: `loopwarden run --scenario "
        "refund` (or any name from `loopwarden scenarios`), or run `loopwarden demo`."
    )


class OpenAIChatModel:
    """Calls ``chat.completions.create``; one instance may serve many runs."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str,
        base_url: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        import openai  # lazy: keeps `import loopwarden` fast

        self._openai = openai
        self.name = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.extra_body = dict(extra_body or {})
        self._client = openai.OpenAI(
            api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=max_retries
        )
        self._api_key, self._base_url = api_key, base_url
        self._timeout_s, self._max_retries = timeout_s, max_retries
        self._aclient: Any = None

    @classmethod
    def from_config(cls, config: ModelConfig) -> OpenAIChatModel:
        key = os.environ.get(config.api_key_env, "").strip()
        if not key:
            raise ConfigError(missing_key_message(config.api_key_env), key="model.api_key_env")
        return cls(
            model=config.name,
            api_key=key,
            base_url=config.base_url,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            temperature=config.temperature,
            max_output_tokens=config.max_output_tokens,
            extra_body=config.extra_body,
        )

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.name, "messages": request.messages}
        if request.tools:
            params["tools"] = request.tools
            params["tool_choice"] = request.tool_choice
        if self.temperature is not None:
            params["temperature"] = self.temperature
        max_out = request.max_output_tokens or self.max_output_tokens
        if max_out is not None:
            params["max_tokens"] = max_out
        if self.extra_body:
            params["extra_body"] = self.extra_body
        return params

    def _error(self, exc: Exception) -> ModelError:
        o = self._openai
        status = getattr(exc, "status_code", None)
        if isinstance(exc, o.APITimeoutError):
            kind = "timeout"
        elif isinstance(exc, o.RateLimitError):
            kind = "rate_limited"
        elif isinstance(exc, o.APIConnectionError):
            kind = "connection"
        elif isinstance(exc, o.APIStatusError):
            kind = "server_error" if (status or 0) >= 500 else "client_error"
        else:
            kind = "error"
        return ModelError(f"{type(exc).__name__}: {exc}", status=status, kind=kind)

    def _convert(self, completion: Any, request: ModelRequest) -> ModelResponse:
        if not getattr(completion, "choices", None):
            raise ModelError("the response has no choices", kind="malformed")
        choice = completion.choices[0]
        msg = choice.message
        calls = []
        for tc in getattr(msg, "tool_calls", None) or ():
            fn = getattr(tc, "function", None)
            if fn is None:
                continue
            calls.append(
                ProposedCall(
                    name=str(getattr(fn, "name", "") or ""),
                    arguments=str(getattr(fn, "arguments", "") or ""),
                    # no id from the server: the loop assigns one unique in the run
                    id=str(getattr(tc, "id", "") or ""),
                )
            )
        u = getattr(completion, "usage", None)
        if u is not None:
            details = getattr(u, "prompt_tokens_details", None)
            cached = int(getattr(details, "cached_tokens", 0) or 0) if details else 0
            usage = Usage(
                prompt=int(u.prompt_tokens or 0),
                completion=int(u.completion_tokens or 0),
                cached=cached,
            )
        else:  # some compatible servers omit usage: estimate rather than count zero
            usage = Usage(
                prompt=request.estimated_tokens,
                completion=estimate_text(msg.content or "")
                + sum(estimate_text(c.arguments) for c in calls),
            )
        return ModelResponse(
            content=msg.content,
            tool_calls=calls,
            usage=usage,
            finish_reason=choice.finish_reason,
            model=getattr(completion, "model", None) or self.name,
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        try:
            completion = self._client.chat.completions.create(**self._params(request))
        except self._openai.OpenAIError as exc:
            raise self._error(exc) from exc
        return self._convert(completion, request)

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        if self._aclient is None:
            self._aclient = self._openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self._base_url, timeout=self._timeout_s,
                max_retries=self._max_retries,
            )
        try:
            completion = await self._aclient.chat.completions.create(**self._params(request))
        except self._openai.OpenAIError as exc:
            raise self._error(exc) from exc
        return self._convert(completion, request)
