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
itself soon after: its reads are bounded by the same deadline).  An async call runs in the
caller's own task, which a timer (or the cancel token) cancels -- the client honours
cancellation by closing its connection -- so it costs no task and no event-loop pass per call
(:func:`loopwarden.clock.await_in_task`).  An async client is kept per event loop, so one model
serves ``asyncio.run(dep.arun(...))`` job after job.  Error texts are
redacted (the API key, bearer credentials) before they leave the client: a server that echoes
the ``Authorization`` header in an error body does not put the key into records or logs.

**Streaming** (:meth:`OpenAIChatModel.stream`, :meth:`~OpenAIChatModel.astream`; used by
``Deployment.stream()``): the same request with ``stream=True`` and
``stream_options={"include_usage": true}``; text deltas are yielded as they arrive, tool-call
deltas are assembled, and the stream ends with the same :class:`~loopwarden.ModelResponse` the
unstreamed call returns.  The same bounds hold (the deadline is checked on every chunk read;
retries only before the first byte).  A stream that misbehaves fails the call as a malformed
unstreamed answer does (:class:`~loopwarden.ModelError`, the run ends ``model_error``): a
chunk that is not JSON or has the wrong shape (``malformed``), a connection that breaks
mid-stream (``connection``), a stream that ends without a finish reason (``malformed``), one
that stalls past the deadline (``timeout``); a stream without usage is estimated, as an
unstreamed answer without usage is.  A server that ignores ``stream`` and answers with one
JSON completion is read as one delta.  Closing the stream early (a guard cut it) closes the
connection: the rest of the answer is not read, nor paid for by a provider that stops
generating when the client leaves.

``openai`` is imported when the first client is built, never by ``import loopwarden``.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from loopwarden.clock import await_in_task
from loopwarden.events import ModelRequest, ModelResponse, ProposedCall
from loopwarden.exceptions import ConfigError, ModelError
from loopwarden.models._chunks import _Assembly, _close, _text_or, _usage, _whole_answer
from loopwarden.redaction import Redactor

if TYPE_CHECKING:
    from loopwarden.clock import CancelToken
    from loopwarden.config import ModelConfig
    from loopwarden.models._bounded_http import CallBounds

__all__ = ["OpenAIChatModel", "missing_key_message"]

_RETRY_STATUS = frozenset({408, 409, 429})
#: what a streamed request adds: the usage comes in a last chunk
_STREAM: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True}}
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

    #: its async calls and streams end when their task is cancelled (the connection is
    #: closed): a streamed run bounds each delta in its own task instead of a task per delta
    ends_when_cancelled: ClassVar[bool] = True

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

    @property
    def base_url(self) -> str:
        """The endpoint this client calls: ``[model] base_url``, else the ``openai`` package's
        (``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``).  Runs carry it
        (``Run.model_url``): telemetry's ``server.address`` / ``server.port``."""
        return str(self._client.base_url)

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
        """The arguments of ``chat.completions.create``.

        The history and the tool specs go in ``extra_body``, which the SDK sends as it is:
        ``create`` walks its typed params recursively to transform them -- an identity for
        chat params (no aliases, no formats), but it cost about as much CPU as the rest of the
        call for a history of a few turns, and it grows with the history.  ``messages`` itself
        stays an (empty) argument, as ``create`` requires; the body's ``messages`` replaces it.
        The configured ``extra_body`` is merged last, so its keys win as before."""
        body: dict[str, Any] = {"messages": request.messages}
        params: dict[str, Any] = {"model": self.name, "messages": ()}
        if request.tools:
            body["tools"] = request.tools
            params["tool_choice"] = request.tool_choice
        if self.temperature is not None:
            params["temperature"] = self.temperature
        max_out = request.max_output_tokens or self.max_output_tokens
        if max_out is not None:
            params["max_tokens"] = max_out
        params["extra_body"] = {**body, **self.extra_body} if self.extra_body else body
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

    def _ended(self, ending: str, value: Any, bounds: CallBounds) -> Any:
        """The call's value when it ended ``ok``; else the error of its cancellation or its
        deadline, raised."""
        if ending == "ok":
            return value
        if ending == "cancelled":
            raise ModelError("the run was cancelled during the model call", kind="cancelled")
        raise self._deadline_error(bounds)

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
        return ModelResponse(
            content=msg.content,
            tool_calls=calls,
            usage=_usage(getattr(completion, "usage", None), request, msg.content, calls),
            finish_reason=choice.finish_reason,
            model=_text_or(getattr(completion, "model", None), self.name),
            id=_text_or(getattr(completion, "id", None), None),
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        """One bounded call (see the module doc), in a daemon thread."""
        from loopwarden.clock import call_within

        bounds = self._bounds(request)
        ending, value = call_within(
            self._call, request, bounds, timeout=bounds.left(), cancel=request.cancel, name="model"
        )
        return self._convert(self._ended(ending, value, bounds), request)

    def _call(self, request: ModelRequest, bounds: CallBounds, stream: bool = False) -> Any:
        params = self._params(request)
        if stream:
            params.update(_STREAM)
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
        bounds = self._bounds(request)
        client = self._async_client()
        ending, value = await await_in_task(
            self._acall(client, request, bounds), bounds.left(), request.cancel
        )
        return self._convert(self._ended(ending, value, bounds), request)

    async def _acall(
        self, client: Any, request: ModelRequest, bounds: CallBounds, stream: bool = False
    ) -> Any:
        params = self._params(request)
        if stream:
            params.update(_STREAM)
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

    # -- streaming ------------------------------------------------------------------------

    def stream(self, request: ModelRequest) -> Iterator[str | ModelResponse]:
        """One bounded call, streamed (see the module doc): text deltas, then the whole
        response.  The request (with its retries) is made in a daemon thread, bounded like
        :meth:`complete`; the chunks are read here, each within the call's deadline."""
        from loopwarden.clock import call_within

        bounds = self._bounds(request)
        ending, value = call_within(
            self._call,
            request,
            bounds,
            True,
            timeout=bounds.left(),
            cancel=request.cancel,
            name="model",
        )
        stream = self._ended(ending, value, bounds)
        assembly = _Assembly()
        try:
            whole = _whole_answer(stream.response)
            if whole:  # a server that does not stream answered as a whole
                text = assembly.whole(json.loads(stream.response.read()))
                if text:
                    yield text
            for chunk in () if whole else stream:
                text = assembly.add(chunk)
                if text:
                    yield text
        except ModelError:
            raise
        except Exception as exc:
            raise self._stream_error(exc, bounds) from None
        finally:
            _close(stream)
        yield assembly.response(self, request)

    async def astream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        """:meth:`stream` on the running event loop."""
        bounds = self._bounds(request)
        client = self._async_client()
        ending, value = await await_in_task(
            self._acall(client, request, bounds, True), bounds.left(), request.cancel
        )
        stream = self._ended(ending, value, bounds)
        assembly = _Assembly()
        try:
            if _whole_answer(stream.response):  # a server that does not stream
                text = assembly.whole(json.loads(await stream.response.aread()))
                if text:
                    yield text
            else:
                async for chunk in stream:
                    text = assembly.add(chunk)
                    if text:
                        yield text
        except ModelError:
            raise
        except Exception as exc:
            raise self._stream_error(exc, bounds) from None
        finally:
            with contextlib.suppress(Exception):  # the connection is going away anyway
                await stream.close()
        yield assembly.response(self, request)

    def _stream_error(self, exc: Exception, bounds: CallBounds) -> ModelError:
        """What a failure while reading a stream means (the same kinds as a whole body's)."""
        import httpx2  # already imported by the client

        if isinstance(exc, self._http.ResponseTooLarge):
            return ModelError(str(exc), kind="too_large")
        if isinstance(exc, httpx2.TimeoutException):
            return self._deadline_error(bounds)
        if isinstance(exc, httpx2.HTTPError):
            text = f"the stream broke off: {type(exc).__name__}: {exc}"
            return ModelError(self.redactor.text(text[:4000]), kind="connection")
        if isinstance(exc, self._openai.APIError):
            return self._error(exc)
        text = f"a chunk of the stream is not a chat-completion chunk: {type(exc).__name__}: {exc}"
        return ModelError(self.redactor.text(text[:4000]), kind="malformed")


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
