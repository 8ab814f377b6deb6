"""``kvstores bench --tasks``: MCP background tasks through a real server, beside fastmcp-tasks (Docket).

Per target URL, a server process (:mod:`kvstores.bench._tasks_server`: uvicorn, FastMCP and
:class:`kvstores.tasks.StoreTasks` on that store, ``worker_concurrency`` tasks at once) serves
one ``task=True`` tool that returns at once. On a ``redis://`` target a second server runs
``fastmcp-tasks`` 4.1.4's ``TasksExtension`` (Docket) on the same Redis (its queue under a name
of its own, same worker concurrency), with another Python (``--docket-python``, or a venv the
bench creates once under :data:`DOCKET_VENV`): fastmcp-tasks pins FastMCP 4.1.4, which cannot
be installed beside kvstores' FastMCP. If neither is usable, the Docket figures are skipped and
each Redis row says why.

The client (:class:`kvstores.tasks.TaskClient`, in this process) speaks the tasks extension as FastMCP's own
client does: ``tools/call`` with the extension declared, a ``CreateTaskResult`` back, then
``tasks/get`` until the task is completed, paced as that client paces it (at once, then after
``poll_seconds``, 20 ms by default, each pause twice the last, up to the server's
``pollIntervalMs``). One call of the benchmark is that whole exchange; the measurement engine
(:mod:`kvstores.bench._measure`: calibrated rounds, the contenders interleaved, round 0
discarded) runs ``submitters`` of them at once. Each row holds, per contender: tasks/s, p50/p99
submit-to-result latency (which includes the polls' pauses), p50/p99 *pickup* latency (from the
moment the client holds the acknowledgement, ``CreateTaskResult``, to the moment the tool starts)
and p50/p99 *submit-to-start* latency (from the moment the client sends ``tools/call``). The
tool's start is its own stamp of ``time.monotonic()`` (one clock for every process on Linux). A
tool may start before its acknowledgement reaches the client: the pickup is signed, and
``started_before_ack`` counts such tasks. Docket acknowledges a task after it has, most often,
already run, so its pickup is negative, which says more of its acknowledgement than of how fast
it picks a task up: the comparison with Docket is judged on submit-to-start instead
(:data:`kvstores.bench._targets.TASK_TARGETS`). ``server_cpu_ms`` is the CPU time the server
process (HTTP, engine and worker, all in one process for both engines) spent per task, median over
the rounds (read from ``/proc``; absent elsewhere): what a task costs, less sensitive than the
latencies to other load on the machine.

The run writes to the store under a prefix, table or collection of its own where the backend
has one (:data:`ISOLATION`) and the URL names none, else to the engine's collections, and removes
what it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from kvstores._loopback import bound_socket
from kvstores._urls import redact_text
from kvstores.bench._backends import family
from kvstores.bench._e2e import stop_server
from kvstores.bench._measure import RowSkipped, Scenario, Settings, calibrate, run_batch
from kvstores.bench._tasks_server import OPTIONS_VARIABLE, URL_VARIABLE

if TYPE_CHECKING:
    from kvstores.tasks import TaskClient

__all__ = [
    "DOCKET",
    "DOCKET_PINS",
    "DOCKET_VENV",
    "ISOLATION",
    "TASKS_COLUMNS",
    "TASKS_GROUP",
    "TasksPlan",
    "add_arguments",
    "check_arguments",
    "docket_python",
    "plan_settings",
    "run_tasks",
    "tasks_lines",
    "tasks_plan",
]

TASKS_GROUP = "tasks"
"""The ``group`` of the rows this module writes."""

DOCKET = "fastmcp-tasks"
"""The contender that is fastmcp-tasks 4.1.4 (Docket) on the same Redis."""

DOCKET_PINS = ("fastmcp==4.1.4", "fastmcp-tasks==4.1.4")
"""What the Docket server's environment must hold."""

DOCKET_VENV = Path.home() / ".cache" / "kvstores" / "docket-venv"
"""Where the bench creates (once) the Docket server's environment when ``--docket-python`` is not given."""

ISOLATION = {"redis": "prefix", "postgresql": "table", "mysql": "table", "mongodb": "collection"}
"""The store option that gives the run a space of its own, per backend (SQLite: a temporary file by default)."""

OPERATION = "submit->result"
"""The rows' operation."""

_SERVER = Path(__file__).with_name("_tasks_server.py")
_START_SECONDS = 60.0
_INSTALL_SECONDS = 600.0
_KEEP_ALIVE_SECONDS = 30.0  # under the servers' 60 s (_tasks_server): the client drops idle connections first
_TASK_SECONDS = 60.0  # a task not completed by then fails its row


@dataclass(frozen=True)
class TasksPlan:
    """The tasks run: rows at each number of concurrent ``submitters``."""

    submitters: tuple[int, ...]
    settings: Settings
    budget_seconds: float
    """Wall-clock cap of the whole run: rows that would start later are skipped and say so."""
    poll_seconds: float = 0.02
    """The client's first pause between two ``tasks/get`` of one task (then doubled each time)."""
    worker_concurrency: int = 10
    """Tasks each server runs at once (Docket's default, and StoreTasks')."""
    docket_python: str | None = None
    """The Python of the Docket server (None: :data:`DOCKET_VENV`, created if missing)."""


# -- the client ------------------------------------------------------------------------------------------


def _stamp_of(outcome: dict[str, Any]) -> float:
    """The ``stamp`` tool's return value in its ``CallToolResult``."""
    structured = outcome.get("structuredContent")
    if isinstance(structured, dict) and "result" in structured:
        return float(structured["result"])
    return float(outcome["content"][0]["text"])


@dataclass
class _Contender:
    """One server under test and the client of it; ``pickups`` collects the current batch's
    (tool start - submission sent, tool start - acknowledgement received), in seconds."""

    client: TaskClient
    server: _Server
    pickups: list[tuple[float, float]]


async def _one_task(subject: _Contender, index: int) -> None:
    """Submit a task, wait for its result; keep when its tool started after the submission and after the ack."""
    sent = time.monotonic()
    task_id = await subject.client.submit("stamp", {})
    acknowledged = time.monotonic()
    started = _stamp_of(await subject.client.result(task_id, within=_TASK_SECONDS))
    subject.pickups.append((started - sent, started - acknowledged))


# -- the servers -------------------------------------------------------------------------------------------


class _Server:
    """A server process of :mod:`kvstores.bench._tasks_server`, its output in a temporary file."""

    def __init__(self, command: list[str], url: str, options: dict[str, Any]) -> None:
        self._socket = bound_socket()  # the server listens on it: no other process can take the port meanwhile
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._command = [*command[:-1], str(self._socket.fileno()), command[-1]]  # KIND FD CONCURRENCY
        self._env = {**os.environ, URL_VARIABLE: url, OPTIONS_VARIABLE: json.dumps(options)}
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (closed by stop())
        self._process: asyncio.subprocess.Process | None = None

    def cpu_seconds(self) -> float | None:
        """The CPU time (user + system) the server process has used so far; None where /proc cannot say."""
        if self._process is None:
            return None
        try:
            fields = Path(f"/proc/{self._process.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def output(self) -> str:
        """The tail of what the server wrote."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-1500:] or "no output"

    async def start(self) -> None:
        """Start it and wait until it answers ``GET /health``."""
        import httpx2

        try:
            self._process = process = await asyncio.create_subprocess_exec(
                *self._command, env=self._env, stdout=self._log, stderr=self._log, pass_fds=[self._socket.fileno()]
            )
        finally:
            self._socket.close()  # the server holds its own copy
        deadline = time.monotonic() + _START_SECONDS
        async with httpx2.AsyncClient(timeout=1) as http:
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"the server exited with {process.returncode}: {self.output()}")
                with contextlib.suppress(httpx2.TransportError):
                    if (await http.get(f"http://127.0.0.1:{self.port}/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer within {_START_SECONDS:g} s: {self.output()}")
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s."""
        if self._process is not None:
            await stop_server(self._process)
        self._socket.close()
        self._log.close()


def _checks_docket(python: str) -> str | None:
    """None if ``python`` runs fastmcp-tasks 4.1.4 on FastMCP 4.1.4, else why not."""
    probe = "import fastmcp, fastmcp_tasks, uvicorn; print(fastmcp.__version__)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot run: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        return f"{python} cannot import fastmcp-tasks: {done.stderr.strip().splitlines()[-1:] or done.returncode}"
    if done.stdout.strip() != "4.1.4":
        return f"{python} has FastMCP {done.stdout.strip()}, not 4.1.4"
    return None


def docket_python(given: str | None, venv: Path = DOCKET_VENV) -> tuple[str | None, str | None]:
    """(the Python that runs the Docket server, None) or (None, why there is none).

    ``given``: that Python, checked. None: the venv at ``venv``, created with :data:`DOCKET_PINS`
    from the package index (pip's own configuration) when it is missing or incomplete.
    """
    if given is not None:
        reason = _checks_docket(given)
        return (None, reason) if reason else (given, None)
    python = venv / "bin" / "python"
    if python.exists() and _checks_docket(str(python)) is None:
        return str(python), None
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=120
        )
        install = [str(python), "-m", "pip", "install", "-q", *DOCKET_PINS]
        subprocess.run(install, check=True, capture_output=True, text=True, timeout=_INSTALL_SECONDS)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] if isinstance(exc.stderr, str) else []
        return None, f"creating {venv} with {' '.join(DOCKET_PINS)} failed: {tail or exc.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"creating {venv} with {' '.join(DOCKET_PINS)} failed: {type(exc).__name__}: {exc}"
    reason = _checks_docket(str(python))
    return (None, reason) if reason else (str(python), None)


def _docket_url(url: str) -> str | None:
    """The URL Docket is given for the redis target ``url`` (None: Docket runs on plain ``redis://`` only)."""
    from kvstores.bench._baselines import redis_driver_url

    if url.partition("://")[0].lower() not in ("redis", "rediss"):
        return None
    return redis_driver_url(url)


async def _drop_docket(url: str, name: str) -> None:
    """Delete the Docket queue's keys (``name:*``)."""
    import redis.asyncio

    client = redis.asyncio.from_url(url)
    try:
        async for key in client.scan_iter(match=f"{name}:*", count=1000):
            await client.delete(key)
    finally:
        await client.aclose()


async def _drop_ours(url: str, options: dict[str, Any]) -> None:
    """Remove what the run wrote: the whole isolated space (the tables it made, on a SQL
    server, where ``destroy()`` would leave them), else the engine's collections."""
    from kvstores.backends._sql import SQLServerStore
    from kvstores.registry import open_store
    from kvstores.tasks._engine import QUEUE, RECORDS

    store = open_store(url, **options)
    try:
        if not options:
            for collection in (RECORDS, QUEUE):
                await store.destroy_collection(collection)
        elif isinstance(store, SQLServerStore):
            await store.fetch(f"DROP TABLE IF EXISTS {', '.join(store.tables())}")
        else:
            await store.destroy()
    finally:
        await store.aclose()


# -- the run -----------------------------------------------------------------------------------------------


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _measure_row(scenario: Scenario, subjects: dict[str, _Contender], settings: Settings) -> dict[str, Any]:
    """The engine's interleaved rounds (:func:`kvstores.bench._measure.measure`), keeping pickups too."""
    import statistics

    calls = {name: await calibrate(scenario, subject, settings) for name, subject in subjects.items()}
    rates: dict[str, list[float]] = {name: [] for name in subjects}
    cpu: dict[str, list[float]] = {name: [] for name in subjects}
    latencies: dict[str, list[float]] = {name: [] for name in subjects}
    pickups: dict[str, list[tuple[float, float]]] = {name: [] for name in subjects}
    server_cpu: dict[str, list[float]] = {name: [] for name in subjects}
    names = list(subjects)
    for round_ in range(settings.rounds + 1):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            subjects[name].pickups = []
            before = subjects[name].server.cpu_seconds()
            elapsed, cpu_seconds, samples = await run_batch(scenario, subjects[name], calls[name], settings)
            after = subjects[name].server.cpu_seconds()
            if round_ and before is not None and after is not None:
                server_cpu[name].append((after - before) / len(samples))
            if round_:
                rates[name].append(len(samples) / elapsed)
                cpu[name].append(cpu_seconds / len(samples))
                latencies[name].extend(samples)
                pickups[name].extend(subjects[name].pickups)
    figures: dict[str, Any] = {}
    for name in names:
        ordered = sorted(latencies[name])
        picked = sorted(since_sent for since_sent, _ in pickups[name])
        after_ack = sorted(since_ack for _, since_ack in pickups[name])
        figures[name] = {
            "ops_per_second": round(statistics.median(rates[name]), 1),
            "p50_us": round(_percentile(ordered, 0.5) * 1e6, 2),
            "p99_us": round(_percentile(ordered, 0.99) * 1e6, 2),
            "cpu_us": round(statistics.median(cpu[name]) * 1e6, 2),
            "calls": len(ordered),
            "pickup_p50_ms": round(_percentile(after_ack, 0.5) * 1e3, 3),
            "pickup_p99_ms": round(_percentile(after_ack, 0.99) * 1e3, 3),
            "started_before_ack": sum(value < 0 for value in after_ack),
            "submit_to_start_p50_ms": round(_percentile(picked, 0.5) * 1e3, 3),
            "submit_to_start_p99_ms": round(_percentile(picked, 0.99) * 1e3, 3),
        }
        if server_cpu[name]:  # what a task costs the server process (HTTP, engine, worker), less load-sensitive
            figures[name]["server_cpu_ms"] = round(statistics.median(server_cpu[name]) * 1e3, 3)
    return figures


async def _start(label: str, server: _Server, started: list[_Server]) -> None:
    started.append(server)
    try:
        await server.start()
    except RuntimeError as exc:
        raise RuntimeError(f"{label}: {exc}") from None


async def run_tasks(label: str, url: str, plan: TasksPlan, deadline: float, progress: Any) -> list[dict[str, Any]]:
    """The tasks rows of the store at ``url`` (shown as ``label``), one per number of submitters.

    Rows that would start after ``deadline`` (``time.monotonic()``) are skipped and say so.
    """
    from kvstores.tasks import TaskClient  # FastMCP: imported only for --tasks

    backend = family(url)
    run_id = secrets.token_hex(4)
    option = ISOLATION.get(backend)
    given = {name for name, _ in parse_qsl(urlsplit(url).query)}
    options = {option: f"kvbench_tasks_{run_id}"} if option and option not in given else {}
    ours = _Server([sys.executable, str(_SERVER), "kvstores", str(plan.worker_concurrency)], url, options)
    servers: list[_Server] = []
    clients: dict[str, TaskClient] = {}
    docket_skipped: str | None = None
    docket: tuple[str, str] | None = None  # (Redis URL, queue name)
    described = {
        "target": label,
        "backend": backend,
        "store": "StoreTasks",
        "group": TASKS_GROUP,
        "operation": OPERATION,
        "value_bytes": None,
        "worker_concurrency": plan.worker_concurrency,
        "poll_ms": plan.poll_seconds * 1e3,
    }
    rows: list[dict[str, Any]] = []
    try:
        await _start("the StoreTasks server", ours, servers)
        clients["kvstores"] = TaskClient(ours.url, poll_seconds=plan.poll_seconds, keep_alive=_KEEP_ALIVE_SECONDS)
        servers_by_name = {"kvstores": ours}
        if backend == "redis":
            docket_url = _docket_url(url)
            python, docket_skipped = (None, "Docket runs on a plain redis:// URL only")
            if docket_url is not None:
                python, docket_skipped = await asyncio.to_thread(docket_python, plan.docket_python)
            if python is not None and docket_url is not None:
                docket = (docket_url, f"kvbench-docket-{run_id}")
                command = [python, str(_SERVER), "docket", str(plan.worker_concurrency)]
                server = _Server(command, docket_url, {"name": docket[1]})
                try:
                    await _start("the fastmcp-tasks server", server, servers)
                    clients[DOCKET] = TaskClient(
                        server.url, poll_seconds=plan.poll_seconds, keep_alive=_KEEP_ALIVE_SECONDS
                    )
                    servers_by_name[DOCKET] = server
                except RuntimeError as exc:
                    docket_skipped = str(exc)
        progress.start(f"{label} tasks", len(plan.submitters) * (plan.settings.rounds + 1) * len(clients))
        for submitters in plan.submitters:
            row: dict[str, Any] = {**described, "concurrency": submitters}
            if docket_skipped is not None:
                row["baseline_skipped"] = {DOCKET: redact_text(docket_skipped, url)}
            if time.monotonic() >= deadline:
                rows.append({**row, "skipped": f"the run's wall-clock cap ({plan.budget_seconds:g} s) was reached"})
                continue
            scenario = Scenario(OPERATION, None, submitters, _one_task, max_calls=20_000)
            subjects = {name: _Contender(client, servers_by_name[name], []) for name, client in clients.items()}
            try:
                figures = await _measure_row(scenario, subjects, plan.settings)
            except RowSkipped as exc:
                rows.append({**row, "skipped": str(exc)})
                continue
            except Exception as exc:  # e.g. a server that fell over: the other rows still run
                rows.append({**row, "skipped": redact_text(f"failed: {type(exc).__name__}: {exc}", url)})
                continue
            finally:
                for _ in range((plan.settings.rounds + 1) * len(clients)):
                    progress.tick()
            mine = figures["kvstores"]["ops_per_second"]
            ratios = {name: round(mine / f["ops_per_second"], 3) for name, f in figures.items() if name != "kvstores"}
            rows.append({**row, "contenders": figures, "ratios": ratios})
    finally:
        for client in clients.values():
            await client.aclose()
        for server in servers:
            await server.stop()
        with contextlib.suppress(Exception):  # best effort: the rows are what matters
            await _drop_ours(url, options)
        if docket is not None:
            with contextlib.suppress(Exception):
                await _drop_docket(*docket)
    return rows


def tasks_lines(row: dict[str, Any]) -> list[list[str]]:
    """A ``--tasks`` row as table lines, one per contender (and one per skipped baseline)."""
    cells = [str(row["operation"]), str(row["concurrency"])]
    if "skipped" in row:
        return [[*cells, "", f"skipped: {row['skipped']}", *[""] * (len(TASKS_COLUMNS) - 4)]]
    lines = []
    for name, figures in row["contenders"].items():
        lines.append(
            [
                *cells,
                name,
                f"{figures['ops_per_second']:,.0f}",
                f"{figures['p50_us'] / 1e3:,.2f}",
                f"{figures['p99_us'] / 1e3:,.2f}",
                f"{figures['pickup_p50_ms']:,.2f}",
                f"{figures['pickup_p99_ms']:,.2f}",
                f"{figures['submit_to_start_p50_ms']:,.2f}",
                f"{figures['submit_to_start_p99_ms']:,.2f}",
                f"{figures['server_cpu_ms']:,.2f}" if "server_cpu_ms" in figures else "-",
                f"{row['ratios'][name]:.2f}x" if name in row.get("ratios", {}) else "",
            ]
        )
    for name, reason in row.get("baseline_skipped", {}).items():
        lines.append([*cells, name, f"skipped: {reason}", *[""] * (len(TASKS_COLUMNS) - 4)])
    return lines


TASKS_COLUMNS = (
    "operation",
    "submitters",
    "contender",
    "tasks/s",
    "p50 ms",
    "p99 ms",
    "pickup p50 ms",
    "pickup p99 ms",
    "submit→start p50 ms",
    "submit→start p99 ms",
    "server cpu ms/task",
    "kvstores ÷ it tasks/s",
)
"""The columns of :func:`tasks_lines`."""


# -- the command line ------------------------------------------------------------------------------------

_QUICK = (Settings(rounds=3, slice_seconds=0.5, max_batch_seconds=10.0), 300.0)
_FULL = (Settings(rounds=5, slice_seconds=2.0, max_batch_seconds=60.0), 1_200.0)
"""(settings, wall-clock cap in seconds) of a ``--quick`` and of a full run."""


def int_list(text: str) -> tuple[int, ...]:
    """``"1,8,64"`` as ``(1, 8, 64)``: the type of ``kvstores bench``'s list options."""
    return tuple(int(part) for part in text.split(",") if part.strip())


def add_arguments(parser: Any) -> None:
    """``--tasks`` and its options, on ``kvstores bench``'s argument parser."""
    parser.add_argument(
        "--tasks",
        action="store_true",
        help="instead: MCP background tasks through a real server, beside fastmcp-tasks (Docket) on Redis",
    )
    parser.add_argument(
        "--submitters", type=int_list, default=(1, 64), metavar="N,N,...", help="--tasks: concurrent submitters"
    )
    parser.add_argument(
        "--docket-python",
        metavar="PATH",
        help=f"--tasks: a Python with {' and '.join(DOCKET_PINS)} (default: a venv created under {DOCKET_VENV})",
    )
    parser.add_argument(
        "--poll-ms", type=float, default=20.0, metavar="MS", help="--tasks: first pause between polls, then doubled"
    )
    parser.add_argument(
        "--worker-concurrency", type=int, default=10, metavar="N", help="--tasks: tasks each server runs at once"
    )


def check_arguments(parser: Any, options: Any) -> None:
    """Reject ``--tasks`` options that cannot run (``parser.error`` exits)."""
    if not options.tasks:
        return
    if options.signals or options.batching_latency:
        parser.error("--tasks, --signals and --batching-latency are separate runs: choose one")
    if not options.submitters or min(options.submitters) < 1:
        parser.error("--submitters takes numbers >= 1")
    if options.poll_ms <= 0 or options.worker_concurrency < 1:
        parser.error("--poll-ms takes a number > 0 and --worker-concurrency one >= 1")


def tasks_plan(options: Any) -> TasksPlan:
    """The plan ``options`` (parsed by a parser with :func:`add_arguments`) describe."""
    settings, budget = _QUICK if options.quick else _FULL
    if options.rounds:
        settings = Settings(options.rounds, settings.slice_seconds, settings.max_batch_seconds)
    return TasksPlan(
        options.submitters, settings, budget, options.poll_ms / 1e3, options.worker_concurrency, options.docket_python
    )


def plan_settings(plan: TasksPlan) -> dict[str, Any]:
    """The ``settings`` of a ``--tasks`` results document."""
    return {
        "rounds": plan.settings.rounds,
        "warmup_rounds": 1,
        "slice_seconds": plan.settings.slice_seconds,
        "tasks": {
            "submitters": list(plan.submitters),
            "poll_ms": plan.poll_seconds * 1e3,
            "worker_concurrency": plan.worker_concurrency,
            "budget_seconds": plan.budget_seconds,
            "docket_python": plan.docket_python,
        },
    }
