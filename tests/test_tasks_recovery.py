"""Task recovery as operators meet it: a killed worker under steady traffic, a task that outlives its TTL, and a
store that is unreachable for longer than a lease while its workers live (real server processes).

The engine's rules behind each are checked in-process on every row by the tasks conformance suite
(``test_tasks_a_lapse_is_claimed_only_once_confirmed``, ``test_tasks_a_running_task_outlives_its_ttl``,
``test_tasks_declined_changes_write_nothing``); here they are checked the way they failed, on SQLite and Redis,
and through a private Redis server that the tests freeze.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.support import Backend
from tests.support.fixtures import rows
from tests.support.redis import own_redis
from tests.support.tasks import TaskServer, TaskWire, replicas, run_log, started, task_servers

pytestmark = pytest.mark.anyio

PROCESS_ROWS = rows("sqlite", "redis")


async def _start(wire: TaskWire, tool: str, arguments: dict[str, object], marker: str) -> str:
    task_id = await wire.submit(tool, {**arguments, "marker": marker})
    await started(wire, marker)
    return task_id


async def _running_on(wires: list[TaskWire], servers: list[TaskServer], marker: str) -> int:
    pids = [server.process.pid for server in servers]  # type: ignore[union-attr]
    return pids.index((await run_log(wires[0], marker))["runs"]["pid"])


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_killed_workers_task_runs_again_under_steady_submits(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    """Submits every 0.2 s wake every worker; the scan for lapsed leases must not wait for a quiet moment."""
    servers = task_servers(backend, namespace, tmp_path, 2, "--lease", "2")
    async with replicas(servers) as wires:
        for server in servers:
            server.start()
        task_id = await _start(wires[0], "counted", {"seconds": 60}, "killed-under-traffic")
        running = await _running_on(wires, servers, "killed-under-traffic")
        survivor = wires[1 - running]
        servers[running].signal(signal.SIGKILL)
        submitted = 0
        for _ in range(300):  # at most 60 s of traffic
            await survivor.submit("echo", {"text": "traffic"})
            submitted += 1
            answer = (await survivor.get(task_id))["result"]
            if answer["status"] == "completed":
                break
            await asyncio.sleep(0.2)
        assert answer["status"] == "completed", f"not re-run after {submitted} submits: {answer['status']}"
        assert (await run_log(survivor, "killed-under-traffic"))["runs"]["runs"] == 2


@pytest.mark.parametrize("backend", PROCESS_ROWS, indirect=True)
async def test_a_task_longer_than_its_ttl_runs_again_when_its_worker_dies(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    servers = task_servers(backend, namespace, tmp_path, 2, "--lease", "1.5", "--ttl", "10")
    async with replicas(servers) as wires:
        for server in servers:
            server.start()
        task_id = await _start(wires[0], "counted", {"seconds": 60}, "outlives-ttl")
        await asyncio.sleep(11)  # past the TTL the task was submitted with: renewals must have kept it queued
        assert (await wires[0].get(task_id))["result"]["status"] == "working"
        running = await _running_on(wires, servers, "outlives-ttl")
        killed = servers[running].process.pid  # type: ignore[union-attr]
        servers[running].signal(signal.SIGKILL)
        survivor = wires[1 - running]
        try:
            done = await survivor.wait(task_id, within=40, pause=0.2)
        except AssertionError as failure:  # which runs there were, and which process ran the last
            failure.add_note(f"killed pid {killed}; runs: {await run_log(survivor, 'outlives-ttl')}")
            raise
        assert done["status"] == "completed", done
        assert (await run_log(survivor, "outlives-ttl"))["runs"]["runs"] == 2


@pytest.mark.redis
async def test_an_outage_longer_than_the_lease_neither_reruns_nor_fails_live_tasks(tmp_path: Path) -> None:
    """The store frozen 6 s (lease 3 s) while a run-once tool and a progress reporter finish: both complete, once."""
    with own_redis(tmp_path) as redis_server:
        url = f"redis://127.0.0.1:{redis_server.port}/0"
        servers = [TaskServer(url, {"timeout": 1.0}, tmp_path, extra=["--lease", "3"]) for _ in range(2)]
        async with replicas(servers) as wires:
            for server in servers:
                server.start()
            once = await _start(wires[0], "once", {"seconds": 2}, "outage-once")
            reporting = await wires[0].submit("reporter", {"steps": 8, "pause": 0.5})
            for _ in range(600):  # until its first progress is stored (at most 30 s)
                if (await wires[0].get(reporting))["result"].get("statusMessage"):
                    break
                await asyncio.sleep(0.05)
            redis_server.pause()
            try:
                await asyncio.sleep(6)  # both tools finish while the store is frozen; every lease lapses
            finally:
                redis_server.resume()
            resumed = time.monotonic()
            done = await wires[1].wait(once, within=30, pause=0.1)
            assert done["status"] == "completed", done
            assert (await run_log(wires[1], "outage-once"))["runs"]["runs"] == 1
            reported = await wires[1].wait(reporting, within=30, pause=0.1)
            assert reported["status"] == "completed", reported
            assert not reported["result"].get("isError"), reported["result"]
            assert time.monotonic() - resumed < 20
