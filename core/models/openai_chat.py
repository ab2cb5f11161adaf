"""An OpenAI-compatible chat-completions client on the ``openai`` package.

Works against any ``base_url`` that speaks chat completions (OpenAI, DashScope, DeepSeek,
vLLM, Ollama, ...).  The API key comes from the environment variable the config names
(``[model] api_key_env``).  ``usage`` is read from every response; a response without usage
is estimated with the project's estimator and marked so.  Failures after the retries
(timeouts, 429, 5xx, connection errors) raise :class:`~loopwarden.ModelError`.

Every call is bounded (see :mod:`loopwarden.models._bounded_http`):

* in time: ``timeout_s`` is the most the call may take *in all* -- connecting, every retry,
  every wait between retries (a server's ``Retry-After`` included) and reading a body that
  arrives one byte at a time -- and ``request.timeout`` (the run's time left) lowers it.  A
  wait that would not end before the deadline is not started: the call fails at once;
* in size: a body larger than ``max_response_bytes`` once decompressed fails the call;
* by the run's cancel token (``request.cancel``): cancelling the run ends the call in flight.

A sync call runs in a daemon thread that is abandoned at the deadline or on cancel (it ends by
itself soon after: its reads are bounded by the same deadline).  An async client is kept per
event loop, so one model serves ``asyncio.run(dep.arun(...))`` job after job.  Error texts are
redacted (the API key, bearer credentials) before they leave the client: a server that echoes
the ``Authorization`` header in an error body does not put the key into records or logs.

``openai`` is imported when the first client is built, never by ``import loopwarden``.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import random
import time
from typing import TYPE_CHECKING, Any

from loopwarden.events import ModelRequest, ModelResponse, ProposedCall, Usage
from loopwarden.exceptions import ConfigError, ModelError
from loopwarden.redaction import Redactor
from loopwarden.tokens import estimate_text

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken
    from loopwarden.config import ModelConfig
    from loopwarden.models._bounded_http import CallBounds

__all__ = ["OpenAIChatModel", "missing_key_message"]

_RETRY_STATUS = frozenset({408, 409, 429})
_BACKOFF_S, _MAX_BACKOFF_S = 0.5, 8.0


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
        max_response_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        import openai  # lazy: keeps `import loopwarden` fast

        from loopwarden.models import _bounded_http

        self._openai = openai
        self._http = _bounded_http
        self.name = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.extra_body = dict(extra_body or {})
        self._api_key, self._base_url = api_key, base_url
        self._timeout_s, self._max_retries = timeout_s, max_retries
        self.max_response_bytes = max_response_bytes
        #: masks the key (and any bearer credential) in every error text this client raises
        self.redactor = Redactor(literals=[api_key])
        # the client never retries by itself: retries are ours, inside the call's deadline
        self._client = openai.OpenAI(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout_s,
            max_retries=0,
            http_client=openai.DefaultHttpxClient(
                timeout=timeout_s, event_hooks=_bounded_http.event_hooks(max_response_bytes)
            ),
        )
        #: one async client per event loop (a client is bound to the loop it first ran on)
        self._aclients: dict[int, tuple[Any, Any]] = {}

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
            max_response_bytes=config.max_response_bytes,
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

    def _error(self, exc: Exception, note: str = "") -> ModelError:
        o = self._openai
        status = getattr(exc, "status_code", None)
        cause = exc.__cause__
        if isinstance(cause, self._http.ResponseTooLarge):
            return ModelError(str(cause), kind="too_large")
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
        text = f"{type(exc).__name__}: {exc}"
        if cause is not None and kind == "connection":
            text += f" ({type(cause).__name__}: {cause})"
        return ModelError(self.redactor.text(text[:4000] + note), status=status, kind=kind)

    def _too_late(self, exc: Exception, wait: float, bounds: CallBounds) -> ModelError:
        """The error to give up with when the wait before a retry would pass the deadline."""
        if isinstance(exc, self._openai.APITimeoutError):
            return self._deadline_error(bounds)
        return self._error(
            exc,
            f" (not retried: the retry would start after {wait:.3g}s, "
            f"past the call's {bounds.seconds:g}s)",
        )

    def _bounds(self, request: ModelRequest) -> CallBounds:
        seconds = self._timeout_s
        if request.timeout is not None:
            seconds = min(seconds, max(0.0, request.timeout))
        return self._http.CallBounds(time.monotonic() + seconds, self.max_response_bytes, seconds)

    def _deadline_error(self, bounds: CallBounds) -> ModelError:
        return ModelError(
            f"the model call did not finish within {bounds.seconds:g}s", kind="timeout"
        )

    def _retry_wait(self, exc: Exception, attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when ``exc`` is not retried."""
        o = self._openai
        if attempt >= self._max_retries or isinstance(exc.__cause__, self._http.ResponseTooLarge):
            return None
        if isinstance(exc, o.APIStatusError):
            if exc.status_code not in _RETRY_STATUS and exc.status_code < 500:
                return None
            after = _retry_after(exc.response.headers)
            if after is not None:
                return after
        elif not isinstance(exc, (o.APITimeoutError, o.APIConnectionError)):
            return None
        backoff: float = _BACKOFF_S * 2.0 ** min(attempt, 16)
        return min(backoff, _MAX_BACKOFF_S) * (1 - 0.25 * random.random())

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
            model=_text_or(getattr(completion, "model", None), self.name),
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        """One bounded call (see the module doc), in a daemon thread."""
        from loopwarden._deadline import call_within

        bounds = self._bounds(request)
        ending, value = call_within(
            self._call, request, bounds, timeout=bounds.left(), cancel=request.cancel, name="model"
        )
        if ending == "ok":
            return self._convert(value, request)
        if ending == "cancelled":
            raise ModelError("the run was cancelled during the model call", kind="cancelled")
        raise self._deadline_error(bounds)

    def _call(self, request: ModelRequest, bounds: CallBounds) -> Any:
        params = self._params(request)
        cancel = request.cancel
        attempt = 0
        while True:
            try:
                with self._http.bounded(bounds):
                    return self._client.chat.completions.create(**params, timeout=bounds.left())
            except self._openai.OpenAIError as exc:
                wait = self._retry_wait(exc, attempt)
                if wait is None:
                    raise self._error(exc) from None
                if wait >= bounds.left():
                    raise self._too_late(exc, wait, bounds) from None
            if _wait(wait, cancel):
                raise ModelError("the run was cancelled during the model call", kind="cancelled")
            attempt += 1

    def _async_client(self) -> Any:
        """The async client of the running event loop (created on its first call there)."""
        loop = asyncio.get_running_loop()
        held = self._aclients.get(id(loop))
        if held is not None and held[0] is loop:
            return held[1]
        for key, (other, _client) in list(self._aclients.items()):
            if other.is_closed():  # forget the clients of loops that are gone
                self._aclients.pop(key, None)
        client = self._openai.AsyncOpenAI(
            api_key=self._api_key,
            base_url=self._base_url,
            timeout=self._timeout_s,
            max_retries=0,
            http_client=self._openai.DefaultAsyncHttpxClient(
                timeout=self._timeout_s,
                event_hooks=self._http.async_event_hooks(self.max_response_bytes),
            ),
        )
        self._aclients[id(loop)] = (loop, client)
        return client

    async def acomplete(self, request: ModelRequest) -> ModelResponse:
        """One bounded call (see the module doc) on the running event loop."""
        from loopwarden._deadline import await_within

        bounds = self._bounds(request)
        client = self._async_client()
        ending, value = await await_within(
            self._acall(client, request, bounds), bounds.left(), request.cancel
        )
        if ending == "ok":
            return self._convert(value, request)
        if ending == "cancelled":
            raise ModelError("the run was cancelled during the model call", kind="cancelled")
        raise self._deadline_error(bounds)

    async def _acall(self, client: Any, request: ModelRequest, bounds: CallBounds) -> Any:
        params = self._params(request)
        attempt = 0
        while True:
            try:
                with self._http.bounded(bounds):
                    return await client.chat.completions.create(**params, timeout=bounds.left())
            except self._openai.OpenAIError as exc:
                wait = self._retry_wait(exc, attempt)
                if wait is None:
                    raise self._error(exc) from None
                if wait >= bounds.left():
                    raise self._too_late(exc, wait, bounds) from None
            await asyncio.sleep(wait)
            attempt += 1


def _text_or(value: Any, default: str) -> str:
    return value if isinstance(value, str) and value else default


def _wait(seconds: float, cancel: CancelToken | None) -> bool:
    """Sleep ``seconds``; True when ``cancel`` was set meanwhile."""
    if cancel is None:
        time.sleep(seconds)
        return False
    return cancel.wait(seconds)


def _retry_after(headers: Any) -> float | None:
    """The server's ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date), if valid."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            value = float(ms) / 1000
            return value if 0 <= value < float("inf") else None
        raw = headers.get("retry-after")
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            when = email.utils.parsedate_to_datetime(raw)
            value = when.timestamp() - time.time()
        return max(0.0, value) if value < float("inf") else None
    except (TypeError, ValueError, OverflowError):
        return None
