"""The console is safe by default: a token to reach it, loopback only without one, read-only
unless resets are allowed, CSRF-checked confirmed resets, redaction, and hostile records shown
as text -- asserted on the bytes served."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.console_records import Made, copy_of, shared_records

from loopwarden.config import load_config
from loopwarden.console.app import COOKIE, Console, Response
from loopwarden.console.assemble import console_from_config
from loopwarden.console.index import RecordIndex
from loopwarden.redaction import Redactor
from loopwarden.store import Shared

LOCAL = {"Host": "127.0.0.1:8377"}


@pytest.fixture
def made(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Made:
    return copy_of(shared_records(tmp_path_factory.mktemp("console-records")), tmp_path)


@pytest.fixture
def shared(made: Made) -> Iterator[Shared]:
    s = Shared(load_config(str(made.config)).store)
    yield s
    s.close()


def _console(made: Made, shared: Shared, tmp_path: Path, **kw: object) -> Console:
    return console_from_config(
        load_config(str(made.config)),
        shared,
        index_file=tmp_path / "index.sqlite3",
        **kw,  # type: ignore[arg-type]
    )


def _open_breaker(shared: Shared) -> str:
    keys = [b.key for b in shared.store.breakers() if b.state == "open"]
    assert keys
    return keys[0]


def _post(app: Console, form: dict[str, str], headers: dict[str, str] | None = None) -> Response:
    from urllib.parse import urlencode

    return app.handle(
        "POST", "/breakers/reset", "", {**LOCAL, **(headers or {})}, urlencode(form).encode()
    )


# -- token -----------------------------------------------------------------------------------


def test_a_token_is_needed_for_every_page(made: Made, shared: Shared, tmp_path: Path) -> None:
    app = _console(made, shared, tmp_path, token="s3cret-token")
    for path in ("/", "/runs", "/budgets", "/breakers", "/api/runs", "/static/console.css"):
        resp = app.handle("GET", path, "", {"Host": "console.example:8377"})
        assert resp.status == 401, path
        assert b"runs-table" not in resp.body
    wrong = app.handle("GET", "/runs", "token=nope", LOCAL)
    assert wrong.status == 401
    bearer = app.handle("GET", "/runs", "", {**LOCAL, "Authorization": "Bearer s3cret-token"})
    assert bearer.status == 200 and b'id="runs-table"' in bearer.body
    assert app.handle("GET", "/healthz", "", {}).status == 200  # a probe needs no token


def test_a_token_in_the_query_sets_a_strict_httponly_cookie(
    made: Made, shared: Shared, tmp_path: Path
) -> None:
    app = _console(made, shared, tmp_path, token="s3cret-token")
    first = app.handle("GET", "/", "token=s3cret-token", {"Host": "h"})
    assert first.status == 200
    cookie = first.header("Set-Cookie") or ""
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    assert "s3cret-token" not in value  # the cookie is not the token itself
    again = app.handle("GET", "/runs", "", {"Host": "h", "Cookie": value})
    assert again.status == 200
    forged = app.handle("GET", "/runs", "", {"Host": "h", "Cookie": f"{COOKIE}=s3cret-token"})
    assert forged.status == 401


def test_without_a_token_only_loopback_hosts_are_answered(
    made: Made, shared: Shared, tmp_path: Path
) -> None:
    app = _console(made, shared, tmp_path)
    for host in ("127.0.0.1:8377", "localhost:8377", "[::1]:8377", "localhost"):
        assert app.handle("GET", "/runs", "", {"Host": host}).status == 200, host
    for host in ("evil.example", "evil.example:8377", "127.0.0.1.evil.example", ""):
        resp = app.handle("GET", "/runs", "", {"Host": host})
        assert resp.status == 403, host  # DNS rebinding: another site's name for 127.0.0.1
        assert b"runs-table" not in resp.body


def test_binding_elsewhere_without_a_token_is_refused(made: Made, tmp_path: Path) -> None:
    import os

    env = {**os.environ, "LOOPWARDEN_DATA_DIR": str(tmp_path)}
    env.pop("LOOPWARDEN_CONSOLE_TOKEN", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loopwarden",
            "console",
            "--config",
            str(made.config),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to bind 0.0.0.0 without a token" in done.stderr
    assert done.stdout == ""


# -- resets: read-only, CSRF, confirm ---------------------------------------------------------


def test_resets_are_refused_unless_allowed(made: Made, shared: Shared, tmp_path: Path) -> None:
    app = _console(made, shared, tmp_path)
    key = _open_breaker(shared)
    resp = _post(app, {"key": key, "csrf": app.csrf_token(), "confirm": "yes"})
    assert resp.status == 403
    body = resp.body.decode()
    assert 'id="message"' in body and "Resets are not allowed" in body
    assert "--allow-resets" in body
    assert key in {b.key for b in shared.store.breakers() if b.state == "open"}
    assert app.handle("GET", "/breakers/reset", "", LOCAL).status == 404


def test_a_confirmed_reset_with_the_csrf_token_resets_the_breaker(
    made: Made, shared: Shared, tmp_path: Path
) -> None:
    app = _console(made, shared, tmp_path, allow_resets=True)
    key = _open_breaker(shared)
    no_csrf = _post(app, {"key": key, "confirm": "yes"})
    bad_csrf = _post(app, {"key": key, "confirm": "yes", "csrf": "0" * 64})
    unconfirmed = _post(app, {"key": key, "csrf": app.csrf_token()})
    assert (no_csrf.status, bad_csrf.status, unconfirmed.status) == (403, 403, 400)
    assert b"CSRF" in no_csrf.body
    assert key in {b.key for b in shared.store.breakers()}  # nothing happened yet
    done = _post(app, {"key": key, "csrf": app.csrf_token(), "confirm": "yes"})
    assert done.status == 200
    assert f"Reset {key}.".encode() in done.body
    assert key not in {b.key for b in shared.store.breakers()}  # as `breakers reset` leaves it
    assert f'data-breaker="{key}"'.encode() not in done.body
    again = _post(app, {"key": key, "csrf": app.csrf_token(), "confirm": "yes"})
    assert again.status == 200 and b"already closed" in again.body


def test_the_csrf_token_is_per_console(made: Made, shared: Shared, tmp_path: Path) -> None:
    one = _console(made, shared, tmp_path, allow_resets=True)
    other = _console(made, shared, tmp_path, allow_resets=True)
    assert one.csrf_token() != other.csrf_token()
    key = _open_breaker(shared)
    assert _post(one, {"key": key, "csrf": other.csrf_token(), "confirm": "yes"}).status == 403


def test_a_reset_needs_the_token_too(made: Made, shared: Shared, tmp_path: Path) -> None:
    app = _console(made, shared, tmp_path, allow_resets=True, token="s3cret-token")
    key = _open_breaker(shared)
    resp = _post(app, {"key": key, "csrf": app.csrf_token(), "confirm": "yes"})
    assert resp.status == 401
    assert key in {b.key for b in shared.store.breakers()}


# -- hostile records --------------------------------------------------------------------------

HOSTILE = [
    "<script>alert('x')</script>",
    '"><img src=x onerror=alert(1)>',
    "</pre></main><script src=//evil.example/x.js></script>",
    "\u202egnp.exe\u200b\u0000\x1b]8;;http://evil\x07",
    "javascript:alert(1)",
]


def _hostile_records(path: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, text in enumerate(HOSTILE):
        rows.append(
            {
                "run_id": f"h{i}{text}",
                "scenario": text,
                "termination": f"stall{text}",
                "stopped_by": text,
                "model": text,
                "meta": {"tenant": text},
                "steps": 1,
                "tool_calls": 1,
                "tokens": {"prompt": 1, "completion": 1, "total": 2},
                "evidence": {"signature": text, "tool": text, "count": 3},
                "warnings": [{"step": 1, "plugin": text, "message": text}],
                "verdicts": [
                    {"step": 1, "hook": "after_tool", "plugin": text, "kind": "warn"},
                    {"step": 1, "hook": "after_tool", "plugin": text, "kind": "stop"},
                ],
                "final_answer": text * 3,
                "trajectory": [
                    {
                        "content": text,
                        "tool_calls": [{"name": text, "arguments": text}],
                        "observations": [text],
                    }
                ],
                "shadow_stop": {"plugin": text, "reason": text, "step": 1},
                "mode": "shadow",
            }
        )
    rows.append(
        {
            "run_id": "huge",
            "termination": "stall",
            "final_answer": "A" * 2_000_000,
            "scenario": "B" * 100_000,
        }
    )
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return rows


def _assert_inert(body: bytes) -> None:
    text = body.decode("utf-8")
    # the markup a record holds appears only escaped (as &lt;script&gt; ... text)
    for needle in ("<script>alert", "<img", "<script src=//evil", "</pre></main><script"):
        assert needle not in text, needle
    # the only script is the console's own
    assert text.count("<script") == text.count('<script src="/static/console.js" defer>')


def test_hostile_records_are_shown_as_text_never_run(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    rows = _hostile_records(records)
    app = Console(RecordIndex(records, tmp_path / "i.sqlite3"))
    app.index.refresh()
    pages = ["/", "/runs", *[f"/runs/{r['run_id']}" for r in rows]]
    for path in pages:
        from urllib.parse import quote

        resp = app.handle("GET", quote(path), "", LOCAL)
        assert resp.status == 200, path
        _assert_inert(resp.body)
        assert (resp.header("Content-Security-Policy") or "").startswith("default-src 'self'")
        assert resp.header("X-Content-Type-Options") == "nosniff"
    one = app.handle("GET", "/runs/h0%3Cscript%3Ealert('x')%3C%2Fscript%3E", "", LOCAL)
    assert b"&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in one.body
    # the filters echo what was typed, escaped
    echoed = app.handle("GET", "/runs", "q=%22%3E%3Cscript%3Ealert(1)%3C/script%3E", LOCAL)
    assert b'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in echoed.body
    _assert_inert(echoed.body)
    # JSON answers escape markup too (ensure_ascii and a JSON content type)
    api = app.handle("GET", "/api/runs", "", LOCAL)
    assert api.header("Content-Type") == "application/json"
    assert b"<script>" not in api.body


def test_huge_strings_are_cut_in_tables_and_whole_on_the_run_page(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    _hostile_records(records)
    app = Console(RecordIndex(records, tmp_path / "i.sqlite3"))
    listing = app.handle("GET", "/runs", "", LOCAL)
    assert b"B" * 200 not in listing.body
    assert len(listing.body) < 200_000
    page = app.handle("GET", "/runs/huge", "", LOCAL)
    assert b"A" * 2_000_000 in page.body


def test_odd_unicode_is_served_as_valid_utf8_text(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    records.write_bytes(
        b'{"run_id": "u1", "termination": "stall", "final_answer": "\\ud800 lone \xe2\x80\xae '
        b'rtl \xf0\x9f\x90\x8d snake \xe6\xb8\xac\xe8\xa9\xa6"}\n'
        b'{"run_id": "u2", "termination": "stall", "final_answer": "bad byte \xff here"}\n'
    )
    app = Console(RecordIndex(records, tmp_path / "i.sqlite3"))
    for path in ("/", "/runs", "/runs/u1", "/runs/u2"):
        resp = app.handle("GET", path, "", LOCAL)
        resp.body.decode("utf-8")  # never invalid bytes
        assert resp.status in (200, 404), path
    # a lone surrogate or an undecodable byte makes the line corrupt, as report counts it
    assert app.handle("GET", "/runs/u1", "", LOCAL).status == 404
    assert app.index.skipped == 2


def test_secrets_are_redacted_everywhere_shown(tmp_path: Path) -> None:
    records = tmp_path / "runs.jsonl"
    key = "sk-abcdefghijklmnopqrstuvwx"
    records.write_text(
        json.dumps(
            {
                "run_id": "sec",
                "termination": "repeat_call",
                "stopped_by": "repeat_call",
                "evidence": {"signature": f'fetch({{"api_key": "{key}"}})', "count": 3},
                "trajectory": [
                    {
                        "content": "",
                        "tool_calls": [
                            {
                                "name": "fetch",
                                "arguments": json.dumps({"password": "hunter22", "q": "x"}),
                            }
                        ],
                        "observations": [f"Authorization: Bearer {key}"],
                    }
                ],
                "final_answer": f"my key is {key}",
                "meta": {"tenant": "acme"},
            }
        )
        + "\n",
        encoding="utf-8",
    )
    app = Console(RecordIndex(records, tmp_path / "i.sqlite3"), redactor=Redactor())
    for path in ("/", "/runs", "/runs/sec", "/api/runs/sec", "/api/overview", "/api/runs"):
        body = app.handle("GET", path, "", LOCAL).body
        assert key.encode() not in body, path
        assert b"hunter22" not in body, path
    assert b"[REDACTED]" in app.handle("GET", "/runs/sec", "", LOCAL).body


def test_under_the_gateway_without_a_token_only_this_machine_is_answered(
    made: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopwarden.console.asgi import ConsoleASGI

    monkeypatch.delenv("LOOPWARDEN_CONSOLE_TOKEN", raising=False)
    config = load_config(str(made.config))
    mounted = ConsoleASGI.from_config(config)
    try:
        app = mounted.console
        assert app.base == "/console/" and app.token is None
        # a remote peer cannot pass by naming 127.0.0.1 in its Host header
        remote = app.handle("GET", "/console/runs", "", LOCAL, peer="203.0.113.7")
        assert remote.status == 403 and b"LOOPWARDEN_CONSOLE_TOKEN" in remote.body
        local = app.handle("GET", "/console/runs", "", LOCAL, peer="127.0.0.1")
        assert local.status == 200 and b'href="/console/runs/' in local.body
    finally:
        mounted.close()


def test_under_the_gateway_the_token_opens_it_to_any_peer(
    made: Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loopwarden.console.asgi import ConsoleASGI

    monkeypatch.setenv("LOOPWARDEN_CONSOLE_TOKEN", "gw-console-token")
    mounted = ConsoleASGI.from_config(load_config(str(made.config)))
    try:
        app = mounted.console
        headers = {"Host": "gw.example", "Authorization": "Bearer gw-console-token"}
        assert app.handle("GET", "/console/runs", "", headers, peer="203.0.113.7").status == 200
        bare = app.handle("GET", "/console/runs", "", {"Host": "gw.example"}, peer="203.0.113.7")
        assert bare.status == 401
    finally:
        mounted.close()
