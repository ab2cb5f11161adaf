"""The console's pages and API over records the demo wrote and a real SQLite store: every view
has data, the overview's figures are ``loopwarden report``'s, new runs arrive through
``/api/changes``; the command serves it over real HTTP, and the gateway mounts it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from support.console_records import Made, copy_of, shared_records

from loopwarden.config import load_config
from loopwarden.console.app import Console, Response
from loopwarden.console.assemble import console_from_config
from loopwarden.report import analyse, load_records
from loopwarden.store import Shared

LOCAL = {"Host": "127.0.0.1:8377"}


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.text_parts: list[str] = []

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(self.text_parts) + "".join(c.text() for c in self.children)

    def iter(self) -> Iterator[Element]:
        for c in self.children:
            yield c
            yield from c.iter()

    def find_all(
        self, tag: str | None = None, cls: str | None = None, **attrs: str
    ) -> list[Element]:
        return [
            e
            for e in self.iter()
            if (tag is None or e.tag == tag)
            and (cls is None or cls in e.classes)
            and all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Element:
        found = self.find_all(tag, cls, **attrs)
        assert len(found) == 1, (tag, cls, attrs, len(found))
        return found[0]


_VOID = {"meta", "link", "input", "br", "img", "hr", "rect", "line"}


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        e = Element(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(e)
        if tag not in _VOID:
            self.cur = e

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        e: Element | None = self.cur
        while e is not None and e.tag != tag:
            e = e.parent
        if e is not None and e.parent is not None:
            self.cur = e.parent

    def handle_data(self, data: str) -> None:
        self.cur.text_parts.append(data)


def parse(resp: Response) -> Element:
    p = _Parser()
    p.feed(resp.body.decode("utf-8"))
    return p.root


@pytest.fixture
def made(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Made:
    return copy_of(shared_records(tmp_path_factory.mktemp("console-records")), tmp_path)


@pytest.fixture
def console(made: Made, tmp_path: Path) -> Iterator[Console]:
    config = load_config(str(made.config))
    shared = Shared(config.store)
    app = console_from_config(config, shared, index_file=tmp_path / "index.sqlite3")
    yield app
    app.index.close()
    shared.close()


def get(app: Console, path: str, query: str = "") -> Response:
    return app.handle("GET", path, query, LOCAL)


def test_overview_has_every_part_with_data(console: Console, made: Made) -> None:
    resp = get(console, "/")
    assert resp.status == 200
    assert (resp.header("Content-Security-Policy") or "").startswith("default-src 'self'")
    doc = parse(resp)
    main = doc.one("main", id="overview")
    chart = main.one("section", id="runs-by-termination")
    assert chart.find_all("svg") and chart.find_all("rect", data_termination="repeat_call")
    report = analyse(load_records(made.records).records)
    reasons = {
        e.attrs["data-reason"]
        for e in main.one(id="top-reasons").find_all("tr")
        if "data-reason" in e.attrs
    }
    assert reasons == set(report["stopped_by"]) and reasons
    savings = main.one(id="savings")
    assert {e.attrs["data-guard"] for e in savings.find_all("tr") if "data-guard" in e.attrs} == (
        reasons
    )
    shadow = main.one(id="shadow")
    assert report["shadow"]["would_stop"] >= 1
    assert shadow.one("b", cls="would-stop").text() == str(report["shadow"]["would_stop"])


def test_overview_figures_are_reports_own(console: Console, made: Made) -> None:
    with made.records.open("a", encoding="utf-8") as fh:
        fh.write("a corrupt line\n")
    loaded = load_records(made.records)
    console._refreshed = 0.0
    data = json.loads(get(console, "/api/overview").body)
    expected = json.loads(json.dumps(analyse(loaded.records, skipped=loaded.skipped)))
    assert data["report"] == expected
    assert data["report"]["skipped_lines"] == 1
    # the page shows the same counts
    doc = parse(get(console, "/"))
    legend = doc.one(id="runs-by-termination").find_all("li")
    shown = {e.attrs["data-termination"]: int(e.one("b").text()) for e in legend}
    assert shown == {t["termination"]: t["runs"] for t in expected["termination"]}
    assert doc.one(id="total-runs").text() == str(expected["runs"])


def test_runs_page_lists_newest_first_and_filters(console: Console, made: Made) -> None:
    records = load_records(made.records).records
    doc = parse(get(console, "/runs"))
    table = doc.one("table", id="runs-table")
    rows = [e for e in table.find_all("tr") if "data-run-id" in e.attrs]
    assert [r.attrs["data-run-id"] for r in rows] == [r["run_id"] for r in reversed(records)]
    for r in rows:
        assert r.one("a").attrs["href"] == f"/runs/{r.attrs['data-run-id']}"
    form = doc.one("form", id="runs-filter")
    guards = [o.attrs["value"] for o in form.one("select", name="guard").find_all("option")]
    assert "circuit_breaker" in guards and "repeat_call" in guards
    assert form.find_all("select", name="termination")
    assert str(len(records)) in doc.one(id="runs-count").text()

    filtered = parse(get(console, "/runs", "guard=circuit_breaker"))
    ids = [e.attrs["data-run-id"] for e in filtered.find_all("tr") if "data-run-id" in e.attrs]
    assert ids and set(ids) == {
        r["run_id"] for r in records if r.get("stopped_by") == "circuit_breaker"
    }
    api = json.loads(get(console, "/api/runs", "guard=circuit_breaker").body)
    assert [r["id"] for r in api["runs"]] == ids and api["total"] == len(ids)
    tenant = parse(get(console, "/runs", "tenant=acme&termination=final_answer"))
    assert len([e for e in tenant.find_all("tr") if "data-run-id" in e.attrs]) == 1


def test_runs_pages_through_with_prev_and_next(tmp_path: Path) -> None:
    from loopwarden.console.index import RecordIndex

    records = tmp_path / "runs.jsonl"
    records.write_text(
        "".join(
            json.dumps({"run_id": f"r{i:03}", "termination": "stall", "stopped_by": "stall"}) + "\n"
            for i in range(120)
        ),
        encoding="utf-8",
    )
    app = Console(RecordIndex(records, tmp_path / "i.sqlite3"))
    first = parse(get(app, "/runs", "guard=stall"))
    assert not first.find_all("a", rel="prev")
    nxt = first.one("a", rel="next").attrs["href"]
    assert nxt.startswith("/runs?") and "guard=stall" in nxt and "page=1" in nxt
    second = parse(get(app, "/runs", nxt.split("?", 1)[1]))
    ids = [e.attrs["data-run-id"] for e in second.find_all("tr") if "data-run-id" in e.attrs]
    assert ids[0] == "r069" and ids[-1] == "r020"
    assert second.find_all("a", rel="prev") and second.find_all("a", rel="next")
    third = parse(get(app, "/runs", "guard=stall&page=2"))
    assert not third.find_all("a", rel="next")
    assert len([e for e in third.find_all("tr") if "data-run-id" in e.attrs]) == 20


def test_one_run_shows_its_timeline(console: Console, made: Made) -> None:
    records = load_records(made.records).records
    record = next(r for r in records if r["termination"] == "stall")
    doc = parse(get(console, f"/runs/{record['run_id']}"))
    main = doc.one("main", id="run")
    timeline = main.one("ol", id="timeline")
    models = timeline.find_all("li", cls="model")
    assert len(models) == len(record["steps_detail"]) == record["steps"]
    assert str(record["steps_detail"][0]["total"]) in models[0].text()
    tools = timeline.find_all("li", cls="tool")
    assert len(tools) == record["tool_calls"]
    first_call = record["trajectory"][0]["tool_calls"][0]
    assert json.loads(tools[0].one(cls="arguments").text()) == json.loads(first_call["arguments"])
    assert tools[0].one(cls="answer").text() == record["trajectory"][0]["observations"][0]
    verdicts = timeline.find_all("li", cls="verdict")
    assert len(verdicts) == len(record["verdicts"])
    stop = next(v for v in verdicts if "stop" in v.classes)
    assert stop.one(cls="guard").text() == "stall"
    assert json.loads(stop.one(cls="evidence").one("pre").text()) == record["evidence"]
    warn = next(v for v in verdicts if "warn" in v.classes)
    assert warn.one(cls="note").one("p").text() == record["warnings"][0]["message"]
    assert record["final_answer"] in main.one(id="final-answer").text()
    assert "stall" in main.one(id="termination").text()


def test_an_unknown_run_is_a_404_page(console: Console) -> None:
    resp = get(console, "/runs/no-such-run")
    assert resp.status == 404
    assert b"no-such-run" in resp.body
    assert get(console, "/api/runs/no-such-run").status == 404
    assert get(console, "/nowhere").status == 404


def test_budgets_and_breakers_come_from_the_store(console: Console, made: Made) -> None:
    config = load_config(str(made.config))
    shared = Shared(config.store)
    try:
        counters = [r.as_dict() for r in shared.store.rows()]
        breakers = [b.as_dict() for b in shared.store.breakers()]
    finally:
        shared.close()
    acme = next(r for r in counters if r["scope"] == "tenant" and r["key"] == "acme")
    doc = parse(get(console, "/budgets"))
    row = doc.one("table", id="budgets-table").one("tr", data_scope="tenant", data_key="acme")
    assert f"tokens {acme['spent']['tokens']}" in row.one(cls="spent").text()
    assert "tokens 500000" in row.one(cls="limit").text()
    assert row.one(cls="reserved").text()
    opened = [b for b in breakers if b["state"] == "open"]
    assert opened
    page = parse(get(console, "/breakers"))
    table = page.one("table", id="breakers-table")
    listed = {e.attrs["data-breaker"] for e in table.find_all("tr") if "data-breaker" in e.attrs}
    assert listed == {b["key"] for b in breakers if b["state"] in ("open", "half_open")}
    row = table.one("tr", data_breaker=opened[0]["key"])
    assert row.one(cls="state").text() == "open"
    form = row.one("form", cls="reset")
    assert form.attrs["method"] == "post" and form.attrs["action"] == "/breakers/reset"
    assert form.one("input", name="key").attrs["value"] == opened[0]["key"]
    assert form.one("input", name="csrf").attrs["value"] == console.csrf_token()
    assert form.find_all("button", cls="reset")
    api = json.loads(get(console, "/api/breakers").body)
    assert {b["key"] for b in api["breakers"]} == {b["key"] for b in breakers}
    assert json.loads(get(console, "/api/budgets").body)["counters"]


def test_new_runs_arrive_through_changes(console: Console, made: Made) -> None:
    doc = parse(get(console, "/runs"))
    body = doc.one("body")
    cursor = body.attrs["data-cursor"]
    assert body.attrs.get("data-poll") == "1"
    empty = json.loads(get(console, "/api/changes", f"after={cursor}").body)
    assert empty["runs"] == [] and str(empty["cursor"]) == cursor
    record = load_records(made.records).records[0]
    with made.records.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({**record, "run_id": "fresh-run"}) + "\n")
    console._refreshed = 0.0
    get(console, "/runs")  # any page refreshes the index
    data = json.loads(get(console, "/api/changes", f"after={cursor}").body)
    assert [r["id"] for r in data["runs"]] == ["fresh-run"]
    assert 'data-run-id="fresh-run" class=new' in data["runs"][0]["html"]
    assert data["total"] == len(load_records(made.records).records)
    assert get(console, "/api/changes", "after=x").status == 400


def test_static_assets_ship_in_the_package(console: Console) -> None:
    css = get(console, "/static/console.css")
    js = get(console, "/static/console.js")
    assert css.status == js.status == 200
    assert (css.header("Content-Type") or "").startswith("text/css")
    assert b"/api/changes" in js.body
    assert get(console, "/static/../app.py").status == 404
    assert get(console, "/healthz").body == b"ok"


def _start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopwarden", "console", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
    return proc, line.strip()


def test_the_command_serves_over_http(made: Made, tmp_path: Path) -> None:
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path)}
    env.pop("LOOPWARDEN_CONSOLE_TOKEN", None)
    proc, line = _start(["--config", str(made.config), "--port", "0"], env)
    try:
        assert line.startswith("console: http://127.0.0.1:") and line.endswith("/")
        url = line.split(" ", 1)[1]
        with urllib.request.urlopen(url + "runs?guard=repeat_call", timeout=10) as resp:
            html = resp.read().decode()
        want = {
            r["run_id"]
            for r in load_records(made.records).records
            if r.get("stopped_by") == "repeat_call"
        }
        assert want and all(f'data-run-id="{i}"' in html for i in want)
        with urllib.request.urlopen(url + "healthz", timeout=10) as resp:
            assert resp.read() == b"ok"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_command_prints_its_token_in_the_url(made: Made, tmp_path: Path) -> None:
    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path), "LOOPWARDEN_CONSOLE_TOKEN": "t0k3n"}
    proc, line = _start(["--config", str(made.config), "--port", "0"], env)
    try:
        assert line.endswith("/?token=t0k3n")
        base = line.split(" ", 1)[1].split("?")[0]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + "runs", timeout=10)
        assert err.value.code == 401
        req = urllib.request.Request(base + "runs", headers={"Authorization": "Bearer t0k3n"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert b'id="runs-table"' in resp.read()
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_gateway_mounts_the_console(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("uvicorn")
    monkeypatch.delenv("LOOPWARDEN_CONSOLE_TOKEN", raising=False)
    from support.gateway import serve

    from loopwarden.deployment import Deployment
    from loopwarden.gateway.app import GatewayApp
    from loopwarden.gateway.state import MemoryState

    text = made.config.read_text(encoding="utf-8") + "\n[gateway]\nconsole = true\n"
    config_file = tmp_path / "gw.toml"
    config_file.write_text(text, encoding="utf-8")
    dep = Deployment(load_config(str(config_file)))
    app = GatewayApp(dep, "http://127.0.0.1:9/v1", MemoryState())
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(serve(app))
        with urllib.request.urlopen(url + "/console/runs?guard=stall", timeout=10) as resp:
            html = resp.read().decode()
        assert 'id="runs-table"' in html and 'href="/console/runs/' in html
        assert 'href="/console/static/console.css"' in html
        with urllib.request.urlopen(url + "/console/static/console.js", timeout=10) as resp:
            assert b"/api/changes" in resp.read()
    dep.close()
    plain = Deployment(load_config(str(made.config)))
    assert GatewayApp(plain, "http://127.0.0.1:9/v1", MemoryState()).console is None
    plain.close()


def test_figures_over_a_large_file_never_make_a_page_wait(made: Made, tmp_path: Path) -> None:
    import time

    from loopwarden.console.index import RecordIndex

    index = RecordIndex(made.records, tmp_path / "big.sqlite3")
    app = Console(index)
    app.figures.sync_limit = 0  # every file counts as large here
    first = get(app, "/")
    assert first.status == 200
    assert b'id="message"' in first.body and b'http-equiv="refresh"' in first.body
    deadline = time.monotonic() + 60
    while (fig := app.figures.overview()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fig is not None
    assert fig["report"] == analyse(load_records(made.records).records)
    assert json.loads(get(app, "/api/overview").body)["report"]["runs"] == fig["report"]["runs"]


def test_a_first_index_in_the_background_says_how_far_it_is_then_serves(
    made: Made, tmp_path: Path
) -> None:
    """The server answers at once; until the first pass is done, a page says "indexing N%"
    and reloads itself, the API answers 503 -- then both serve the records."""
    import threading

    from loopwarden.console.index import RecordIndex

    gate = threading.Event()

    class Gated(RecordIndex):  # the real index, held at the start until the test says so
        def refresh(self) -> int:
            gate.wait(10)
            return super().refresh()

    app = Console(Gated(made.records, tmp_path / "index.sqlite3"))
    thread = app.index_in_background()
    try:
        waiting = get(app, "/")
        assert waiting.status == 503 and waiting.header("Refresh") == "2"
        assert "indexing 0%" in parse(waiting).one("p", id="message").text()
        api = get(app, "/api/runs")
        assert api.status == 503 and json.loads(api.body) == {"indexing": True, "percent": 0}
        assert get(app, "/healthz").status == 200  # the server itself is up
        gate.set()
        thread.join(10)
        assert app.ready.is_set()
        done, size = app.index.progress()
        assert done == size == made.records.stat().st_size
        ready = get(app, "/runs")
        assert ready.status == 200 and ready.header("Refresh") is None
        lines = made.records.read_text(encoding="utf-8").splitlines()
        shown = parse(ready).one("p", id="runs-count").one("b").text()
        assert shown == f"{len(lines):,}" and len(lines) > 1
    finally:
        gate.set()
        thread.join(10)
        app.index.close()


def test_the_console_indexes_in_the_background_past_a_size(made: Made, tmp_path: Path) -> None:
    config = load_config(str(made.config))
    shared = Shared(config.store)
    small = console_from_config(config, shared, index_file=tmp_path / "a.sqlite3")
    assert small.ready.is_set() and small.index.count() > 0  # indexed before it returned
    big = console_from_config(config, shared, index_file=tmp_path / "b.sqlite3", background_over=0)
    try:
        assert big.ready.wait(10)
        assert big.index.count() == small.index.count()
        assert get(big, "/runs").status == 200
    finally:
        small.index.close()
        big.index.close()
        shared.close()
