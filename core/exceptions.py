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
    ├── ModelError             the model call failed for good (after the client's retries)
    └── GuardStopped           a guard stopped a framework run whose output must be
                               structured, and no structured output came (adapters only)

``ToolError`` is separate: tools raise it to report a failure *to the model* (with a
``retryable`` flag); the loop turns it into an error observation.

Also here, because every file loopwarden reads (config, scenarios, plugin tables) fails the same
way: :func:`load_toml` and :func:`validation_error`, which turn an unreadable file or pydantic's
error into a :class:`ConfigError` naming the file, the key and what was expected.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

__all__ = [
    "ConfigError",
    "GuardStopped",
    "LoopwardenError",
    "ModelError",
    "PluginLoadError",
    "ScenarioError",
    "StoreError",
    "ToolDefinitionError",
    "ToolError",
    "load_toml",
    "validation_error",
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
        #: the config file, when the error is about one
        self.path = str(path) if path is not None else None
        #: the dotted key in it (``plugins.repeat_call.max_repeats``), or None
        self.key = key
        #: what would have been accepted, when known
        self.expected = expected
        #: what is wrong, without the file and key
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
        #: the plugin's name (or the reference that enabled it)
        self.plugin = plugin
        #: what went wrong, without the plugin, file and key
        self.reason = message
        #: the config file that asked for the plugin, when known
        self.path = str(path) if path is not None else None
        #: the config key that named it (``plugins.enabled[2]``), when known
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
        #: the HTTP status, when there was one
        self.status = status
        #: how the call failed: ``timeout``, ``rate_limited``, ``server_error``, ... (above)
        self.kind = kind
        super().__init__(message)


class GuardStopped(LoopwardenError):
    """A guard stopped a framework run whose output must be structured (pydantic-ai's
    ``output_type``, LangChain's ``response_format``), and the stop gave no structured
    output: a hard stop (its answer is text), or a soft stop whose wrap-up turn answered
    with text.  Raised by the adapter instead of an answer the framework cannot validate.

    Carries the stop as the run record has it: ``run_id``, ``termination`` (the stop
    reason), ``stopped_by`` (the plugin), ``soft``, and ``final_answer`` (the best-effort
    text, for the caller to show or log).  The run is recorded before it is raised.
    """

    def __init__(
        self,
        *,
        run_id: str,
        termination: str,
        stopped_by: str | None,
        soft: bool,
        final_answer: str | None,
    ) -> None:
        self.run_id = run_id
        self.termination = termination
        self.stopped_by = stopped_by
        self.soft = soft
        self.final_answer = final_answer
        by = f" by {stopped_by}" if stopped_by else ""
        super().__init__(
            f"run {run_id} was stopped{by} ({termination}) without the structured output "
            "its agent must return"
        )


class ToolError(Exception):
    """Raised by a tool to report a failure to the model.

    :param message: the observation the model sees (``"NOT_FOUND: order 99999"``).
    :param retryable: whether trying the same call again may succeed (429, 5xx, timeouts).
    :param retry_after: seconds the service asked to wait before trying again (its
        ``Retry-After``); the runtime's retries honour it.
    :param in_doubt: the request went out and no answer came back (the connection or the
        server died mid-call): the call may have taken effect.  Its result is
        ``unknown_outcome``, recorded in the ledgers as "may have taken effect" and never
        executed again silently -- as a timeout.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        in_doubt: bool = False,
    ) -> None:
        #: the observation the model sees
        self.message = message
        #: whether trying the same call again may succeed
        self.retryable = retryable
        #: seconds the service asked to wait before trying again, if it said
        self.retry_after = retry_after
        #: the request went out unanswered: the call may have taken effect (``unknown_outcome``)
        self.in_doubt = in_doubt
        super().__init__(message)


# -- how a bad file or table becomes a ConfigError ---------------------------------------------


def _describe(err: Mapping[str, Any]) -> tuple[str, str]:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    elif "input" in err and err.get("type") != "missing":
        msg += f", got {err['input']!r}"
    return loc, msg


def _known_keys(model: type[BaseModel] | None, loc: Sequence[Any]) -> list[str]:
    """The keys the table at ``loc`` (the bad key's parents) accepts, when ``model`` says."""
    import typing

    from pydantic import BaseModel

    current: Any = model
    for part in loc:
        if typing.get_origin(current) is dict:  # a table of named tables: ``part`` is a name
            current = typing.get_args(current)[-1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = field.annotation
        args = [a for a in typing.get_args(current) if isinstance(a, type)]
        if typing.get_origin(current) is dict:
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) and args:
            models = [a for a in args if issubclass(a, BaseModel)]
            current = models[0] if len(models) == 1 else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def validation_error(
    exc: ValidationError,
    *,
    path: str | None,
    prefix: str = "",
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """Turn pydantic's error into a ConfigError naming the first bad key, and listing every
    other problem after it.  An unknown key gets a "did you mean" from the keys its table
    accepts (``model``: the validated model, for its field names)."""
    import difflib

    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        loc, msg = _describe(err)
        if err.get("type") == "extra_forbidden":
            parts = err.get("loc", ())
            close = difflib.get_close_matches(
                str(parts[-1]) if parts else "", _known_keys(model, parts[:-1]), n=1
            )
            if close:
                msg += f" (did you mean {close[0]!r}?)"
        key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        problems.append((key, msg))
    key, msg = problems[0]
    if len(problems) > 1:
        where = path or "the config"
        msg += (
            "; and "
            + "; ".join(f"{k}: {m}" if k else m for k, m in problems[1:])
            + f" ({len(problems)} problems in {where})"
        )
    return ConfigError(msg, path=path, key=key or None)


def load_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file raises ConfigError."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib

    try:
        with path.open("rb") as fh:
            data: dict[str, Any] = tomllib.load(fh)
            return data
    except FileNotFoundError:
        raise ConfigError("file not found", path=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a file", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=path) from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition
        raise ConfigError(
            f"not UTF-8 text ({_encoding_hint(path)}byte {exc.start} cannot be decoded)",
            path=path,
            expected="a TOML file saved as UTF-8",
        ) from None
    except RecursionError:
        raise ConfigError("values nested too deeply to read", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=path) from None


def _encoding_hint(path: Path) -> str:
    """A guess at what the file is, when it is not UTF-8."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError:
        return ""
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "it looks like UTF-16; "
    return ""
