"""HAProxy (Debian's package) in front of a test's server processes: round-robin, no stickiness.

The proxy runs in the foreground on a free loopback port from a generated configuration; each
response names the replica that served it (``X-Replica``: r0, r1...), and the admin socket lets a
test cut every connection at once, as a load balancer that drops its streams would.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support import Unavailable, free_port, stop_process

REPLICA_HEADER = "x-replica"
"""The response header that names the replica behind the proxy."""


class HAProxy:
    """``haproxy`` balancing round-robin over ``ports`` (127.0.0.1), one request at a time."""

    def __init__(self, ports: list[int], work_dir: Path) -> None:
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
        if binary is None:
            raise Unavailable("haproxy is not installed (apt-get install -y haproxy)")
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.names = [f"r{index}" for index in range(len(ports))]
        self.admin = work_dir / f"haproxy-{self.port}.sock"
        self.config = work_dir / f"haproxy-{self.port}.cfg"
        self.log = work_dir / f"haproxy-{self.port}.log"
        servers = "\n".join(
            f"    server {name} 127.0.0.1:{port} check inter 250ms fall 1 rise 1"
            for name, port in zip(self.names, ports)
        )
        # http-server-close: each request is balanced on its own; retries + redispatch: a request
        # sent to a replica that just died goes to another; long timeouts: SSE streams stay open.
        self.config.write_text(
            f"""global
    stats socket {self.admin} mode 600 level admin
    maxconn 2000

defaults
    mode http
    option http-server-close
    retries 3
    option redispatch 1
    timeout connect 1s
    timeout client 120s
    timeout server 120s
    timeout http-request 10s

frontend mcp
    bind 127.0.0.1:{self.port}
    default_backend replicas

backend replicas
    balance roundrobin
    http-response set-header {REPLICA_HEADER} %[srv_name]
{servers}
"""
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> HAProxy:
        """Start the proxy and wait until it accepts connections."""
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise AssertionError(f"haproxy refused its configuration:\n{check.stderr}")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([self.binary, "-db", "-f", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"haproxy exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"haproxy did not listen:\n{self.log.read_text()}") from None
                time.sleep(0.05)

    def command(self, line: str) -> str:
        """One command on the admin socket; its answer."""
        with socket.socket(socket.AF_UNIX) as admin:
            admin.settimeout(5)
            admin.connect(str(self.admin))
            admin.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := admin.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def drop_connections(self) -> None:
        """Cut every connection through the proxy, to every replica (both sides see the stream end)."""
        for name in self.names:
            self.command(f"shutdown sessions server replicas/{name}")

    def wait_until_up(self, name: str, timeout: float = 10.0) -> None:
        """Block until the health checks see replica ``name`` up again."""
        deadline = time.monotonic() + timeout
        while f"replicas/{name} is UP" not in self._state(name):
            assert time.monotonic() < deadline, f"haproxy does not see {name} up"
            time.sleep(0.05)

    def _state(self, name: str) -> str:
        for line in self.command("show servers state replicas").splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[3] == name:
                return f"replicas/{name} is {'UP' if fields[5] == '2' else 'DOWN'}"
        return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.process is not None:
            stop_process(self.process, timeout=5)
