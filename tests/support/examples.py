"""Helpers for the FastMCP tests: run the persistent_state example scripts as processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support import free_port, stop_process

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "persistent_state"
"""The folder of the persistent_state example."""


def run_example(script: str, *args: str, cwd: Path) -> str:
    """Run an example script to completion in ``cwd``; return its stdout (fail on a non-zero exit)."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def sections(output: str) -> dict[str, list[str]]:
    """An example's output as {section title: its indented lines}; sections are separated by blank lines."""
    found: dict[str, list[str]] = {}
    for block in output.strip().split("\n\n"):
        title, *lines = block.splitlines()
        found[title] = [line.strip() for line in lines]
    return found


class ExampleServer:
    """examples/persistent_state/server.py running in a child process on a free port."""

    def __init__(self, store_url: str | None, cwd: Path) -> None:
        self.store = ["--store", store_url] if store_url else []
        self.cwd = cwd
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = self.cwd / f"server-{self.port}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(EXAMPLES / "server.py"), *self.store, "--port", str(self.port)],
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Block until the server says it is serving on its port; fail with its log if it exits or hangs.

        Its own log line, not a connection to the port: the port was free when :func:`free_port`
        chose it, but another test worker may have bound it since, and a connection would then
        reach that process while this server exits. A server that finds its port taken is
        started again on another.
        """
        deadline = time.monotonic() + timeout
        for attempt in range(3):
            while True:
                log = self.log.read_text(errors="replace")
                if f"Uvicorn running on http://127.0.0.1:{self.port} " in log:
                    return
                if self.process.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"server.py did not start serving:\n{log}")
                time.sleep(0.1)
            if "address already in use" not in log or attempt == 2:
                raise AssertionError(f"server.py exited with {self.process.returncode}:\n{log}")
            self._spawn()

    def stop(self) -> None:
        """Stop the server (SIGTERM: uvicorn shuts down cleanly and the store is closed)."""
        stop_process(self.process)


@contextmanager
def example_servers(store_url: str | None, count: int, cwd: Path) -> Iterator[list[str]]:
    """Run ``count`` example servers on one store at once; yield their MCP URLs."""
    with ExitStack() as stack:
        servers = []
        for _ in range(count):
            server = ExampleServer(store_url, cwd)
            stack.callback(server.stop)
            servers.append(server)
        for server in servers:
            server.wait_until_serving()
        try:
            yield [server.url for server in servers]
        except BaseException:
            for server in servers:  # pytest shows them beside the failure
                print(f"-- {server.log.name}:\n{server.log.read_text(errors='replace')}")
            raise
