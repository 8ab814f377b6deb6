"""Redis entries of the table: the machine's Redis, and a 3-master Cluster started here.

Also the helpers the Redis tests use to run their own ``redis-server`` processes.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

from tests.support import Backend, Unavailable, free_port, stop_process

REDIS_URL = "redis://127.0.0.1:6379/15"
"""The machine's Redis, on a database the tests may fill and empty."""

CLUSTER_BUS_OFFSET = 10_000
"""A Cluster node talks to the others on its port + 10,000."""


class RedisServer:
    """A ``redis-server`` of the tests' own on 127.0.0.1 (no persistence unless ``options`` ask for it)."""

    def __init__(self, folder: Path, *options: str, port: int | None = None) -> None:
        self.folder = folder
        self.options = options
        self.port = free_port() if port is None else port
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again: same port and folder) and wait until it answers PING; raise Unavailable if it cannot."""
        executable = shutil.which("redis-server")
        if executable is None:
            raise Unavailable("redis-server is not installed")
        log = self.folder / f"redis-{self.port}.log"
        self.process = subprocess.Popen(
            [
                executable,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
                *("--daemonize", "no", "--dir", str(self.folder), "--logfile", str(log)),
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise Unavailable(f"redis-server on port {self.port} exited with {self.process.returncode}")
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise Unavailable(f"redis-server on port {self.port} did not answer") from None
                time.sleep(0.05)

    def pause(self) -> None:
        """SIGSTOP: it accepts connections and never answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        self.process = None

    def stop(self) -> None:
        """Stop it cleanly (resumed first if paused); nothing if it is not running."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
            stop_process(process, timeout=10)


@contextmanager
def own_redis(folder: Path, *options: str) -> Iterator[RedisServer]:
    """A started RedisServer, stopped afterwards; skip (or fail when Redis is required) if it cannot start."""
    from tests.support.fixtures import skip_or_fail

    server = RedisServer(folder, *options)
    try:
        server.start()
    except Unavailable as exc:
        skip_or_fail("redis", f"cannot start redis-server: {exc}")
    try:
        yield server
    finally:
        server.stop()


class RedisBackend(Backend):
    """The machine's Redis on 127.0.0.1:6379, db 15; one key prefix per namespace."""

    name = "redis"
    server = True
    proxied = True
    password_user = ""  # the server has no password: redis-py then ignores the one it sends

    def tls_url(self, url: str) -> str:
        return url.replace("redis://", "rediss://", 1)

    def start(self) -> None:
        try:
            with redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
                client.ping()
        except redis.RedisError as exc:
            raise Unavailable(f"no Redis at {REDIS_URL}: {exc}") from exc

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return REDIS_URL, {"prefix": namespace}

    def client(self) -> redis.Redis | redis.RedisCluster:
        """A synchronous client of the server, which the caller closes."""
        return redis.Redis.from_url(REDIS_URL)

    def async_client(self) -> redis.asyncio.Redis | redis.asyncio.RedisCluster:
        """An asyncio client of the server, which the caller closes."""
        return redis.asyncio.Redis.from_url(REDIS_URL)

    def tagged(self, tag: str) -> dict[str, Any]:
        return {"client_name": tag}

    async def connections(self, tag: str) -> int | None:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            return sum(1 for entry in await client.client_list() if entry.get("name") == tag)
        finally:
            await client.aclose()

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        with self.client() as client:
            # the documented layout: <prefix>{<collection, % { } escaped>}<key>
            assert client.set(f"{store.prefix}{{default}}{key}", raw, xx=True)


class RedisClusterBackend(RedisBackend):
    """A 3-master Redis Cluster on free loopback ports, started and stopped here."""

    name = "redis-cluster"
    proxied = False  # three nodes, each at its own address

    def tagged(self, tag: str) -> dict[str, Any]:
        return {}  # connections are counted on the standalone row only

    async def connections(self, tag: str) -> int | None:
        return None

    def start(self) -> None:
        if shutil.which("redis-cli") is None:
            raise Unavailable("redis-cli is not installed")
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-cluster-"))
        self.servers: list[RedisServer] = []
        try:
            self._start_cluster()
        except BaseException:
            self.stop()
            raise

    def _start_cluster(self) -> None:
        self.ports = [free_port(plus=CLUSTER_BUS_OFFSET) for _ in range(3)]
        for port in self.ports:
            options = ("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf")
            self.servers.append(RedisServer(self.folder, *options, port=port))
            self.servers[-1].start()
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if created.returncode != 0:
            raise Unavailable(f"redis-cli --cluster create failed: {created.stdout}{created.stderr}")
        deadline = time.monotonic() + 30
        while not all(self._cluster_ok(port) for port in self.ports):
            if time.monotonic() > deadline:
                raise Unavailable("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    @staticmethod
    def _cluster_ok(port: int) -> bool:
        with redis.Redis(port=port, socket_timeout=2, decode_responses=True) as client:
            info: dict[str, str] = client.execute_command("CLUSTER INFO")
        return info.get("cluster_state") == "ok"

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}", {"prefix": namespace}

    def client(self) -> redis.Redis | redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.ports[0])

    def async_client(self) -> redis.asyncio.Redis | redis.asyncio.RedisCluster:
        return redis.asyncio.RedisCluster.from_url(f"redis://127.0.0.1:{self.ports[0]}")
