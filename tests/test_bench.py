"""`kvstores bench --quick` runs end to end and writes the JSON it promises (never asserting timings)."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvstores._loopback import bound_socket
from kvstores.bench._report import SECTIONS, update_markdown
from kvstores.bench._run import BATCHING_OFF
from kvstores.bench._scenarios import BATCHING_OPERATIONS, KV_OPERATIONS
from kvstores.bench._targets import evaluate
from kvstores.bench._tasks import DOCKET, TASKS_GROUP, docket_python
from tests.support import Backend, free_port, interruptible
from tests.support.fixtures import rows as backend_rows

pytest.importorskip("rich")


def _bench(*args: str, cwd: Path) -> dict[str, Any]:
    out = cwd / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "kvstores.bench", "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kvstores bench" in result.stdout
    document: dict[str, Any] = json.loads(out.read_text())
    return document


_MARKERS = "".join(f"<!-- kvstores bench: {name} -->\nold\n<!-- /kvstores bench: {name} -->\n" for name in SECTIONS)
"""A page that holds every section's markers around the text "old"."""


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that were measured; fails when every row was skipped (a check over no rows checks nothing)."""
    measured = [row for row in rows if "skipped" not in row]
    assert measured, f"every row was skipped: {[row['skipped'] for row in rows]}"
    return measured


def _own_section(tmp_path: Path, document: dict[str, Any], name: str) -> str:
    """Fill a page of every section's markers from ``document``: the text after section ``name``'s
    marker, once every other section was checked to be left as it was."""
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(_MARKERS)
    update_markdown(page, document)
    text = page.read_text()
    assert text.count("old") == len(SECTIONS) - 1, f"the {name} run fills its own section only"
    return text.partition(f"<!-- kvstores bench: {name} -->")[2]


def _check_figures(figures: dict[str, Any]) -> None:
    assert set(figures) == {"ops_per_second", "p50_us", "p99_us", "cpu_us", "calls"}
    assert figures["ops_per_second"] > 0
    assert figures["calls"] > 0
    assert figures["cpu_us"] >= 0
    assert 0 < figures["p50_us"] <= figures["p99_us"]


def test_measured_fails_when_every_row_is_skipped() -> None:
    with pytest.raises(AssertionError, match="every row was skipped"):
        _measured([{"operation": "get", "skipped": "64 calls took 3.1 s (limit 3 s)"}])


def test_quick_compare_on_memory(tmp_path: Path) -> None:
    document = _bench("--compare", "--no-events", "--no-atomic", "memory://", cwd=tmp_path)
    assert document["machine"]["cpu_count"] >= 1
    assert document["settings"]["compare"] is True
    rows = [row for row in document["rows"] if row["group"] == "kv"]
    assert {row["operation"] for row in rows} == set(KV_OPERATIONS)
    assert {row["concurrency"] for row in rows} == {1, 64}
    measured = _measured(rows)
    for row in rows:  # a row is skipped only when a stall made it slower than its limit (a loaded machine)
        assert "skipped" not in row or " calls took " in row["skipped"], row
    for row in measured:
        assert (row["target"], row["backend"], row["store"]) == ("memory://", "memory", "MemoryStore")
        assert set(row["contenders"]) == {"kvstores", "dict+json", "py-key-value"}
        for figures in row["contenders"].values():
            _check_figures(figures)
        assert set(row["ratios"]) == {"dict+json", "py-key-value"}
        assert all(ratio > 0 for ratio in row["ratios"].values())
    otel = _measured([row for row in document["rows"] if row["group"] == "otel"])
    assert {(row["operation"], row["concurrency"]) for row in otel} == {("get", 1), ("put", 1)}
    for row in otel:
        assert set(row["contenders"]) == {"kvstores", "no opentelemetry-api", "with an SDK"}
        assert all(ratio > 0 for ratio in row["ratios"].values())
    labels = {target["target"] for target in document["targets"]}
    assert "MemoryStore vs py-key-value MemoryStore, 100 B" in labels
    assert "MemoryStore with opentelemetry-api and no SDK vs without it" in labels
    assert all(isinstance(target["met"], bool) for target in document["targets"])


def test_quick_default_targets_with_events(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    document = _bench(cwd=tmp_path)
    rows = document["rows"]
    assert {row["target"] for row in rows} == {"memory://", "sqlite (temporary file)"}
    kv = _measured([row for row in rows if row["group"] == "kv"])
    assert {row["operation"] for row in kv if row["backend"] == "sqlite"} == set(KV_OPERATIONS)
    for row in kv:
        assert set(row["contenders"]) == {"kvstores"}
        assert row["ratios"] == {}
        _check_figures(row["contenders"]["kvstores"])
    events = {(row["backend"], row["store"], row["operation"]) for row in _measured(rows) if row["group"] == "events"}
    assert ("sqlite", "StoreEventStore", "replay") in events
    assert ("sqlite", "StoreEventStore", "append@10") in events
    assert ("memory", "InMemoryEventStore", "append") in events
    assert document["targets"] == [], "without --compare there is no baseline to judge"
    assert not list(tmp_path.glob("*.db*")), "the temporary SQLite file belongs in a temporary directory"


def _row(store: str, operation: str, ratio: float | None, group: str = "events") -> dict[str, Any]:
    row: dict[str, Any] = {
        "target": "memory://",
        "backend": "memory",
        "store": store,
        "group": group,
        "operation": operation,
        "value_bytes": None,
        "concurrency": 1,
    }
    if ratio is None:
        return {**row, "skipped": "failed: boom"}
    figures = {"ops_per_second": 100.0 * ratio, "p50_us": 1.0, "p99_us": 2.0, "cpu_us": 1.0, "calls": 10}
    baseline = {**figures, "ops_per_second": 100.0}
    return {**row, "contenders": {"kvstores": figures, "fastmcp": baseline}, "ratios": {"fastmcp": ratio}}


def test_event_targets_are_judged_per_event_store_class() -> None:
    rows = [_row("InMemoryEventStore", "replay", 107.0), _row("StoreEventStore", "replay", 2.1)]
    replay = {result["store"]: result for result in evaluate(rows) if "replay" in result["target"]}
    assert replay["StoreEventStore"]["met"] is False
    assert replay["StoreEventStore"]["median_ratio"] == 2.1
    assert replay["InMemoryEventStore"]["met"] is True


def test_a_target_whose_rows_were_all_skipped_is_a_miss() -> None:
    rows = [_row("StoreEventStore", "append", 10.0), _row("StoreEventStore", "replay", None)]
    replay = [result for result in evaluate(rows) if "replay" in result["target"]]
    assert len(replay) == 1
    assert replay[0]["met"] is False
    assert replay[0]["rows"] == 0
    assert replay[0]["skipped_rows"] == 1


def test_markdown_sections_are_rewritten_in_place(tmp_path: Path) -> None:
    rows = [_row("StoreEventStore", "append", 10.0), _row("StoreEventStore", "replay", 2.1)]
    document = {"rows": rows, "targets": evaluate(rows), "scaling": {}}
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# prose kept\n{_MARKERS}more prose\n")
    update_markdown(page, document)
    text = page.read_text()
    assert text.startswith("# prose kept\n") and text.endswith("more prose\n")
    kept = "only the batching-latency, signals, e2e and tasks sections, not filled here, are kept"
    assert text.count("old") == 4, kept
    assert "<!-- kvstores bench: batching-latency -->\nold\n" in text
    assert "| StoreEventStore replay vs fastmcp EventStore (memory) | `memory://` | >= 5.0x | 2.10x |" in text
    assert "- StoreEventStore replay vs fastmcp EventStore (memory) on memory://: needs >= 5.0x" in text


@pytest.mark.parametrize("backend", backend_rows("redis"), indirect=True)
def test_batching_latency_runs_through_the_proxy(backend: Backend, namespace: str, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:6379/15?prefix={namespace}"
    shape = ("--callers", "1,4", "--collections", "1,2")
    document = _bench("--rounds", "1", "--batching-latency", "--latency", "2", *shape, url, "memory://", cwd=tmp_path)
    assert document["settings"]["batching_latency"]["delay_ms_each_way"] == 2.0
    redis_rows = [row for row in document["rows"] if row["backend"] == "redis"]
    assert {(row["operation"], row["concurrency"], row["collections"]) for row in redis_rows} == {
        (operation, callers, count) for operation in BATCHING_OPERATIONS for callers in (1, 4) for count in (1, 2)
    }
    for row in _measured(redis_rows):
        assert row["group"] == "batching"
        assert set(row["contenders"]) == {"kvstores", BATCHING_OFF}
        for figures in row["contenders"].values():
            _check_figures(figures)
    memory_rows = [row for row in document["rows"] if row["backend"] == "memory"]
    assert memory_rows and all("no latency to add" in row["skipped"] for row in memory_rows)
    judged = [target for target in document["targets"] if target["group"] == "batching"]
    assert [target["target"] for target in judged] == [
        "RedisStore batching on within 1.05x of off, 1 caller over 1 collection (median round)",
        "RedisStore batching on within 1.05x of off, 1 caller over 1 collection (p99 round)",
    ]
    assert all(target["every_row"] is True and target["rows"] == 2 for target in judged)
    section = _own_section(tmp_path, document, "batching-latency")
    assert "#### `redis://127.0.0.1:6379/15?prefix=" in section and "| get | 4 | 2 |" in section


def test_signals_deliver_every_event_once_across_processes(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    url = f"sqlite:///{tmp_path}/signals.db"
    document = _bench("--signals", "--rate", "5", "--events", "5", "--streams", "1,3", url, cwd=tmp_path)
    assert document["settings"]["signals"]["events_per_stream"] == 5
    rows = _measured(document["rows"])
    assert rows == document["rows"], [row.get("skipped") for row in document["rows"]]
    assert {(row["operation"], row["concurrency"], row["rate"]) for row in rows} == {
        (operation, streams, rate) for operation in ("signal", "follow") for streams in (1, 3) for rate in (5.0, None)
    }
    for row in rows:
        assert (row["group"], row["backend"], row["replicas"]) == ("signals", "sqlite", "two processes")
        assert row["events_per_stream"] == (10 if row["rate"] else 5)  # paced: 5/s for --quick's 2 s
        figures = row["contenders"]["kvstores"]
        assert figures["sent"] == figures["delivered"] == row["events_per_stream"] * row["concurrency"]
        assert (figures["lost"], figures["duplicated"], figures["errors"]) == (0, 0, 0)
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] and figures["events_per_second"] > 0
    judged = {target["target"]: target for target in document["targets"]}
    assert set(judged) == {
        "SQLiteStore signal and follow p99 <= 100 ms, paced (sqlite)",
        "SQLiteStore signal and follow: no lost or duplicated event",
    }
    assert judged["SQLiteStore signal and follow p99 <= 100 ms, paced (sqlite)"]["rows"] == 4, "paced rows only"
    assert judged["SQLiteStore signal and follow: no lost or duplicated event"]["met"] is True
    section = _own_section(tmp_path, document, "signals")
    assert "| follow | 3 | burst of 5 | kvstores |" in section and "no lost or duplicated event" in section


def test_e2e_serves_both_apps_through_uvicorn(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp")
    url = f"sqlite:///{tmp_path}/e2e.db"
    document = _bench("--e2e", "--sessions", "2", "--seconds", "1", "--rounds", "1", url, cwd=tmp_path)
    assert document["settings"]["e2e"] == {
        "sessions": 2,
        "seconds": 1.0,
        "rounds": 1,
        "replicas": 1,
        "budget_seconds": 300.0,
    }
    [row] = _measured(document["rows"])
    assert (row["group"], row["backend"], row["operation"], row["concurrency"]) == ("e2e", "sqlite", "tools/call", 2)
    assert set(row["contenders"]) == {"kvstores", "fastmcp"}
    for figures in row["contenders"].values():
        [measured] = figures["rounds"]
        _check_figures(measured)
        assert figures["ops_per_second"] == measured["ops_per_second"]
    assert row["ratios"]["fastmcp"] > 0
    judged = {target["target"]: target for target in document["targets"]}
    assert set(judged) == {
        "durable sessions calls/s vs FastMCP's own app (sqlite)",
        "durable sessions p99 within 1.05x of FastMCP's own app (sqlite)",
    }
    assert all(target["rows"] == 1 for target in judged.values())
    section = _own_section(tmp_path, document, "e2e")
    assert "| sqlite | 2 |" in section and "durable sessions calls/s vs FastMCP's own app (sqlite)" in section


def test_e2e_serves_replicas_behind_haproxy(tmp_path: Path) -> None:
    pytest.importorskip("fastmcp")
    url = f"sqlite:///{tmp_path}/e2e.db"
    args = ("--e2e", "--replicas", "2", "--sessions", "4", "--seconds", "3", "--rounds", "1", url)
    document = _bench(*args, cwd=tmp_path)
    assert document["settings"]["e2e"]["replicas"] == 2
    [row] = _measured(document["rows"])
    assert (row["group"], row["replicas"], row["concurrency"]) == ("e2e", 2, 4)
    for figures in row["contenders"].values():  # every call answered, through the proxy, on either replica
        _check_figures(figures["rounds"][0])
    assert {target["worst_row"] for target in document["targets"]} == {
        "tools/call x4 sessions, 2 replicas behind HAProxy"
    }


def _tasks_row(backend: str, concurrency: int, ours: dict[str, float], docket: dict[str, float]) -> dict[str, Any]:
    figures = {"kvstores": ours, DOCKET: docket}
    return {
        "target": "redis://127.0.0.1:6379/15",
        "backend": backend,
        "store": "StoreTasks",
        "group": TASKS_GROUP,
        "operation": "submit->result",
        "value_bytes": None,
        "concurrency": concurrency,
        "contenders": figures,
        "ratios": {DOCKET: ours["ops_per_second"] / docket["ops_per_second"]},
    }


def test_task_targets_judge_docket_in_every_row_and_the_bounds_at_one_submitter() -> None:
    rows = [
        _tasks_row(
            "redis",
            1,
            {"ops_per_second": 50.0, "submit_to_start_p50_ms": 4.0, "pickup_p50_ms": 0.0, "p50_us": 5_000.0},
            {"ops_per_second": 40.0, "submit_to_start_p50_ms": 8.0, "pickup_p50_ms": -3.0, "p50_us": 10_000.0},
        ),
        _tasks_row(
            "redis",
            64,
            {"ops_per_second": 30.0, "submit_to_start_p50_ms": 0.0, "pickup_p50_ms": 0.0, "p50_us": 90_000.0},
            {"ops_per_second": 60.0, "submit_to_start_p50_ms": 2.0, "pickup_p50_ms": -3.0, "p50_us": 60_000.0},
        ),
    ]
    for concurrency, pickup, p50_us in ((1, 12.5, 9_500.0), (64, 900.0, 80_000.0)):
        ours = {"ops_per_second": 9.0, "pickup_p50_ms": pickup, "p50_us": p50_us}
        row = _tasks_row("postgresql", concurrency, ours, {"ops_per_second": 1.0})
        rows.append({**row, "contenders": {"kvstores": ours}, "ratios": {}})
    judged = {result["target"]: result for result in evaluate(rows)}
    throughput = judged["StoreTasks tasks/s vs fastmcp-tasks (Docket) on Redis"]
    assert (throughput["met"], throughput["worst_ratio"], throughput["rows"]) == (False, 0.5, 2)
    start = judged["StoreTasks submit-to-start p50 vs fastmcp-tasks (Docket) on Redis (its ÷ ours)"]
    assert start["met"] is True and start["worst_ratio"] == 2.0, "a figure of 0 counts as 1 µs, never a division by 0"
    result = judged["StoreTasks submit→result p50 vs fastmcp-tasks (Docket) on Redis (its ÷ ours)"]
    assert (result["met"], result["worst_ratio"], result["median_ratio"]) == (False, 0.667, 1.333)
    bound = judged["StoreTasks pickup p50 <= 10 ms, 1 submitter (postgresql)"]
    assert (bound["met"], bound["worst"], bound["rows"]) == (False, 12.5, 1), "the 64-submitter row is not judged"
    quick = judged["StoreTasks submit→result p50 <= 10 ms, 1 submitter (postgresql)"]
    assert (quick["met"], quick["worst"], quick["rows"]) == (True, 9.5, 1), "judged in ms, at one submitter only"


def test_docket_python_given_is_checked_and_never_replaced(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python, reason = docket_python(str(tmp_path / "no-python"), venv)
    assert python is None and reason is not None and "no-python cannot run" in reason
    python, reason = docket_python(sys.executable, venv)  # kvstores' own environment: FastMCP 4.2, no fastmcp-tasks
    assert python is None and reason is not None and "cannot import fastmcp-tasks" in reason
    assert not venv.exists(), "a Python that was given is never swapped for a venv the bench creates"


def test_a_server_port_is_held_from_the_moment_it_is_chosen() -> None:
    """The bench's and the demo's servers inherit a bound socket (kvstores._loopback): while it is held, no other
    process can bind its port (CI once saw the tasks server exit with "address already in use" on a port it was
    told was free), and a connection is refused until the server listens, so waiting for one waits for it."""
    with bound_socket() as held:
        port = held.getsockname()[1]
        with socket.socket() as rival, pytest.raises(OSError, match="in use"):
            rival.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn, asyncio and redis-server bind
            rival.bind(("127.0.0.1", port))
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_target_whose_rows_all_failed_fails_the_run(tmp_path: Path) -> None:
    """The tasks server starts on a store it cannot reach (it connects lazily), so each row fails on its own:
    the run says so on stderr and exits 1, as when the store cannot be opened at all."""
    unreachable = f"redis://127.0.0.1:{free_port()}/0?timeout=0.5"
    result = subprocess.run(
        [sys.executable, "-m", "kvstores.bench", "--quick", "--tasks", "--submitters", "1", unreachable],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"kvstores bench: {unreachable}: nothing was measured: failed:" in result.stderr, result.stderr[-3000:]


def test_ctrl_c_stops_the_bench_and_its_servers_in_one_line(tmp_path: Path) -> None:
    """Ctrl-C while the tasks server runs: exit 130 within seconds, one line on stderr (no traceback), and
    the server process it started is gone."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvstores.bench",
            "--quick",
            "--json",
            "bench.json",
            "--tasks",
            f"sqlite:///{tmp_path}/t.db",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        preexec_fn=interruptible,
    )
    try:
        children = Path(f"/proc/{child.pid}/task/{child.pid}/children")
        deadline = time.monotonic() + 60
        while not (servers := children.read_text().split()):
            assert child.poll() is None and time.monotonic() < deadline, "the bench started no server"
            time.sleep(0.1)
        time.sleep(1)  # the server up, the rounds under way
        child.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        _, stderr = child.communicate(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 130, stderr
    assert stderr.strip() == "kvstores bench: interrupted; no results written", stderr
    assert took < 20, f"the bench took {took:.1f} s to exit after Ctrl-C"
    assert not [pid for pid in servers if Path(f"/proc/{pid}").exists()], "a server outlived the bench"
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("backend", backend_rows("redis"), indirect=True)
def test_tasks_run_through_servers_and_say_why_docket_is_skipped(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    pytest.importorskip("fastmcp")
    redis_url = f"redis://127.0.0.1:6379/15?prefix={namespace}"
    sqlite_url = f"sqlite:///{tmp_path}/tasks.db"
    missing = tmp_path / "no-python"
    options = ("--tasks", "--rounds", "1", "--submitters", "1,4", "--docket-python", str(missing))
    document = _bench(*options, "memory://", sqlite_url, redis_url, cwd=tmp_path)
    assert document["errors"] == {}
    assert document["settings"]["tasks"]["submitters"] == [1, 4]
    rows = _measured(document["rows"])
    assert rows == document["rows"], [row.get("skipped") for row in document["rows"]]
    assert sorted((row["backend"], row["concurrency"]) for row in rows) == [
        (backend_name, submitters) for backend_name in ("memory", "redis", "sqlite") for submitters in (1, 4)
    ]
    for row in rows:
        assert (row["group"], row["store"], row["operation"]) == (TASKS_GROUP, "StoreTasks", "submit->result")
        assert set(row["contenders"]) == {"kvstores"} and row["ratios"] == {}
        figures = row["contenders"]["kvstores"]
        assert figures["ops_per_second"] > 0 and figures["calls"] >= row["concurrency"]
        assert 0 < figures["p50_us"] <= figures["p99_us"]
        assert 0 < figures["submit_to_start_p50_ms"] <= figures["submit_to_start_p99_ms"]
        # each task's acknowledgement arrives after its submission left: every pickup is shorter
        assert figures["pickup_p50_ms"] < figures["submit_to_start_p50_ms"]
        assert 0 <= figures["started_before_ack"] <= figures["calls"]
        assert figures["server_cpu_ms"] >= 0, "read from the server process's /proc entry"
        skipped = row.get("baseline_skipped", {})
        if row["backend"] == "redis":
            assert set(skipped) == {DOCKET} and f"{missing} cannot run" in skipped[DOCKET]
        else:
            assert skipped == {}
    judged = {target["target"]: target for target in document["targets"]}
    own = {
        "StoreTasks pickup p50 <= 100 ms, 1 submitter (sqlite)",
        "StoreTasks submit→result p50 <= 20 ms, 1 submitter (sqlite)",
    }
    assert set(judged) == own, "no Docket: no Docket target"
    assert all(judged[name]["rows"] == 1 for name in own)
    section = _own_section(tmp_path, document, "tasks")
    assert f"| submit->result | 4 | {DOCKET} | skipped: {missing} cannot run" in section
    assert "StoreTasks pickup p50 <= 100 ms, 1 submitter (sqlite)" in section
    leftovers = asyncio.run(_task_keys(sqlite_url))
    assert leftovers == [], "the run removes the tasks it wrote"


@pytest.mark.parametrize("backend", backend_rows("postgresql", "mysql"), indirect=True)
def test_tasks_drop_the_tables_they_made(backend: Any, tmp_path: Path) -> None:
    """``destroy()`` leaves a table behind by design; the run made its own, so it drops them."""
    pytest.importorskip("fastmcp")
    url = backend.database_url  # the session's own database: no other run's tables
    options = ("--tasks", "--rounds", "1", "--submitters", "1")
    document = _bench(*options, url, cwd=tmp_path)
    assert document["errors"] == {}
    assert _measured(document["rows"])
    listed = f"SELECT table_name FROM information_schema.tables WHERE table_name LIKE {backend.mark(1)}"
    (tables,) = backend.run_sql(url, (listed, ("kvbench_tasks%",)))
    assert tables == [], "the tasks run leaves its tables (and MariaDB's signals table) behind"


async def _task_keys(url: str) -> list[str]:
    from kvstores import open_store
    from kvstores.tasks._engine import QUEUE, RECORDS

    store = open_store(url)
    try:
        return [key for collection in (RECORDS, QUEUE) for key in await store.keys(collection)]
    finally:
        await store.aclose()
