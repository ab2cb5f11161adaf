"""The console's records index: built by byte offset, incremental, rebuilt when the file is
another one, and the same records as ``loopwarden report`` reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.console_records import Made, copy_of, shared_records

from loopwarden.console.index import Filters, RecordIndex, index_path, record_time
from loopwarden.report import load_records


@pytest.fixture
def made(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Made:
    return copy_of(shared_records(tmp_path_factory.mktemp("console-records")), tmp_path)


def _index(made: Made, tmp_path: Path) -> RecordIndex:
    index = RecordIndex(made.records, tmp_path / "index.sqlite3")
    index.refresh()
    return index


def test_indexes_every_valid_record_that_report_reads(made: Made, tmp_path: Path) -> None:
    with made.records.open("a", encoding="utf-8") as fh:
        fh.write('{"not": "a record"}\nnot json at all\n\n')
    loaded = load_records(made.records)
    index = _index(made, tmp_path)
    assert index.count() == len(loaded.records) > 5
    assert index.skipped == loaded.skipped == 2
    page = index.page(Filters(), 0, 1000)
    # newest first: the last line of the file is the first row
    assert [r.id for r in page.runs] == [r["run_id"] for r in reversed(loaded.records)]


def test_one_run_is_read_at_its_offset_whole(made: Made, tmp_path: Path) -> None:
    index = _index(made, tmp_path)
    for record in load_records(made.records).records:
        found = index.load(record["run_id"])
        assert found is not None
        assert found[1] == record
    assert index.load("no-such-run") is None


def test_appended_records_are_picked_up_and_a_partial_line_waits(
    made: Made, tmp_path: Path
) -> None:
    index = _index(made, tmp_path)
    before = index.count()
    cursor = index.cursor()
    record = json.loads(made.records.read_text(encoding="utf-8").splitlines()[0])
    line = json.dumps({**record, "run_id": "appended-1"})
    with made.records.open("a", encoding="utf-8") as fh:
        fh.write(line[:40])  # a writer mid-line
    assert index.refresh() == 0
    assert index.find("appended-1") is None
    with made.records.open("a", encoding="utf-8") as fh:
        fh.write(line[40:] + "\n")
    assert index.refresh() == 1
    assert index.count() == before + 1
    assert [r.id for r in index.after(cursor)] == ["appended-1"]
    found = index.load("appended-1")
    assert found is not None and found[1]["run_id"] == "appended-1"


def test_a_truncated_or_rotated_file_is_indexed_afresh(made: Made, tmp_path: Path) -> None:
    index = _index(made, tmp_path)
    lines = made.records.read_text(encoding="utf-8").splitlines(keepends=True)
    made.records.write_text("".join(lines[:2]), encoding="utf-8")  # truncated in place
    index.refresh()
    assert index.count() == 2
    rotated = made.records.with_suffix(".new")
    rotated.write_text("".join(lines[-3:]), encoding="utf-8")
    os.replace(rotated, made.records)  # another file under the same name
    index.refresh()
    ids = [json.loads(x)["run_id"] for x in lines[-3:]]
    assert sorted(r.id for r in index.page(Filters(), 0, 100).runs) == sorted(ids)


def test_a_file_rewritten_in_place_with_the_same_length_is_rebuilt(
    made: Made, tmp_path: Path
) -> None:
    index = _index(made, tmp_path)
    data = made.records.read_bytes()
    first = json.loads(data.split(b"\n")[0])
    old = first["run_id"].encode()
    new = b"x" * len(old)
    made.records.write_bytes(data.replace(old, new))  # same size, same inode, other bytes
    index.refresh()
    assert index.find(old.decode()) is None
    assert index.find(new.decode()) is not None


def test_filters_match_the_records(made: Made, tmp_path: Path) -> None:
    index = _index(made, tmp_path)
    records = load_records(made.records).records

    def ids(**kw: str) -> set[str]:
        return {r.id for r in index.page(Filters(**kw), 0, 1000).runs}  # type: ignore[arg-type]

    assert ids(termination="repeat_call") == {
        r["run_id"] for r in records if r["termination"] == "repeat_call"
    }
    assert ids(guard="circuit_breaker") == {
        r["run_id"] for r in records if r.get("stopped_by") == "circuit_breaker"
    }
    acme = {r["run_id"] for r in records if r["meta"].get("tenant") == "acme"}
    assert ids(tenant="acme") == acme and len(acme) == 2
    one = records[0]
    assert ids(conversation=one["conversation_id"]) == {one["run_id"]}
    assert ids(model="scripted") == {r["run_id"] for r in records}
    assert ids(q="explore-divergence") == {
        r["run_id"] for r in records if r["scenario"] == "explore-divergence"
    }
    assert ids(termination="repeat_call", tenant="acme") == set()


def test_time_filters_use_the_records_own_time_when_they_carry_one(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    rows = [
        {"run_id": "old", "termination": "final_answer", "ended_at": "2026-01-01T10:00:00Z"},
        {"run_id": "mid", "termination": "stall", "ended_at": 1767700000.0},  # 2026-01-06
        {"run_id": "new", "termination": "stall", "ended_at": "2026-02-01T00:00:00+00:00"},
    ]
    records.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    index = RecordIndex(records, tmp_path / "i.sqlite3")
    index.refresh()
    since = record_time({"t": 0, "ended_at": "2026-01-05T00:00:00Z"})
    assert since is not None
    got = index.page(Filters(since=since), 0, 10).runs
    assert [r.id for r in got] == ["new", "mid"]
    assert all(r.ts_exact for r in got)
    axis, starts, series = index.over_time(4)
    assert axis == "time" and len(starts) == 4
    assert sum(series["stall"]) == 2 and sum(series["final_answer"]) == 1


def test_pages_are_newest_first_and_complete(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    records.write_text(
        "".join(json.dumps({"run_id": f"r{i}", "termination": "stall"}) + "\n" for i in range(7)),
        encoding="utf-8",
    )
    index = RecordIndex(records, tmp_path / "i.sqlite3")
    index.refresh()
    pages = [index.page(Filters(), p, 3) for p in range(3)]
    assert [[r.id for r in p.runs] for p in pages] == [
        ["r6", "r5", "r4"],
        ["r3", "r2", "r1"],
        ["r0"],
    ]
    assert [p.has_next for p in pages] == [True, True, False]
    assert pages[0].total == 7


def test_the_index_is_keyed_by_the_records_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "runs.jsonl", tmp_path / "b" / "runs.jsonl"
    assert index_path(a) != index_path(b)
    assert index_path(a) == index_path(tmp_path / "a" / ".." / "a" / "runs.jsonl")


def test_an_index_reopened_continues_where_it_stopped(made: Made, tmp_path: Path) -> None:
    first = _index(made, tmp_path)
    n = first.count()
    first.close()
    again = RecordIndex(made.records, tmp_path / "index.sqlite3")
    assert again.count() == n
    assert again.refresh() == 0  # nothing re-read
    assert again.count() == n


def test_chunks_smaller_than_a_line_still_index_whole_lines(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import loopwarden.console.index as index_module

    monkeypatch.setattr(index_module, "_CHUNK", 97)  # far shorter than one record
    index = _index(made, tmp_path)
    loaded = load_records(made.records)
    assert index.count() == len(loaded.records)
    for record in loaded.records:
        found = index.load(record["run_id"])
        assert found is not None and found[1] == record
