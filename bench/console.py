"""The console over 100,000 run records: the runs page, a filter and one run, over real HTTP.

The records are made from real ones: the built-in demo scenarios are played guarded with the
``run_record`` plugin on (``trajectory`` and ``steps_detail`` too), which gives one record of
each stop the demo shows (final_answer, repeat_call, oscillation, stall, max_steps, timeout,
circuit_open, ...).  ``--records`` (default 100,000) records are written from them into one
JSONL file: each a copy of one of those records with its own ``run_id``, a tenant (of 50), a
conversation (runs come in conversations of 1-5), a model (of 4), tokens and cost scaled by a
random factor and a time (``ended_at``, epoch seconds, over the last 30 days, in file order)
-- the run_record plugin writes no time of its own, and ``ended_at`` is one of the fields the
console's index reads it from.  A tenth keep the trajectory and per-step tokens (the one-run
timeline); the rest are what the plugin writes by default.

Then ``loopwarden console --records FILE --port 0`` runs as the command (its index in a data
directory of the bench's own) and is asked, over HTTP with a new connection per request as a
browser's first visit makes it:

* ``startup_s``: from the command's start to its ``console: URL`` line (a large new file is
  indexed in the background: the console listens at once and answers 503 "indexing" until
  ready);
* ``ready_s``: from the command's start to the first answer that is not 503 (the index built
  from nothing: every line read once);
* ``cold_first_runs_page_ms``: the first ``/runs`` after that;
* ``runs_page``: ``/runs``, the first page of every run, newest first;
* ``filter``: ``/runs`` filtered -- to a guard, a termination, a tenant, a model, a time window,
  a guard and a tenant, and a text search (``q``) -- each filter in turn;
* ``one_run``: ``/runs/<id>`` of runs drawn at random over the whole file;
* ``api``: ``/api/runs`` and ``/api/runs/<id>`` alike;
* ``overview``: ``/`` -- ``first_ms``, its first answer (the report's figures computed over
  every record), then ``cached`` (kept until a run is appended).

Each figure is the p50 / p95 / max of ``--rounds`` requests, in ms (client-side, the whole
answer read).  The targets (issue 47): runs page first answer <= 300 ms, a filter <= 300 ms,
one run <= 100 ms.

**A run's path** (``run_path``): the console only reads.  ``--runs`` runs of the built-in
``refund`` scenario, in process, with the shipped guards and ``run_record`` appending to the
same 100,000-record file, in paired rounds: the console stopped (SIGSTOP: as if absent) and the
console serving (SIGCONT, with three pollers asking ``/api/changes`` and ``/runs`` every
0.5 s, so it re-reads the file as the runs append to it).  Reported per side: wall ms per
run, the run's own CPU ms (its thread's), and the ms of the records plugin's append (its
``flock``-ed write: where a run would wait for a reader holding the file), p50 / p95; the
ratio of the wall medians per pair; and that the console never wrote the file (its first bytes'
SHA-256 and every line are unchanged; the console's descriptors on it are read-only, from
``/proc``) and saw every appended run (``/api/runs`` total = the file's lines).

    python bench/console.py [--records N] [--rounds R] [--runs K] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from _common import machine, pct

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
path = "{records}"
trajectory = true
steps_detail = true

[plugins.spend_limits]
budgets = [{{ scope = "tenant", window = "day", max_tokens = 100000000 }}]
"""

CONSOLE = [sys.executable, "-m", "loopwarden", "console"]
MODELS = ["gpt-4o-mini", "gpt-4o", "deepseek-chat", "qwen-plus"]
TENANTS = [f"tenant-{i:02d}" for i in range(50)]
DAYS = 30
#: runs played before the timed ones (appended to the file too)
WARMUP = 3
#: a browser's page left open, three times over: the changes poll and the runs page, every 0.5 s
POLLER = """
import sys, time, urllib.request
base = sys.argv[1]
while True:
    for path in ("api/changes?after=0", "runs"):
        try:
            urllib.request.urlopen(base + path, timeout=30).read()
        except OSError:
            pass
    time.sleep(0.5)
"""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env.update(
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"),
        LOOPWARDEN_DATA_DIR=str(home / "data" / "loopwarden"),
        PYTHONUNBUFFERED="1",
    )
    return env


def real_records(home: Path) -> list[dict[str, Any]]:
    """Records of the built-in scenarios, played guarded by ``loopwarden demo``."""
    records = home / "templates.jsonl"
    config = home / "templates.toml"
    config.write_text(
        CONFIG.format(home=home.as_posix(), records=records.as_posix()), encoding="utf-8"
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "loopwarden",
            "demo",
            "--observers",
            "--no-records",
            "--quiet",
            "--config",
            config,
        ],
        env=_env(home),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # its table may say FAILED where the breaker changes an outcome
    )
    lines = records.read_text("utf-8").splitlines()
    out = [json.loads(line) for line in lines if line.strip()]
    if not out:
        raise SystemExit("loopwarden demo wrote no run records")
    return out


def generate(templates: list[dict[str, Any]], n: int, path: Path, seed: int = 47) -> list[str]:
    """``n`` records from ``templates`` into ``path``; returns their run ids."""
    rng = random.Random(seed)
    now = time.time()
    start = now - DAYS * 86400
    ids: list[str] = []
    conversation, left = "", 0
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            record = dict(templates[rng.randrange(len(templates))])
            if left == 0:
                conversation, left = f"{rng.getrandbits(128):032x}", rng.randint(1, 5)
                tenant = rng.choice(TENANTS)
                model = rng.choice(MODELS)
            left -= 1
            run_id = f"{rng.getrandbits(128):032x}"
            ids.append(run_id)
            scale = rng.uniform(0.5, 3.0)
            tokens = record.get("tokens") or {}
            record.update(
                run_id=run_id,
                conversation_id=conversation,
                meta={**(record.get("meta") or {}), "tenant": tenant},
                model=model,
                tokens={k: int(v * scale) for k, v in tokens.items()},
                cost=round((record.get("cost") or 0.0) * scale, 8),
                ended_at=round(start + (now - start) * (i + 1) / n, 3),
            )
            if rng.random() >= 0.1:  # what run_record writes without trajectory/steps_detail
                record.pop("trajectory", None)
                record.pop("steps_detail", None)
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return ids


class Console:
    """``loopwarden console`` as a subprocess, its output in a file."""

    def __init__(self, records: Path, config: Path, home: Path) -> None:
        self.log = home / "console.log"
        began = time.perf_counter()
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [*CONSOLE, "--records", records, "--config", config, "--port", "0"],
                env=_env(home),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        while True:
            text = self.log.read_text("utf-8", errors="replace")
            line = next((ln for ln in text.splitlines() if ln.startswith("console: ")), None)
            if line:
                self.url = line.split(" ", 1)[1].strip()
                break
            if self.proc.poll() is not None or time.perf_counter() - began > 120:
                raise SystemExit(f"loopwarden console did not start:\n{text}")
            time.sleep(0.01)
        self.startup_s = time.perf_counter() - began
        while True:  # the index may still be building in the background (503 "indexing")
            status, _, _ = get(self.url + "api/changes?after=0")
            if status != 503:
                break
            if self.proc.poll() is not None or time.perf_counter() - began > 600:
                raise SystemExit("loopwarden console did not finish indexing")
            time.sleep(0.2)
        self.ready_s = time.perf_counter() - began

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def get(url: str) -> tuple[int, float, bytes]:
    """One request on a new connection: (status, seconds until the whole answer, body)."""
    began = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        body, status = err.read(), err.code
    return status, time.perf_counter() - began, body


def timed(urls: list[str]) -> dict[str, float]:
    """p50 / p95 / max ms of these requests, each answered 200."""
    ms: list[float] = []
    for url in urls:
        status, seconds, _ = get(url)
        if status != 200:
            raise SystemExit(f"{url}: HTTP {status}")
        ms.append(seconds * 1000)
    return {
        "p50": round(statistics.median(ms), 1),
        "p95": round(pct(ms, 0.95), 1),
        "max": round(max(ms), 1),
        "n": len(ms),
    }


def filters(templates: list[dict[str, Any]], t_mid: float) -> dict[str, str]:
    """One query of each kind of filter the runs page has."""
    guard = next(t["stopped_by"] for t in templates if t.get("stopped_by") == "repeat_call")
    day = 86400
    return {
        "guard": f"guard={guard}",
        "termination": "termination=oscillation",
        "tenant": "tenant=tenant-07",
        "model": "model=deepseek-chat",
        "time": "since="
        + urllib.parse.quote(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_mid)))
        + "&until="
        + urllib.parse.quote(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_mid + day))),
        "guard_and_tenant": f"guard={guard}&tenant=tenant-07",
        "search": "q=query_order",
    }


def measure_pages(
    base: str, ids: list[str], templates: list[dict[str, Any]], rounds: int, seed: int = 7
) -> dict[str, Any]:
    rng = random.Random(seed)
    t_mid = time.time() - DAYS * 86400 / 2
    out: dict[str, Any] = {}
    out["runs_page"] = timed([base + "runs"] * rounds)
    out["filter"] = {
        name: timed([f"{base}runs?{query}"] * rounds)
        for name, query in filters(templates, t_mid).items()
    }
    out["one_run"] = timed([f"{base}runs/{rng.choice(ids)}" for _ in range(rounds)])
    out["api"] = {
        "runs": timed([base + "api/runs"] * rounds),
        "one_run": timed([f"{base}api/runs/{rng.choice(ids)}" for _ in range(rounds)]),
    }
    # the overview: its first answer computes the report's figures over every record; later
    # ones are cached until a run is appended
    status, first_s, _ = get(base)
    if status != 200:
        raise SystemExit(f"/: HTTP {status}")
    out["overview"] = {"first_ms": round(first_s * 1000, 1), "cached": timed([base] * rounds)}
    return out


def read_only(pid: int, records: Path) -> bool | None:
    """Whether every descriptor ``pid`` holds on ``records`` is read-only (None: none open)."""
    seen = []
    target = records.resolve()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if Path(os.readlink(fd)) != target:
                continue
            flags = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        value = int(next(ln for ln in flags.splitlines() if ln.startswith("flags:")).split()[1], 8)
        seen.append(value & os.O_ACCMODE == os.O_RDONLY)
    return all(seen) if seen else None


def run_path(
    console: Console, records: Path, config: Path, home: Path, runs: int, pairs: int
) -> dict[str, Any]:
    """Runs appending to the records file, the console stopped vs serving (paired rounds)."""
    os.environ.update(_env(home))
    from loopwarden import Deployment

    size = records.stat().st_size
    with records.open("rb") as f:
        head = hashlib.sha256(f.read(size)).hexdigest()
    before_lines = sum(1 for _ in records.open("rb"))
    from loopwarden.plugins.run_record import JsonlAppender

    appends: list[float] = []
    plain_append = JsonlAppender.append

    def timed_append(self: JsonlAppender, obj: Any) -> bool:
        began = time.perf_counter()
        try:
            return plain_append(self, obj)
        finally:
            appends.append((time.perf_counter() - began) * 1000)

    JsonlAppender.append = timed_append  # type: ignore[method-assign]
    dep = Deployment.from_config(config)
    for _ in range(WARMUP):  # imports, the shop database, the store
        dep.run(scenario="refund")
    fd_checks: list[bool | None] = []
    sides: dict[str, list[float]] = {"console_stopped": [], "console_serving": []}
    cpu: dict[str, list[float]] = {"console_stopped": [], "console_serving": []}
    append_ms: dict[str, list[float]] = {"console_stopped": [], "console_serving": []}
    ratios: list[float] = []
    for i in range(pairs):
        order = ["console_stopped", "console_serving"]
        if i % 2:
            order.reverse()
        medians: dict[str, float] = {}
        for side in order:
            pollers: list[subprocess.Popen[bytes]] = []
            if side == "console_stopped":
                console.proc.send_signal(signal.SIGSTOP)
            else:
                console.proc.send_signal(signal.SIGCONT)
                pollers = [
                    subprocess.Popen([sys.executable, "-c", POLLER, console.url]) for _ in range(3)
                ]
                time.sleep(2.0)  # their interpreters started: only their polling overlaps
            ms = []
            appends.clear()
            for _ in range(runs):
                began, began_cpu = time.perf_counter(), time.thread_time()
                dep.run(scenario="refund", meta={"tenant": "bench"})
                ms.append((time.perf_counter() - began) * 1000)
                cpu[side].append((time.thread_time() - began_cpu) * 1000)
                if side == "console_serving":
                    fd_checks.append(read_only(console.proc.pid, records))
            for p in pollers:
                p.terminate()
                p.wait()
            console.proc.send_signal(signal.SIGCONT)
            sides[side].extend(ms)
            append_ms[side].extend(appends)
            medians[side] = statistics.median(ms)
        ratios.append(medians["console_serving"] / medians["console_stopped"])
    dep.close()
    with records.open("rb") as f:
        same_head = hashlib.sha256(f.read(size)).hexdigest() == head
    lines = sum(1 for _ in records.open("rb"))
    time.sleep(0.5)
    _, _, body = get(console.url + "api/runs")
    total = json.loads(body)["total"]
    return {
        "runs_per_side": runs * pairs,
        "warmup_runs": WARMUP,
        "ms_per_run": {
            side: {"p50": round(statistics.median(v), 2), "p95": round(pct(v, 0.95), 2)}
            for side, v in sides.items()
        },
        "cpu_ms_per_run": {
            side: {"p50": round(statistics.median(v), 2), "p95": round(pct(v, 0.95), 2)}
            for side, v in cpu.items()
        },
        "append_ms_per_run": {
            side: {"p50": round(statistics.median(v), 3), "p95": round(pct(v, 0.95), 3)}
            for side, v in append_ms.items()
        },
        "ratio_serving_to_stopped": {
            "median": round(statistics.median(ratios), 3),
            "min": round(min(ratios), 3),
            "max": round(max(ratios), 3),
            "pairs": pairs,
        },
        "file_unchanged_before_the_appends": same_head,
        "lines_appended": lines - before_lines,
        "console_total_equals_lines": total == lines,
        "console_descriptors_read_only": (
            None
            if not any(c is not None for c in fd_checks)
            else all(c for c in fd_checks if c is not None)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records in the file")
    parser.add_argument("--rounds", type=int, default=20, help="requests per figure")
    parser.add_argument("--runs", type=int, default=40, help="runs per side per pair")
    parser.add_argument("--pairs", type=int, default=4, help="paired rounds of the run path")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--quick", action="store_true", help="2,000 records, few requests")
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds, args.runs, args.pairs = 2_000, 3, 3, 1
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lw-console-bench-") as tmp:
        home = Path(tmp)
        templates = real_records(home)
        records = home / "runs.jsonl"
        began = time.perf_counter()
        ids = generate(templates, args.records, records)
        generate_s = time.perf_counter() - began
        config = home / "config.toml"
        config.write_text(
            CONFIG.format(home=home.as_posix(), records=records.as_posix()), encoding="utf-8"
        )
        console = Console(records, config, home)
        try:
            status, cold_s, _ = get(console.url + "runs")
            if status != 200:
                raise SystemExit(f"/runs: HTTP {status}\n{console.log.read_text()}")
            index_files = list((home / "data" / "loopwarden").rglob("*.sqlite3"))
            result: dict[str, Any] = {
                "records": args.records,
                "records_bytes": records.stat().st_size,
                "templates": sorted({t["termination"] for t in templates}),
                "generate_s": round(generate_s, 2),
                "startup_s": round(console.startup_s, 3),
                "ready_s": round(console.ready_s, 3),
                "cold_first_runs_page_ms": round(cold_s * 1000, 1),
                "index_bytes": sum(p.stat().st_size for p in index_files if "shop" not in p.name),
            }
            result.update(measure_pages(console.url, ids, templates, args.rounds))
            result["run_path"] = run_path(console, records, config, home, args.runs, args.pairs)
        finally:
            console.stop()
    result["targets"] = {
        "runs_page_p50_le_300ms": result["runs_page"]["p50"] <= 300,
        "filters_p50_le_300ms": all(f["p50"] <= 300 for f in result["filter"].values()),
        "one_run_p50_le_100ms": result["one_run"]["p50"] <= 100,
    }
    result["load_before"] = [round(x, 2) for x in load_before]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["machine"] = machine()
    result["python"] = sys.version.split()[0]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.records:,} records ({result['records_bytes'] / 1e6:.0f} MB), {machine()}")
    print(
        f"startup {result['startup_s']} s, ready {result['ready_s']} s; "
        f"cold first /runs {result['cold_first_runs_page_ms']} ms"
    )
    for name in ("runs_page", "one_run"):
        print(f"{name:>12}: {result[name]}")
    print(f"{'overview':>12}: {result['overview']}")
    for name, figures in result["filter"].items():
        print(f"{'filter ' + name:>24}: {figures}")
    print(f"run path: {json.dumps(result['run_path'])}")
    print(f"targets: {result['targets']}")


if __name__ == "__main__":
    main()
