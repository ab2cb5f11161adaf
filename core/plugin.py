"""The base class for plugins (optional, but it does the chores).

A plugin is any object with ``@hookimpl`` methods.  Subclassing :class:`Plugin` adds:

* ``Settings`` -- a pydantic model for the plugin's ``[plugins.<name>]`` table (unknown keys
  are errors); the loader validates the table and passes the instance to ``__init__``;
* :meth:`state` -- this plugin's per-run state slot, created by :meth:`new_state`;
* :meth:`warn`, :meth:`skip`, :meth:`stop` -- verdicts that carry the plugin's name;
* :meth:`connect` / :meth:`close` -- the lifecycle hooks ``on_configure`` /
  ``on_unconfigure`` call them (subscribe to signals, flush files); a plugin may implement
  those hooks directly instead; ``check_model(model, path=...)`` is called for the hook
  ``validate_model`` and ``check_config(path=...)`` for ``validate_config`` (the 0.1 spelling
  of these methods keeps working).

Example::

    from loopwarden import Plugin, hookimpl

    class NoRefunds(Plugin):
        name = "no_refunds"

        @hookimpl
        def before_tool(self, run, call):
            if call.name == "apply_refund":
                return self.stop("forbidden_tool", tool=call.name,
                                 answer="I can't issue refunds here; nothing was refunded.")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

# the settings value types live with the config (below every table); plugin authors import
# them from here
from loopwarden.config.values import PositiveSeconds as PositiveSeconds
from loopwarden.config.values import Seconds as Seconds
from loopwarden.config.values import TypedTable, check_patterns, check_templates
from loopwarden.config.values import scalar_type_error as scalar_type_error
from loopwarden.hookspecs import hookimpl
from loopwarden.verdicts import Skip, Stop, Warn, skip, stop, warn

if TYPE_CHECKING:
    from loopwarden.config import Config
    from loopwarden.run import DeploymentView, Run

__all__ = [
    "NoSettings",
    "Plugin",
    "PluginSettings",
    "TypedTable",
    "check_patterns",
    "check_templates",
]


class PluginSettings(TypedTable):
    """Base for plugin settings models: unknown keys are errors, values are validated (a
    number field takes a number, a boolean field a boolean: as the JSON Schema says)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoSettings(PluginSettings):
    """For plugins without settings."""


S = TypeVar("S", bound=BaseModel)


class Plugin(Generic[S]):
    """Convenience base class for loopwarden plugins (see the module docstring)."""

    #: the plugin's one name (verdicts, state, record fields, its ``[plugins.<name>]``
    #: table): what the class declares here, else the entry point's name when enabled by one,
    #: else the class name -- the loader and the testing kit set it on the instance
    name: str = ""
    #: the settings model for this plugin's ``[plugins.<name>]`` table
    Settings: ClassVar[type[BaseModel]] = NoSettings
    #: an essential plugin can be configured but never disabled or blocked
    essential: ClassVar[bool] = False
    #: a plugin whose stops are normal endings, not guards (a hand-off to a person ends the
    #: run): ``[run] mode = "shadow"`` leaves it enforced
    ends_runs_normally: ClassVar[bool] = False

    def __init__(self, settings: S | None = None) -> None:
        if not self.name:
            self.name = type(self).__name__
        #: the validated ``[plugins.<name>]`` table (an instance of ``Settings``)
        self.settings: S = settings if settings is not None else self.Settings()  # type: ignore[assignment]

    # -- per-run state -----------------------------------------------------------------

    def new_state(self) -> Any:
        """Create this plugin's state for a new run (override; default: a dict)."""
        return {}

    def state(self, run: Run) -> Any:
        """This plugin's state slot on ``run`` (created on first use)."""
        try:
            return run.state[self.name]
        except KeyError:
            value = run.state[self.name] = self.new_state()
            return value

    def new_conversation_state(self) -> Any:
        """Create this plugin's conversation-scoped state (override; default: a dict)."""
        return {}

    def conversation_state(self, run: Run) -> Any:
        """This plugin's slot on the run's conversation: it carries on to the next run of the
        same conversation (the next user message), while :meth:`state` starts afresh."""
        slots = run.conversation.state
        try:
            return slots[self.name]
        except KeyError:
            value = slots[self.name] = self.new_conversation_state()
            return value

    # -- verdicts carrying this plugin's name ------------------------------------------

    def warn(self, message: str, **evidence: Any) -> Warn:
        """:func:`loopwarden.warn` with this plugin's name."""
        return warn(message, plugin=self.name, **evidence)

    def skip(self, observation: str, *, message: str | None = None, **evidence: Any) -> Skip:
        """:func:`loopwarden.skip` with this plugin's name."""
        return skip(observation, plugin=self.name, message=message, **evidence)

    def stop(
        self,
        reason: str,
        *,
        soft: bool = False,
        message: str | None = None,
        answer: str | None = None,
        **evidence: Any,
    ) -> Stop:
        """:func:`loopwarden.stop` with this plugin's name."""
        return stop(reason, soft=soft, plugin=self.name, message=message, answer=answer, **evidence)

    # -- lifecycle -----------------------------------------------------------------------

    def connect(self, deployment: DeploymentView) -> None:
        """Called once when a deployment registers this plugin (subscribe to signals here)."""

    def close(self) -> None:
        """Called when the deployment closes (flush files, stop threads)."""

    # The lifecycle hooks, implemented by the methods above.  The plugin manager registers
    # each only when the subclass overrides the method it calls (see :func:`unused_shim`),
    # so a plugin without them implements no lifecycle hook.

    @hookimpl
    def on_configure(self, deployment: DeploymentView) -> None:
        """The ``on_configure`` hook: calls :meth:`connect`."""
        self.connect(deployment)

    @hookimpl
    def on_unconfigure(self) -> None:
        """The ``on_unconfigure`` hook: calls :meth:`close`."""
        self.close()

    @hookimpl
    def validate_model(self, model: str, path: str | None) -> None:
        """The ``validate_model`` hook: calls ``check_model(model, path=)`` when defined."""
        check = getattr(self, "check_model", None)  # the 0.1 spelling of this hook
        if callable(check):
            check(model, path=path)

    @hookimpl
    def validate_config(self, config: Config) -> None:
        """The ``validate_config`` hook: calls ``check_config(path=)`` when defined."""
        check = getattr(self, "check_config", None)  # the 0.1 spelling of this hook
        if callable(check):
            check(path=config.path)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


#: lifecycle hook -> the method the base class's implementation calls
_SHIMS: dict[str, str] = {
    "on_configure": "connect",
    "on_unconfigure": "close",
    "validate_model": "check_model",
    "validate_config": "check_config",
}


def unused_shim(obj: object, hook: str) -> bool:
    """True when ``obj``'s ``hook`` is the base class's implementation and the method it
    calls is not overridden: then it would do nothing, and is not registered."""
    method = _SHIMS.get(hook)
    if method is None or not isinstance(obj, Plugin):
        return False
    cls = type(obj)
    if getattr(cls, hook, None) is not getattr(Plugin, hook):
        return False  # the plugin implements the hook itself
    return getattr(cls, method, None) is getattr(Plugin, method, None)
