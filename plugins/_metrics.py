"""The metrics plugin's stores: the in-process registry and its Prometheus mirror.

Split from :mod:`loopwarden.plugins.metrics` (which re-exports :class:`HistogramValue` and
:class:`MetricsRegistry`): that module decides *what* is measured -- the metric definitions,
and the signal receivers that count runs, guard firings, calls and budget use; this one
*keeps* the numbers -- thread-safe counters and fixed-bucket histograms in process, and, with
``prometheus = true``, the same series in a prometheus-client registry (text exposition and the
HTTP server).  prometheus-client (``loopwarden[prometheus]``) is imported only when the mirror
is created.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["HistogramValue", "MetricsRegistry"]


# ---------------------------------------------------------------------------------------------
# The in-process registry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """A histogram's state: ``buckets`` maps each upper bound to the cumulative count."""

    count: int
    sum: float
    buckets: dict[float, int]

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class _Def:
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    prom_name: str = ""
    namespaced: bool = True


class MetricsRegistry:
    """Counters and fixed-bucket histograms, thread-safe, constant memory per label set."""

    def __init__(self, defs: Iterable[_Def]) -> None:
        self.defs = {d.name: d for d in defs}
        self._counters: dict[str, dict[tuple[str, ...], float]] = {}
        self._hists: dict[str, dict[tuple[str, ...], list[Any]]] = {}
        self._lock = threading.Lock()
        for d in self.defs.values():
            if d.kind in ("counter", "gauge"):  # a gauge is a counter that is set
                self._counters[d.name] = {}
            else:
                self._hists[d.name] = {}

    def _key(self, name: str, labels: Mapping[str, Any]) -> tuple[str, ...]:
        names = self.defs[name].labels
        try:
            if len(labels) == len(names):
                return tuple(
                    [v if type(v) is str else str(v) for v in map(labels.__getitem__, names)]
                )
        except KeyError:
            pass
        raise KeyError(f"{name} takes labels {list(names)}, got {sorted(labels)}")

    def inc(self, name: str, amount: float = 1.0, **labels: Any) -> None:
        key = self._key(name, labels)
        with self._lock:
            series = self._counters[name]
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: Any) -> None:
        """Set a gauge."""
        key = self._key(name, labels)
        with self._lock:
            self._counters[name][key] = value

    def add(self, counts: Iterable[tuple[str, tuple[str, ...], float]]) -> None:
        """Increment several counters under one lock, each by a ready-made key: its label
        values as strings, in the definition's order (the per-step receivers' fast path --
        no key built from keyword labels, one lock round for all of a signal's counts)."""
        counters = self._counters
        with self._lock:
            for name, key, amount in counts:
                series = counters[name]
                series[key] = series.get(key, 0.0) + amount

    def observe(self, name: str, value: float, **labels: Any) -> None:
        key = self._key(name, labels)
        bounds = self.defs[name].buckets
        with self._lock:
            series = self._hists[name]
            state = series.get(key)
            if state is None:
                state = series[key] = [[0] * len(bounds), 0.0, 0]
            counts: list[int] = state[0]
            for i, bound in enumerate(bounds):
                if value <= bound:
                    counts[i] += 1
                    break
            state[1] += value
            state[2] += 1

    def value(self, name: str, **labels: Any) -> float:
        """A counter's value for these labels (0 when never incremented)."""
        key = self._key(name, labels)
        with self._lock:
            return self._counters[name].get(key, 0.0)

    def total(self, name: str, **labels: Any) -> float:
        """A counter summed over every label not given (``total("runs_total")``)."""
        d = self.defs[name]
        want = {d.labels.index(k): str(v) for k, v in labels.items()}
        with self._lock:
            return sum(
                v
                for key, v in self._counters[name].items()
                if all(key[i] == s for i, s in want.items())
            )

    def histogram(self, name: str, **labels: Any) -> HistogramValue:
        """A histogram's count, sum and cumulative buckets (``inf`` last)."""
        key = self._key(name, labels)
        bounds = self.defs[name].buckets
        with self._lock:
            state = self._hists[name].get(key)
            counts = list(state[0]) if state else [0] * len(bounds)
            total, n = (state[1], state[2]) if state else (0.0, 0)
        cumulative: dict[float, int] = {}
        running = 0
        for bound, c in zip(bounds, counts, strict=True):
            running += c
            cumulative[bound] = running
        cumulative[float("inf")] = n
        return HistogramValue(count=n, sum=total, buckets=cumulative)

    def snapshot(self) -> dict[str, Any]:
        """Every series, JSON-able: ``{name: [{"labels": {...}, "value"|"count"...}]}``."""
        out: dict[str, Any] = {}
        with self._lock:
            counters = {n: dict(s) for n, s in self._counters.items()}
            hist_keys = {n: list(s) for n, s in self._hists.items()}
        for name, series in counters.items():
            labels = self.defs[name].labels
            out[name] = [
                {"labels": dict(zip(labels, k, strict=True)), "value": v}
                for k, v in sorted(series.items())
            ]
        for name, keys in hist_keys.items():
            labels = self.defs[name].labels
            rows = []
            for k in sorted(keys):
                lab = dict(zip(labels, k, strict=True))
                h = self.histogram(name, **lab)
                rows.append(
                    {
                        "labels": lab,
                        "count": h.count,
                        "sum": h.sum,
                        "buckets": {
                            ("+Inf" if b == float("inf") else repr(b)): c
                            for b, c in h.buckets.items()
                        },
                    }
                )
            out[name] = rows
        return out


# ---------------------------------------------------------------------------------------------
# The Prometheus mirror (the optional extra loopwarden[prometheus])
# ---------------------------------------------------------------------------------------------


class _Prometheus:
    """The prometheus-client mirror of the in-process metrics."""

    def __init__(self, defs: Sequence[_Def], namespace: str) -> None:
        import prometheus_client as pc

        self.pc = pc
        self.registry = pc.CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, Any] = {}
        for d in defs:
            ns = namespace if d.namespaced else ""
            if d.kind == "counter":
                self.metrics[d.name] = pc.Counter(
                    d.prom_name, d.help, list(d.labels), namespace=ns, registry=self.registry
                )
            elif d.kind == "gauge":
                self.metrics[d.name] = pc.Gauge(
                    d.prom_name, d.help, list(d.labels), namespace=ns, registry=self.registry
                )
            else:
                self.metrics[d.name] = pc.Histogram(
                    d.prom_name,
                    d.help,
                    list(d.labels),
                    namespace=ns,
                    registry=self.registry,
                    buckets=[*d.buckets, float("inf")],
                )
        self.server: Any = None

    def inc(self, name: str, amount: float, labels: Mapping[str, Any]) -> None:
        m = self.metrics[name]
        (m.labels(**{k: str(v) for k, v in labels.items()}) if labels else m).inc(amount)

    def set(self, name: str, value: float, labels: Mapping[str, Any]) -> None:
        m = self.metrics[name]
        (m.labels(**{k: str(v) for k, v in labels.items()}) if labels else m).set(value)

    def observe(self, name: str, value: float, labels: Mapping[str, Any]) -> None:
        m = self.metrics[name]
        (m.labels(**{k: str(v) for k, v in labels.items()}) if labels else m).observe(value)

    def text(self) -> str:
        data: bytes = self.pc.generate_latest(self.registry)
        return data.decode("utf-8")

    def serve(self, port: int, addr: str) -> None:
        self.server = self.pc.start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        server = self.server
        self.server = None
        if isinstance(server, tuple):  # (httpd, thread) in prometheus-client >= 0.17
            server[0].shutdown()
            server[0].server_close()
