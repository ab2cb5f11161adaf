"""The hostile-world kit's stores and models: a store that times out, one that blocks until
released, and a model that spends its whole output allowance.

For tests and benches (``bench/shared_budget.py``, ``bench/concurrency.py``): each wraps a
real store (SQLite or Redis) and only adds the fault, so what the store does underneath is the
real thing.  :func:`install_store` puts a wrapper in front of a deployment's store.

* :class:`FlakyStore`    every ``every``-th call raises :class:`StoreError` (a timeout): either
  before the call reaches the store (nothing written) or after it (written, the answer lost) --
  ``mode = "alternate"`` takes turns, since a client cannot tell the two apart.
* :class:`GatedStore`    each call (of ``methods``) waits for ``gate`` to open: an unresponsive
  store, made deterministic -- a test opens the gate from the event loop, which can only happen
  if the loop is not frozen inside the store call.
* :class:`CappedModel`   answers every call with as many output tokens as it may: the request's
  ``max_output_tokens``, else its own (as the OpenAI client sends its ``[model]`` cap) -- the
  worst case the shared budgets must bound.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from loopwarden.events import ModelRequest, ModelResponse, Usage
from loopwarden.exceptions import StoreError

if TYPE_CHECKING:
    from loopwarden.deployment import Deployment
    from loopwarden.store import Store

__all__ = ["STORE_CALLS", "CappedModel", "FlakyStore", "GatedStore", "install_store"]

#: the store calls a run makes (budgets, the ledger, then circuit breakers); ``rows`` /
#: ``reset`` / ``breakers`` / ``close`` are operations, never faulted
STORE_CALLS = (
    "reserve",
    "settle",
    "claim",
    "finish",
    "release",
    "breaker_admit",
    "breaker_record",
)


class _Wrapper:
    """Delegates everything to ``inner``; subclasses fault the calls of :data:`STORE_CALLS`."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in STORE_CALLS:
            return attr
        return lambda *args, **kwargs: self._call(name, args, kwargs)


class FlakyStore(_Wrapper):
    """Every ``every``-th store call (counting from the ``first``-th) times out -- or, with a
    ``seed``, each call with probability ``1 / every`` (a fixed pattern can fall in step with
    the calls of a run: then every run meets its fault at the same call).

    ``mode``: ``"before"`` (nothing reached the store), ``"after"`` (the store did it; the
    answer was lost) or ``"alternate"`` (before, after, before, ...).  ``calls`` counts the
    calls, ``failed`` lists ``(method, "before" | "after")`` per injected timeout.
    """

    def __init__(
        self,
        inner: Store,
        *,
        every: int = 2,
        first: int = 2,
        mode: Literal["before", "after", "alternate"] = "alternate",
        methods: Sequence[str] = STORE_CALLS,
        seed: int | None = None,
    ) -> None:
        super().__init__(inner)
        self.every, self.first, self.mode, self.methods = every, first, mode, tuple(methods)
        self.rng = random.Random(seed) if seed is not None else None
        self.calls = 0
        self.failed: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name not in self.methods:
            return super()._call(name, args, kwargs)
        with self._lock:
            self.calls += 1
            n = self.calls
            if self.rng is not None:
                fault = self.rng.random() < 1 / self.every
            else:
                fault = n >= self.first and (n - self.first) % self.every == 0
            when = self.mode
            if fault and when == "alternate":
                when = "before" if len(self.failed) % 2 == 0 else "after"
            if fault:
                self.failed.append((name, when))
        if fault and when == "before":
            raise StoreError(f"timed out ({name}; injected, before the store)", url=self.url)
        value = super()._call(name, args, kwargs)
        if fault:
            raise StoreError(f"timed out ({name}; injected, after the store)", url=self.url)
        return value


class GatedStore(_Wrapper):
    """Each call of ``methods`` calls ``on_enter`` (from the calling thread), then waits for
    ``gate`` -- at most ``guard_s``: past it the call fails with :class:`StoreError` and is
    counted in ``timeouts``, so a test that never opens the gate fails instead of hanging."""

    def __init__(
        self,
        inner: Store,
        *,
        methods: Sequence[str] = STORE_CALLS,
        on_enter: Callable[[str], None] | None = None,
        guard_s: float = 10.0,
    ) -> None:
        super().__init__(inner)
        self.methods = tuple(methods)
        self.on_enter = on_enter
        self.guard_s = guard_s
        self.gate = threading.Event()
        self.entered: list[str] = []
        self.threads: set[int] = set()
        self.timeouts = 0

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name in self.methods:
            self.entered.append(name)
            self.threads.add(threading.get_ident())
            if self.on_enter is not None:
                self.on_enter(name)
            if not self.gate.wait(self.guard_s):
                self.timeouts += 1
                raise StoreError(f"{name}: the gate stayed closed {self.guard_s:g}s", url=self.url)
        return super()._call(name, args, kwargs)


def install_store(deployment: Deployment, wrap: Callable[[Store], Any]) -> Any:
    """Put ``wrap(store)`` in front of ``deployment``'s store (opened now); returns it."""
    shared = deployment.shared
    wrapped = wrap(shared.store)
    shared._store = wrapped  # the kit stands in for the store the deployment opened
    return wrapped


class CappedModel:
    """A model that answers each call with all the output tokens it may use (see the module
    doc): ``usage.completion`` is the request's ``max_output_tokens`` (else this model's own,
    else ``default_output``), ``usage.prompt`` the request's estimate; ``before_answer`` is
    called first (a test's barrier).  Records each request's cap in ``caps``."""

    name = "scripted"

    def __init__(
        self,
        max_output_tokens: int | None = None,
        *,
        default_output: int = 1000,
        answer: str = "Done.",
        before_answer: Callable[[ModelRequest], None] | None = None,
    ) -> None:
        self.max_output_tokens = max_output_tokens
        self.default_output = default_output
        self.answer = answer
        self.before_answer = before_answer
        self.caps: list[int | None] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.caps.append(request.max_output_tokens)
        if self.before_answer is not None:
            self.before_answer(request)
        out = request.max_output_tokens or self.max_output_tokens or self.default_output
        return ModelResponse(
            content=self.answer,
            usage=Usage(prompt=request.estimated_tokens, completion=out),
            finish_reason="length",
            model=self.name,
        )
