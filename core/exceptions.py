"""The exceptions loopwarden raises, as one tree.

Domain events inside a run (a guard stopping it, a tool failing, the model returning garbage)
are *values* -- verdicts, error observations, stop reasons in the run record -- never
exceptions.  Exceptions are for the caller's mistakes and for broken set-ups::

    LoopwardenError
    ├── ConfigError            a config file is missing, unreadable or invalid
    │   └── ScenarioError      a scenario or trajectory file is invalid
    ├── PluginLoadError        a plugin cannot be found, imported, configured or ordered
    ├── ToolDefinitionError    a tool cannot be declared (bad signature, duplicate name)
    ├── StoreError             the shared store (budgets, ledger) cannot be reached or used
    └── ModelError             the model call failed for good (after the client's retries)

``ToolError`` is separate: tools raise it to report a failure *to the model* (with a
``retryable`` flag); the loop turns it into an error observation.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ConfigError",
    "LoopwardenError",
    "ModelError",
    "PluginLoadError",
    "ScenarioError",
    "StoreError",
    "ToolDefinitionError",
    "ToolError",
]


class LoopwardenError(Exception):
    """Base of every exception loopwarden raises on purpose."""


class ConfigError(LoopwardenError):
    """A configuration file is invalid.

    Carries the file, the dotted key and what was expected, so the message can name all three.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        key: str | None = None,
        expected: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.key = key
        self.expected = expected
        self.message = message
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(p for p in (self.path, self.key) if p)
        text = f"{where}: {self.message}" if where else self.message
        if self.expected:
            text += f" (expected {self.expected})"
        return text


class ScenarioError(ConfigError):
    """A scenario (or trajectory) file is invalid."""


class PluginLoadError(LoopwardenError):
    """A plugin cannot be found, imported, configured or put in the configured order."""

    def __init__(
        self,
        message: str,
        *,
        plugin: str | None = None,
        path: str | Path | None = None,
        key: str | None = None,
    ) -> None:
        self.plugin = plugin
        self.reason = message
        self.path = str(path) if path is not None else None
        self.key = key
        text = f"plugin {plugin!r}: {message}" if plugin else message
        where = ": ".join(p for p in (self.path, key) if p)
        super().__init__(f"{where}: {text}" if where else text)

    def located(self, path: str | Path | None, key: str | None) -> PluginLoadError:
        """The same error, naming the config file and key that asked for the plugin."""
        err = PluginLoadError(self.reason, plugin=self.plugin, path=path, key=key)
        err.__cause__ = self.__cause__
        return err


class ToolDefinitionError(LoopwardenError):
    """A tool declaration is invalid (unsupported signature, duplicate name, ...)."""


class StoreError(LoopwardenError):
    """The shared store cannot be reached or used (``url``: the store, without a password).

    Inside a run it is never raised to the caller: ``[store] on_store_error`` decides (fail
    closed: refuse; fail open: carry on without the store), with a log line and a note in the
    run record either way.
    """

    def __init__(self, message: str, *, url: str | None = None) -> None:
        self.url = url
        super().__init__(message)


class ModelError(LoopwardenError):
    """The model call failed for good: timeout, rate limit or server error after retries.

    ``kind`` says how: ``timeout`` (the call's total deadline passed), ``rate_limited``,
    ``server_error``, ``client_error`` (a 4xx: a bad key, a bad request), ``connection``,
    ``too_large`` (the body passed ``[model] max_response_bytes``), ``cancelled`` (the run was
    cancelled during the call), ``malformed`` (no usable response), or ``error``.  ``status``
    is the HTTP status, when there was one.  The message is redacted (no API key).
    """

    def __init__(self, message: str, *, status: int | None = None, kind: str = "error") -> None:
        self.status = status
        self.kind = kind
        super().__init__(message)


class ToolError(Exception):
    """Raised by a tool to report a failure to the model.

    :param message: the observation the model sees (``"NOT_FOUND: order 99999"``).
    :param retryable: whether trying the same call again may succeed (429, 5xx, timeouts).
    :param retry_after: seconds the service asked to wait before trying again (its
        ``Retry-After``); the runtime's retries honour it.
    """

    def __init__(
        self, message: str, *, retryable: bool = False, retry_after: float | None = None
    ) -> None:
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        super().__init__(message)
