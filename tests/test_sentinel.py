"""Redis Sentinel: a primary, a replica and three sentinels of the tests' own, on loopback.

The failover test kills the primary (SIGKILL) under a steady write load, checks that the store
raises only StoreConnectionError while the sentinels fail over and then carries on on the
promoted replica with the same store object, and measures how many acknowledged writes were
lost (replication is asynchronous: the window is what the dead primary had not yet sent).
Sentinel timings are shortened (down-after-milliseconds 500, failover-timeout 2000) so the
failover takes a few seconds.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio.sentinel import Sentinel

from kvstores.backends.redis import RedisStore
from kvstores.errors import StoreConnectionError
from tests.support import Unavailable, free_port, stop_process
from tests.support.fixtures import skip_or_fail
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

SERVICE = "kvstores-primary"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 2_000
TIMEOUT = 1.0
"""The store's timeout in these tests."""


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise Unavailable(f"{what} within {seconds} s")
        time.sleep(0.1)


@dataclass
class SentinelSetup:
    """A primary, its replica and three sentinels monitoring ``SERVICE``."""

    folder: Path
    primary: RedisServer
    replica: RedisServer
    sentinel_ports: list[int] = field(default_factory=list)
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start_sentinel(self) -> None:
        port = free_port()
        config = self.folder / f"sentinel-{port}.conf"  # the sentinel rewrites it: a file of its own
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndaemonize no\nlogfile {self.folder / f'sentinel-{port}.log'}\n"
            f"dir {self.folder}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        executable = shutil.which("redis-server")
        assert executable is not None
        process = subprocess.Popen(
            [executable, str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.sentinels.append(process)
        self.sentinel_ports.append(port)

    def primary_port(self) -> int:
        """The primary's port as the first sentinel reports it."""
        with redis.Redis(port=self.sentinel_ports[0], socket_timeout=1, decode_responses=True) as sentinel:
            _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return int(port)

    def ready(self) -> bool:
        """Every sentinel knows the replica and the two other sentinels."""
        for port in self.sentinel_ports:
            with redis.Redis(port=port, socket_timeout=1) as sentinel:
                if len(sentinel.execute_command("SENTINEL", "REPLICAS", SERVICE)) < 1:
                    return False
                if len(sentinel.execute_command("SENTINEL", "SENTINELS", SERVICE)) < 2:
                    return False
        return True

    def stop(self) -> None:
        for process in self.sentinels:
            stop_process(process, timeout=5)
        self.primary.stop()
        self.replica.stop()


def _replica_linked(replica: RedisServer) -> bool:
    with redis.Redis(port=replica.port, socket_timeout=1, decode_responses=True) as client:
        return bool(client.info("replication").get("master_link_status") == "up")


@pytest.fixture(scope="module")
def setup() -> Iterator[SentinelSetup]:
    """Started once for the module; the failover test, last, leaves the old primary dead."""
    if shutil.which("redis-server") is None:
        skip_or_fail("redis", "redis-server is not installed")
    folder = Path(tempfile.mkdtemp(prefix="kvstores-sentinel-"))
    primary = RedisServer(folder)
    replica = RedisServer(folder, "--replicaof", "127.0.0.1", str(primary.port))
    started = SentinelSetup(folder, primary, replica)
    try:
        primary.start()
        replica.start()
        _wait(lambda: _replica_linked(replica), 15, "the replica did not link to the primary")
        for _ in range(3):
            started.start_sentinel()
        _wait(started.ready, 20, "the sentinels did not discover the replica and each other")
    except Unavailable as exc:
        started.stop()
        shutil.rmtree(folder, ignore_errors=True)
        skip_or_fail("redis", f"cannot start Redis Sentinel: {exc}")
    yield started
    started.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def store(setup: SentinelSetup) -> AsyncIterator[RedisStore]:
    opened = RedisStore.from_url(f"{setup.url}?prefix=sentinel&timeout={TIMEOUT}")
    yield opened
    await opened.aclose()


async def test_sentinel_url_reaches_the_primary(setup: SentinelSetup, store: RedisStore) -> None:
    await store.put("k", {"v": 1}, ttl=30)
    assert await store.get("k") == {"v": 1}
    with redis.Redis(port=setup.primary.port) as primary:
        assert primary.exists("sentinel{default}k")
    assert await store.keys() == ["k"]


async def test_client_from_sentinel_master_for(setup: SentinelSetup) -> None:
    sentinel = Sentinel([("127.0.0.1", port) for port in setup.sentinel_ports], socket_timeout=TIMEOUT)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(SERVICE, socket_timeout=TIMEOUT)
    store = RedisStore(client=client, prefix="passed-in")
    try:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}])
        assert await store.get_many(["a", "b"]) == [{"v": 1}, {"v": 2}]
        assert await store.pop("a") == {"v": 1}
        await store.destroy()
    finally:
        await store.aclose()
        assert await client.ping()  # the store never closes a client it was given
        await client.aclose()
        await sentinel.aclose()


def _clients(server: RedisServer) -> int:
    """Connections open on ``server``, not counting the one that asks."""
    with redis.Redis(port=server.port, socket_timeout=1) as client:
        return len(client.client_list()) - 1


async def test_lookups_at_once_leave_no_sentinel_connection_open(setup: SentinelSetup, tmp_path: Path) -> None:
    """Every look-up first asks a server that cannot answer (a plain Redis: SENTINEL is unknown to it), then the
    next sentinel; look-ups at once must not lose that first client, whose connections the store's close closes."""
    mute = RedisServer(tmp_path)
    mute.start()
    try:
        hosts = ",".join(f"127.0.0.1:{port}" for port in [mute.port, *setup.sentinel_ports])
        store = RedisStore.from_url(f"redis+sentinel://{hosts}/{SERVICE}/0?prefix=lookups&timeout={TIMEOUT}")
        try:  # put_many is not coalesced: eight calls at once open eight connections, each looking up the primary
            await asyncio.gather(*(store.put_many([f"k{i}"], [{"i": i}]) for i in range(8)))
            assert await asyncio.to_thread(_clients, mute) >= 1, "the look-ups never asked the first server"
        finally:
            await store.aclose()
        for _ in range(100):  # at most 10 s for the server to see the closes
            if await asyncio.to_thread(_clients, mute) == 0:
                break
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(_clients, mute) == 0, "the store left connections open on a sentinel"
    finally:
        mute.stop()


@dataclass
class Writes:
    """Writes of a load, each key once: when each was acknowledged."""

    acked: dict[str, float] = field(default_factory=dict)
    errors: list[tuple[float, BaseException]] = field(default_factory=list)
    untyped: list[BaseException] = field(default_factory=list)


async def _writer(store: RedisStore, worker: int, writes: Writes, stop: asyncio.Event) -> None:
    for n in range(1_000_000):  # bounded by the test's deadline as well
        if stop.is_set():
            return
        keys = [f"w{worker}-{n}"] if n % 2 else [f"w{worker}-{n}-{part}" for part in "abc"]
        try:
            if len(keys) == 1:
                await store.put(keys[0], {"n": n})
            else:
                await store.put_many(keys, [{"n": n}] * len(keys))
        except StoreConnectionError as exc:
            writes.errors.append((time.monotonic(), exc))
            await asyncio.sleep(0.05)
            continue
        except Exception as exc:
            writes.untyped.append(exc)
            return
        now = time.monotonic()
        for key in keys:
            writes.acked[key] = now


async def test_failover_under_load(setup: SentinelSetup, store: RedisStore, capsys: pytest.CaptureFixture[str]) -> None:
    writes = Writes()
    stop = asyncio.Event()
    workers = [asyncio.create_task(_writer(store, worker, writes, stop)) for worker in range(4)]
    try:
        await asyncio.sleep(1.0)
        old_primary = setup.primary.port
        setup.primary.kill()
        killed = time.monotonic()
        # wait for the sentinels to promote the replica and the store to write there again
        recovered = None
        for _ in range(300):  # at most 30 s
            await asyncio.sleep(0.1)
            after = [at for at in writes.acked.values() if at > killed + 0.05]
            if after:
                recovered = min(after)
                break
        await asyncio.sleep(1.0)  # writes carry on on the new primary
    finally:
        stop.set()
        await asyncio.gather(*workers)
    assert not writes.untyped, writes.untyped
    assert recovered is not None, "no write succeeded within 30 s of killing the primary"
    assert await asyncio.to_thread(setup.primary_port) == setup.replica.port != old_primary
    assert writes.errors, "no StoreConnectionError during the failover"

    # every acknowledged write, read on the promoted replica through the same store object
    keys = list(writes.acked)
    found: list[Any] = []
    for start in range(0, len(keys), 1_000):
        found += await store.get_many(keys[start : start + 1_000])
    lost = [key for key, value in zip(keys, found) if value is None]
    before = [writes.acked[key] for key in lost]
    assert all(at <= killed for at in before), "a write acknowledged after the kill was lost"
    window = killed - min(before) if before else 0.0
    with capsys.disabled():
        print(
            f"\nsentinel failover: {len(keys)} writes acknowledged, {len(lost)} lost "
            f"(acknowledged within {window * 1000:.0f} ms before the kill); "
            f"writes failed for {recovered - killed:.1f} s ({len(writes.errors)} StoreConnectionErrors)"
        )
    # asynchronous replication on loopback: what the primary had not sent when it died, a moment's writes
    assert window < 1.0, f"acknowledged writes lost from {window:.2f} s before the kill"
