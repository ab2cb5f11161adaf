"""Loading and validating ``config.toml``.

A deployment is one TOML file: the model, the run's texts and defaults, named profiles, the
shared store, tool natures, and the plugins -- ``[plugins] enabled`` (whose order is the call
order) and one ``[plugins.<name>]`` table per plugin, validated by that plugin's settings model
when the plugins load.  Unknown keys are errors (``[shop]``, the demo's table, is kept as
written and validated by :mod:`loopwarden.demo`).  A bad file raises :class:`ConfigError` naming the
file, the key and what was expected, before any run starts.

Where the file comes from: ``--config FILE``; else ``./config.toml`` if present; else the
default shipped inside the package.  A file that says ``extends = "defaults"`` (or another
file) lists only what differs from it (:mod:`loopwarden.config.inherit`: tables merge key by
key, other values replace).  A file without ``extends`` is complete -- what it leaves out has
the models' defaults -- except for ``[profiles]``: the shipped profiles are built in, and a
file adds its own or replaces one of the same name (:func:`parse_config`).

The tables every part shares live here too: the settings value types
(:mod:`loopwarden.config.values`, re-exported by :mod:`loopwarden.plugin`) and the ``[mcp]``
server tables (:mod:`loopwarden.config.mcp`, re-exported by :mod:`loopwarden.mcp`).

May import: the lowest layer only (exceptions, fingerprint, clock) and, on first use, the
models' context windows (:mod:`loopwarden.models.windows`); never a plugin, the MCP client, the
store, a run or a deployment -- everything above reads the config, the config reads nothing
of theirs (import-linter: "the config reads nothing above it").
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    model_validator,
)

from loopwarden.config.inherit import Layered, resolve
from loopwarden.config.mcp import McpConfig
from loopwarden.config.values import PositiveSeconds, TypedTable, check_templates
from loopwarden.exceptions import ConfigError, load_toml, validation_error
from loopwarden.fingerprint import DEFAULT_VOLATILE_KEYS, AnswerMasks

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on 3.10 only
    pass

__all__ = [
    "Config",
    "GatewayConfig",
    "ModelConfig",
    "ProfileConfig",
    "RunConfig",
    "StoreConfig",
    "Texts",
    "ToolNature",
    "blamed",
    "default_config_path",
    "find_config",
    "layered_config",
    "load_config",
    "load_toml",
    "parse_config",
    "shipped_profiles",
    "validation_error",
]

DEFAULT_WRAP_UP = (
    "Stop calling tools now. Using only the information above, give the user your best final "
    "answer; say plainly what is still unknown."
)
DEFAULT_FALLBACK = (
    "Sorry, I could not complete this request automatically. A human colleague will follow up."
)


class _Strict(TypedTable):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """``[model]``: which model answers."""

    provider: Literal["scripted", "openai"] = "openai"
    name: str = "gpt-4o-mini"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    #: the most one model call may take in all, retries and their waits included
    timeout_s: PositiveSeconds = 60.0
    max_retries: int = Field(default=2, ge=0)
    #: the largest response body accepted (after decompression); a larger one fails the call
    max_response_bytes: PositiveInt = 8 * 1024 * 1024
    temperature: float | None = None
    max_output_tokens: PositiveInt | None = None
    #: the model's context window in tokens (None: from the genai-prices package, else the
    #: table of known models, see :mod:`loopwarden.models.windows`); context limits follow it
    context_window: PositiveInt | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)

    def window(self) -> tuple[int, str]:
        """The context window (tokens) and where it came from (see
        :func:`loopwarden.models.windows.context_window`)."""
        from loopwarden.models.windows import context_window

        return context_window(self.name, self.context_window, self.base_url)


class Texts(_Strict):
    """``[run.texts]``: observations and notes the loop itself writes for the model.

    Each is a ``str.format`` template; the fields each may use are listed in its default.
    """

    unknown_tool: str = (
        "ERROR: unknown tool {name!r}; nothing was executed. Available tools: {available}."
    )
    malformed_arguments: str = (
        "ERROR: the arguments for {name} are not a valid JSON object ({detail}); nothing was "
        "executed. Call it again with arguments that match its schema."
    )
    invalid_arguments: str = "ERROR: invalid arguments for {name}: {detail}; nothing was executed."
    tool_timeout: str = (
        "ERROR: TIMEOUT: {name} did not finish within {seconds:.1f}s; its result was discarded."
    )
    tool_cancelled: str = "ERROR: CANCELLED: the run was cancelled while {name} was running."
    tool_retried_ok: str = (
        "{content}\n(This result took {attempts} attempts: the earlier ones failed with a "
        "transient error and were retried automatically.)"
    )
    tool_retried_failed: str = (
        "{content}\n({name} failed {attempts} times with a transient error; it was retried "
        "automatically already. Do not call it again with these arguments now.)"
    )
    not_executed: str = "NOT EXECUTED: the run is stopping ({reason})."
    side_effect_replayed: str = (
        "{name} was already executed with these arguments in this run and was not executed "
        "again. Its earlier result: {content}"
    )
    side_effect_failed: str = (
        "{name} already failed with these arguments in this run and was not executed again: "
        "{content}"
    )
    side_effect_unknown: str = (
        "{name} was already started with these arguments in this run and did not report back "
        "in time; it may have taken effect, so it was not executed again. Check its effect "
        "with a read-only tool before asking for it again. ({content})"
    )
    shared_side_effect_done: str = (
        "{name} was already executed with these arguments by an earlier run and was not "
        "executed again. Its recorded result: {content}"
    )
    shared_side_effect_unknown: str = (
        "{name} was already started with these arguments by another run, which did not record "
        "its outcome; it may have taken effect, so it was not executed again. Check its effect "
        "with a read-only tool before asking for it again. ({content})"
    )
    shared_side_effect_in_progress: str = (
        "{name} is being executed with these arguments by another run right now; it was not "
        "executed again. Check its effect with a read-only tool in a moment."
    )
    store_unavailable: str = (
        "ERROR: {name} was not executed: the shared store that makes sure it runs only once "
        "cannot be reached ({content})."
    )
    best_effort: str = "Here is the last information I found: {observation}"
    #: the user's answer when a hard stop in ``before_tool`` blocks a declared side effect
    #: and the stop gives no ``answer=`` (the model's own text may announce the action)
    side_effect_blocked: str = (
        "I did not carry out {name}: it was stopped before it ran ({reason}), so nothing was "
        "changed. A human colleague can help with this request."
    )

    @model_validator(mode="after")
    def _check_templates(self) -> Texts:
        check_templates(
            self,
            type(self).model_fields,
            dict(
                name="t",
                available="a, b",
                detail="d",
                seconds=1.0,
                reason="r",
                content="c",
                observation="o",
                attempts=3,
            ),
        )
        return self


class RunConfig(_Strict):
    """``[run]``: texts injected into model requests, defaults for every run."""

    system_prompt: str = (
        "You are a helpful assistant. Use the tools when they help, and answer in the user's "
        "language."
    )
    profile: str | None = None
    #: "enforce": verdicts steer the run; "shadow": every verdict is computed, recorded,
    #: logged, alerted and counted, but only the essential max_steps changes the run
    mode: Literal["enforce", "shadow"] = "enforce"
    wrap_up_instruction: str = DEFAULT_WRAP_UP
    fallback_answer: str = DEFAULT_FALLBACK
    warning_role: Literal["user", "system", "developer"] = "system"
    warning_prefix: str = "[loopwarden] "
    max_observation_chars: PositiveInt | None = 16000
    volatile_keys: list[str] = Field(default_factory=lambda: list(DEFAULT_VOLATILE_KEYS))
    #: compare tool answers with their volatile parts masked (line numbers, clocks,
    #: durations, ids, temp paths: loopwarden.fingerprint); false: byte for byte
    mask_volatile: bool = True
    #: further regular expressions whose matches are masked in tool answers
    volatile_patterns: list[str] = Field(default_factory=list)
    #: a tool answer at most this long keeps a time that is not a log stamp: the time is the
    #: answer (a clock); 0 masks every time as noise (loopwarden.fingerprint)
    time_value_chars: int = Field(default=120, ge=0)
    token_estimator: Literal["cjk", "tiktoken", "auto"] = "cjk"
    texts: Texts = Field(default_factory=lambda: Texts())

    @model_validator(mode="after")
    def _check_patterns(self) -> RunConfig:
        try:
            AnswerMasks(self.volatile_patterns)
        except re.error as exc:
            raise ValueError(f"volatile_patterns: not a regular expression: {exc}") from None
        return self


class ProfileConfig(_Strict):
    """``[profiles.<name>]``: the three limits (steps, tokens, seconds) for a class of task."""

    max_steps: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    max_seconds: PositiveSeconds | None = None
    #: the largest request in tokens (token_budget's max_context), e.g. for a small model
    max_context: PositiveInt | None = None
    description: str | None = None


class ToolNature(_Strict):
    """``[tools.<name>]``: the nature of a tool the deployment does not define itself.

    Framework tools (the adapters in :mod:`loopwarden.adapters`) and recorded runs carry no
    loopwarden declaration; these tables give guards what :func:`loopwarden.tools.tool` flags
    would.  A flag left out is not asserted: only a declared nature skips a call or answers it
    from the side-effect ledger, and a tool with no table runs every time it is called (its
    name may only weigh a loop detector's evidence, see :mod:`loopwarden.tools.recorded`).
    """

    read_only: bool | None = None
    deterministic: bool | None = None
    side_effect: bool | None = None
    terminal: bool | None = None
    retryable: bool | None = Field(
        default=None, description="every error of this tool may succeed when tried again"
    )
    idempotency_keys: list[str] | None = Field(
        default=None,
        description="the arguments that identify one side effect (default: all); needs "
        "side_effect = true",
    )

    @model_validator(mode="after")
    def _keys_need_side_effect(self) -> ToolNature:
        if self.idempotency_keys is not None and self.side_effect is not True:
            raise ValueError(
                "idempotency_keys identify a side effect: declare side_effect = true as well"
            )
        return self


class StoreConfig(_Strict):
    """``[store]``: where budgets and the side-effect ledger are shared (see loopwarden.store)."""

    url: str | None = Field(
        default=None,
        description='"sqlite:///PATH" or "redis://HOST:PORT/DB" (default: store.sqlite3 in '
        "the data directory, LOOPWARDEN_DATA_DIR)",
    )
    namespace: str = Field(
        default="loopwarden",
        min_length=1,
        description="prefix of every Redis key (several deployments, one server)",
    )
    timeout_s: PositiveSeconds = Field(
        default=5.0,
        description="the longest one store call waits: connect / read timeout (Redis), "
        "lock wait in all (SQLite)",
    )
    async_calls: Literal["threads", "loop"] = Field(
        default="threads",
        description='how an async run makes its store calls: "threads" runs each step that '
        'may reach the store in a worker thread; "loop" keeps the step on the event loop and '
        "awaits each store call, made on the store's threads (needs greenlet: "
        "loopwarden[serving]). bench/README.md measures both",
    )
    max_connections: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Redis: connections a store keeps to the server at most (per process, and "
        "per event loop for async runs); a call that finds them all busy waits for one, up to "
        "timeout_s, instead of failing. A URL's ?max_connections=N wins",
    )
    on_store_error: Literal["fail_closed", "fail_open"] = Field(
        default="fail_closed",
        description='an unreachable store: "fail_closed" refuses (runs with shared budgets '
        'stop, side effects do not run), "fail_open" carries on without it; logged and noted '
        "in the run record either way",
    )
    reservation_ttl_s: PositiveSeconds = Field(
        default=300.0,
        description="a reservation not settled within this long (its process died) stops counting",
    )
    ledger: bool = Field(
        default=True,
        description="keep the side-effect ledger in the store: "
        "an idempotency key runs once across runs, processes and hosts",
    )
    ledger_ttl_s: PositiveSeconds = Field(
        default=7 * 86400.0,
        description="how long an executed key is remembered (at least ledger_lease_s)",
    )
    ledger_lease_s: PositiveSeconds = Field(
        default=600.0,
        description="a claim older than this without an outcome is reported as "
        '"may have taken effect" instead of "in progress"',
    )
    ledger_scope: list[str] | None = Field(
        default=None,
        description="meta keys whose values prefix ledger keys (side effects of one tenant "
        "never answer those of another); unset: the run's `tenant` and `user` meta keys, "
        "those it carries; [] for one ledger across the deployment",
    )

    @model_validator(mode="after")
    def _ledger_outlives_its_lease(self) -> StoreConfig:
        # An entry shorter-lived than the lease would vanish while its claim should still
        # read "in progress": a worker killed after the effect would be followed by a second
        # execution as soon as the entry expired.
        if self.ledger_ttl_s < self.ledger_lease_s:
            raise ValueError(
                f"store.ledger_ttl_s ({self.ledger_ttl_s:g} s) is shorter than "
                f"store.ledger_lease_s ({self.ledger_lease_s:g} s): a side effect whose worker "
                "died could run twice; set ledger_ttl_s >= ledger_lease_s"
            )
        return self


#: tool names that end an agent's own loop when it is called (the answer is the tool's
#: argument): a stop is delivered as a call to one of them when the request lists it and
#: requires a tool call (see docs/gateway.md)
DEFAULT_FINISH_TOOLS = (
    "final_answer",
    "submit",
    "finish",
    "attempt_completion",
    "task_complete",
    "complete_task",
)


class GatewayConfig(_Strict):
    """``[gateway]``: ``loopwarden gateway`` and ``loopwarden.wrap`` (see loopwarden.gateway)."""

    upstream: str | None = Field(
        default=None,
        description="the OpenAI-compatible base URL requests are forwarded to, e.g. "
        '"https://api.openai.com/v1" (default: [model] base_url, else OPENAI_BASE_URL); '
        "--upstream wins",
    )
    host: str = Field(default="127.0.0.1", description="the address the gateway binds")
    port: int = Field(default=8787, ge=0, le=65535, description="the port the gateway binds")
    keys: list[str] = Field(
        default_factory=list,
        description="gateway keys a client must present (x-loopwarden-key, or the bearer "
        'token when forward_key is false); "${ENV}" is read from the environment; '
        "empty: no gateway key is asked for",
    )
    forward_key: bool = Field(
        default=True,
        description="pass the client's Authorization / x-api-key on to the upstream; false: "
        "the upstream key comes from upstream_key_env",
    )
    upstream_key_env: str = Field(
        default="OPENAI_API_KEY",
        description="the environment variable holding the upstream's key when forward_key is false",
    )
    upstreams: dict[Literal["chat", "responses", "messages"], str] = Field(
        default_factory=dict,
        description="a wire's own upstream base URL, over `upstream`: e.g. messages = "
        '"https://api.anthropic.com" for Anthropic clients beside OpenAI ones',
    )
    upstream_key_envs: dict[Literal["chat", "responses", "messages"], str] = Field(
        default_factory=dict,
        description="a wire's own key variable when forward_key is false, over "
        'upstream_key_env: e.g. messages = "ANTHROPIC_API_KEY" (sent as x-api-key)',
    )
    stop_mode: Literal["answer", "error"] = Field(
        default="answer",
        description='how a stop reaches the client: "answer" -- a 200 completion the agent '
        'finishes on (finish_reason "stop", x-loopwarden-stop header); "error" -- a 400 '
        "with a loopwarden_stop code and x-should-retry: false (never a 429 or 5xx)",
    )
    finish_tools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_FINISH_TOOLS),
        description="tools that end an agent's own loop: a stop is delivered as a call to the "
        "first of them the request lists, when the request requires a tool call",
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="the largest request body accepted (a larger one gets a 413)",
    )
    upstream_timeout_s: PositiveSeconds = Field(
        default=600.0, description="the longest the gateway waits for the upstream's answer"
    )
    state_ttl_s: PositiveSeconds = Field(
        default=86400.0,
        description="how long a conversation's state is kept in the store after its last "
        "request (a run idle longer starts afresh)",
    )
    overhead_header: bool = Field(
        default=True,
        description="add x-loopwarden-overhead-ms (the gateway's own time) to every answer",
    )
    console: bool = Field(
        default=False,
        description="serve the console (`loopwarden console`'s pages) at /console/: with "
        "LOOPWARDEN_CONSOLE_TOKEN set, to whoever has the token; without it, only to this "
        "machine",
    )
    session_headers: list[str] = Field(
        default_factory=lambda: [
            "x-loopwarden-run",
            "x-claude-code-session-id",
            "session-id",
            "session_id",
            "x-session-id",
            "x-session-affinity",
            "x-opencode-session",
            "x-litellm-session-id",
            "helicone-session-id",
        ],
        description="request headers whose value names the conversation, first match wins "
        "(a header sent fresh with every request would make every request a run of its "
        "own: list only per-session ids)",
    )
    tool_error_patterns: list[str] = Field(
        default_factory=list,
        description="regular expressions searched in the first 500 characters of a tool "
        "result the client sends: a match is judged a failure (ok = false), as a tool that "
        "raised -- chat completions carry no error flag on a tool message; e.g. "
        "'^\\s*[Ee]rror\\s*:'.  Replay honours them too, beside a recorded "
        "observation_is_error",
    )

    @model_validator(mode="after")
    def _patterns_compile(self) -> GatewayConfig:
        for wire, url in self.upstreams.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"gateway.upstreams.{wire} {url!r} is not an http(s) URL")
        for i, pattern in enumerate(self.tool_error_patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"gateway.tool_error_patterns[{i}] {pattern!r} is not a regular "
                    f"expression: {exc}"
                ) from None
        return self


class PluginsConfig(BaseModel):
    """``[plugins]``: ``enabled`` (call order), ``blocked``, and one table per plugin."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: list[str] = Field(default_factory=list)
    blocked: list[str] = Field(default_factory=list)
    #: plugins a file that ``extends`` another appends to the inherited ``enabled`` (applied
    #: when the files merge: never set on a loaded config)
    enable: list[str] = Field(
        default_factory=list,
        exclude=True,
        description="in a file with extends: plugins appended to the inherited enabled list "
        "(one already enabled keeps its place)",
    )
    #: plugins such a file removes from the inherited ``enabled``
    disable: list[str] = Field(
        default_factory=list,
        exclude=True,
        description="in a file with extends: plugins removed from the inherited enabled list "
        "(each must be enabled there)",
    )

    def tables(self) -> dict[str, dict[str, Any]]:
        """Each plugin's settings table, without the ``shadow`` switch every table may carry."""
        return {
            name: (
                {k: v for k, v in table.items() if k != "shadow"}
                if isinstance(table, dict)
                else table
            )
            for name, table in (self.model_extra or {}).items()
        }

    def shadowed(self) -> list[str]:
        """The plugins whose table says ``shadow = true``."""
        return [
            name
            for name, table in (self.model_extra or {}).items()
            if isinstance(table, dict) and table.get("shadow") is True
        ]


class Config(_Strict):
    """A whole deployment file."""

    #: ``extends``: the file this one builds on -- ``"defaults"`` (the shipped config) or a
    #: path relative to this file's directory; the file then lists only what differs
    extends: str | None = Field(
        default=None,
        exclude=True,
        description='the config this file builds on: "defaults" (the shipped config) or a '
        "TOML file relative to this file's directory; tables merge key by key, other values "
        "replace the parent's",
    )
    #: ``[model]``: the endpoint, the model's name, its window, timeouts and retries
    model: ModelConfig = Field(default_factory=ModelConfig)
    #: ``[run]``: texts injected into requests, the default profile, ``mode``
    run: RunConfig = Field(default_factory=RunConfig)
    #: ``[profiles.<name>]``: the shipped profiles, and the file's own added or replacing them
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    #: ``[shop]``, the demo's table: kept as written and validated by :mod:`loopwarden.demo`
    #: (the core knows nothing of the shop; deployment files that set it stay valid)
    shop: dict[str, Any] = Field(default_factory=dict)
    #: ``[tools.<name>]``: natures of tools the deployment does not define itself
    tools: dict[str, ToolNature] = Field(default_factory=dict)
    #: ``[mcp.servers.<name>]``: MCP servers whose tools the deployment takes (loopwarden.mcp)
    mcp: McpConfig = Field(default_factory=McpConfig)

    #: ``[store]``: the shared store (SQLite file or Redis) for budgets and the ledger
    store: StoreConfig = Field(default_factory=StoreConfig)
    #: ``[gateway]``: the OpenAI-compatible gateway and the client wrapper
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    #: ``[plugins]``: ``enabled`` (the call order), ``blocked``, one table per plugin
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    #: the file it came from (not a TOML key)
    path: str | None = Field(default=None, exclude=True)

    def profile(self, name: str | None) -> ProfileConfig | None:
        """The named profile (or ``[run] profile``), None when no profile applies."""
        asked = name  # a caller's argument (--profile, profile=), not the file's run.profile
        name = name or self.run.profile
        if name is None:
            return None
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none defined"
            where = dict(key="profile") if asked else dict(path=self.path, key="run.profile")
            raise ConfigError(
                f"unknown profile {name!r} (the built-in profiles and those of "
                f"{self.path or 'the config'})",
                expected=f"one of: {known}",
                **where,
            ) from None


def default_config_path() -> Path:
    """The config shipped inside the package."""
    return Path(str(resources.files("loopwarden").joinpath("default_config.toml")))


def find_config(explicit: str | Path | None = None) -> Path:
    """``explicit``, else ``./config.toml`` if present, else the shipped default."""
    if explicit is not None:
        return Path(explicit)
    local = Path("config.toml")
    if local.is_file():
        return local
    return default_config_path()


@functools.cache
def shipped_profiles() -> dict[str, Any]:
    """The ``[profiles]`` tables of the shipped default config, as written (read once)."""
    profiles = load_toml(default_config_path()).get("profiles") or {}
    return dict(profiles) if isinstance(profiles, Mapping) else {}


def layered_config(data: Mapping[str, Any], *, path: str | None = None) -> Layered:
    """``data`` (the file at ``path``) merged over the files it ``extends``, with where each
    value came from (see :mod:`loopwarden.config.inherit`); a file without ``extends`` as it
    is."""
    return resolve(data, path=path, shipped=default_config_path())


@contextlib.contextmanager
def blamed(config: Config) -> Iterator[None]:
    """Re-raise a :class:`ConfigError` about ``config``'s file -- a plugin's table, checked when
    the plugins load -- naming the file of the ``extends`` chain that wrote the key, and its
    line (the merged config knows only the file it was loaded from)."""
    try:
        yield
    except ConfigError as exc:
        if config.extends is None or config.path is None or exc.path != config.path:
            raise
        where = layered_config(load_toml(Path(config.path)), path=config.path).blame(exc.key or "")
        if where is None or where.file == config.path:
            raise
        line = f" (line {where.line})" if where.line else ""
        raise ConfigError(
            exc.message + line, path=where.file, key=exc.key, expected=exc.expected
        ) from None


def parse_config(data: Mapping[str, Any], *, path: str | None = None) -> Config:
    """Validate a parsed TOML mapping into a :class:`Config`.

    A file with ``extends`` is first merged over the files it builds on; an error then names
    the file (and line) that wrote the bad key.  The shipped profiles are built in: every
    config has them, and its own ``[profiles.<name>]`` tables add profiles or replace a shipped
    one of the same name whole."""
    layered = layered_config(data, path=path)
    if len(layered.layers) == 1:
        return _validate(layered.data, path)
    try:
        return _validate(layered.data, path)
    except ConfigError as exc:
        where = layered.blame(exc.key or "")
        if where is None or exc.key is None:
            raise
        line = f" (line {where.line})" if where.line else ""
        raise ConfigError(
            exc.message + line, path=where.file, key=exc.key, expected=exc.expected
        ) from None


def _validate(data: Mapping[str, Any], path: str | None) -> Config:
    """The merged mapping validated (see :func:`parse_config`)."""
    data = dict(data)
    profiles = data.get("profiles")
    if profiles is None or isinstance(profiles, Mapping):
        data["profiles"] = {**shipped_profiles(), **(profiles or {})}
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, path=path, model=Config) from None
    for name, table in (cfg.plugins.model_extra or {}).items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"must be a table, got {table!r}",
                path=path,
                key=f"plugins.{name}",
                expected=f"[plugins.{name}] with the plugin's settings",
            )
        if not isinstance(table.get("shadow", False), bool):
            raise ConfigError(
                f"must be true or false, got {table['shadow']!r}",
                path=path,
                key=f"plugins.{name}.shadow",
            )
    for name in cfg.plugins.enabled:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError("empty plugin name", path=path, key="plugins.enabled")
    if cfg.run.profile is not None and cfg.run.profile not in cfg.profiles:
        raise ConfigError(
            f"unknown profile {cfg.run.profile!r}",
            path=path,
            key="run.profile",
            expected="a name defined under [profiles]",
        )
    return cfg.model_copy(update={"path": path})


def load_config(path: str | Path | None = None) -> Config:
    """Find, read and validate the config (see :func:`find_config`)."""
    p = find_config(path)
    return parse_config(load_toml(p), path=str(p))
