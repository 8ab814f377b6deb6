"""The targets: every ratio kvstores promises against a baseline, in one table, and how a run is judged.

A target covers the measured rows of one group (``kv``, ``atomic``, ``events``, ``batching``...)
whose operation, value size and concurrency (and for ``batching`` rows, number of collections)
it names, on one backend or on every backend. It is judged separately for each target URL and
each store class under test, so that one event store's miss is never averaged away by another's
success: the *median* ratio over the rows it covers must reach ``minimum`` (with ``every_row``,
the worst ratio must); the worst row is reported beside it. A target whose baseline ran
but whose every row was skipped or failed is a miss ("not measured"), never silently absent.

A :class:`Limit` is a target without a baseline: a figure of kvstores' own that must stay within
a bound in every row it covers (the ``--signals`` rows: p99 delivery latency per backend, and
no lost or duplicated event). It is judged whenever its rows are in the run.

To add a target of every backend, add a :class:`Target` or a :class:`Limit` to :data:`TARGETS`;
a backend's own targets and bounds are in its row of :data:`kvstores.bench._backends.BACKENDS`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from kvstores.bench._backends import BACKENDS, raw_name
from kvstores.bench._e2e import E2E_GROUP, E2E_OPERATION
from kvstores.bench._measure import STRING
from kvstores.bench._otel import NO_API
from kvstores.bench._run import BATCHING_OFF
from kvstores.bench._scenarios import (
    ATOMIC_OPERATIONS,
    BATCHING_OPERATIONS,
    BATCHING_VALUE_BYTES,
    size_label,
)
from kvstores.bench._sealing import NO_ENCRYPTION
from kvstores.bench._signals import SIGNALS_GROUP
from kvstores.bench._tasks import DOCKET, OPERATION, TASKS_GROUP

__all__ = [
    "BATCHING_TOLERANCE",
    "RAW",
    "SIGNAL_LIMITS",
    "TARGETS",
    "TASK_PICKUP_P50_MS",
    "TASK_RESULT_P50_MS",
    "TASK_TARGETS",
    "Limit",
    "Target",
    "evaluate",
    "row_label",
]

RAW = "raw"
"""As a target's baseline: the raw driver of each row's backend (``aiosqlite``, ``redis.asyncio``...)."""

_LOWER_IS_BETTER = frozenset({"p50_us", "p99_us", "cpu_us", "submit_to_start_p50_ms"})
_FLOOR = 1e-3  # a lower-is-better figure of 0 counts as this much


@dataclass(frozen=True)
class Target:
    """A ratio kvstores promises: the median over the matching rows of ours ÷ baseline >= ``minimum``."""

    label: str
    """Shown in reports; ``{store}``, ``{backend}`` and ``{baseline}`` are filled in."""
    baseline: str
    """A contender name (``py-key-value``, ``fastmcp``...) or :data:`RAW`."""
    minimum: float
    operations: tuple[str, ...]
    group: str = "kv"
    backend: str | None = None
    """Backend family the rows come from; None: every backend, each judged on its own."""
    value_bytes: int | None = None
    """Only rows of this value size (None: every size)."""
    concurrency: int | None = None
    """Only rows with this many concurrent tasks (None: every concurrency)."""
    metric: str = "ops_per_second"
    """The figure compared; for latencies and CPU (lower is better) the ratio is baseline ÷ ours,
    so that above 1 always means kvstores does better."""
    collections: int | None = None
    """Only rows spread over this many collections (None: any)."""
    every_row: bool = False
    """Judge the worst row rather than the median: every row must reach ``minimum``."""
    shape: str | None = None
    """Only rows whose values have this shape (None: any)."""

    def covers(self, row: dict[str, Any]) -> bool:
        """True if ``row`` is one of this target's rows (measured or skipped)."""
        return (
            row["group"] == self.group
            and row["operation"] in self.operations
            and (self.backend is None or row["backend"] == self.backend)
            and (self.value_bytes is None or row["value_bytes"] == self.value_bytes)
            and (self.concurrency is None or row["concurrency"] == self.concurrency)
            and (self.collections is None or row.get("collections") == self.collections)
            and (self.shape is None or row.get("shape", STRING) == self.shape)
        )

    def baseline_of(self, backend: str) -> str:
        """The contender this target compares with on ``backend``."""
        return raw_name(backend) if self.baseline == RAW else self.baseline

    def ratio(self, row: dict[str, Any], baseline: str) -> float | None:
        """Ours ÷ ``baseline`` in ``row`` (inverted for lower-is-better metrics), or None if not measured."""
        contenders = row.get("contenders", {})
        if baseline not in contenders:
            return None
        if self.metric == "ops_per_second":
            return float(row["ratios"][baseline])  # the figure the row shows
        ours, theirs = contenders["kvstores"][self.metric], contenders[baseline][self.metric]
        if self.metric in _LOWER_IS_BETTER:
            return float(max(theirs, _FLOOR) / max(ours, _FLOOR))
        return float(ours / theirs)


@dataclass(frozen=True)
class Limit:
    """A bound on one of kvstores' own figures, e.g. p99 <= 50 ms: every row it covers must keep it."""

    label: str
    """Shown in reports; ``{store}`` and ``{backend}`` are filled in."""
    metrics: tuple[str, ...]
    """Figures of the ``kvstores`` contender; their sum is compared (e.g. lost + duplicated)."""
    maximum: float
    unit: str
    operations: tuple[str, ...]
    group: str = SIGNALS_GROUP
    backend: str | None = None
    """Backend family the rows come from; None: every backend, each judged on its own."""
    paced_only: bool = False
    """Only the rows sent at a set ``rate`` (a latency), not the back-to-back bursts (a throughput)."""
    concurrency: int | None = None
    """Only rows with this many concurrent tasks (None: every concurrency)."""
    scale: float = 1.0
    """What the sum is multiplied by to be in ``unit`` (e.g. 1e-3 for a figure in µs bounded in ms)."""

    def covers(self, row: dict[str, Any]) -> bool:
        """True if ``row`` is one of this limit's rows (measured or skipped)."""
        return (
            row["group"] == self.group
            and row["operation"] in self.operations
            and (self.backend is None or row["backend"] == self.backend)
            and (not self.paced_only or row.get("rate") is not None)
            and (self.concurrency is None or row["concurrency"] == self.concurrency)
        )

    def value(self, row: dict[str, Any]) -> float | None:
        """The row's figure, or None if it was not measured."""
        ours = row.get("contenders", {}).get("kvstores")
        if ours is None or any(metric not in ours for metric in self.metrics):
            return None
        return float(sum(ours[metric] for metric in self.metrics)) * self.scale


_SIGNAL_OPERATIONS = ("signal", "follow")

SIGNAL_LIMITS = (
    *(
        Limit(
            f"{{store}} signal and follow p99 <= {bound:g} ms, paced ({{backend}})",
            ("p99_ms",),
            bound,
            "ms",
            _SIGNAL_OPERATIONS,
            backend=backend,
            paced_only=True,
        )
        for backend, bound in ((name, row.signal_p99_ms) for name, row in BACKENDS.items())
        if bound is not None
    ),
    Limit(
        "{store} signal and follow: no lost or duplicated event",
        ("lost", "duplicated"),
        0,
        "events",
        _SIGNAL_OPERATIONS,
    ),
)
"""The ``--signals`` targets."""

TASK_PICKUP_P50_MS = {"postgresql": 10.0, "mysql": 10.0, "sqlite": 100.0, "mongodb": 100.0}
"""The ``--tasks`` bound on the p50 pickup latency (acknowledgement to the tool's start) per backend, judged
with one submitter (with more than the server's worker slots, a pickup includes the wait for a free
slot); Redis is judged against Docket instead."""

TASK_RESULT_P50_MS = {"postgresql": 10.0, "mysql": 10.0, "sqlite": 20.0, "mongodb": 20.0}
"""The ``--tasks`` bound on the p50 of a quick tool's submit→result time per backend (issue 40), judged
with one submitter; Redis is judged against Docket instead."""


def _task_p50_bounds(figure: str, metric: str, bounds: dict[str, float], scale: float = 1.0) -> tuple[Limit, ...]:
    """A bound in ms on the p50 of ``metric`` per backend of ``bounds``, judged with one submitter."""
    return tuple(
        Limit(
            f"{{store}} {figure} p50 <= {bound:g} ms, 1 submitter ({{backend}})",
            (metric,),
            bound,
            "ms",
            (OPERATION,),
            group=TASKS_GROUP,
            backend=backend,
            concurrency=1,
            scale=scale,
        )
        for backend, bound in bounds.items()
    )


def _against_docket(label: str, metric: str) -> Target:
    """Kvstores' ``metric`` against Docket's on Redis, in every row."""
    return Target(label, DOCKET, 1.0, (OPERATION,), TASKS_GROUP, "redis", metric=metric, every_row=True)


TASK_TARGETS: tuple[Target | Limit, ...] = (
    _against_docket("{store} tasks/s vs {baseline} (Docket) on Redis", "ops_per_second"),
    _against_docket(
        "{store} submit-to-start p50 vs {baseline} (Docket) on Redis (its ÷ ours)", "submit_to_start_p50_ms"
    ),
    _against_docket("{store} submit→result p50 vs {baseline} (Docket) on Redis (its ÷ ours)", "p50_us"),
    *_task_p50_bounds("submit→result", "p50_us", TASK_RESULT_P50_MS, scale=1e-3),
    *_task_p50_bounds("pickup", "pickup_p50_ms", TASK_PICKUP_P50_MS),
)
"""The ``--tasks`` targets: on Redis at least Docket's tasks/s and at most its submit-to-start and
submit→result p50 in every row (its pickup from the acknowledgement is negative:
:mod:`kvstores.bench._tasks`); elsewhere bounds on the submit→result and pickup p50."""

BATCHING_TOLERANCE = 1.05
"""How much longer than with batching off a round may take with batching on and still meet its
target: the noise of one row on this machine. With one caller both settings run the same code
(a lone call goes out at once), so a stricter bound would judge the noise."""


def _spread(callers: int, collections: int) -> str:
    """``64 callers over 32 collections``."""
    return f"{callers} caller{'s' * (callers != 1)} over {collections} collection{'s' * (collections != 1)}"


_BATCHING_SHAPES = tuple((callers, count) for callers in (1, 8, 64) for count in (1, 4, 32))
"""(callers, collections) of the batching-through-latency targets (issue 21 §5; 8 callers, fewer than a
pool's connections: issue 31)."""

TARGETS: tuple[Target | Limit, ...] = (
    *(
        Target(
            ratio.label,
            ratio.baseline,
            ratio.minimum,
            ratio.operations,
            "kv",
            backend,
            ratio.value_bytes,
            ratio.concurrency,
            every_row=ratio.every_row,
            shape=ratio.shape,
        )
        for backend, row in BACKENDS.items()
        for ratio in row.targets
    ),
    Target("{store} atomic operations vs raw {baseline}", RAW, 0.8, ATOMIC_OPERATIONS, "atomic"),
    Target("{store} with opentelemetry-api and no SDK vs without it", NO_API, 0.97, ("get", "put"), "otel", "memory"),
    *(
        Target("{store} with encryption keys vs without", NO_ENCRYPTION, 0.87, ("get", "put"), "encryption", backend)
        for backend, row in BACKENDS.items()
        if row.tcp_schemes
    ),
    *(
        target
        for backend, (alone, gets, puts) in ((name, row.batching) for name, row in BACKENDS.items() if row.batching)
        for target in (
            Target("{store} get/put, 1 caller, vs raw {baseline}", RAW, alone, ("get", "put"), "kv", backend, 100, 1),
            Target("{store} get, 64 callers, vs raw {baseline}", RAW, gets, ("get",), "kv", backend, 100, 64),
            Target("{store} put, 64 callers, vs raw {baseline}", RAW, puts, ("put",), "kv", backend, 100, 64),
            Target(
                "{store} p99 of get/put, 64 callers, vs raw {baseline}",
                RAW,
                1.0,
                ("get", "put"),
                "kv",
                backend,
                100,
                64,
                "p99_us",
            ),
        )
    ),
    *(
        Target(
            f"{{store}} batching on within {BATCHING_TOLERANCE}x of off, {_spread(callers, count)} ({round_name})",
            BATCHING_OFF,
            round(1 / BATCHING_TOLERANCE, 3),
            BATCHING_OPERATIONS,
            "batching",
            value_bytes=BATCHING_VALUE_BYTES,
            concurrency=callers,
            metric=metric,
            collections=count,
            every_row=True,
        )
        for callers, count in _BATCHING_SHAPES
        for metric, round_name in (("p50_us", "median round"), ("p99_us", "p99 round"))
    ),
    Target("{store} append vs fastmcp EventStore ({backend})", "fastmcp", 3.0, ("append",), "events"),
    Target("{store} replay vs fastmcp EventStore ({backend})", "fastmcp", 5.0, ("replay",), "events"),
    *SIGNAL_LIMITS,
    Target("durable sessions calls/s vs FastMCP's own app ({backend})", "fastmcp", 0.95, (E2E_OPERATION,), E2E_GROUP),
    Target(
        "durable sessions p99 within 1.05x of FastMCP's own app ({backend})",
        "fastmcp",
        round(1 / 1.05, 3),
        (E2E_OPERATION,),
        E2E_GROUP,
        metric="p99_us",
    ),
    *TASK_TARGETS,
)
"""Every target, in report order."""


def row_label(row: dict[str, Any]) -> str:
    """A row in words: ``get 100 B x64``, ``StoreEventStore.append``."""
    if row["group"] == "events":
        return f"{row['store']}.{row['operation']}"
    if row["group"] == E2E_GROUP:
        replicas = row.get("replicas", 1)
        behind = f", {replicas} replicas behind HAProxy" if replicas > 1 else ""
        return f"{row['operation']} x{row['concurrency']} sessions{behind}"
    if row["group"] == SIGNALS_GROUP:
        pace = f"{row['rate']:g}/s each" if row.get("rate") else "burst"
        return f"{row['operation']} x{row['concurrency']} stream{'s' * (row['concurrency'] != 1)}, {pace}"
    if row["group"] == TASKS_GROUP:
        return f"{row['operation']} x{row['concurrency']} submitter{'s' * (row['concurrency'] != 1)}"
    if "collections" in row:
        return f"{row['operation']}, {_spread(row['concurrency'], row['collections'])}"
    return f"{row['operation']} {size_label(row['value_bytes'], row.get('shape', STRING))} x{row['concurrency']}"


def _judge(target: Target, url: str, store: str, rows: list[dict[str, Any]], baseline: str) -> dict[str, Any]:
    backend = rows[0]["backend"]
    ratios = [(ratio, row) for row in rows if (ratio := target.ratio(row, baseline)) is not None]
    result: dict[str, Any] = {
        "target": target.label.format(store=store, backend=backend, baseline=baseline),
        "url": url,
        "backend": backend,
        "store": store,
        "baseline": baseline,
        "group": target.group,
        "metric": target.metric,
        "minimum": target.minimum,
        "every_row": target.every_row,
        "rows": len(ratios),
        "skipped_rows": len(rows) - len(ratios),
    }
    if not ratios:
        return {**result, "median_ratio": None, "worst_ratio": None, "worst_row": None, "met": False}
    median = statistics.median(ratio for ratio, _ in ratios)
    worst, worst_row = min(ratios, key=lambda pair: pair[0])
    return {
        **result,
        "median_ratio": round(median, 3),
        "worst_ratio": round(worst, 3),
        "worst_row": row_label(worst_row),
        "met": (worst if target.every_row else median) >= target.minimum,
    }


def _judge_limit(limit: Limit, url: str, store: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    backend = rows[0]["backend"]
    values = [(value, row) for row in rows if (value := limit.value(row)) is not None]
    result: dict[str, Any] = {
        "target": limit.label.format(store=store, backend=backend),
        "url": url,
        "backend": backend,
        "store": store,
        "baseline": None,
        "group": limit.group,
        "metric": "+".join(limit.metrics),
        "maximum": limit.maximum,
        "unit": limit.unit,
        "every_row": True,
        "rows": len(values),
        "skipped_rows": len(rows) - len(values),
    }
    if not values:
        return {**result, "worst": None, "worst_row": None, "met": False}
    worst, worst_row = max(values, key=lambda pair: pair[0])
    return {
        **result,
        "worst": round(worst, 3),
        "worst_row": row_label(worst_row),
        "met": worst <= limit.maximum and len(values) == len(rows),
    }


def evaluate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target judged on ``rows``, per target URL and store class, in :data:`TARGETS` order.

    A (URL, store) is judged only if the target's baseline ran against that URL (so a run
    without ``--compare`` has no targets); it is then a miss when none of its rows was measured.
    A :class:`Limit` is judged on every (URL, store) with rows it covers, and missed when any was skipped.
    """
    contenders: dict[str, set[str]] = {}
    for row in rows:
        contenders.setdefault(row["target"], set()).update(row.get("contenders", {}))
    results = []
    for target in TARGETS:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for row in rows:
            if target.covers(row):
                groups.setdefault((row["target"], row["store"]), []).append(row)
        if isinstance(target, Limit):
            results += [_judge_limit(target, url, store, covered) for (url, store), covered in groups.items()]
            continue
        for (url, store), covered in groups.items():
            baseline = target.baseline_of(covered[0]["backend"])
            if baseline in contenders[url]:
                results.append(_judge(target, url, store, covered, baseline))
    return results
