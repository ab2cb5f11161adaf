"""The run record's fields as docs/contracts.md lists them: what every record must carry."""

from __future__ import annotations

RECORD_FIELDS = frozenset(
    {
        "run_id",
        "scenario",
        "termination",
        "soft",
        "steps",
        "tool_calls",
        "tokens",
        "cost",
        "duplicate_calls",
        "oscillation_hits",
        "stall_rounds",
        "warnings",
        "stopped_by",
        "evidence",
        "final_answer",
        "final_answer_present",
        "elapsed_s",
    }
)
