"""``kvstores bench``: measure stores side by side with their raw drivers and py-key-value-aio.

Usage: ``kvstores bench [TARGET ...] [--compare] [--quick] [--scaling] [--json FILE] [--plot FILE.png]
[--markdown FILE.md]``, ``kvstores bench --batching-latency [--latency MS] TARGET ...`` or
``kvstores bench --signals [--streams N,N] [--rate R] [--events N] TARGET ...`` or
``kvstores bench --e2e [--sessions N] [--seconds S] [--profile DIR] TARGET ...``
``kvstores bench --tasks [--submitters N,N] [--docket-python PATH] [TARGET ...]``
(``python -m kvstores.bench ...`` is the same command). Ctrl-C stops a run and every server it
started, with one line on stderr and exit 130; no results are written.

TARGET is any store URL; the default is ``memory://`` and a temporary SQLite file. Each
target runs get, put, put with TTL, ttl, and get_many/put_many/delete_many of 100 keys, at
value sizes 100 B, 10 KB and 1 MB of one long string and 1 MB of 14,000 small objects, with 1
and 64 concurrent tasks; put_if_absent, pop and update when the store implements
``kvstores.AtomicStore``; then MCP event-store append, replay and append by stream length
(``--stream-lengths``, when ``mcp`` is installed). It reports ops/s, p50/p99 latency and client
CPU per call for every row.

``--compare`` adds, interleaved in the same run, the raw driver doing the same work (see
:mod:`kvstores.bench._baselines`), py-key-value-aio's store on the same backend where one
exists, and fastmcp's EventStore; each row then shows ours/baseline ops/s, and the targets
(:mod:`kvstores.bench._targets`) are judged, every miss listed. ``--scaling`` adds sweeps over
collection size, value size and concurrency (1 to 256 tasks, every contender); ``--large
[BACKENDS]`` adds the 1M-key memory/SQLite and 100k-key Redis/MongoDB points, which take
minutes to load. ``--quick`` runs 100 B values only, in shorter rounds.

``--batching-latency`` measures something else instead: for each networked TARGET, a
loopback proxy adding ``--latency`` ms (default 10) to every chunk in each direction stands in front of
its server (:mod:`kvstores.bench._proxy`), the store is opened through it with batching on and
with batching off, and both run rounds of C concurrent gets (and puts) spread over K
collections (``--callers``, default 1,8,64; ``--collections``, default 1,4,32), interleaved; each
row shows the median and p99 round time of both, and the targets require batching on to be no
slower than off within :data:`kvstores.bench._targets.BATCHING_TOLERANCE`, at every C and K.
The run is bounded: ``--rounds`` (default 10) and a wall-clock cap of 15 minutes (3 with
``--quick``), past which the remaining rows are skipped and say so.

``--signals`` measures cross-replica delivery instead (:mod:`kvstores.bench._signals`): for each
TARGET, a second process (replica A; in process for ``memory://``) publishes on the signal
channel and stores events in a live StoreEventStore on each of ``--streams`` concurrent streams
(default 1,64), paced at ``--rate`` events/s per stream for 5 s (default 10; 2 s with
``--quick``; 0: no paced rows) and then in a burst of ``--events`` back to back (default 200;
50 with ``--quick``), while this process (replica B) listens and follows; each row shows
p50/p99 delivery latency, events/s, and the events lost and duplicated, beside mcp-persist's
``subscribe()`` on Redis and PostgreSQL. The targets are limits: p99 per backend in every
paced row, and no lost or duplicated event in every row. Capped at 15 minutes of wall clock
(3 with ``--quick``).

``--e2e`` measures MCP tool calls end to end instead (:mod:`kvstores.bench._e2e`): for each
TARGET, the same FastMCP server with the same StoreEventStore on that store runs in a real
uvicorn process, once through FastMCP's own stateful ``http_app`` and once through
``kvstores.sessions.http_app``, and ``--sessions`` concurrent handshake sessions (default 16)
call ``remember`` and ``recall`` (``ctx.set_state`` / ``ctx.get_state``) in turn for
``--seconds`` (default 8; 3 with ``--quick``), ``--rounds`` times (default 2, the order
alternating); each row shows calls/s, p50/p99 and the server's CPU per call of both (the
median of the rounds) and durable ÷ FastMCP, judged against the targets (calls/s >= 0.95x,
p99 within 1.05x). ``--replicas N`` runs N server processes per mode behind HAProxy
(durable sessions round-robin, FastMCP's app sticky by session). ``--profile DIR`` runs each
server process under cProfile and writes its statistics there. The default TARGET is a
temporary SQLite file.
``--tasks`` measures MCP background tasks instead (:mod:`kvstores.bench._tasks`): for each TARGET,
a server process (uvicorn, FastMCP, :class:`kvstores.tasks.StoreTasks` on that store) runs a tool
that returns at once, and a wire-level client submits tasks and polls them to completion from
``--submitters`` concurrent submitters (default 1,64); each row shows tasks/s, p50/p99
submit-to-result latency and the pickup latency (acknowledgement, and submission, to the tool's
start). On a ``redis://`` TARGET, fastmcp-tasks 4.1.4 (Docket) runs beside it on the same Redis,
under another Python (``--docket-python PATH``, or a venv created once under
``~/.cache/kvstores/docket-venv``); without one its figures are skipped and the rows say why.

``--load FILE`` reads a document ``--json`` wrote instead of measuring, and re-judges the
targets; with ``--markdown FILE.md`` and ``--plot`` this regenerates BENCHMARKS.md's tables
and the plots from committed results (see :mod:`kvstores.bench._report`).

Scenario definitions: :mod:`kvstores.bench._scenarios`; the method:
:mod:`kvstores.bench._measure` and ``benchmarks/BENCHMARKS.md``.

The benchmark writes to the collections ``kvbench*`` (and fastmcp's ``fastmcp_events`` and
``fastmcp_streams``) of each target and destroys them at the end: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kvstores._optional import missing_extra
from kvstores._urls import redact, redact_text
from kvstores.bench._backends import BACKENDS, BenchBackend, bench_backend
from kvstores.bench._e2e import E2EPlan, run_e2e
from kvstores.bench._measure import Settings
from kvstores.bench._report import plot, print_tables, update_markdown
from kvstores.bench._run import LatencyPlan, Plan, Progress, run_batching_latency, run_target
from kvstores.bench._signals import DRAIN_SECONDS, SignalsPlan, run_signals
from kvstores.bench._targets import evaluate
from kvstores.bench._tasks import (
    TasksPlan,
    add_arguments,
    check_arguments,
    int_list,
    plan_settings,
    run_tasks,
    tasks_plan,
)

__all__ = ["main"]

_QUICK = Plan(
    value_sizes=(100,),
    concurrencies=(1, 64),
    settings=Settings(rounds=3, slice_seconds=0.02, max_batch_seconds=1.0),
    compare=False,
    events=True,
    scaling=False,
    stream_lengths=(10,),
    collection_sizes={"other": (1_000, 10_000)},
    scaling_value_sizes=(100, 10_000, 1_000_000),
    scaling_concurrencies=(1, 16, 64),
)
_FULL = Plan(
    value_sizes=(100, 10_000, 1_000_000),
    concurrencies=(1, 64),
    settings=Settings(rounds=5, slice_seconds=0.08, max_batch_seconds=3.0),
    compare=False,
    events=True,
    scaling=False,
    stream_lengths=(10, 100, 1_000),
    collection_sizes={
        **{family: backend.collection_sizes for family, backend in BACKENDS.items()},
        "other": BenchBackend().collection_sizes,
    },
    scaling_value_sizes=(100, 1_000, 10_000, 100_000, 1_000_000),
    scaling_concurrencies=(1, 4, 16, 64, 256),
    object_sizes=(1_000_000,),
)
_LATENCY_QUICK = (Settings(rounds=3, slice_seconds=0.05, max_batch_seconds=2.0), 180.0)
_LATENCY_FULL = (Settings(rounds=10, slice_seconds=0.2, max_batch_seconds=5.0), 900.0)
"""Batching-through-latency runs: (settings, wall-clock cap in seconds)."""
_SIGNALS_QUICK = (50, 2.0, 180.0)
_SIGNALS_FULL = (200, 5.0, 900.0)
"""Cross-replica delivery runs: (default events per stream of a burst, seconds of a paced row, wall-clock cap)."""
_E2E_QUICK = (3.0, 300.0)
_E2E_FULL = (8.0, 1800.0)
"""End-to-end runs: (default measured seconds per mode and round, wall-clock cap)."""


class _RichProgress(Progress):
    """A rich progress bar on stderr, one stage at a time."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar
        self._task = bar.add_task("starting", total=None)

    def start(self, description: str, total: int) -> None:
        """Begin a stage."""
        self._bar.reset(self._task, description=description, total=total)

    def tick(self) -> None:
        """One round of one contender is done."""
        self._bar.advance(self._task)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvstores bench", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "targets", nargs="*", metavar="TARGET", help="store URLs (default: memory:// and a temp SQLite)"
    )
    parser.add_argument("--compare", action="store_true", help="add raw-driver, py-key-value and fastmcp baselines")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter rounds (under a minute)")
    parser.add_argument("--scaling", action="store_true", help="add collection-size, value-size and concurrency sweeps")
    parser.add_argument(
        "--large",
        nargs="?",
        const=",".join(BACKENDS),
        default="",
        metavar="BACKENDS",
        help="with --scaling: 1M memory/SQLite keys, 100k others (default: every backend; or e.g. sqlite,redis)",
    )
    parser.add_argument("--no-events", action="store_true", help="skip the MCP event-store scenarios")
    parser.add_argument("--no-atomic", action="store_true", help="skip put_if_absent, pop and update")
    parser.add_argument(
        "--stream-lengths",
        type=int_list,
        metavar="N,N,...",
        help="stream lengths of the append@N event rows (default 10,100,1000; --quick 10; '' for none)",
    )
    parser.add_argument(
        "--batching-latency",
        action="store_true",
        help="instead: batching on vs off through a latency-adding proxy, for networked TARGETs",
    )
    parser.add_argument(
        "--latency", type=float, default=10.0, metavar="MS", help="--batching-latency: ms added each way (default 10)"
    )
    parser.add_argument(
        "--callers", type=int_list, default=(1, 8, 64), metavar="N,N,...", help="--batching-latency: calls per round"
    )
    parser.add_argument(
        "--collections",
        type=int_list,
        default=(1, 4, 32),
        metavar="N,N,...",
        help="--batching-latency: collections a round spreads over",
    )
    parser.add_argument(
        "--signals",
        action="store_true",
        help="instead: cross-replica event delivery latency (signal channel, live event store, mcp-persist)",
    )
    parser.add_argument(
        "--streams", type=int_list, default=(1, 64), metavar="N,N,...", help="--signals: concurrent streams per row"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=10.0,
        metavar="R",
        help="--signals: events/s per stream of the paced rows (0: none)",
    )
    parser.add_argument("--events", type=int, metavar="N", help="--signals: events per stream of a burst (default 200)")
    parser.add_argument(
        "--e2e",
        action="store_true",
        help="instead: tools/call end to end through uvicorn, durable sessions vs FastMCP's own app",
    )
    parser.add_argument("--sessions", type=int, default=16, metavar="N", help="--e2e: concurrent sessions")
    parser.add_argument("--seconds", type=float, metavar="S", help="--e2e: measured seconds per mode and round")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="--e2e: write each server's cProfile stats here")
    parser.add_argument(
        "--replicas", type=int, default=1, metavar="N", help="--e2e: server processes per mode, behind HAProxy if > 1"
    )
    add_arguments(parser)
    parser.add_argument("--rounds", type=int, help="measured rounds per row (after one warm-up round)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="write plots (needs matplotlib: kvstores[plot])")
    parser.add_argument(
        "--markdown", type=Path, metavar="FILE.md", help="rewrite the generated tables of FILE.md (e.g. BENCHMARKS.md)"
    )
    parser.add_argument("--load", type=Path, metavar="FILE", help="report on a results document instead of measuring")
    return parser


def _collection_sizes(base: Plan, large: str) -> dict[str, tuple[int, ...]]:
    """The collection-size sweep per backend: ``base``'s, with the large sizes for the backends named."""
    chosen = {name.strip() for name in large.split(",") if name.strip()}
    sizes = {family: base.collection_sizes.get(family, base.collection_sizes["other"]) for family in BACKENDS}
    sizes["other"] = base.collection_sizes["other"]
    for family in chosen:
        sizes[family] = bench_backend(family).large_sizes
    return sizes


def _plan(options: argparse.Namespace) -> Plan:
    base = _QUICK if options.quick else _FULL
    settings = Settings(
        options.rounds or base.settings.rounds, base.settings.slice_seconds, base.settings.max_batch_seconds
    )
    return Plan(
        value_sizes=base.value_sizes,
        concurrencies=base.concurrencies,
        settings=settings,
        compare=options.compare,
        events=not options.no_events and importlib.util.find_spec("mcp") is not None,
        scaling=options.scaling,
        atomic=not options.no_atomic,
        stream_lengths=base.stream_lengths if options.stream_lengths is None else options.stream_lengths,
        collection_sizes=_collection_sizes(base, options.large),
        scaling_value_sizes=base.scaling_value_sizes,
        scaling_concurrencies=base.scaling_concurrencies,
        object_sizes=base.object_sizes,
    )


def _latency_plan(options: argparse.Namespace) -> LatencyPlan:
    settings, budget = _LATENCY_QUICK if options.quick else _LATENCY_FULL
    if options.rounds:
        settings = Settings(options.rounds, settings.slice_seconds, settings.max_batch_seconds)
    return LatencyPlan(options.latency / 1e3, options.callers, options.collections, settings, budget)


def _signals_plan(options: argparse.Namespace) -> SignalsPlan:
    events, paced_seconds, budget = _SIGNALS_QUICK if options.quick else _SIGNALS_FULL
    return SignalsPlan(options.streams, options.events or events, budget, options.rate, paced_seconds)


def _e2e_plan(options: argparse.Namespace) -> E2EPlan:
    seconds, budget = _E2E_QUICK if options.quick else _E2E_FULL
    profile = None if options.profile is None else str(options.profile)
    return E2EPlan(options.sessions, options.seconds or seconds, options.rounds or 2, budget, profile, options.replicas)


async def _run_each(
    targets: dict[str, str],
    run: Callable[[str, str, Any, float, Progress], Awaitable[list[dict[str, Any]]]],
    plan: SignalsPlan | LatencyPlan | E2EPlan | TasksPlan,
    progress: Progress,
) -> dict[str, Any]:
    """``run(label, url, plan, deadline, progress)`` on each target, within the plan's budget."""
    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    deadline = time.monotonic() + plan.budget_seconds
    for label, url in targets.items():
        try:
            target_rows = await run(label, url, plan, deadline, progress)
        except Exception as exc:  # one failing target must not lose the others' results
            errors[label] = redact_text(f"{type(exc).__name__}: {exc}", url)
            continue
        rows += target_rows
        if (failure := _all_failed(target_rows)) is not None:
            errors[label] = failure
    return {"rows": rows, "scaling": {}, "errors": errors}


def _all_failed(rows: list[dict[str, Any]]) -> str | None:
    """Why a target measured nothing when its rows failed (an error of the run: exit 1), else None.

    Rows skipped for a reason of the plan's only (the wall-clock cap, a URL the mode cannot use) are no failure.
    """
    if rows and all("skipped" in row for row in rows):
        failed = [str(row["skipped"]) for row in rows if "failed" in str(row["skipped"])]
        if failed:
            return f"nothing was measured: {failed[0]}"
    return None


async def _run_all(targets: dict[str, str], plan: Plan, progress: Progress) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    scaling: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, str] = {}
    for label, url in targets.items():
        try:
            target_rows, target_scaling = await run_target(label, url, plan, progress)
        except Exception as exc:  # one failing target must not lose the others' results
            errors[label] = redact_text(f"{type(exc).__name__}: {exc}", url)
            continue
        rows += target_rows
        if (failure := _all_failed(target_rows)) is not None:
            errors[label] = failure
        for axis, points in target_scaling.items():
            scaling.setdefault(axis, []).extend(points)
    return {"rows": rows, "scaling": scaling, "errors": errors}


def _settings(plan: Plan | LatencyPlan | SignalsPlan | E2EPlan | TasksPlan) -> dict[str, Any]:
    if isinstance(plan, E2EPlan):
        return {
            "e2e": {
                "sessions": plan.sessions,
                "seconds": plan.seconds,
                "rounds": plan.rounds,
                "replicas": plan.replicas,
                "budget_seconds": plan.budget_seconds,
            }
        }
    if isinstance(plan, TasksPlan):
        return plan_settings(plan)
    if isinstance(plan, SignalsPlan):
        return {
            "signals": {
                "streams": list(plan.streams),
                "events_per_stream": plan.events,
                "rate_per_stream": plan.rate,
                "paced_seconds": plan.paced_seconds,
                "budget_seconds": plan.budget_seconds,
                "drain_seconds": DRAIN_SECONDS,
            }
        }
    if isinstance(plan, LatencyPlan):
        return {
            "rounds": plan.settings.rounds,
            "warmup_rounds": 1,
            "slice_seconds": plan.settings.slice_seconds,
            "batching_latency": {
                "delay_ms_each_way": plan.delay_seconds * 1e3,
                "callers": list(plan.callers),
                "collections": list(plan.collections),
                "budget_seconds": plan.budget_seconds,
            },
        }
    return {
        "rounds": plan.settings.rounds,
        "warmup_rounds": 1,
        "slice_seconds": plan.settings.slice_seconds,
        "value_sizes": list(plan.value_sizes),
        "object_sizes": list(plan.object_sizes),
        "concurrencies": list(plan.concurrencies),
        "stream_lengths": list(plan.stream_lengths),
        "compare": plan.compare,
    }


def _document(
    argv: list[str],
    plan: Plan | LatencyPlan | SignalsPlan | E2EPlan | TasksPlan,
    results: dict[str, Any],
    elapsed: float,
) -> dict[str, Any]:
    return {
        "command": ["kvstores", "bench", *map(redact_text, argv)],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_at_end": [round(load, 2) for load in os.getloadavg()],  # 1, 5, 15 min: was it quiet?
        },
        "settings": _settings(plan),
        "elapsed_seconds": round(elapsed, 1),
        "targets": evaluate(results["rows"]),
        **results,
    }


def _measure(argv: list[str], options: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark ``options`` describe; return the results document."""
    plan: Plan | LatencyPlan | SignalsPlan | E2EPlan | TasksPlan
    if options.e2e:
        plan = _e2e_plan(options)
    elif options.tasks:
        plan = tasks_plan(options)
    elif options.signals:
        plan = _signals_plan(options)
    elif options.batching_latency:
        plan = _latency_plan(options)
    else:
        plan = _plan(options)
    try:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgressBar
    except ImportError as exc:
        raise missing_extra("rich", "cli") from exc
    started, load = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvbench-") as folder:
        defaults = {"memory://": "memory://", "sqlite (temporary file)": f"sqlite:///{folder}/bench.db"}
        if isinstance(plan, E2EPlan):  # a session shared by processes: the in-memory store has none
            del defaults["memory://"]
        targets = {redact(url): url for url in options.targets} or defaults  # label: URL
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with RichProgressBar(*columns, transient=True) as bar:
            if isinstance(plan, E2EPlan):
                results = asyncio.run(_run_each(targets, run_e2e, plan, _RichProgress(bar)))
            elif isinstance(plan, TasksPlan):
                results = asyncio.run(_run_each(targets, run_tasks, plan, _RichProgress(bar)))
            elif isinstance(plan, SignalsPlan):
                results = asyncio.run(_run_each(targets, run_signals, plan, _RichProgress(bar)))
            elif isinstance(plan, LatencyPlan):
                results = asyncio.run(_run_each(targets, run_batching_latency, plan, _RichProgress(bar)))
            else:
                results = asyncio.run(_run_all(targets, plan, _RichProgress(bar)))
    document = _document(argv, plan, results, time.perf_counter() - started)
    document["machine"]["load_average_at_start"] = [round(value, 2) for value in load]
    return document


def main(argv: list[str] | None = None) -> int:
    """Run ``kvstores bench`` with ``argv`` (default: sys.argv[1:]); return the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    options = parser.parse_args(argv)
    if options.batching_latency:
        if not options.targets and not options.load:
            parser.error("--batching-latency needs the URLs of networked stores (redis://, postgresql://...)")
        if options.latency < 0 or not options.callers or not options.collections:
            parser.error("--batching-latency needs --latency >= 0 and numbers in --callers and --collections")
        if min(options.callers + options.collections) < 1:
            parser.error("--callers and --collections take numbers >= 1")
    if options.e2e:
        if options.signals or options.batching_latency or options.tasks:
            parser.error("--e2e, --tasks, --signals and --batching-latency are separate runs: choose one")
        if options.sessions < 1 or options.replicas < 1 or (options.seconds is not None and options.seconds <= 0):
            parser.error("--e2e needs --sessions >= 1, --replicas >= 1 and --seconds > 0")
    if options.signals:
        if options.batching_latency:
            parser.error("--signals and --batching-latency are two runs: choose one")
        if not options.streams or min(options.streams) < 1 or (options.events is not None and options.events < 1):
            parser.error("--signals needs --streams and --events of numbers >= 1")
        if options.rate < 0:
            parser.error("--rate takes a number >= 0")
    check_arguments(parser, options)
    # py-key-value warns that its MongoDB store's API is unstable, on every use: noise here
    warnings.filterwarnings("ignore", message="A configured store is unstable", category=UserWarning)
    if options.load:
        document = json.loads(options.load.read_text())
        document["targets"] = evaluate(document["rows"])
    else:
        try:
            document = _measure(argv, options)
        except KeyboardInterrupt:  # Ctrl-C: the servers and stores it started are stopped on the way out
            print("\nkvstores bench: interrupted; no results written", file=sys.stderr)
            return 130
    print_tables(document["rows"], document["targets"])
    if options.json:
        options.json.write_text(json.dumps(document, indent=1) + "\n")
    if options.markdown:
        update_markdown(options.markdown, document)
        print(f"wrote {options.markdown}")
    if options.plot:
        for path in plot(document["rows"], document["scaling"], options.plot):
            print(f"wrote {path}")
    print(f"{len(document['rows'])} rows in {document['elapsed_seconds']} s")
    for label, error in document["errors"].items():
        print(f"kvstores bench: {label}: {error}", file=sys.stderr)
    return 1 if document["errors"] else 0
