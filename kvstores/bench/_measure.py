"""The measurement engine: calibrated, interleaved rounds of one scenario over its contenders.

For each scenario every contender is first calibrated (batches of growing size until one
takes a quarter of the time slice) so that one round of it lasts about ``slice_seconds``.
Then ``rounds + 1`` rounds run; in each round every contender runs its batch once, in an
order rotated every round so that machine noise hits all of them alike. Round 0 warms up
and is discarded. ops/s is the median over the measured rounds; p50/p99 come from the
per-call latencies of all measured rounds pooled; client CPU per call is the median over the
measured rounds of the process's CPU time per call (less sensitive than wall time to other
load on the machine, and what a call costs the client whatever the server's speed).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from time import perf_counter, process_time
from typing import Any

__all__ = ["OBJECTS", "STRING", "RowSkipped", "Scenario", "Settings", "Stats", "calibrate", "measure", "run_batch"]

_REFILL_LIMIT = 4  # a refill may take this many times max_batch_seconds

Op = Callable[[Any, int], Awaitable[object]]
"""One call of a scenario: ``op(subject, index)``; indices are distinct within a batch."""


@dataclass(frozen=True)
class Settings:
    """How long and how often each contender runs."""

    rounds: int
    slice_seconds: float
    max_batch_seconds: float
    """A row whose smallest batch (one call per task) takes longer is skipped, as is one whose
    refill takes over four times as long."""


STRING = "string"
"""The value shape of one long string (every row's unless it says otherwise)."""

OBJECTS = "objects"
"""The value shape of many small objects."""


class RowSkipped(Exception):
    """A scenario was too slow on some contender to measure within the time limits."""


@dataclass(frozen=True)
class Scenario:
    """One row of results: an operation at a value size and a concurrency."""

    operation: str
    value_bytes: int | None
    concurrency: int
    op: Op
    refill: Callable[[Any, int], Awaitable[None]] | None = None
    """Run untimed before each batch of ``n`` calls (e.g. to create the keys it deletes)."""
    max_calls: int = 200_000
    """Upper bound on the calls of one batch (bounds the data a refill writes)."""
    shape: str = STRING
    """The shape of the values: :data:`STRING` or :data:`OBJECTS`."""


@dataclass(frozen=True)
class Within:
    """A contender measured inside a context (e.g. with a module switched off), entered around each batch."""

    subject: Any
    context: Callable[[], AbstractContextManager[object]]


@dataclass(frozen=True)
class Stats:
    """One contender's figures for one scenario."""

    ops_per_second: float
    p50_us: float
    p99_us: float
    cpu_us: float
    """Client CPU time (user + system, this process) per call."""
    calls: int

    def as_json(self) -> dict[str, float | int]:
        """The figures as a JSON object."""
        return {
            "ops_per_second": round(self.ops_per_second, 1),
            "p50_us": round(self.p50_us, 2),
            "p99_us": round(self.p99_us, 2),
            "cpu_us": round(self.cpu_us, 2),
            "calls": self.calls,
        }


async def _worker(op: Op, subject: Any, indices: range, latencies: list[float]) -> None:
    clock = perf_counter
    for index in indices:
        start = clock()
        await op(subject, index)
        latencies.append(clock() - start)


async def run_batch(
    scenario: Scenario, subject: Any, calls: int, settings: Settings
) -> tuple[float, float, list[float]]:
    """Run ``calls`` calls over the scenario's concurrent tasks; return (elapsed, CPU seconds, latencies)."""
    if isinstance(subject, Within):
        with subject.context():
            return await run_batch(scenario, subject.subject, calls, settings)
    tasks = scenario.concurrency
    per_task = -(-calls // tasks)
    if scenario.refill is not None:
        limit = _REFILL_LIMIT * settings.max_batch_seconds
        try:
            await asyncio.wait_for(scenario.refill(subject, per_task * tasks), limit)
        except TimeoutError:
            raise RowSkipped(f"writing the data for {per_task * tasks} calls took over {limit:g} s") from None
    latencies: list[float] = []
    start, start_cpu = perf_counter(), process_time()
    if tasks == 1:
        await _worker(scenario.op, subject, range(per_task), latencies)
    else:
        workers = [
            asyncio.ensure_future(_worker(scenario.op, subject, range(t * per_task, (t + 1) * per_task), latencies))
            for t in range(tasks)
        ]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            for worker in workers:  # no straggler may outlive a failed batch
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
    return perf_counter() - start, process_time() - start_cpu, latencies


async def calibrate(scenario: Scenario, subject: Any, settings: Settings) -> int:
    """The number of calls one round of ``subject`` needs to last about ``slice_seconds``."""
    calls = scenario.concurrency
    slice_seconds = settings.slice_seconds
    while True:
        elapsed, _, _ = await run_batch(scenario, subject, calls, settings)
        if elapsed > settings.max_batch_seconds:
            raise RowSkipped(f"{calls} calls took {elapsed:.1f} s (limit {settings.max_batch_seconds:g} s)")
        if elapsed >= slice_seconds / 4 or calls >= scenario.max_calls:
            break
        calls *= 4
    wanted = int(calls * slice_seconds / max(elapsed, 1e-9))
    return max(scenario.concurrency, min(wanted, scenario.max_calls))


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(
    scenario: Scenario, subjects: dict[str, Any], settings: Settings, tick: Callable[[], None]
) -> dict[str, Stats]:
    """Measure ``scenario`` on every subject (name -> object the op receives), interleaved.

    Raises RowSkipped when one call per task already takes longer than ``max_batch_seconds``.
    """
    calls = {name: await calibrate(scenario, subject, settings) for name, subject in subjects.items()}
    rates: dict[str, list[float]] = {name: [] for name in subjects}
    cpu: dict[str, list[float]] = {name: [] for name in subjects}
    latencies: dict[str, list[float]] = {name: [] for name in subjects}
    names = list(subjects)
    for round_ in range(settings.rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            elapsed, cpu_seconds, samples = await run_batch(scenario, subjects[name], calls[name], settings)
            if round_:
                rates[name].append(len(samples) / elapsed)
                cpu[name].append(cpu_seconds / len(samples))
                latencies[name].extend(samples)
            tick()
    stats: dict[str, Stats] = {}
    for name in names:
        ordered = sorted(latencies[name])
        stats[name] = Stats(
            ops_per_second=statistics.median(rates[name]),
            p50_us=_percentile(ordered, 0.5) * 1e6,
            p99_us=_percentile(ordered, 0.99) * 1e6,
            cpu_us=statistics.median(cpu[name]) * 1e6,
            calls=len(ordered),
        )
    return stats
