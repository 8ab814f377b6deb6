"""Dashboard tests (tests/test_dashboard*.py): a store seeded with recognisable secrets, and ``kvstores
dashboard`` run as a real process on a free loopback port.

Every value a page must never show is built from :data:`SECRET` (task arguments and results, callers'
tokens, session ids, event messages, the operator token, a URL password), so one substring check
over a response body or the DOM finds any of them.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstores._lease import Lease
from kvstores.tasks import TaskEngine, TaskState
from tests.support import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]

SECRET = "SEKRIT"
"""What every secret the tests plant contains."""

OPERATOR_TOKEN = f"{SECRET}-operator-token-{uuid.uuid4().hex}"
"""The token dashboards are started with, when they take one."""


@dataclass
class Seeded:
    """What :func:`seed` wrote: labels by role, and the secrets planted."""

    running: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)


def _secret(what: str) -> str:
    return f"{SECRET}-{what}-{uuid.uuid4().hex[:8]}"


async def seed(store: Any, *, tasks: int = 6) -> Seeded:
    """Tasks in every interesting state (running with progress, queued, completed, one stuck), durable
    sessions (one terminated) and an event stream, each carrying secrets."""
    from mcp.types import JSONRPCNotification

    from kvstores.events import StoreEventStore
    from kvstores.sessions import SessionRegistry

    seeded = Seeded()
    engine = TaskEngine(store)
    for index in range(tasks):
        argument, token, result = _secret("argument"), _secret("caller"), _secret("result")
        seeded.secrets += [argument, token, result]
        record = await engine.submit(
            tool=("analyze", "export")[index % 2],
            version=None,
            arguments={"dataset": argument},
            scope=None,
            caller={"token": token, "headers": {"authorization": token}},
            poll_interval_ms=100,
        )
        seeded.secrets.append(record.id)
        label = "#" + record.ref[:12]
        if index % 3 == 0:
            claim = await engine.claim(record.ref)
            assert claim is not None
            progress = {"current": 2, "total": 5, "message": f"step 2 of 5 ({index})"}
            await engine.fenced(claim, lambda record, p=progress: dataclasses.replace(record, progress=p))
            seeded.running.append(label)
        elif index % 3 == 1:
            claim = await engine.claim(record.ref)
            assert claim is not None
            assert await engine.finish(claim, TaskState.COMPLETED, result={"content": result})
            seeded.done.append(label)
        else:
            seeded.queued.append(label)
    record = await engine.submit(
        tool="lost", version=None, arguments={"x": _secret("argument")}, scope=None, caller={}, poll_interval_ms=100
    )
    claim = await engine.claim(record.ref)
    assert claim is not None  # then its worker "dies": the lease ran out a minute ago
    lapsed = Lease("gone-worker", claim.token, time.time() - 60)
    await engine.fenced(claim, lambda record: dataclasses.replace(record, lease=lapsed))
    seeded.stuck.append("#" + record.ref[:12])
    seeded.secrets.append(record.id)
    registry = SessionRegistry(store)
    for index in range(3):
        session_id = _secret(f"session{index}")
        seeded.secrets.append(session_id)
        await registry.register(
            session_id,
            owner={"subject": _secret("owner")},
            handshake={"clientInfo": {"name": "probe"}},
            protocol_version=None,
        )
        if index == 2:
            await registry.terminate(session_id)
    events = StoreEventStore(store)
    message = _secret("event")
    seeded.secrets.append(message)
    for _ in range(3):
        await events.store_event(
            _secret("stream"), JSONRPCNotification(jsonrpc="2.0", method="note", params={"m": message})
        )
    return seeded


async def seed_many(store: Any, count: int) -> set[str]:
    """``count`` task records in one ``put_many`` (a busy server's backlog, without running a server); their labels."""
    from kvstores.tasks._book import RECORDS
    from kvstores.tasks._record import TaskRecord

    now = time.time()
    states = list(TaskState)
    records = [
        TaskRecord(
            id=uuid.uuid4().hex,
            scope=None,
            tool=f"bulk{index % 4}",
            version=None,
            arguments={"n": _secret("argument")},
            caller={},
            rerun=True,
            created=now - index,
            updated=now - index / 2,
            ttl_ms=900_000,
            poll_ms=100,
            state=states[index % len(states)],
        )
        for index in range(count)
    ]
    await store.put_many(
        [record.ref for record in records], [record.to_json() for record in records], collection=RECORDS
    )
    return {"#" + record.ref[:12] for record in records}


@dataclass
class Dashboard:
    """A ``kvstores dashboard`` process and where it serves."""

    process: subprocess.Popen[str]
    url: str
    port: int


@contextmanager
def dashboard(
    target: str, *arguments: str, token: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Dashboard]:
    """Run ``kvstores dashboard TARGET`` until the block ends; then SIGTERM it and check it exited 0 with
    nothing on stderr."""
    port = free_port()
    environment = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    environment.pop("KVSTORES_DASHBOARD_TOKEN", None)
    if token is not None:
        environment["KVSTORES_DASHBOARD_TOKEN"] = token
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvstores.cli",
            "dashboard",
            target,
            "--port",
            str(port),
            "--interval",
            "0.5",
            *arguments,
        ],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the announcement, once it listens (or EOF: it failed)
        assert line.startswith("kvstores dashboard: serving http://127.0.0.1:"), (line, _stderr(process))
        yield Dashboard(process, f"http://127.0.0.1:{port}", port)
    finally:
        stop_process(process)
        _, stderr = process.communicate()
    assert process.returncode == 0, (process.returncode, stderr)
    assert stderr == "", stderr


def _stderr(process: subprocess.Popen[str]) -> str:
    if process.poll() is None:
        return ""
    assert process.stderr is not None
    return process.stderr.read()


def assert_no_secret(text: str, *secrets: str) -> None:
    """``text`` holds none of ``secrets`` nor anything marked :data:`SECRET`."""
    for secret in (*secrets, SECRET):
        assert secret not in text, f"a secret reached the page: {secret[:12]}..."
