"""LangGraph's side of the LangChain adapter: seeing an agent invocation end where the
middleware does not, and the last steps of ``recursion_limit``.

:class:`_GraphErrors` is a LangChain callback handler, added to every callback manager of the
process, that learns the graph run of each loopwarden run and calls the run's closer when that
graph run ends (an exception raised outside the middleware, an interrupt in another node).
:func:`_last_steps` tells the middleware that LangGraph raises ``GraphRecursionError`` next.
Used by :mod:`loopwarden.adapters.langchain` only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook

MAX_LAST = 256
#: the part of LangGraph's ``GraphRecursionError`` message the record quotes
RECURSION = "LangGraph's recursion_limit: the graph raises GraphRecursionError next"


class _GraphErrors(BaseCallbackHandler):
    """The one hook that sees an agent invocation end on an exception raised outside the
    middleware (another middleware's node -- ``ModelCallLimitExceededError`` --, LangGraph's
    own ``GraphRecursionError``, a cancellation between steps): the agent graph's run ends
    with ``on_chain_error``.  Added to every callback manager of the process through
    LangChain's configure hook (registered by the first middleware made; it ignores every
    event but chains'), it learns the graph run of each loopwarden run from the start of the
    middleware's ``before_agent`` node and calls the run's closer when that graph run fails."""

    run_inline = True  # a dict look-up: never worth an executor hop

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()  # the middlewares' before_agent node names
        self._graphs: OrderedDict[UUID, UUID] = OrderedDict()  # node run -> its graph run
        self._open: dict[UUID, Callable[[BaseException | None], None]] = {}
        self._lock = threading.Lock()

    @property
    def ignore_llm(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_agent(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is not None and kwargs.get("name") in self.names:
            with self._lock:
                self._graphs[run_id] = parent_run_id
                while len(self._graphs) > MAX_LAST:
                    self._graphs.popitem(last=False)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, error)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._ended(run_id, None)

    def _ended(self, run_id: UUID, error: BaseException | None) -> None:
        if not self._open:  # the common case: no loopwarden run waits on a graph run
            return
        with self._lock:
            closer = self._open.pop(run_id, None)
        if closer is not None:
            closer(error)

    def watch(
        self, node_run: UUID | None, closer: Callable[[BaseException | None], None]
    ) -> UUID | None:
        """Call ``closer`` (with the exception, or None) when the graph run of the node run
        ``node_run`` ends while the watch is on (the middleware unwatches a run it ends); its
        id."""
        with self._lock:
            graph = self._graphs.pop(node_run, None) if node_run is not None else None
            if graph is not None:
                self._open[graph] = closer
        return graph

    def unwatch(self, graph: UUID) -> None:
        with self._lock:
            self._open.pop(graph, None)


_GRAPH_ERRORS = _GraphErrors()
_GRAPH_ERRORS_VAR: ContextVar[_GraphErrors | None] = ContextVar(
    "loopwarden_langchain_graph_errors", default=_GRAPH_ERRORS
)
_registered = False
_registering = threading.Lock()


def _watch_graph_errors(node_name: str) -> None:
    """Register :data:`_GRAPH_ERRORS` with LangChain's callback configuration (once per
    process) and have it learn the graph runs of the node ``node_name``."""
    global _registered
    with _registering:
        _GRAPH_ERRORS.names.add(node_name)
        if not _registered:
            register_configure_hook(_GRAPH_ERRORS_VAR, True)
            _registered = True


def _last_steps(state: Mapping[str, Any]) -> bool:
    """LangGraph raises ``GraphRecursionError`` once the node after this one has run: one
    step is left at most (``remaining_steps``), and after a model or tools node another node
    always comes (the tools or the model, this middleware's ``after_agent`` at the least)."""
    remaining = state.get("remaining_steps")
    return remaining is not None and remaining <= 1
