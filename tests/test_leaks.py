"""The leak check (tests/support/leaks.py): what a test leaves unclosed fails that test, not a later one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SUITE = """
import asyncio
import socket
import subprocess
import sys
import tracemalloc

import pytest

tracemalloc.start(5)


class Cycle:
    def __init__(self):
        self.me = self  # only the garbage collector frees it
        self.sock = socket.socket()


@pytest.fixture
def unclosed_socket():
    yield socket.socket()  # nobody closes it


def test_leaves_a_socket_in_a_cycle():
    Cycle()


def test_leaves_its_fixture_socket(unclosed_socket):
    pass


async def sleeper():
    await asyncio.sleep(3600)


def test_leaves_a_pending_task():
    loop = asyncio.new_event_loop()
    task = loop.create_task(sleeper())
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    task.me = task


ORPHAN = "import os, time; parent = os.getppid()\\nwhile os.getppid() == parent: time.sleep(0.05)"


def test_leaves_a_child_process_running():
    holder = Cycle()  # freed by the collector: the child runs on (it ends when this pytest does, killed or not)
    holder.child = subprocess.Popen([sys.executable, "-c", ORPHAN])


def test_fails_holding_a_child_process():
    child = subprocess.Popen([sys.executable, "-c", ORPHAN])
    assert child.poll() == 0, "fails: pytest keeps this frame, and so the child, for a post-mortem"


def test_closes_what_it_opens():
    with socket.socket():
        pass
"""


def run_suite(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """The suite above under pytest in a child process, with the leak check unless ``options`` leave it out."""
    (tmp_path / "test_suite.py").write_text(_SUITE)
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options, "test_suite.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=120,
    )


def test_each_leak_fails_the_test_that_left_it(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "-p", "tests.support.leaks")
    assert "1 failed, 5 passed, 5 errors" in result.stdout, result.stdout
    errors = sorted(line for line in result.stdout.splitlines() if line.startswith("ERROR "))
    assert [line.split(" - ")[0] for line in errors] == [
        "ERROR test_suite.py::test_fails_holding_a_child_process",
        "ERROR test_suite.py::test_leaves_a_child_process_running",
        "ERROR test_suite.py::test_leaves_a_pending_task",
        "ERROR test_suite.py::test_leaves_a_socket_in_a_cycle",
        "ERROR test_suite.py::test_leaves_its_fixture_socket",
    ], result.stdout
    assert "test_suite.py::test_leaves_a_socket_in_a_cycle left 1 resource(s) unclosed" in result.stdout
    assert "unclosed <socket.socket" in result.stdout
    assert "Task was destroyed but it is pending!" in result.stdout
    assert "is still running (killed)" in result.stdout, result.stdout
    assert 'test_suite.py", line 16' in result.stdout, "tracemalloc's traceback names where the socket was made"


def test_without_the_check_the_leaking_tests_pass(tmp_path: Path) -> None:
    result = run_suite(tmp_path)
    assert "1 failed, 5 passed" in result.stdout, result.stdout
