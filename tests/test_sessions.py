"""Durable MCP sessions (kvstores.sessions): real server processes, real HTTP, on each persistent backend.

The scenario tests run two uvicorn processes on one store and send a handshake client's requests
to one or the other; the process tests need a backend row, the rest use SQLite or memory.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import kvstores.events._liveness
import kvstores.sessions._terminations
from kvstores import MemoryStore, open_store
from kvstores.events import STOPPED_MESSAGE, StoreEventStore
from kvstores.sessions import (
    REGISTRY_COLLECTION,
    SessionRecordError,
    SessionRegistry,
    http_app,
)
from tests.support import Backend
from tests.support.events import DROP_AFTER, PROTOCOL_VERSION, STEPS, FlakyStore, RawSession, serving, sse_events
from tests.support.fixtures import rows_with
from tests.support.sessions import TOKENS, Router, SessionServer, build_app, label, routed_client

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

IDLE_TTL = 12.0
"""The servers' idle_ttl: records live 15 s after a refresh, a warm session is rechecked every 3 s."""

MOVE_IDLE_TTL = 300.0
"""The idle_ttl of the servers a session moves between: longer than a restart takes on a loaded machine."""

PERSISTENT = rows_with("persistent", "processes")


@contextmanager
def running(*servers: SessionServer) -> Iterator[None]:
    """Start the servers, wait until all serve, and stop them however the test ends (a failure
    carries the servers' logs)."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_until_serving()
        yield
    except BaseException as exc:
        for server in servers:
            exc.add_note(f"--- log of the server on port {server.port} ---\n{server.log.read_text(errors='replace')}")
        raise
    finally:
        for server in servers:
            server.stop()


def restart(server: SessionServer) -> None:
    """SIGKILL the server and start it again on the same port."""
    server.kill()
    server.start()
    server.wait_until_serving()


async def call(client: Any, tool: str, **arguments: Any) -> Any:
    return (await client.call_tool(tool, arguments)).data


async def status(
    http: httpx.AsyncClient, url: str, session_id: str, *, method: str = "POST", token: str | None = None
) -> int:
    """The HTTP status of a tools/list (or a DELETE) in session ``session_id``."""
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": PROTOCOL_VERSION,
        "mcp-session-id": session_id,
    }
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with http.stream(method, url, headers=headers, **({"json": body} if method == "POST" else {})) as response:
        return response.status_code


async def eventually(predicate: Any, within: float) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, f"not within {within} s"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("backend", PERSISTENT, indirect=True)
async def test_a_session_moves_between_processes_survives_a_kill_and_ends_everywhere(
    backend: Backend, namespace: str, store: Any, tmp_path: Path
) -> None:
    url, options = backend.url(namespace)
    # Records that outlive any restart of a loaded machine: a record idle longer than idle_ttl is
    # rightly gone, and A's restart below is idle time of the session.
    a, b = (SessionServer(url, options, tmp_path, idle_ttl=MOVE_IDLE_TTL) for _ in range(2))
    router = Router(a.port)
    notes: list[str] = []

    async def note(progress: float, total: float | None, message: str | None) -> None:
        notes.append(str(message))
        if message == f"step {DROP_AFTER}":
            router.port = b.port  # the client resumes the dropped stream on the other process

    with running(a, b):
        async with routed_client(router) as client:
            session_id = await call(client, "set_state", key="k", value="v")
            router.port = b.port
            assert await call(client, "get_state", key="k") == "v"
            assert await call(client, "client_name") == "fastmcp"  # the handshake came along

            await anyio.to_thread.run_sync(restart, a)
            router.port = a.port
            assert await call(client, "set_state", key="k2", value="v2") == session_id
            assert await call(client, "get_state", key="k") == "v"

            result = await client.call_tool("long_task", {}, progress_handler=note)
            assert result.data == "done"
            assert notes == [f"step {step}" for step in range(1, STEPS + 1)]
            assert router.port == b.port
        # Leaving the client sent DELETE to B. A still holds the session in memory.

        registry = SessionRegistry(store)
        record = await registry.get(session_id)
        assert record is not None and record.terminated
        async with httpx.AsyncClient(timeout=10) as http:
            assert await status(http, b.url, session_id) == 404
            assert await status(http, b.url, session_id, method="DELETE") == 404

            # A's last reading of the record is older than READ_WINDOW: its next request reads the
            # tombstone, whether or not the DELETE's signal has reached A yet.
            assert await status(http, a.url, session_id) == 404
            assert await status(http, a.url, session_id) == 404  # and stays refused, now without a copy

            for unknown in ("0" * 32, "never-registered", "x" * 5000):
                assert await status(http, a.url, unknown) == 404
                assert await status(http, b.url, unknown) == 404

            # 50 sessions opened at once, half on each process: every one registered and adoptable.
            opened = await asyncio.gather(*(RawSession(http, server.url).open() for server in [a, b] * 25))
            ids = [session.session_id for session in opened]
            assert len(set(ids)) == 50
            records = await asyncio.gather(*(registry.get(sid) for sid in ids))
            assert all(r is not None and not r.terminated and r.owner is None for r in records)
            other = {a.url: b.url, b.url: a.url}
            statuses = await asyncio.gather(
                *(status(http, other[s.url], s.session_id) for s in opened[:6]),
            )
            assert statuses == [200] * 6


async def test_a_session_is_refused_to_another_principal(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'auth.db'}"
    a = SessionServer(url, {}, tmp_path, idle_ttl=IDLE_TTL, auth=True)
    b = SessionServer(url, {}, tmp_path, idle_ttl=IDLE_TTL, auth=True)
    router = Router(a.port)
    with running(a, b):
        async with routed_client(router, token="token-x") as client, httpx.AsyncClient(timeout=10) as http:
            session_id = await call(client, "set_state", key="k", value="x's")
            # B has never seen the session: principal Y cannot get it adopted, nor can no one.
            assert await status(http, b.url, session_id, token="token-y") == 404
            assert (await http.post(b.url, headers={"mcp-session-id": session_id}, json={})).status_code == 401
            # X can, on B; then B holds it and still refuses Y (the SDK's own check).
            router.port = b.port
            assert await call(client, "get_state", key="k") == "x's"
            assert await status(http, b.url, session_id, token="token-y") == 404
            assert await status(http, a.url, session_id, token="token-y") == 404
            # Y's DELETE ends nothing.
            assert await status(http, b.url, session_id, method="DELETE", token="token-y") == 404
            assert await call(client, "get_state", key="k") == "x's"
        async with open_store(url) as check:
            record = await SessionRegistry(check).get(session_id)
        assert record is not None and record.terminated
        assert record.owner == {"client_id": TOKENS["token-x"]["client_id"], "issuer": None, "subject": None}


async def test_an_unreadable_record_gives_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    store = open_store(f"sqlite:///{path}")
    registry = SessionRegistry(store)
    await store.put("from-the-future", {"v": 2, "session_id": "from-the-future"}, collection=REGISTRY_COLLECTION)
    await store.put(
        "mangled", {"v": 1, "session_id": "mangled", "created": "yesterday"}, collection=REGISTRY_COLLECTION
    )
    await store.put("undecodable", {"v": 1}, collection=REGISTRY_COLLECTION)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE kvstores_entries SET value = '{not json' WHERE key = 'undecodable'")

    with pytest.raises(SessionRecordError, match="another kvstores version"):
        await registry.get("from-the-future")
    with pytest.raises(SessionRecordError, match=r"corrupt.*created"):
        await registry.get("mangled")
    async with serving(build_app(store, idle_ttl=IDLE_TTL)) as url, httpx.AsyncClient(timeout=10) as http:
        for session_id, message in [("from-the-future", "another kvstores version"), ("mangled", "corrupt")]:
            async with http.stream("POST", url, headers=_headers(session_id), json=_LIST) as response:
                assert response.status_code == 500
                assert message in json.loads(await response.aread())["error"]["message"]
        async with http.stream("POST", url, headers=_headers("undecodable"), json=_LIST) as response:
            assert response.status_code == 500
            message = json.loads(await response.aread())["error"]["message"]
            assert f"{label('undecodable')} is corrupt" in message and "'undecodable'" not in message
        session = await RawSession(http, url).open()  # the server goes on serving
        assert await status(http, url, session.session_id) == 200
        # A DELETE of an unreadable session replaces the record with a readable tombstone.
        await registry.terminate("mangled")
        record = await registry.get("mangled")
        assert record is not None and record.terminated
    await store.aclose()


_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def _headers(session_id: str) -> dict[str, str]:
    return {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": PROTOCOL_VERSION,
        "mcp-session-id": session_id,
    }


async def test_the_registry_forgets_idle_sessions(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'idle.db'}")
    idle_ttl = 0.6
    registry = SessionRegistry(store, idle_ttl=idle_ttl)
    async with serving(build_app(store, idle_ttl=idle_ttl)) as url, httpx.AsyncClient(timeout=10) as http:
        sessions = [await RawSession(http, url).open() for _ in range(5)]
        await registry.terminate(sessions[0].session_id)
        assert len(await store.keys(REGISTRY_COLLECTION)) == 5
        await asyncio.sleep(registry.record_ttl + 0.2)
        assert await store.keys(REGISTRY_COLLECTION) == []
        await store.cull()
        with closing(sqlite3.connect(tmp_path / "idle.db")) as db:
            left = db.execute("SELECT count(*) FROM kvstores_entries WHERE collection = ?", (REGISTRY_COLLECTION,))
            assert left.fetchone() == (0,)
    await store.aclose()


async def test_a_record_is_shared_once_another_process_adopts_it_and_a_delete_says_so() -> None:
    """A session's record is unshared while only its creator serves it; an adoption's refresh shares it (a
    DELETE then waits out the other processes' readings); a record without the field counts as shared."""
    store = MemoryStore()
    registry = SessionRegistry(store)

    async def shared(session_id: str, **touch: bool) -> bool:
        record = await registry.touch(session_id, **touch)
        assert record is not None and not record.terminated
        return record.shared

    for session_id in ("alone", "adopted"):
        assert await registry.register(session_id, owner=None, handshake=None, protocol_version=None)
    assert await shared("alone") is False
    assert await shared("adopted", adopted=True) is True
    assert await shared("adopted") is True  # and stays so
    written = await store.get("alone", collection=REGISTRY_COLLECTION)
    assert written is not None and written["shared"] is False
    await store.put("older", {**written, "session_id": "older", "shared": None}, collection=REGISTRY_COLLECTION)
    with pytest.raises(SessionRecordError, match="shared"):
        await registry.get("older")
    older = {name: value for name, value in written.items() if name != "shared"}  # as an older kvstores writes it
    await store.put("older", {**older, "session_id": "older"}, collection=REGISTRY_COLLECTION)
    assert await shared("older") is True
    told = [await registry.terminate(session_id) for session_id in ("alone", "adopted", "older", "unknown")]
    assert told == [False, True, True, True]
    for session_id in ("alone", "unknown"):
        tombstone = await registry.get(session_id)
        assert tombstone is not None and tombstone.terminated


class _CountingRouter(Router):
    """A Router that counts the requests sent in a session (those with an ``Mcp-Session-Id``)."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.in_session = 0

    async def handle_async_request(self, request: Any) -> Any:
        self.in_session += "mcp-session-id" in request.headers
        return await super().handle_async_request(request)


@pytest.mark.parametrize("window", [0.0, 60.0])
async def test_a_warm_session_reads_its_record_once_per_window(monkeypatch: pytest.MonkeyPatch, window: float) -> None:
    """The per-request cost of the registry on a warm session: a read only when the last one began a
    READ_WINDOW ago (a refresh instead, once per interval), so none per request within the window."""
    monkeypatch.setattr(kvstores.sessions._terminations, "READ_WINDOW", window)
    counted = FlakyStore(MemoryStore())
    app = build_app(MemoryStore(), idle_ttl=2.0, registry_store=counted)
    async with serving(app) as url:
        router = _CountingRouter(int(url.split(":")[2].split("/")[0]))
        async with routed_client(router) as client:
            assert counted.calls["put_if_absent"] == 1
            started = time.monotonic()
            for _ in range(20):
                await call(client, "get_state", key="k")
            elapsed = time.monotonic() - started
            # 40+ requests (calls and their GET/notifications): reads, and only the refreshes that are due
            assert counted.calls["update"] <= int(elapsed / 0.5) + 1
            started = time.monotonic()
            while time.monotonic() - started < 1.6:
                await call(client, "get_state", key="k")
            refreshes = counted.calls["update"]
            assert 1 <= refreshes <= 5  # one per refresh interval (0.5 s) at most
        assert set(counted.calls) <= {"put_if_absent", "get", "update"}, counted.calls
        assert counted.calls["update"] == refreshes + 1  # the DELETE wrote the tombstone
        assert router.in_session > 40
        if window == 0:  # every request in the session (the DELETE too) read or refreshed the record once
            assert counted.calls["get"] + counted.calls["update"] == router.in_session + 1, counted.calls
        else:  # the first requests read it (the GET stream and the first call may race), refreshes renew it
            assert counted.calls["get"] <= 3, counted.calls


async def test_http_app_refuses_what_it_cannot_make_durable() -> None:
    from fastmcp import FastMCP

    mcp = FastMCP("x")
    with pytest.raises(ValueError, match="stateful"):
        http_app(mcp, store=MemoryStore(), stateless_http=True)
    with pytest.raises(ValueError, match="Streamable HTTP"):
        http_app(mcp, store=MemoryStore(), transport="sse")
    with pytest.raises(TypeError, match="AtomicStore"):
        SessionRegistry(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_ttl"):
        SessionRegistry(MemoryStore(), idle_ttl=0)


async def test_events_of_one_session_never_replay_to_another(tmp_path: Path) -> None:
    async def events_of(stream: Any) -> list[dict[str, str]]:
        found = []
        with anyio.fail_after(10):
            async with stream as response:
                async for event in sse_events(response):
                    found.append(event)
                    if '"result"' in event.get("data", ""):
                        break
        return found

    async with (
        open_store(f"sqlite:///{tmp_path / 'events.db'}") as store,
        serving(build_app(store, idle_ttl=IDLE_TTL)) as url,
        httpx.AsyncClient(timeout=10) as http,
    ):
        owner = await RawSession(http, url).open()
        before = await events_of(owner.call(1, "long_task", {}))
        await asyncio.sleep(0.3)
        thief = await RawSession(http, url).open()
        stolen = await events_of(thief.resume(before[-1]["id"]))
        resumed = await events_of(owner.resume(before[-1]["id"]))
    assert [event for event in stolen if event.get("data")] == []
    assert json.loads(resumed[-1]["data"])["result"]["content"][0]["text"] == "done"


async def test_a_delete_the_registry_cannot_record_is_an_error_and_changes_nothing() -> None:
    registry_store = FlakyStore(MemoryStore())
    async with (
        serving(build_app(MemoryStore(), idle_ttl=IDLE_TTL, registry_store=registry_store)) as url,
        httpx.AsyncClient(timeout=10) as http,
    ):
        session_id = (await RawSession(http, url).open()).session_id
        registry_store.down = True
        assert await status(http, url, session_id, method="DELETE") == 503
        assert await status(http, url, "0" * 32) == 503  # a session this process cannot look up: not "unknown"
        registry_store.down = False
        assert await status(http, url, session_id) == 200  # the session goes on: the client may retry
        assert await status(http, url, session_id, method="DELETE") == 200
        assert await status(http, url, session_id) == 404
    record = await SessionRegistry(registry_store.store).get(session_id)
    assert record is not None and record.terminated


FREEZE = 4.0
"""Seconds a holder stays frozen while a DELETE lands elsewhere (longer than a signal channel's heartbeats)."""


@pytest.mark.parametrize("backend", PERSISTENT, indirect=True)
async def test_a_holder_thawed_after_a_delete_elsewhere_refuses_the_session(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    url, options = backend.url(namespace)
    a, b = (SessionServer(url, options, tmp_path, idle_ttl=IDLE_TTL) for _ in range(2))
    with running(a, b):
        assert a.process is not None
        async with httpx.AsyncClient(timeout=10) as http:
            session_id = (await RawSession(http, a.url).open()).session_id
            assert await status(http, a.url, session_id) == 200
            a.process.send_signal(signal.SIGSTOP)
            try:
                # 503 when the frozen process holds the store's write lock (SQLite): nothing was recorded
                deleted = await status(http, b.url, session_id, method="DELETE")
                assert deleted in (200, 503)
                await asyncio.sleep(FREEZE)
            finally:
                a.process.send_signal(signal.SIGCONT)
            if deleted == 503:  # the session went on: the client retries, and the live holder refuses it
                assert await status(http, a.url, session_id) == 200  # within the second signals take
                assert await status(http, b.url, session_id, method="DELETE") == 200

                async def refused_by_a() -> bool:
                    return await status(http, a.url, session_id) == 404

                await eventually(refused_by_a, within=5)
            assert await status(http, a.url, session_id) == 404
            assert await status(http, b.url, session_id) == 404


SENT_IDS: list[int | str] = ["2001", "007", 2001, 2**63 + 5, "1234567890123456789"]
"""Request ids whose string forms (the SDK's stream ids) lose their type, leading zeros or size."""


async def test_a_follower_answers_with_the_request_id_as_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error a follower (another process) sends for a request whose runner stopped carries the request's
    id exactly as the client sent it: same JSON type, same value."""
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_TTL", 0.4)
    monkeypatch.setattr(kvstores.events._liveness, "LEASE_REFRESH", 0.1)
    store = MemoryStore()
    runner = StoreEventStore(store)
    async with (
        serving(_holding_app(store, runner)) as a,
        serving(_holding_app(store, StoreEventStore(store))) as b,
        httpx.AsyncClient(timeout=10) as http,
    ):
        session = await RawSession(http, a).open()
        for sent in SENT_IDS:
            async with session.call(sent, "hold", {}) as response:
                priming = await anext(sse_events(response))  # then the client's connection drops
            # The runner stops renewing its lease.
            while (renewing := runner._liveness.renewing) is not None and not renewing.done():
                renewing.cancel()
                await asyncio.sleep(0.01)
            async with http.stream("GET", b, headers=session.headers(**{"last-event-id": priming["id"]})) as response:
                answers = [json.loads(event["data"]) async for event in sse_events(response) if event.get("data")]
            assert [answer["error"]["message"] for answer in answers] == [STOPPED_MESSAGE], (sent, priming)
            assert type(answers[0]["id"]) is type(sent) and answers[0]["id"] == sent


def _holding_app(store: Any, events: StoreEventStore) -> Any:
    """A durable app whose tool ``hold`` runs until cancelled, with ``events`` as its event store."""
    from fastmcp import FastMCP

    mcp = FastMCP("holding")

    @mcp.tool
    async def hold() -> str:
        await asyncio.sleep(60)
        return "held"

    return http_app(mcp, store=store, event_store=events, retry_interval=200)
