"""Stop reasons, and the families that logging, alerting, metrics and reports group them in.

The ``termination`` field of a run record is one of :data:`STOP_REASONS` (plugins may add their
own).  One definition of each family, so that "stopped by a loop guard" means the same thing
in the report, the alert threshold and the metrics.
"""

from __future__ import annotations

__all__ = [
    "BUDGET_REASONS",
    "ERROR_REASONS",
    "FAILURE_REASONS",
    "LOOP_REASONS",
    "NORMAL_ENDINGS",
    "NOT_CARRIED_OUT_REASONS",
    "STOP_REASONS",
]

#: every stop reason the project itself uses (the contract in docs/contracts.md)
STOP_REASONS: tuple[str, ...] = (
    "final_answer",
    "max_steps",
    "max_tokens",
    "max_context",
    "max_cost",
    "max_tool_calls",
    "timeout",
    "cancelled",
    "repeat_call",
    "oscillation",
    "no_progress",
    "stall",
    "failure_streak",
    "terminal_tool",
    "plugin_error",
    "model_error",
    "max_turns",
    # loopwarden.adapters: the framework ended the run before loopwarden's loop did (its own
    # step or usage limit, a guardrail)
    "ended_by_framework",
    # circuit_breaker: a run kept calling a tool that a fleet-wide breaker paused
    "circuit_open",
    # loopwarden.gateway: within one request the model kept proposing only calls that were
    # answered for it (skipped, or side effects already done); the run wrapped up
    "skipped_calls",
)

#: the run ended as it should: the model answered, or a terminal tool handed it off
NORMAL_ENDINGS: tuple[str, ...] = ("final_answer", "terminal_tool")

#: a loop guard caught the agent going in circles: "stopped by a loop guard" in the report,
#: the alert threshold and ``agent.loop_detected`` (the usual fix: the prompt or the tool
#: descriptions)
LOOP_REASONS: tuple[str, ...] = ("repeat_call", "oscillation", "no_progress", "stall")

#: tools kept failing (the usual fix: the tools' availability or the retry policy)
FAILURE_REASONS: tuple[str, ...] = ("failure_streak", "circuit_open")

#: a budget or cap ran out
BUDGET_REASONS: tuple[str, ...] = (
    "max_steps",
    "max_tokens",
    "max_context",
    "max_cost",
    "max_tool_calls",
    "timeout",
    "max_turns",
    "max_runs",
    "max_model_calls",
)

#: something failed: the model call, a plugin, the shared store, or the loop itself
ERROR_REASONS: tuple[str, ...] = ("plugin_error", "model_error", "error", "store_unavailable")

#: the run could not be carried out ("could not be carried out" in docs/contracts.md):
#: ``loopwarden run`` exits 3 on these; every other ending is a decision -- the model's or a
#: guard's -- and exits 0
NOT_CARRIED_OUT_REASONS: tuple[str, ...] = ERROR_REASONS
