"""The console in a real browser, used as an operator would use it.

``loopwarden console`` runs as a subprocess over run records that the demo's scenarios wrote
into a temporary home (``loopwarden demo`` with the records plugin on, then ``loopwarden run``
with a tenant), with a circuit breaker opened in a SQLite store by the ``outage`` scenario.
Headless Chromium (Debian's package, through Playwright; see :mod:`support.browser`) opens the
overview, filters the runs to a guard, opens a run and reads its verdict and evidence, watches
a new run appear without a reload, and resets a breaker -- refused without ``--allow-resets``,
done with it; it needs the token where one is set, and a record full of markup and scripts is
shown as text, never run.

With ``LOOPWARDEN_SCREENSHOTS=DIR`` set, the tests save what the browser showed as PNGs in DIR
(docs/console.md shows them: ``LOOPWARDEN_SCREENSHOTS=docs/console``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import Console, launch_chromium

#: a browser and a console over demo records, started per module: seconds, not milliseconds
pytestmark = pytest.mark.slow

#: how long a page may take to show what it should (the console polls every 2 s)
WAIT_MS = 15_000

CONFIG = """\
[store]
url = "sqlite:///{home}/store.sqlite3"

[plugins]
enabled = [
    "max_steps", "timeout", "token_budget", "cost_budget", "tool_calls", "spend_limits",
    "circuit_breaker", "retry_policy", "terminal_tool", "repeat_call", "oscillation",
    "no_progress", "stall", "failure_streak", "run_record",
]

[plugins.run_record]
path = "{home}/runs.jsonl"
trajectory = true
steps_detail = true

[plugins.spend_limits]
budgets = [{{ scope = "tenant", window = "day", max_tokens = 200000, warn_at = 0.8 }}]

[plugins.circuit_breaker]
# one tenant's outage opens the tool's breaker (the shipped default waits for two)
failures = 2
min_calls = 2
min_sources = 1
open_s = 3600.0
"""


def _env(home: Path) -> dict[str, str]:
    """The environment of a user whose home, data and config are ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        LOOPWARDEN_DATA_DIR=str(home / "data" / "loopwarden"),
    )
    return env


def _loopwarden(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden", *args, "--config", str(home / "config.toml")],
        env=_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=300,
    )


def play(home: Path, scenario: str, tenant: str) -> dict[str, Any]:
    """One run of a built-in scenario (its record appended to the records file)."""
    proc = _loopwarden(home, "run", "--scenario", scenario, "--meta", f"tenant={tenant}", "--json")
    lines = proc.stdout.strip().splitlines()
    assert lines, f"loopwarden run --scenario {scenario}: {proc.stderr}"
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def records(home: Path) -> list[dict[str, Any]]:
    text = (home / "runs.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def make_home(home: Path) -> None:
    """Records of every demo scenario, a tenant's runs and an open breaker under ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(CONFIG.format(home=home.as_posix()), encoding="utf-8")
    # the demo's guarded runs, recorded (its table says FAILED where the breaker changes an
    # outcome the demo expects, hence no check of its exit status)
    # (--no-records: its console sample's tenant and breaker would blur the checks below)
    demo = _loopwarden(home, "demo", "--observers", "--quiet", "--no-records")
    assert (home / "runs.jsonl").is_file(), demo.stdout + demo.stderr
    play(home, "refund", "acme")
    outage = play(home, "outage", "acme")
    assert outage["termination"] == "circuit_open", outage
    shown = json.loads(_loopwarden(home, "breakers", "--json").stdout)
    assert any(b["state"] == "open" for b in shown["breakers"]), shown


def copy_home(source: Path, target: Path) -> Path:
    """A copy of a home with its config pointing at the copy (its own store and records)."""
    shutil.copytree(source, target)
    text = (source / "config.toml").read_text("utf-8")
    (target / "config.toml").write_text(
        text.replace(source.as_posix(), target.as_posix()), encoding="utf-8"
    )
    return target


def console_args(home: Path, *extra: str) -> list[str]:
    return [
        "--records",
        str(home / "runs.jsonl"),
        "--config",
        str(home / "config.toml"),
        "--port",
        "0",
        *extra,
    ]


def shot(page: Any, name: str) -> None:
    """Save what the page shows when ``LOOPWARDEN_SCREENSHOTS`` names a directory."""
    where = os.environ.get("LOOPWARDEN_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


def open_breaker_key(home: Path) -> str:
    """The name of the tool whose breaker the ``outage`` run opened."""
    shown = json.loads(_loopwarden(home, "breakers", "--json").stdout)
    (name,) = [b["name"] for b in shown["breakers"] if b["state"] == "open"]
    assert isinstance(name, str)
    return name


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Path:
    """The recorded runs and the store (made after the browser is known to be there)."""
    path = tmp_path_factory.mktemp("console") / "home"
    make_home(path)
    return path


@pytest.fixture(scope="module")
def console(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """A read-only console (no --allow-resets) over the home's records and store."""
    c = Console(console_args(home), _env(home), tmp_path_factory.mktemp("log") / "console.log")
    yield c
    c.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser tab (its own cookies) that records its script errors, what Chromium
    refuses for it (the CSP) and the page's assets or polls that fail (``errors``)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    tab.errors = []
    tab.on("pageerror", lambda exc: tab.errors.append(str(exc)))

    def logged(msg: Any) -> None:
        # a page answered 4xx on purpose is checked by its test; failed assets come below
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            tab.errors.append(msg.text)

    def answered(response: Any) -> None:
        request = response.request
        if (
            response.status >= 400
            and request.resource_type != "document"
            and not request.url.endswith("/favicon.ico")  # asked by the browser, not the page
        ):
            tab.errors.append(f"{response.status} {request.method} {request.url}")

    tab.on("console", logged)
    tab.on("response", answered)
    yield tab
    context.close()


def submit(page: Any, form: str) -> None:
    """Submit a form as a person does: its submit button, else Enter in its first field."""
    button = page.locator(f"{form} [type=submit], {form} button:not([type])")
    with page.expect_navigation():
        if button.count():
            button.first.click()
        else:
            page.locator(f"{form} input:not([type=hidden])").first.press("Enter")


# ---------------------------------------------------------------------------------------------
# the views
# ---------------------------------------------------------------------------------------------


def test_the_overview_shows_runs_by_termination_and_the_reports_stop_reasons(
    page: Any, console: Console, home: Path
) -> None:
    response = page.goto(console.url)
    assert response is not None and response.status == 200
    page.wait_for_selector("main#overview")
    assert page.locator("#runs-by-termination svg").count() >= 1
    for part in ("#savings", "#top-reasons", "#shadow"):
        assert page.locator(part).is_visible(), part
    # the stop reasons are the report's (one source of truth): each guard with its stops
    report = json.loads(_loopwarden(home, "report", str(home / "runs.jsonl"), "--json").stdout)
    stops: dict[str, int] = report["stopped_by"]
    rows = page.locator("#top-reasons tr[data-reason]")
    assert rows.count() >= 1
    for i in range(rows.count()):
        row = rows.nth(i)
        reason = row.get_attribute("data-reason")
        assert reason in stops, (reason, stops)
        assert re.search(rf"\b{stops[reason]}\b", row.inner_text()), (reason, row.inner_text())
    # long call signatures ("Most repeated calls") wrap: the page is no wider than the window
    assert page.locator("#top-reasons code").count() >= 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    assert page.errors == []
    shot(page, "overview")


def test_filtering_runs_to_a_guard(page: Any, console: Console, home: Path) -> None:
    page.goto(console.url + "runs")
    page.wait_for_selector("#runs-table")
    everyone = page.locator("#runs-table tr[data-run-id]").count()
    assert everyone >= 1
    page.select_option("#runs-filter select[name=guard]", "repeat_call")
    submit(page, "#runs-filter")
    page.wait_for_url(re.compile(r"[?&]guard=repeat_call"))
    page.wait_for_selector("#runs-table")
    shown = [
        page.locator("#runs-table tr[data-run-id]").nth(i).get_attribute("data-run-id")
        for i in range(page.locator("#runs-table tr[data-run-id]").count())
    ]
    by_id = {r["run_id"]: r for r in records(home)}
    stopped = {i for i, r in by_id.items() if r["stopped_by"] == "repeat_call"}
    assert stopped and stopped <= set(shown), (stopped, shown)
    for run_id in shown:  # only runs that guard stopped or judged
        r = by_id[run_id]
        judged = {v.get("plugin") for v in r.get("verdicts") or []}
        assert r["stopped_by"] == "repeat_call" or "repeat_call" in judged, r
    assert len(shown) < everyone
    assert str(len(shown)) in page.inner_text("#runs-count")
    assert page.errors == []
    shot(page, "runs-filtered")


def test_a_run_shows_its_steps_the_verdict_and_its_evidence(
    page: Any, console: Console, home: Path
) -> None:
    run = next(r for r in records(home) if r["scenario"] == "always-not-found")
    page.goto(console.url + "runs?termination=repeat_call")
    page.locator(f'#runs-table tr[data-run-id="{run["run_id"]}"] a').first.click()
    page.wait_for_url(re.compile(rf"/runs/{run['run_id']}$"))
    page.wait_for_selector("main#run")
    shot(page, "run")
    assert page.locator("#timeline li.step.model").count() == run["steps"]
    tools = page.locator("#timeline li.step.tool")
    assert tools.count() >= 1
    assert "99999" in tools.first.locator(".arguments").inner_text()
    assert "NOT_FOUND" in tools.first.locator(".answer").inner_text()
    stops = page.locator("#timeline li.verdict").filter(
        has=page.locator(".action", has_text=re.compile(r"^stop"))
    )
    assert stops.count() == 1
    verdict = stops.first
    assert verdict.locator(".guard").inner_text().strip() == "repeat_call"
    evidence = verdict.locator(".evidence").inner_text()
    assert "query_order" in evidence and str(run["evidence"]["count"]) in evidence
    notes = " ".join(page.locator("#timeline li.verdict .note").all_inner_texts())
    assert run["warnings"][0]["message"].split(";")[0] in notes
    assert page.inner_text("#final-answer").strip() == run["final_answer"]
    assert "repeat_call" in page.inner_text("#termination")
    assert page.errors == []
    # an id that is no run
    missing = page.goto(console.url + "runs/no-such-run")
    assert missing is not None and missing.status == 404


def test_budgets_show_a_tenants_spend_and_limit(page: Any, console: Console) -> None:
    page.goto(console.url + "budgets")
    row = page.locator('#budgets-table tr[data-scope="tenant"][data-key="acme"]').first
    row.wait_for()
    assert re.search(r"\d", row.locator(".spent").inner_text())
    assert "200" in row.locator(".limit").inner_text().replace(",", "")
    assert page.errors == []
    shot(page, "budgets")


def test_a_new_run_appears_without_a_reload(page: Any, console: Console, home: Path) -> None:
    page.goto(console.url + "runs")
    page.wait_for_selector("#runs-table")
    page.evaluate("window.__not_reloaded = true")
    run = play(home, "always-not-found", "initech")  # appends its record to the file
    row = page.locator(f'#runs-table tr[data-run-id="{run["run_id"]}"]')
    row.wait_for(timeout=WAIT_MS)
    assert "new" in (row.get_attribute("class") or "").split()
    assert page.evaluate("window.__not_reloaded === true"), "the page was reloaded"
    first = page.locator("#runs-table tr[data-run-id]").first
    assert first.get_attribute("data-run-id") == run["run_id"], "newest first"
    assert page.errors == []
    shot(page, "new-run")


# ---------------------------------------------------------------------------------------------
# breakers: reset refused when read-only, done when allowed
# ---------------------------------------------------------------------------------------------


def reset_breaker(page: Any, url: str, tool: str) -> None:
    """Open the breakers page and reset the breaker of ``tool``, confirming when asked."""
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(url + "breakers")
    row = page.locator("#breakers-table tr[data-breaker]").filter(has_text=tool).first
    row.wait_for()
    assert row.locator(".state").inner_text().strip() == "open"
    form = row.locator("form.reset")
    assert form.locator('input[name="csrf"]').count() == 1
    confirm = form.locator('input[name="confirm"]')
    if confirm.count() and confirm.first.get_attribute("type") in ("checkbox", "radio"):
        confirm.first.check()
    with page.expect_navigation():
        form.locator("button.reset").click()
    if page.locator("#message").count() == 0:  # a confirmation page of its own: confirm there
        with page.expect_navigation():
            page.locator("button.reset").first.click()


def test_a_reset_is_refused_without_allow_resets(page: Any, console: Console, home: Path) -> None:
    tool = open_breaker_key(home)
    statuses: list[int] = []
    page.on(
        "response",
        lambda r: statuses.append(r.status) if r.request.method == "POST" else None,
    )
    reset_breaker(page, console.url, tool)
    message = page.locator("#message").inner_text()
    assert "not allowed" in message.lower(), message
    assert "--allow-resets" in message, message
    assert 403 in statuses, statuses
    shot(page, "breakers-refused")
    assert open_breaker_key(home) == tool, "the breaker is still open"


def test_a_confirmed_reset_closes_the_breaker_with_allow_resets(
    page: Any, home: Path, tmp_path: Path
) -> None:
    own = copy_home(home, tmp_path / "home")  # its own store: the other tests keep theirs
    tool = open_breaker_key(own)
    console = Console(console_args(own, "--allow-resets"), _env(own), tmp_path / "console.log")
    try:
        reset_breaker(page, console.url, tool)
        message = page.locator("#message").inner_text()
        assert "reset" in message.lower() and tool in message, message
        shot(page, "breakers-reset")
        page.goto(console.url + "breakers")
        page.wait_for_selector("#breakers-table")
        still = page.locator("#breakers-table tr[data-breaker]").filter(has_text=tool)
        assert all(s.strip() != "open" for s in still.locator(".state").all_inner_texts())
    finally:
        console.stop()
    shown = json.loads(_loopwarden(own, "breakers", "--json").stdout)
    assert all(b["state"] != "open" for b in shown["breakers"] if b["name"] == tool), shown


# ---------------------------------------------------------------------------------------------
# access and hostile records
# ---------------------------------------------------------------------------------------------


def test_with_a_token_the_page_opens_only_with_it(page: Any, home: Path, tmp_path: Path) -> None:
    token = "s3cret-console-token"
    console = Console(console_args(home, "--token", token), _env(home), tmp_path / "console.log")
    try:
        refused = page.goto(console.url + "runs")
        assert refused is not None and refused.status == 401
        assert page.locator("#runs-table").count() == 0
        opened = page.goto(console.url + "?token=" + token)
        assert opened is not None and opened.status == 200
        page.wait_for_selector("main#overview")
        # the cookie carries the visit on: links work without the token in the address
        with page.expect_navigation():
            page.locator('a[href$="runs"]').first.click()
        assert "token=" not in page.url
        page.wait_for_selector("#runs-table tr[data-run-id]")
        cookies = {c["name"]: c for c in page.context.cookies()}
        assert cookies["lw_console"]["httpOnly"] is True
        assert cookies["lw_console"]["sameSite"] == "Strict"
    finally:
        console.stop()


HOSTILE = (
    '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
    "\u202ereversed\u202c \u0000 \x1b[31m" + "A" * 20_000
)


def test_a_hostile_record_is_shown_as_text_and_never_run(
    page: Any, console: Console, home: Path
) -> None:
    template = next(r for r in records(home) if r["scenario"] == "always-not-found")
    record = {
        **template,
        "run_id": "hostile-0001",
        "scenario": "<b>bold</b>",
        "final_answer": HOSTILE,
        "meta": {"tenant": '"><script>window.__pwned = 3</script>'},
    }
    with (home / "runs.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(console.url + "runs")
    row = page.locator('#runs-table tr[data-run-id="hostile-0001"]')
    row.wait_for(timeout=WAIT_MS)
    assert "<b>bold</b>" in row.inner_text()
    page.goto(console.url + "runs/hostile-0001")
    page.wait_for_selector("main#run")
    shown = page.inner_text("#final-answer")
    assert "<script>window.__pwned = 1</script>" in shown
    assert page.locator("main#run script, main#run img").count() == 0
    assert page.evaluate("window.__pwned === undefined")
    assert dialogs == [] and page.errors == []
