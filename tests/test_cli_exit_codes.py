"""``loopwarden run``'s exit codes against the contract (docs/contracts.md).

The contract's stop-reason table sorts every reason into a family; "could not be carried out"
exits 3, every other family 0 (a decision: the model's or a guard's).  The table is read from
the docs, so a reason added to a family there is checked here too; and a run whose store is
unreachable (``store_unavailable``) exits 3 end to end, on SQLite and on Redis.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopwarden import reasons
from loopwarden.commands.cli import main
from loopwarden.commands.run import EXIT_NOT_CARRIED_OUT, EXIT_OK, exit_code

CONTRACTS = Path(__file__).resolve().parents[1] / "docs" / "contracts.md"
NOT_CARRIED_OUT = "could not be carried out"


def contract_families() -> dict[str, list[str]]:
    """The stop-reason table of docs/contracts.md: family -> the reasons it lists."""
    text = CONTRACTS.read_text(encoding="utf-8")
    section = text.split("## Stop reasons", 1)[1].split("\n## ", 1)[0]
    families: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("family", "") or set(cells[0]) <= {"-"}:
            continue
        # a reason is a code span at the start of the cell or after a comma
        families[cells[0]] = re.findall(r"(?:^|, )`([a-z_]+)`", cells[1])
    return families


def expected_exit(family: str) -> int:
    return EXIT_NOT_CARRIED_OUT if family == NOT_CARRIED_OUT else EXIT_OK


CASES = [
    pytest.param(reason, expected_exit(family), id=f"{reason}")
    for family, names in contract_families().items()
    for reason in names
]


def test_the_contract_table_is_read() -> None:
    families = contract_families()
    assert NOT_CARRIED_OUT in families and "normal endings" in families
    assert len(CASES) >= len(reasons.STOP_REASONS)


@pytest.mark.parametrize(("reason", "code"), CASES)
def test_every_stop_reason_exits_as_its_family_says(reason: str, code: int) -> None:
    assert exit_code({"termination": reason}) == code


def test_the_not_carried_out_family_is_the_contract_row_plus_the_internal_error() -> None:
    listed = set(contract_families()[NOT_CARRIED_OUT])
    assert set(reasons.NOT_CARRIED_OUT_REASONS) == listed | {"error"}
    assert exit_code({"termination": "error"}) == EXIT_NOT_CARRIED_OUT


def test_every_reason_the_project_defines_is_in_the_contract_table() -> None:
    listed = {r for names in contract_families().values() for r in names}
    defined = set(reasons.STOP_REASONS) | set(reasons.BUDGET_REASONS) | set(reasons.ERROR_REASONS)
    assert defined - {"error"} <= listed


@pytest.mark.parametrize("reason", ["forbidden_tool", "my_plugin_reason"])
def test_a_plugins_own_reason_is_a_guard_decision(reason: str) -> None:
    assert exit_code({"termination": reason}) == EXIT_OK


# -- end to end: a store that cannot be reached --------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def unreachable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A ``[store] url`` that cannot be opened: SQLite under a file, Redis on a dead port."""
    if request.param == "sqlite":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        yield f"sqlite:///{blocker / 'store.sqlite3'}"
        return
    pytest.importorskip("redis")
    request.getfixturevalue("redis_server")  # the Redis half runs where Redis tests run
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"  # nothing listens there


def test_run_exits_3_when_the_shared_store_is_unavailable(
    unreachable_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        f"""
[store]
url = "{unreachable_store}"
timeout_s = 0.5
[plugins]
enabled = ["spend_limits"]
[plugins.spend_limits]
budgets = [{{ scope = "tenant", window = "day", max_runs = 3 }}]
""",
        encoding="utf-8",
    )
    code = main(["run", "--scenario", "refund", "--config", str(config), "--meta", "tenant=acme"])
    out = capsys.readouterr().out
    assert "termination: store_unavailable" in out
    assert code == EXIT_NOT_CARRIED_OUT
