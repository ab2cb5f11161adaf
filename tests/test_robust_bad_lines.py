"""One bad line never crashes ``report`` or ``replay``: it is skipped and counted (item 9).

Each bad line sits between two good ones; the command must exit as it would without it,
report both good lines and count exactly one skipped line.  Replay keeps a recorded run whose
text holds a lone surrogate or an undecodable byte -- cleaned to U+FFFD (issue 33, item 9).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopwarden.commands.cli import main

GOOD_RECORD = json.dumps(
    {
        "run_id": "good",
        "termination": "final_answer",
        "steps": 1,
        "tokens": {"prompt": 1, "completion": 1, "total": 2},
    }
)
GOOD_TRAJECTORY = json.dumps(
    {"id": "good", "steps": [{"content": "hello", "tool_calls": [], "observations": []}]}
)

# name -> (a bad run-record line, a bad trajectory line), as bytes
BAD_LINES: dict[str, tuple[bytes, bytes]] = {
    "a 400-digit integer": (
        b'{"run_id": "b", "termination": "final_answer", "tokens": {"total": ' + b"9" * 400 + b"}}",
        b'{"id": "b", "steps": [{"content": "x", "tool_calls": [], "usage": {"prompt_tokens": '
        + b"9" * 400
        + b"}}]}",
    ),
    "NaN": (
        b'{"run_id": "b", "termination": "final_answer", "cost": NaN}',
        b'{"id": "b", "steps": [{"content": "x", "tool_calls": [], '
        b'"usage": {"prompt_tokens": NaN}}]}',
    ),
    "1e999": (
        b'{"run_id": "b", "termination": "final_answer", "cost": 1e999}',
        b'{"id": "b", "steps": [{"content": "x", "tool_calls": [], '
        b'"usage": {"prompt_tokens": 1e999}}]}',
    ),
    "100,000 nested [": (b"[" * 100_000, b'{"id": "b", "steps": ' + b"[" * 100_000),
    "an invalid UTF-8 byte": (
        b'{"run_id": "b", "termination": "final_\xff"}',
        b'{"id": "b", "steps": [{"content": "\xff", "tool_calls": []}]}',
    ),
    "a lone surrogate": (
        b'{"run_id": "b", "termination": "final_\\ud800answer"}',
        b'{"id": "b", "steps": [{"content": "x\\udc00", "tool_calls": []}]}',
    ),
}


def _file(tmp_path: Path, good: str, bad: bytes) -> Path:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(good.encode() + b"\n" + bad + b"\n" + good.encode() + b"\n")
    return path


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_report_skips_and_counts_the_bad_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, GOOD_RECORD, BAD_LINES[case][0])
    assert main(["report", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["runs"] == 2
    assert "skipped 1 corrupt line" in err and "(line 2)" in err


#: bad for a record, but a trajectory whose text is cleaned and kept (replay)
CLEANED = ("an invalid UTF-8 byte", "a lone surrogate")


@pytest.mark.parametrize("case", [c for c in BAD_LINES if c not in CLEANED])
def test_replay_skips_and_counts_the_bad_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, GOOD_TRAJECTORY, BAD_LINES[case][1])
    assert main(["replay", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in lines[:-1]] == ["good", "good"]
    assert lines[-1]["summary"]["unreadable_lines"] == 1
    assert "skipped 1 unreadable line" in err


def test_replay_keeps_a_run_whose_argument_holds_a_lone_surrogate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every recorded run has half an emoji (``\\ud83d``) in a tool argument, one also an
    undecodable byte: replay reports them all, the text cleaned to U+FFFD, and exits 0 (it
    dropped each and exited 2, "every line unreadable")."""
    runs = [
        b'{"id": "r%d", "steps": [{"content": "x", "tool_calls": [{"name": "search", '
        b'"arguments": {"q": "emoji \\ud83d cut"}}], "observations": ["none"]}, '
        b'{"content": "done", "tool_calls": []}]}' % i
        for i in range(3)
    ]
    runs[2] = runs[2].replace(b'"done"', b'"d\xffne"')
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(runs) + b"\n")
    assert main(["replay", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in lines[:-1]] == ["r0", "r1", "r2"]
    assert [r["steps"] for r in lines[:-1]] == [2, 2, 2]
    assert lines[-1]["summary"]["unreadable_lines"] == 0
    assert "unreadable" not in err


def test_report_of_records_the_plugin_wrote_from_odd_values(tmp_path: Path) -> None:
    """What run_record writes is always read back: NaN, infinities and huge integers in a
    record become strings, never a line that report rejects."""
    from loopwarden.plugins.run_record import encode_line
    from loopwarden.report import load_records

    record = {
        "run_id": "odd",
        "termination": "final_answer",
        "cost": float("nan"),
        "tokens": {"prompt": 10**400, "completion": float("inf"), "total": 1},
        "evidence": {"deep": [[[[["x"]]]]], "text": "a\ud800b"},
    }
    path = tmp_path / "runs.jsonl"
    path.write_bytes(encode_line(record))
    loaded = load_records(path)
    assert loaded.skipped == 0
    (back,) = loaded.records
    assert back["cost"] == "nan" and back["tokens"]["completion"] == "inf"
    assert back["evidence"]["text"] == "a\ufffdb"


def test_a_written_record_is_one_line_for_every_line_splitter() -> None:
    """JSON leaves U+2028, U+2029 and U+0085 raw inside strings; str.splitlines (and
    JavaScript) break lines there.  Found by bench/fuzz.py."""
    from loopwarden.plugins.run_record import encode_line

    record = {
        "run_id": "x",
        "termination": "final_answer",
        "final_answer": "a\u2028b\u2029c\x85d\x1ce\x0bf\rg",
    }
    text = encode_line(record).decode("utf-8")
    assert len(text.splitlines()) == 1
    assert json.loads(text)["final_answer"] == record["final_answer"]
