"""no_progress on content (issue 45): different calls answered by the same substantive content
while the model's text stands still are no progress; acknowledgements are not content.

Each test says whether it fails on the code before this round ("fails before") or is a
healthy twin ("twin")."""

from __future__ import annotations

from typing import Any

from support.detectors import Feed, kinds

from loopwarden.plugins.no_progress import NoProgress, NoProgressSettings
from loopwarden.testing import make_tool_result
from loopwarden.tools import ToolRegistry
from loopwarden.tools.recorded import recorded_tool

DOCUMENT = (
    "Return policy (v3). Customers may return most items within 30 days of delivery for a "
    "full refund. Items must be unused and in their original packaging. Electronics carry a "
    "15% restocking fee unless defective. Refunds are issued within 5 to 10 business days."
)


def _feed(name: str, **settings: Any) -> Feed:
    reg = ToolRegistry()
    reg.add(recorded_tool(name))
    return Feed(NoProgress(NoProgressSettings(**settings)), tools=reg)


def _turns(f: Feed, name: str, key: str, args: list[str], answer: str, text: str) -> list[Any]:
    out = []
    for a in args:
        c = f.call(name, {key: a})
        v = f.respond(text, [c])
        out.append(kinds([v])[0])
        if v is not None:
            break
        f.after(c, make_tool_result(answer))
    return out


def test_rephrased_searches_answered_by_one_document_are_stopped_within_five_steps() -> None:
    """Fails before: each different query's identical document counted as new."""
    f = _feed("search_help_center")
    queries = [f"blender warranty claim, wording {i}" for i in range(10)]
    out = _turns(f, "search_help_center", "query", queries, DOCUMENT, "Searching the warranty.")
    assert out[-1] == "stop:no_progress"
    assert len(out) <= 5


def test_identical_acknowledgements_to_different_statements_are_progress() -> None:
    """Twin: "Query OK, 0 rows affected" to seven statements, the same text each turn."""
    f = _feed("mysql_query")
    stmts = [f"CREATE INDEX i{i} ON t (c{i})" for i in range(7)]
    ack = "Query OK, 0 rows affected (0.01 sec)"
    assert _turns(f, "mysql_query", "sql", stmts, ack, "Running the next statement.") == [None] * 7


def test_empty_results_and_failures_are_judged_per_call() -> None:
    """Twin: another date without rooms, another failing id, is another thing checked."""
    f = _feed("search_hotels")
    dates = [f"2026-12-0{i}" for i in range(1, 8)]
    assert _turns(f, "search_hotels", "date", dates, '{"hotels": []}', "Next day.") == [None] * 7
    f = _feed("lookup_plan")
    out = []
    for i in range(6):
        c = f.call("lookup_plan", {"id": f"P{i}"})
        out.append(kinds([f.respond("Next plan.", [c])])[0])
        f.after(c, make_tool_result("Error: plan not found in the catalogue", ok=False))
    assert out == [None] * 6


def test_ack_max_chars_zero_judges_every_answer_per_call() -> None:
    """Fails before (no such setting): 0 restores the per-call judgement for all answers."""
    f = _feed("search_help_center", ack_max_chars=0)
    queries = [f"blender warranty claim, wording {i}" for i in range(6)]
    out = _turns(f, "search_help_center", "query", queries, DOCUMENT, "Searching the warranty.")
    assert out == [None] * 6
