"""Hostile model output, fuzzed: nothing a model says may crash a run or repeat a side effect.

    python bench/fuzz.py N SEED            # e.g. python bench/fuzz.py 5000 1
    python bench/fuzz.py N SEED --json

Generates ``N`` cases from ``SEED``.  A case is one to three model turns and a final answer,
each turn with hostile content and zero to four hostile tool calls: malformed JSON, arguments
of the wrong type or nested up to 100,000 deep, lone UTF-16 surrogates and other odd unicode
(NUL, bidi overrides, zero-width and combining characters, 100,000-character strings),
unknown or mangled tool names, numbers with 5,000 digits, ``NaN`` and ``1e999``, e-mail
addresses and order ids that differ only by case and spaces.  Every case is played twice,
each time with the shipped ``config.toml`` plus ``run_record``, alternately through
``Deployment.run`` and ``Deployment.arun``:

* ``scripted``: through the scripted model (``loopwarden.models.scripted``);
* ``http``: through the real OpenAI client (``loopwarden.models.openai_chat``) against a
  local chat-completions stub in this file, which sends the same turns as raw JSON -- with
  ``\\ud83d`` escapes, wrong field types, and sometimes a body that is not a completion at
  all (invalid JSON, no choices, a number for content).

Tools: two read-only lookups, a clock, and two side effects (``send_email`` keyed on ``to``,
``refund`` keyed on ``order_id``) that count their executions.  Per path it reports:

``crashes``          an exception escaped ``run`` / ``arun``, or the record did not encode
``hangs``            a case did not finish within ``--timeout`` seconds (default 60)
``missing_records``  the run_record file did not get exactly one strict-JSON line for the run
``double_effects``   a side effect ran twice for keys equal up to case and whitespace
``bad_requests``     (http) a request the client sent back was not valid UTF-8 JSON
``blamed_model``     (http) a run ended ``model_error`` although every body was well formed

and the terminations seen, with how many side effects executed and how many repeats of them
the ledger answered without executing.  Exit code 0 when every count above is 0.

Measured (2 shared cores, Python 3.11.7): ``python bench/fuzz.py 5000 1 --json`` -- 0 crashes,
0 hangs, 0 missing records, 0 double side effects, 0 bad requests, 0 blamed models on both
paths, in 759 s (869 s in an earlier run: the machine is shared).  Scripted: 3,598 side
effects executed, 1,125 repeats answered by the ledger; terminations final_answer 2,868,
failure_streak 1,310, max_context 708, max_tokens 64, repeat_call 48, stall 2.  HTTP: 3,238
executed, 996 replayed; final_answer 2,620, failure_streak 1,219, max_context 650,
model_error 474 (broken bodies), repeat_call 36, stall 1.

The smoke test in ``tests/test_bench_smoke.py`` runs a few cases.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loopwarden import Deployment
from loopwarden.config import Config, default_config_path, load_toml, parse_config
from loopwarden.models.openai_chat import OpenAIChatModel
from loopwarden.models.scenario import ScriptConfig
from loopwarden.models.scripted import ScriptedModel
from loopwarden.report import read_records
from loopwarden.tools import ToolRegistry, tool

# -- the tools: side effects count their executions ------------------------------------------

_EXECUTED: collections.Counter[tuple[str, str]] = collections.Counter()
_EXEC_LOCK = threading.Lock()


def _same(value: object) -> str:
    """Keys equal up to case and whitespace are one key (what a user would say)."""
    return " ".join(str(value).split()).casefold()


def _effect(name: str, key: object) -> None:
    with _EXEC_LOCK:
        _EXECUTED[(name, _same(key))] += 1


@tool(read_only=True, deterministic=True)
def get_order(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped, tracking SF{len(order_id) * 7919 % 10007}"


@tool(read_only=True, deterministic=True)
def search(query: str, limit: int = 5) -> str:
    """Search the knowledge base."""
    return f"{min(max(limit, 0), 5)} results for {query[:200]!r}"


@tool
def now() -> str:
    """The current time."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


@tool(side_effect=True, idempotency_keys=("to",))
def send_email(to: str, body: str) -> str:
    """Send an e-mail."""
    _effect("send_email", to)
    return f"sent to {to}"


@tool(side_effect=True, idempotency_keys=("order_id",))
def refund(order_id: str, amount: float = 0.0) -> str:
    """Refund an order."""
    _effect("refund", order_id)
    return f"refunded {order_id}"


TOOLS = ToolRegistry([get_order, search, now, send_email, refund])

# -- generators ------------------------------------------------------------------------------

ODD = [
    "\ud83d",
    "\ude00",
    "\ud83d\ude00",
    "\udbff",
    "\x00",
    "\u202e",
    "\u200b",
    "\ufeff",
    "e\u0301",
    "\u2028",
    "\U0001f600",
    "中文",
    "ß",
    "İ",
    "\\",
    '"',
    "\n",
    "\t",
    "{",
    "}",
    "[REDACTED]",
    "sk-abcdefghijklmnopqrstuv",
    "api_key=secret123",
]
EMAILS = [
    "Bob@Example.com",
    "bob@example.com",
    " bob@example.com ",
    "BOB@EXAMPLE.COM",
    "bob@example.com\t",
    "alice@example.com",
]
ORDERS = ["88231", " 88231", "88231 ", "A-1", "a-1", "99999"]
NAMES = ["get_order", "search", "now", "send_email", "refund"]


def _text(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.03:
        return rng.choice(ODD) * rng.choice([1000, 100_000])
    if r < 0.1:
        return ""
    return "".join(
        rng.choice(ODD) if rng.random() < 0.4 else rng.choice("abc xyz 123")
        for _ in range(rng.randint(1, 12))
    )


def _deep(rng: random.Random) -> str:
    depth = rng.choice([50, 99, 100, 101, 500, 5000, 100_000])
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


def _value(rng: random.Random) -> str:
    """A JSON value as text (possibly not JSON at all)."""
    r = rng.random()
    if r < 0.35:
        return json.dumps(_text(rng))  # ASCII, lone surrogates as \\udXXX escapes
    if r < 0.45:
        return rng.choice(
            [
                "0",
                "-1",
                "1e308",
                "1e999",
                "-1e999",
                "NaN",
                "Infinity",
                "1.5",
                "9" * 5000,
                "1" + "0" * 40,
                "true",
                "null",
            ]
        )
    if r < 0.55:
        return _deep(rng)
    if r < 0.65:
        return json.dumps([_text(rng), 1, None])
    if r < 0.75:
        return json.dumps(rng.choice(EMAILS + ORDERS))
    return json.dumps(rng.choice(["x", "hello", "88231", "return policy"]))


def _arguments(rng: random.Random, name: str) -> str:
    """Arguments as the raw text a model sends (often not a valid object for the tool)."""
    r = rng.random()
    if r < 0.08:
        return rng.choice(
            [
                "",
                "{",
                '{"to": ',
                "{'to': 'x'}",
                '{"to": "a",}',
                "[]",
                "5",
                '"text"',
                "null",
                "true",
                "{}}",
                "// comment\n{}",
                "\x00",
            ]
        )
    if r < 0.16:
        return _deep(rng)
    fields = {
        "get_order": ["order_id"],
        "search": ["query", "limit"],
        "now": [],
        "send_email": ["to", "body"],
        "refund": ["order_id", "amount"],
    }.get(name, ["to", "order_id", "query"])
    parts = []
    for f in fields:
        if rng.random() < 0.1:
            continue  # a missing field
        if f == "to" and rng.random() < 0.6:
            value = json.dumps(rng.choice(EMAILS))
        elif f == "order_id" and rng.random() < 0.6:
            value = json.dumps(rng.choice(ORDERS))
        else:
            value = _value(rng)
        parts.append(f"{json.dumps(f)}: {value}")
    if rng.random() < 0.15:
        parts.append(f"{json.dumps(_text(rng))}: {_value(rng)}")  # an unexpected field
    if rng.random() < 0.1:
        parts.append(f'"request_id": "{rng.random()}"')  # volatile
    return "{" + ", ".join(parts) + "}"


def _name(rng: random.Random) -> str:
    r = rng.random()
    base = rng.choice(NAMES)
    if r < 0.7:
        return base
    return rng.choice(
        [
            base.upper(),
            base + " ",
            "",
            "no_such_tool",
            base[:3] + "\ud800" + base[3:],
            "x" * 10_000,
            base.replace("_", "\u200b_"),
            "\x00",
            "functions." + base,
        ]
    )


@dataclass
class Call:
    name: str
    arguments: str  # raw text (may be anything)
    id: str
    #: (http only) a field sent with the wrong JSON type: ("arguments", '{"a": 1}'), ...
    wire: tuple[str, str] | None = None


@dataclass
class Case:
    turns: list[tuple[str | None, list[Call]]]
    final: str
    garbage: list[str | None] = field(default_factory=list)  # per turn: a broken body or None


GARBAGE = [
    "",
    "not json",
    "{",
    '{"choices": []}',
    '{"choices": [{"index": 0}]}',
    '{"choices": [{"index": 0, "message": null, "finish_reason": "stop"}]}',
    '{"choices": [{"index": 0, "message": {"role": "assistant", "content": 5}}]}',
    '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "x", '
    '"tool_calls": {"a": 1}}}]}',
    "[1, 2, 3]",
    '"just a string"',
    "null",
    "<html>502 Bad Gateway</html>",
]


def make_case(rng: random.Random) -> Case:
    turns = []
    for _ in range(rng.randint(1, 3)):
        content = None if rng.random() < 0.2 else _text(rng)
        calls = []
        for j in range(rng.choice([0, 1, 1, 1, 2, 3, 4])):
            name = _name(rng)
            ident = rng.choice([f"call_{j}", "", "dup", "c\ud800"])
            wire = None
            if rng.random() < 0.05:
                wire = rng.choice(
                    [
                        ("arguments", '{"order_id": "88231"}'),
                        ("arguments", "5"),
                        ("arguments", "null"),
                        ("arguments", "[1]"),
                        ("name", "7"),
                        ("name", "null"),
                        ("id", "42"),
                    ]
                )
            calls.append(Call(name, _arguments(rng, name.strip()), ident, wire))
        turns.append((content, calls))
    if rng.random() < 0.4:  # side effects proposed again with keys that differ in form
        for _ in range(rng.randint(1, 2)):
            calls = []
            for j in range(rng.randint(1, 3)):
                if rng.random() < 0.5:
                    args = {"to": rng.choice(EMAILS), "body": _text(rng)}
                    calls.append(Call("send_email", json.dumps(args), f"e{j}"))
                else:
                    args = {"order_id": rng.choice(ORDERS), "amount": rng.choice([1, 1.0, 2])}
                    calls.append(Call("refund", json.dumps(args), f"r{j}"))
            turns.insert(rng.randint(0, len(turns)), (_text(rng) or None, calls))
    garbage = [rng.choice(GARBAGE) if rng.random() < 0.05 else None for _ in turns]
    return Case(turns, _text(rng) or "done", garbage)


# -- the two model paths ---------------------------------------------------------------------


def scripted_model(case: Case) -> ScriptedModel:
    turns = [
        {
            "content": content,
            "tool_calls": [
                {"name": c.name, "arguments": c.arguments, "id": c.id or None} for c in calls
            ],
        }
        for content, calls in case.turns
    ]
    return ScriptedModel(
        ScriptConfig.model_validate({"turns": turns, "then": "final", "final_text": case.final})
    )


def _body(content: str | None, calls: list[Call], usage: bool = True) -> str:
    msg = '"role": "assistant", "content": ' + (
        json.dumps(content) if content is not None else "null"
    )
    if calls:
        msg += ', "tool_calls": [' + ", ".join(_wire_call(c) for c in calls) + "]"
    tail = ', "usage": {"prompt_tokens": 10, "completion_tokens": 5}' if usage else ""
    return (
        '{"id": "fz", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini", '
        '"choices": [{"index": 0, "message": {' + msg + '}, "finish_reason": "stop"}]' + tail + "}"
    )


def _wire_call(c: Call) -> str:
    fields = {
        "id": json.dumps(c.id),
        "name": json.dumps(c.name),
        "arguments": json.dumps(c.arguments),
    }
    if c.wire is not None:
        fields[c.wire[0]] = c.wire[1]
    return (
        f'{{"id": {fields["id"]}, "type": "function", "function": {{"name": '
        f'{fields["name"]}, "arguments": {fields["arguments"]}}}}}'
    )


def well_formed(case: Case) -> bool:
    """Whether every body of the case is a completion of the documented shape (a run that
    ends ``model_error`` then blamed the model for what the loop should have handled)."""
    return all(g is None for g in case.garbage) and not any(
        c.wire is not None and c.wire[0] != "arguments" for _, calls in case.turns for c in calls
    )


def http_bodies(case: Case) -> list[str]:
    out = [
        g if g is not None else _body(content, calls)
        for (content, calls), g in zip(case.turns, case.garbage, strict=True)
    ]
    out.append(_body(case.final, []))
    return out


class Stub:
    """A local chat-completions endpoint: answers each request with the next queued body
    and checks that every request the client sends is valid UTF-8 JSON."""

    def __init__(self) -> None:
        self.queue: collections.deque[str] = collections.deque()
        self.bad_requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()  # headers and body go out as two writes: no Nagle delay
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                try:
                    text = raw.decode("utf-8")
                    json.loads(text)
                except ValueError:
                    stub.bad_requests += 1
                body = (stub.queue.popleft() if stub.queue else _body("done", [])).encode(
                    "utf-8", "surrogatepass"
                )
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- running ---------------------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    crashes: int = 0
    hangs: int = 0
    missing_records: int = 0
    double_effects: int = 0
    bad_requests: int = 0
    blamed_model: int = 0
    terminations: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: list[str] = field(default_factory=list)
    #: side effects executed, and repeats of them the ledger answered without executing
    effects_executed: int = 0
    effects_replayed: int = 0

    def note(self, kind: str, case_no: int, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 10:
            self.examples.append(f"case {case_no}: {kind}: {detail[:300]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "crashes": self.crashes,
            "hangs": self.hangs,
            "missing_records": self.missing_records,
            "double_effects": self.double_effects,
            "bad_requests": self.bad_requests,
            "blamed_model": self.blamed_model,
            "effects_executed": self.effects_executed,
            "effects_replayed": self.effects_replayed,
            "terminations": dict(self.terminations.most_common()),
            "examples": self.examples,
        }


def fuzz_config(records: Path) -> Config:
    data = load_toml(default_config_path())
    data["plugins"]["enabled"] = [*data["plugins"]["enabled"], "run_record"]
    data["plugins"]["run_record"] = {"path": str(records), "trajectory": True}
    data["plugins"].setdefault("logging", {})
    # one ledger per case: the shared store would otherwise answer a later case's side effect
    # with an earlier case's result, and the in-run ledger would go untested
    data.setdefault("store", {})["ledger_scope"] = ["fuzz_case"]
    return parse_config(data, path="<fuzz>")


class _Loop:
    """One event loop in its own thread, for the ``arun`` cases (replaced after a hang)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def target() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # reported as a crash by the caller
            box.append((False, exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


class Runner:
    """Plays cases on one path (scripted or http) and tallies what went wrong."""

    def __init__(self, path: str, records: Path, stub: Stub | None, timeout: float) -> None:
        self.path = path
        self.records = records
        self.stub = stub
        self.timeout = timeout
        self.dep = Deployment(fuzz_config(records))
        self.tally = Tally()
        self.offset = 0
        self.aloop = _Loop()
        self.model: Any = None
        if stub is not None:
            self.model = OpenAIChatModel(
                model="gpt-4o-mini",
                api_key="sk-fuzz-000000000000",
                base_url=stub.url,
                timeout_s=10,
                max_retries=0,
            )

    def _model(self, case: Case) -> Any:
        if self.stub is None:
            return scripted_model(case)
        self.stub.queue.clear()
        self.stub.queue.extend(http_bodies(case))
        return self.model

    def play(self, case_no: int, case: Case, use_async: bool) -> None:
        t = self.tally
        t.cases += 1
        with _EXEC_LOCK:
            _EXECUTED.clear()
        bad_before = self.stub.bad_requests if self.stub is not None else 0
        model = self._model(case)
        user = "help me with order 88231 \ud83d"
        meta = {"fuzz_case": f"{id(self)}-{case_no}"}
        if use_async:
            fut = self.aloop.submit(self.dep.arun(user, model=model, tools=TOOLS, meta=meta))
            try:
                run = fut.result(self.timeout)
            except TimeoutError:
                fut.cancel()
                self.aloop = _Loop()
                t.note("hangs", case_no, "arun")
                return
            except Exception as exc:
                t.note("crashes", case_no, f"{type(exc).__name__}: {exc}")
                return
        else:
            thread, box = _in_thread(
                lambda: self.dep.run(user, model=model, tools=TOOLS, meta=meta)
            )
            thread.join(self.timeout)
            if not box:
                t.note("hangs", case_no, "run")
                return
            ok, value = box[0]
            if not ok:
                t.note("crashes", case_no, f"{type(value).__name__}: {value}")
                return
            run = value
        try:
            record = run.record()
            json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except Exception as exc:
            t.note("crashes", case_no, f"record: {type(exc).__name__}: {exc}")
            return
        t.terminations[record["termination"]] += 1
        self._check_record(case_no, record)
        with _EXEC_LOCK:
            twice = {k: n for k, n in _EXECUTED.items() if n > 1}
            t.effects_executed += sum(_EXECUTED.values())
        t.effects_replayed += sum(
            1
            for m in run.messages
            if m.get("role") == "tool" and "not executed again" in str(m.get("content"))
        )
        if twice:
            t.note("double_effects", case_no, repr(twice))
        if self.stub is not None:
            bad = self.stub.bad_requests - bad_before
            if bad:
                t.note("bad_requests", case_no, f"{bad} request(s)")
            if record["termination"] == "model_error" and well_formed(case):
                t.note("blamed_model", case_no, json.dumps(record["evidence"])[:300])

    def _check_record(self, case_no: int, record: dict[str, Any]) -> None:
        with self.records.open("rb") as fh:
            fh.seek(self.offset)
            new = fh.read()
        self.offset += len(new)
        lines = new.decode("utf-8", "surrogateescape").split("\n")
        loaded = read_records(lines)
        if loaded.skipped or [r.get("run_id") for r in loaded.records] != [record["run_id"]]:
            self.tally.note(
                "missing_records",
                case_no,
                f"{len(loaded.records)} record(s), {loaded.skipped} corrupt; "
                f"errors {record['errors']}",
            )

    def close(self) -> None:
        self.dep.close()


def fuzz(
    n: int, seed: int, timeout: float = 60.0, progress: Callable[[int], None] | None = None
) -> dict[str, Any]:
    rng = random.Random(seed)
    stub = Stub()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loopwarden-fuzz-") as tmp:
        os.environ.setdefault("LOOPWARDEN_DATA_DIR", tmp)
        runners = {
            "scripted": Runner("scripted", Path(tmp) / "scripted.jsonl", None, timeout),
            "http": Runner("http", Path(tmp) / "http.jsonl", stub, timeout),
        }
        try:
            for i in range(n):
                case = make_case(rng)
                use_async = i % 2 == 1
                for runner in runners.values():
                    runner.play(i, case, use_async)
                if progress is not None:
                    progress(i + 1)
        finally:
            for runner in runners.values():
                runner.close()
            stub.close()
    paths = {name: r.tally.as_dict() for name, r in runners.items()}
    keys = ("crashes", "hangs", "missing_records", "double_effects", "bad_requests", "blamed_model")
    totals = {k: sum(p[k] for p in paths.values()) for k in keys}
    return {
        "n": n,
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "python": sys.version.split()[0],
        "paths": paths,
        "totals": totals,
        "ok": not any(totals.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int, help="how many cases")
    parser.add_argument("seed", type=int, help="random seed (the same seed, the same cases)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds after which a case counts as hung (default 60)",
    )
    args = parser.parse_args(argv)

    def progress(done: int) -> None:
        if not args.json and (done % 500 == 0 or done == args.n):
            print(f"  {done}/{args.n} cases", file=sys.stderr, flush=True)

    import logging

    logging.getLogger("loopwarden").setLevel(logging.CRITICAL)  # thousands of verdicts
    result = fuzz(args.n, args.seed, args.timeout, progress)
    if args.json:
        print(json.dumps(result, ensure_ascii=True))
    else:
        print(f"fuzz: {args.n} cases, seed {args.seed}, {result['seconds']} s")
        for name, p in result["paths"].items():
            counts = ", ".join(
                f"{k} {p[k]}"
                for k in (
                    "crashes",
                    "hangs",
                    "missing_records",
                    "double_effects",
                    "bad_requests",
                    "blamed_model",
                )
            )
            print(f"{name:>9}: {p['cases']} runs: {counts}")
            print(
                f"{'':>9}  side effects executed {p['effects_executed']}, repeats answered "
                f"by the ledger {p['effects_replayed']}"
            )
            print(f"{'':>9}  terminations: {json.dumps(p['terminations'])}")
            for ex in p["examples"]:
                print(f"{'':>9}  {ex}".encode("ascii", "backslashreplace").decode())
        print(
            "OK: no crash, hang, lost record or repeated side effect" if result["ok"] else "FAILED"
        )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
