"""The console as a framework-free request handler: :meth:`Console.handle` takes a method, a
path, a query, headers and a body and returns a :class:`Response`.

The standard library's threading HTTP server serves it (:mod:`loopwarden.console.server`), and
``loopwarden gateway`` mounts the same object under ``/console/``.  The console only reads: the
records file through its index (:mod:`loopwarden.console.index`) and the shared store's
budgets and breakers; the one write is a breaker reset, refused unless resets are allowed.

Safety, all of it here so every front end gets it:

* **token** -- when one is set, a request needs ``Authorization: Bearer TOKEN`` or
  ``?token=TOKEN`` (which sets the HttpOnly, SameSite=Strict cookie ``lw_console`` so the links
  work without it), else a 401 page; without a token only loopback ``Host`` names are answered
  (a page on another site cannot reach the console through DNS rebinding);
* **CSRF** -- a reset is a POST carrying the page's ``csrf`` token (an HMAC of a secret made at
  start-up) and ``confirm=yes``;
* **read-only by default** -- without ``allow_resets`` every reset answers 403;
* **escaping and redaction** -- every text shown is HTML-escaped; records and store values
  pass through the configured :class:`~loopwarden.redaction.Redactor` first;
* **headers** -- ``Content-Security-Policy: default-src 'self'`` (no inline script, no CDN),
  ``X-Content-Type-Options: nosniff``, no framing, no referrer.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import mimetypes
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote

from loopwarden.console import pages
from loopwarden.console.figures import Figures
from loopwarden.console.index import FILTERS, Filters, RecordIndex
from loopwarden.redaction import Redactor

__all__ = ["COOKIE", "Console", "Response", "StoreView"]

log = logging.getLogger("loopwarden.console")

#: the cookie a ``?token=`` sets
COOKIE = "lw_console"
#: runs per page
PAGE_SIZE = 50
#: at most this often the index looks for appended records (seconds)
REFRESH_S = 0.5
#: the Host names answered when no token is set
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})

CSP = (
    "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


@dataclass
class Response:
    """What :meth:`Console.handle` answers: a status, headers and the body's bytes."""

    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


@dataclass
class StoreView:
    """What the console reads from (and, for a reset, writes to) the shared store.

    ``budgets`` returns ``loopwarden budgets --json``'s rows (with ``limits``); ``breakers``
    ``loopwarden breakers --json``'s; ``reset(key)`` resets one breaker by its store key as
    ``loopwarden breakers reset`` does and returns whether it existed.  Each may raise: the
    page then says the store could not be read.
    """

    budgets: Callable[[], list[dict[str, Any]]]
    breakers: Callable[[], list[dict[str, Any]]]
    reset: Callable[[str], bool]
    budgets_note: str = ""
    breakers_note: str = ""


def _empty_store() -> StoreView:
    return StoreView(lambda: [], lambda: [], lambda key: False)


class Console:
    """The console application (see the module docstring).

    :param index: the records' index.
    :param store: the shared store's budgets and breakers.
    :param token: the token every request must carry (None: none, loopback only).
    :param allow_resets: whether a confirmed breaker reset is carried out.
    :param redactor: masks secrets in everything shown.
    :param base: the path the console is served under (``/``, or ``/console/`` in the gateway).
    :param step_cap: the step cap the savings estimate assumes.
    :param loopback_only: without a token, answer only loopback ``Host`` names.
    """

    def __init__(
        self,
        index: RecordIndex,
        store: StoreView | None = None,
        *,
        token: str | None = None,
        allow_resets: bool = False,
        redactor: Redactor | None = None,
        base: str = "/",
        step_cap: int | None = None,
        loopback_only: bool = True,
    ) -> None:
        self.index = index
        self.store = store or _empty_store()
        self.token = token or None
        self.allow_resets = allow_resets
        self.redactor = redactor or Redactor()
        self.base = base if base.endswith("/") else base + "/"
        self.loopback_only = loopback_only
        #: without a token, also refuse peers that are not this machine (the gateway's
        #: mount: it may listen on any address)
        self.require_local_peer = False
        self.figures = Figures(index, **({"step_cap": step_cap} if step_cap else {}))
        self._secret = secrets.token_bytes(32)
        self._refreshed = 0.0
        self._refresh_lock = threading.Lock()
        #: set once the index has caught up with the file (see :meth:`index_in_background`)
        self.ready = threading.Event()
        self.ready.set()

    def index_in_background(self) -> threading.Thread:
        """Build the index in a thread, so the server answers at once: until it is done,
        pages say "indexing N%" (and reload themselves), the API answers 503."""
        self.ready.clear()
        self._refresh_lock.acquire()

        def build() -> None:
            try:
                self.index.refresh()
                self._refreshed = time.monotonic()
            except Exception:  # the pages will try again on their own refresh
                log.exception("console: indexing %s failed", self.index.records)
            finally:
                self._refresh_lock.release()
                self.ready.set()
            if self.index.count() > self.figures.sync_limit:
                self.figures.start()

        thread = threading.Thread(target=build, name="console-index", daemon=True)
        thread.start()
        return thread

    # -- the request handler -----------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes = b"",
        *,
        peer: str | None = None,
    ) -> Response:
        """Answer one request (``path`` without the query; ``query`` the raw query string;
        ``headers`` with any case of names; ``peer`` the client's address, when known)."""
        try:
            return self._handle(method.upper(), path, query, _lower(headers), body, peer)
        except Exception:  # a bug or an unreadable file: a page that says so, never a trace
            log.exception("console: %s %s failed", method, path)
            return self._page(500, "Error", "The console could not answer this request.")

    def _handle(
        self,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes,
        peer: str | None,
    ) -> Response:
        if not path.startswith(self.base) and path + "/" != self.base:
            return self._page(404, "Not found", "No such page.")
        rel = unquote(path[len(self.base) :]) if path.startswith(self.base) else ""
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        if rel == "healthz":
            return Response(200, b"ok", [("Content-Type", "text/plain; charset=utf-8")])
        if self.token is None and (
            (self.loopback_only and not _loopback(headers.get("host", "")))
            or (self.require_local_peer and not _loopback_ip(peer))
        ):
            return self._page(
                403,
                "Forbidden",
                "Without a token this console answers only on this machine (127.0.0.1): set "
                "LOOPWARDEN_CONSOLE_TOKEN to reach it from elsewhere.",
            )
        set_cookie = None
        if self.token is not None:
            given = params.pop("token", None)
            if given is not None and hmac.compare_digest(given, self.token):
                set_cookie = (
                    f"{COOKIE}={self._cookie_value()}; HttpOnly; SameSite=Strict; Path={self.base}"
                )
            elif not self._authorised(headers):
                resp = self._page(401, "Unauthorized", "This console needs its token.")
                resp.headers.append(("WWW-Authenticate", 'Bearer realm="loopwarden console"'))
                return resp
        if rel.startswith("static/"):
            resp = self._static(rel[len("static/") :])
        elif method == "POST" and rel == "breakers/reset":
            resp = self._reset(headers, body)
        elif method not in ("GET", "HEAD"):
            resp = self._page(405, "Method not allowed", "Only GET here.")
            resp.headers.append(("Allow", "GET, HEAD"))
        elif not self.ready.is_set():
            resp = self._indexing(rel)
        else:
            self._refresh()
            resp = self._get(rel, params)
        if set_cookie:
            resp.headers.append(("Set-Cookie", set_cookie))
        return resp

    def _get(self, rel: str, params: dict[str, str]) -> Response:
        if rel == "":
            fig = self._overview()
            if fig is None:
                return self._html(200, pages.computing(self.index.count(), base=self.base))
            return self._html(200, pages.overview(fig, base=self.base))
        if rel == "runs":
            return self._runs(params)
        if rel.startswith("runs/"):
            return self._run(rel[len("runs/") :])
        if rel == "budgets":
            rows, note = self._budgets()
            return self._html(200, pages.budgets(rows, note, base=self.base))
        if rel == "breakers":
            rows, note = self._breakers()
            return self._html(
                200,
                pages.breakers(
                    rows,
                    base=self.base,
                    csrf=self.csrf_token(),
                    allow_resets=self.allow_resets,
                    note=note,
                ),
            )
        if rel.startswith("api/"):
            return self._api(rel[len("api/") :], params)
        return self._page(404, "Not found", "No such page.")

    # -- access --------------------------------------------------------------------------------

    def _cookie_value(self) -> str:
        token = self.token or ""
        return hmac.new(self._secret, token.encode(), hashlib.sha256).hexdigest()

    def _authorised(self, headers: Mapping[str, str]) -> bool:
        if self.token is None:
            return True
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and hmac.compare_digest(auth[7:].strip(), self.token):
            return True
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value, self._cookie_value()):
                return True
        return False

    def csrf_token(self) -> str:
        """The token a reset form carries (fixed for the console's life)."""
        return hmac.new(self._secret, b"csrf", hashlib.sha256).hexdigest()

    # -- data ------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Index appended records, at most every :data:`REFRESH_S` -- unless another request
        is at it already: this one answers from the index as it stands."""
        if time.monotonic() - self._refreshed < REFRESH_S:
            return
        if not self._refresh_lock.acquire(blocking=False):
            return
        try:
            if time.monotonic() - self._refreshed >= REFRESH_S:
                self.index.refresh()
                self._refreshed = time.monotonic()
        finally:
            self._refresh_lock.release()

    def _overview(self) -> dict[str, Any] | None:
        fig = self.figures.overview()
        if fig is None:
            return None
        return {**fig, "report": self.redactor(fig["report"])}

    def _filters(self, params: Mapping[str, str]) -> Filters:
        return Filters(
            **{k: params.get(k) or None for k in FILTERS},
            since=_time(params.get("since")),
            until=_time(params.get("until"), end=True),
            q=params.get("q") or None,
        )

    def _page_no(self, params: Mapping[str, str]) -> int:
        try:
            return max(int(params.get("page") or 0), 0)
        except ValueError:
            return 0

    def _runs(self, params: dict[str, str]) -> Response:
        page = self.index.page(self._filters(params), self._page_no(params), PAGE_SIZE)
        choices = {"termination": self.index.values("termination")}
        choices["guard"] = self.index.values("guard")
        shown = self._shown_runs(page.runs)
        page.runs = shown
        html = pages.runs(page, params, choices, self.index.cursor(), base=self.base)
        return self._html(200, html)

    def _shown_runs(self, runs: list[Any]) -> list[Any]:
        """Runs with their text columns redacted (a tenant or scenario may hold a secret)."""
        from dataclasses import replace

        out = []
        for r in runs:
            red = {
                k: self.redactor.text(getattr(r, k))
                for k in ("tenant", "conversation", "model", "scenario")
                if isinstance(getattr(r, k), str)
            }
            out.append(replace(r, **red) if red else r)
        return out

    def _run(self, run_id: str) -> Response:
        found = self.index.load(run_id)
        if found is None:
            return self._page(404, "Run not found", f"No run record has the id {run_id}.")
        indexed, record = found
        return self._html(
            200, pages.run(self._shown_runs([indexed])[0], self.redactor(record), base=self.base)
        )

    def _budgets(self) -> tuple[list[dict[str, Any]], str]:
        try:
            rows = self.store.budgets()
        except Exception as exc:  # the store is down or unreadable: say so on the page
            return [], f"The shared store could not be read: {type(exc).__name__}: {exc}"
        return self.redactor(rows), self.store.budgets_note

    def _breakers(self) -> tuple[list[dict[str, Any]], str]:
        try:
            rows = self.store.breakers()
        except Exception as exc:
            return [], f"The shared store could not be read: {type(exc).__name__}: {exc}"
        return self.redactor(rows), self.store.breakers_note

    def _reset(self, headers: Mapping[str, str], body: bytes) -> Response:
        form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", errors="replace"), True).items()}
        rows, note = self._breakers()

        def page(status: int, message: str) -> Response:
            html = pages.breakers(
                rows,
                base=self.base,
                csrf=self.csrf_token(),
                allow_resets=self.allow_resets,
                message=message,
                note=note,
            )
            return self._html(status, html)

        if not self.allow_resets:
            return page(
                403,
                "Resets are not allowed: this console is read-only. Start it with "
                "`loopwarden console --allow-resets` to reset breakers from here, or run "
                "`loopwarden breakers reset NAME`.",
            )
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf_token()):
            return page(403, "The form's CSRF token is missing or wrong: reload the page.")
        key = form.get("key", "")
        if form.get("confirm") != "yes":
            return page(400, f"Not reset: tick confirm to reset {key}.")
        try:
            done = self.store.reset(key)
        except Exception as exc:
            return page(503, f"The shared store could not be written: {type(exc).__name__}")
        if done:
            log.warning("console: breaker %s reset", key)
        self._refreshed = 0.0
        rows, note = self._breakers()
        return page(200, f"Reset {key}." if done else f"No breaker {key} (already closed).")

    def _api(self, rel: str, params: dict[str, str]) -> Response:
        if rel == "overview":
            fig = self._overview()
            if fig is None:  # the first figures over a large file are being computed
                return self._json({"computing": True, "runs": self.index.count()}, 202)
            return self._json(fig)
        if rel == "runs":
            page = self.index.page(self._filters(params), self._page_no(params), PAGE_SIZE)
            return self._json(
                {
                    "total": page.total,
                    "page": page.page,
                    "size": page.size,
                    "runs": [r.as_dict() for r in self._shown_runs(page.runs)],
                }
            )
        if rel.startswith("runs/"):
            found = self.index.load(rel[len("runs/") :])
            if found is None:
                return self._json({"error": "no such run"}, 404)
            indexed, record = found
            return self._json(
                {
                    "run": self._shown_runs([indexed])[0].as_dict(),
                    "record": self.redactor(record),
                }
            )
        if rel == "budgets":
            rows, note = self._budgets()
            return self._json({"counters": rows, "note": note})
        if rel == "breakers":
            rows, note = self._breakers()
            return self._json({"breakers": rows, "note": note})
        if rel == "changes":
            try:
                after = int(params.get("after") or 0)
            except ValueError:
                return self._json({"error": "after must be a cursor (a whole number)"}, 400)
            new = self._shown_runs(self.index.after(after))
            return self._json(
                {
                    "cursor": new[-1].seq if new else max(after, 0),
                    "runs": [
                        {**r.as_dict(), "html": pages.run_row(r, self.base, new=True)} for r in new
                    ],
                    "total": self.index.count(),
                    "terminations": self.index.terminations(),
                }
            )
        return self._json({"error": "no such endpoint"}, 404)

    # -- answers -------------------------------------------------------------------------------

    def _headers(self, content_type: str) -> list[tuple[str, str]]:
        return [
            ("Content-Type", content_type),
            ("Content-Security-Policy", CSP),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-store"),
        ]

    def _html(self, status: int, html: str) -> Response:
        return Response(
            status,
            html.encode("utf-8", errors="backslashreplace"),
            self._headers("text/html; charset=utf-8"),
        )

    def _indexing(self, rel: str) -> Response:
        """The answer while the first index is built: how far it is, again in 2 seconds."""
        done, size = self.index.progress()
        pct = int(100 * done / size) if size else 0
        if rel.startswith("api/"):
            resp = self._json({"indexing": True, "percent": pct}, 503)
        else:
            resp = self._page(
                503,
                "Indexing",
                f"indexing {pct}%: the console is reading the run records "
                f"({done / 1e6:,.1f} of {size / 1e6:,.1f} MB) and opens when it is done. "
                "This page reloads itself.",
            )
        resp.headers += [("Retry-After", "2"), ("Refresh", "2")]
        return resp

    def _page(self, status: int, title: str, message: str) -> Response:
        return self._html(status, pages.message_page(title, message, base=self.base))

    def _json(self, value: Any, status: int = 200) -> Response:
        # markup characters as escapes: the answer stays inert even where it is not read as
        # JSON (a sniffing client, a proxy's error page)
        data = (
            json.dumps(value, ensure_ascii=True, default=str)
            .replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
        )
        return Response(status, data.encode(), self._headers("application/json"))

    def _static(self, name: str) -> Response:
        if "/" in name or name.startswith(".") or not name:
            return self._page(404, "Not found", "No such file.")
        res = resources.files("loopwarden.console").joinpath("static").joinpath(name)
        if not res.is_file():
            return self._page(404, "Not found", "No such file.")
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        headers = self._headers(kind)
        headers[-1] = ("Cache-Control", "max-age=300")
        return Response(200, res.read_bytes(), headers)


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _loopback(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback (any port)."""
    host = host.strip().lower()
    if host.startswith("["):
        name = host[: host.find("]") + 1]
    else:
        name = host.split(":")[0] if host.count(":") <= 1 else host
    return name in LOOPBACK_HOSTS


def _loopback_ip(peer: str | None) -> bool:
    """Whether a peer address is this machine's loopback."""
    if not peer:
        return False
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


def _time(text: str | None, *, end: bool = False) -> float | None:
    """A filter's time: epoch seconds, or an ISO date / time (UTC unless it says); a bare date
    as ``until`` means the end of that day."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    ts = parsed.timestamp()
    if end and len(text.strip()) == 10:  # a date: until its end
        ts += 86400
    return ts
