"""Tool declarations and the demo shop on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import Field, ValidationError

from loopwarden import ToolDefinitionError, ToolError
from loopwarden.demo.shop import Shop, default_data_dir
from loopwarden.tools import ToolContext, ToolRegistry, tool


def test_schema_comes_from_type_hints_and_docstring() -> None:
    @tool(read_only=True, deterministic=True)
    def find(
        query: Annotated[str, Field(description="what to find")],
        limit: int = 3,
        ctx: ToolContext | None = None,
    ) -> str:
        """Find things.

        Longer text that is not part of the description.
        """
        return query

    schema = find.schema()["function"]
    assert schema["name"] == "find" and schema["description"] == "Find things."
    props = schema["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "what to find"}
    assert props["limit"]["default"] == 3
    assert schema["parameters"]["required"] == ["query"]
    assert find.read_only and find.deterministic and not find.side_effect


def test_context_parameter_is_injected_not_in_schema() -> None:
    @tool
    def waits(ctx: ToolContext) -> str:
        """Waits."""
        return "ok"

    assert waits.context_param == "ctx"
    assert waits.schema()["function"]["parameters"]["properties"] == {}


def test_validation_rejects_wrong_and_extra_arguments() -> None:
    @tool
    def f(n: int) -> int:
        """F."""
        return n

    assert f.validate({"n": "5"}) == {"n": 5}
    with pytest.raises(ValidationError):
        f.validate({"n": "five"})
    with pytest.raises(ValidationError):
        f.validate({"n": 1, "m": 2})


def test_bad_declarations_are_refused() -> None:
    with pytest.raises(ToolDefinitionError):
        tool(read_only=True, side_effect=True)(lambda: None)

    def star(*args: int) -> None: ...

    with pytest.raises(ToolDefinitionError):
        tool(star)
    reg = ToolRegistry()

    @tool
    def g() -> None:
        """G."""

    reg.add(g)
    with pytest.raises(ToolDefinitionError, match="duplicate"):
        reg.add(g)


def test_shop_is_created_and_seeded_in_the_data_dir(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "s.sqlite3")
    order = shop.query_order("88231")
    assert order["product"] == "比特 S10 Pro 扫地机" and order["amount_yuan"] == 1999
    assert order["signed_at"].startswith("2026-06-22") and order["tracking_no"] == "SF1234567890"
    assert shop.query_logistics("SF1234567890")[-1]["event"].startswith("已签收")
    assert "7 天" in shop.search_knowledge("七天无理由退货")[0]["body"]
    with pytest.raises(ToolError, match="NOT_FOUND"):
        shop.query_order("99999")
    assert (tmp_path / "s.sqlite3").is_file()


def test_default_location_is_the_user_data_dir_never_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LOOPWARDEN_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr("sys.platform", "linux")
    assert Shop().db_path == tmp_path / "loopwarden" / "shop.sqlite3"


def test_refund_is_a_single_row_even_under_concurrency(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "s.sqlite3")
    results: list[dict[str, object]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def go() -> None:
        start.wait()
        try:
            results.append(shop.apply_refund("88231", "七天无理由退货"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []  # every caller gets the one refund, none an IntegrityError
    assert len(shop.refunds()) == 1 and len(results) == 8
    assert len({r["refund_id"] for r in results}) == 1
    with sqlite3.connect(tmp_path / "s.sqlite3") as c:
        assert c.execute("SELECT COUNT(*) FROM refunds").fetchone()[0] == 1


def test_shop_tool_flags_are_the_contract(tmp_path: Path) -> None:
    tools = Shop(tmp_path / "s.sqlite3").tools()
    assert tools.names == [
        "query_order",
        "query_logistics",
        "search_knowledge",
        "get_current_time",
        "apply_refund",
        "transfer_to_human",
    ]
    flags = {t.name: (t.read_only, t.deterministic, t.side_effect, t.terminal) for t in tools}
    assert flags["query_order"] == (True, True, False, False)
    assert flags["get_current_time"] == (True, False, False, False)
    assert flags["apply_refund"] == (False, False, True, False)
    assert flags["transfer_to_human"][2:] == (True, True)


def test_a_reworded_reason_never_makes_a_second_refund(tmp_path: Path) -> None:
    shop = Shop(tmp_path / "s.sqlite3")
    first = shop.apply_refund("88231", "七天无理由退货")
    again = shop.apply_refund("88231", "7天无理由退货")
    assert again["refund_id"] == first["refund_id"] and again["duplicate"] is True
    assert len(shop.refunds()) == 1


def test_without_a_path_the_database_lands_in_the_data_dir_not_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loopwarden

    monkeypatch.setenv("LOOPWARDEN_DATA_DIR", str(tmp_path / "data"))
    assert default_data_dir() == tmp_path / "data"
    shop = Shop()
    shop.query_order("88231")
    assert (tmp_path / "data" / "shop.sqlite3").is_file()
    package = Path(loopwarden.__file__).resolve().parent
    assert package not in shop.db_path.resolve().parents
