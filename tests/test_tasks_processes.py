"""kvstores.tasks across processes: a task known on every replica at once; a worker killed, frozen, stopped or
holding the wrong key; the operator's commands; three replicas behind HAProxy.

Servers and workers run as child processes (tests/support/tasks.py). One module, so that the test command runs
these one at a time on one worker: each starts two or three server processes. They run on two rows, SQLite (the
processes share a file) and Redis (they share a server): what a process's death, freeze or stop does is the
engine's, the same over every store, while what the engine asks of each store (one claim wins, a lapsed lease is
fenced off, a task is known at once to another store object) is checked on every row in-process by the tasks
conformance suite (tests/test_conformance.py) and the wire on every row by tests/test_tasks.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kvstores._sealing import generate_key
from tests.support import Backend, interruptible
from tests.support.fixtures import rows
from tests.support.haproxy import HAProxy
from tests.support.tasks import TaskServer, TaskWire, replicas, run_log, started, task_servers

pytestmark = pytest.mark.anyio

PROCESS_ROWS = rows("sqlite", "redis")
"""The rows these tests run on (the module's docstring says why two)."""


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_task_created_on_one_replica_is_known_on_another_at_once(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    first, second = task_servers(backend, namespace, tmp_path, 2)
    async with replicas([first, second]) as (a, b):
        first.start()
        second.start()
        for _ in range(20):
            task_id = await a.submit("echo", {"text": "x"})
            assert "result" in await b.get(task_id)
        assert (await b.wait(task_id))["status"] == "completed"


@pytest.mark.parametrize("backend", rows("sqlite"), indirect=True)
async def test_the_worker_and_tasks_commands(backend: Backend, namespace: str, tmp_path: Path) -> None:
    import subprocess

    from tests.support import stop_process
    from tests.support.tasks import ROOT

    url = backend.full_url(namespace)
    [serving] = task_servers(backend, namespace, tmp_path, 1, "--no-worker")
    wire = TaskWire(serving.url)
    environment = {**os.environ, "KVSTORES_URL": url}
    command = [sys.executable, "-m", "kvstores.cli"]
    log = (tmp_path / "worker.log").open("wb")
    worker = None
    try:
        serving.start()
        worker = _cli_worker(command, environment, log)
        done = await wire.wait(await wire.submit("echo", {"text": "secret-argument"}), within=60)
        assert done["result"]["structuredContent"] == {"result": "echo secret-argument"}
        sleeping = await wire.submit("sleeper", {"seconds": 60, "marker": uuid.uuid4().hex})
        await wire.wait(sleeping, until=("working",))

        def cli(*arguments: str) -> str:
            ran = subprocess.run(
                [*command, *arguments], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
            )
            assert ran.returncode == 0, ran.stderr
            return ran.stdout

        listing = cli("tasks", "ls", url)
        assert "completed" in listing and "echo" in listing and "sleeper" in listing
        assert "secret-argument" not in listing and done["taskId"] not in listing
        [sleeper_label] = [line.split()[0] for line in listing.splitlines() if "sleeper" in line]
        shown = json.loads(cli("tasks", "show", sleeper_label, "--json"))
        assert shown["state"] == "working" and shown["attempts"] == 1 and shown["worker"]
        assert sleeping not in json.dumps(shown)
        assert "cancelled" in cli("tasks", "cancel", url, sleeper_label)
        assert (await wire.get(sleeping))["result"]["status"] == "cancelled"
        worker.send_signal(signal.SIGINT)  # Ctrl-C: a quiet exit, in time
        assert worker.wait(timeout=15) == 0
        log.flush()
        assert "Traceback" not in (tmp_path / "worker.log").read_text()
    finally:
        await wire.aclose()
        if worker is not None:
            stop_process(worker)
        log.close()
        serving.stop()


def _cli_worker(command: list[str], environment: dict[str, str], log: Any) -> Any:
    """``kvstores worker tests.support.task_app:mcp`` as a child process."""

    from tests.support.tasks import ROOT

    return subprocess.Popen(
        [*command, "worker", "tests.support.task_app:mcp"],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=log,
        preexec_fn=interruptible,
    )


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_three_replicas_behind_haproxy(backend: Backend, namespace: str, tmp_path: Path) -> None:
    """Submit and poll through the balancer; kill the replica running a task: it finishes elsewhere, once;
    stop every replica mid-task and start them again: the task still completes."""
    servers = task_servers(backend, namespace, tmp_path, 3)
    async with replicas(servers):
        for server in servers:
            server.start()
        proxy = HAProxy([server.port for server in servers], tmp_path).start()
        try:
            await _survives_kills_and_restarts(servers, proxy)
        finally:
            proxy.stop()


async def _survives_kills_and_restarts(replicas: list[TaskServer], proxy: HAProxy) -> None:
    wire = TaskWire(proxy.url)
    try:
        task_id, marker = await _started(wire, "counted", 30)
        pids = [replica.process.pid for replica in replicas]  # type: ignore[union-attr]
        running = pids.index((await run_log(wire, marker))["runs"]["pid"])
        replicas[running].signal(signal.SIGKILL)
        done = await wire.wait(task_id, within=40, pause=0.2)
        assert done["status"] == "completed"
        assert done["result"]["structuredContent"]["result"] in {f"pid {pid}" for pid in pids if pid != pids[running]}
        assert (await run_log(wire, marker))["runs"]["runs"] == 2
        replicas[running].start()
        proxy.wait_until_up(proxy.names[running])

        task_id, second = await _started(wire, "counted", 30)
        for replica in replicas:
            replica.stop()
        for replica in replicas:
            replica.start()
        for name in proxy.names:
            proxy.wait_until_up(name)
        done = await wire.wait(task_id, within=40, pause=0.2)
        assert done["status"] == "completed" and done["result"]["structuredContent"]["result"].startswith("pid")
        assert (await run_log(wire, second))["runs"]["runs"] >= 2  # each replica stopped in turn may have taken it
    finally:
        await wire.aclose()


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_task_whose_worker_was_killed_runs_again_elsewhere(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    servers = task_servers(backend, namespace, tmp_path, 2)
    async with replicas(servers) as wires:
        for server in servers:
            server.start()
        task_id, marker = await _started(wires[0], "counted", 30)
        pids = [server.process.pid for server in servers]  # type: ignore[union-attr]
        running = pids.index((await run_log(wires[0], marker))["runs"]["pid"])
        other = 1 - running
        servers[running].signal(signal.SIGKILL)
        killed = time.monotonic()
        done = await wires[other].wait(task_id, within=40, pause=0.2)
        assert done["status"] == "completed", done
        assert done["result"]["structuredContent"] == {"result": f"pid {pids[other]}"}
        assert time.monotonic() - killed < 17.5 + 3  # the documented bound (README), the re-run, the polling
        assert (await run_log(wires[other], marker))["runs"]["runs"] == 2


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_tool_that_opts_out_of_reruns_fails_when_its_worker_dies(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    first, second = task_servers(backend, namespace, tmp_path, 2, "--lease", "2")
    async with replicas([first, second]) as (a, b):
        first.start()
        task_id, marker = await _started(a, "once", 30)
        second.start()
        first.signal(signal.SIGKILL)
        failed = await b.wait(task_id, within=30, pause=0.2)
        assert failed["status"] == "failed" and "opts out of re-runs" in failed["error"]["message"]
        assert (await run_log(b, marker))["runs"]["runs"] == 1


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_frozen_worker_never_overwrites_the_rerun(backend: Backend, namespace: str, tmp_path: Path) -> None:
    first, second = task_servers(backend, namespace, tmp_path, 2, "--lease", "1.5")
    async with replicas([first, second]) as (a, b):
        first.start()
        task_id, marker = await _started(a, "counted", 3)
        first.signal(signal.SIGSTOP)
        second.start()
        done = await b.wait(task_id, within=40, pause=0.2)
        rerun = {"result": f"pid {second.process.pid}"}  # type: ignore[union-attr]
        assert done["result"]["structuredContent"] == rerun
        first.signal(signal.SIGCONT)
        await asyncio.sleep(5)  # the frozen run wakes up, finishes its sleep and tries to write its outcome
        after = (await b.get(task_id))["result"]
        assert after["status"] == "completed" and after["result"]["structuredContent"] == rerun
        assert after["lastUpdatedAt"] == done["lastUpdatedAt"]
        assert (await run_log(b, marker))["runs"]["runs"] == 2


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_worker_with_the_wrong_key_fails_the_task_naming_it(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    right, wrong = generate_key(), generate_key()
    [serving] = task_servers(backend, namespace, tmp_path, 1, "--no-worker", options={"encryption_keys": [right]})
    [worker] = task_servers(backend, namespace, tmp_path, 1, "--no-http", options={"encryption_keys": [wrong]})
    async with replicas([serving, worker]) as (wire, _):
        serving.start()
        worker.start()
        marker = uuid.uuid4().hex
        task_id = await wire.submit("counted", {"seconds": 0, "marker": marker})
        failed = await wire.wait(task_id, within=30, pause=0.2)
        assert failed["status"] == "failed", failed
        assert "encryption keys" in failed["error"]["message"] and "key id" in failed["error"]["message"]
        assert (await run_log(wire, marker))["runs"] is None  # the tool never ran


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_stopped_server_gives_its_running_task_back(backend: Backend, namespace: str, tmp_path: Path) -> None:
    first, second = task_servers(backend, namespace, tmp_path, 2)
    async with replicas([first, second]) as (a, b):
        first.start()
        task_id, marker = await _started(a, "counted", 30)
        second.start()
        first.stop()  # SIGTERM: a clean shutdown
        stopped = time.monotonic()
        done = await b.wait(task_id, within=30, pause=0.1)
        assert done["result"]["structuredContent"] == {"result": f"pid {second.process.pid}"}  # type: ignore[union-attr]
        assert time.monotonic() - stopped < 8  # the rescan and the re-run, not the 10 s lease
        assert (await run_log(b, marker))["runs"]["runs"] == 2


async def _started(wire: TaskWire, tool: str, seconds: float) -> tuple[str, str]:
    """Submit ``tool`` (one of the tools that record their runs under a marker) through ``wire``; return the
    task's id and its marker once the tool has started."""
    marker = uuid.uuid4().hex
    task_id = await wire.submit(tool, {"seconds": seconds, "marker": marker})
    await started(wire, marker)
    return task_id, marker
