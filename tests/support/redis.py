"""Redis backends for the tests: the machine's Redis, and a 3-master Cluster started here.

Also the helpers the Redis tests use to run their own ``redis-server`` processes.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from kvstores.backends.redis import RedisStore
from tests.support import Backend, Unavailable, stop_process

REDIS_URL = "redis://127.0.0.1:6379/15"
"""The machine's Redis, on a database the tests may fill and empty."""


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; with a free port 10,000 above it (a Cluster bus) if asked."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if not with_bus:
            return port
        if port + 10_000 < 65_536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10_000))
                except OSError:
                    continue
            return port
    raise Unavailable("no free loopback port pair for a Redis Cluster node")


def start_server(port: int, folder: Path, *options: str) -> subprocess.Popen[bytes]:
    """Start ``redis-server`` on ``port`` (no persistence) and wait until it answers PING."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise Unavailable("redis-server is not installed")
    process = subprocess.Popen(
        [
            executable,
            *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
            *("--daemonize", "no", "--dir", str(folder), "--logfile", str(folder / f"redis-{port}.log")),
            *options,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            raise Unavailable(f"redis-server on port {port} exited with {process.returncode}")
        try:
            with redis.Redis(port=port, socket_timeout=1) as client:
                client.ping()
            return process
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                stop_server(process)
                raise Unavailable(f"redis-server on port {port} did not answer") from None
            time.sleep(0.05)


def stop_server(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started by :func:`start_server`."""
    stop_process(process, timeout=10)


class RedisBackend(Backend):
    """The machine's Redis on 127.0.0.1:6379, db 15; one key prefix per namespace."""

    name = "redis"

    def start(self) -> None:
        try:
            with redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2) as client:
                client.ping()
        except redis.RedisError as exc:
            raise Unavailable(f"no Redis at {REDIS_URL}: {exc}") from exc

    async def open(self, namespace: str, **options: Any) -> RedisStore:
        return RedisStore(REDIS_URL, prefix=namespace, **options)


class RedisClusterBackend(Backend):
    """A 3-master Redis Cluster on free loopback ports, started and stopped here."""

    name = "redis-cluster"

    def start(self) -> None:
        if shutil.which("redis-cli") is None:
            raise Unavailable("redis-cli is not installed")
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-cluster-"))
        self.processes: list[subprocess.Popen[bytes]] = []
        try:
            self._start_cluster()
        except BaseException:
            self.stop()
            raise

    def _start_cluster(self) -> None:
        self.ports = [free_port(with_bus=True) for _ in range(3)]
        for port in self.ports:
            options = ("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf")
            self.processes.append(start_server(port, self.folder, *options))
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
        for process in self.processes:
            stop_server(process)
        self.processes.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    async def open(self, namespace: str, **options: Any) -> RedisStore:
        return RedisStore(f"redis+cluster://127.0.0.1:{self.ports[0]}", prefix=namespace, **options)
