"""A process that uses a store exits at once and silently, whether or not it closed the store.

FastMCP never closes the store it is given, so an unclosed store is the normal case: these
tests run real child processes (a script that returns from ``asyncio.run`` with calls still
queued; the README's FastMCP HTTP server stopped with SIGINT) and check exit status, exit
time and everything written to stderr.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Backend, free_port, stop_process

pytestmark = pytest.mark.anyio

EXIT_WITHIN = 2.0  # seconds from asyncio.run's return to the end of the process
SIGINT_EXIT_WITHIN = 5.0


@pytest.fixture(autouse=True)
def _forget_what_the_children_left(backend: Backend, namespace: str) -> Iterator[None]:
    """The children never close their stores, let alone clean them: destroy their namespace
    afterwards, so that nothing stays behind on a shared server (the machine's Redis)."""
    yield
    if backend.persistent:

        async def destroy() -> None:
            store = await backend.open(namespace)
            try:
                await store.destroy()
            finally:
                await store.aclose()

        asyncio.run(destroy())


_SCRIPT = """
import asyncio, sys
from kvstores import open_store

URL, OPTIONS, KEEP = {url!r}, {options!r}, {keep!r}
kept = []

async def main():
    store = open_store(URL, **OPTIONS)
    await store.put("k", {{"v": 1}})
    assert await store.get("k") == {{"v": 1}}
    # calls still queued when main returns: asyncio.run cancels them
    for i in range(50):
        asyncio.ensure_future(store.get("k"))
        asyncio.ensure_future(store.put(f"k{{i}}", {{"i": i}}, ttl=60))
    await asyncio.sleep(0)
    if KEEP:
        kept.append(store)  # held for the life of the process, as FastMCP holds its store

asyncio.run(main())
print("returned", flush=True)
"""

_SIGNALS_SCRIPT = """
import asyncio
from kvstores import open_store, signals

URL, OPTIONS = {url!r}, {options!r}
kept = []

async def main():
    store = open_store(URL, **OPTIONS)
    channel = signals.channel(store)
    subscription = await channel.subscribe("exit-test")
    await channel.publish("exit-test", "hello")
    async with asyncio.timeout(10):
        async for message in subscription:
            if message == "hello":
                break
    kept.append(store)  # neither the store nor its channel is ever closed

asyncio.run(main())
print("returned", flush=True)
"""

_SERVER = """
import sys
from fastmcp import FastMCP, Context
from kvstores import open_store

mcp = FastMCP("exit-test", session_state_store=open_store({url!r}, **{options!r}))

@mcp.tool
async def remember(value: str, ctx: Context) -> str:
    await ctx.set_state("value", value)
    return str(await ctx.get_state("value"))

mcp.run(transport="http", host="127.0.0.1", port={port}, show_banner=False)
"""


def _url(backend: Backend, namespace: str, tmp_path: Path, **extra: Any) -> tuple[str, dict[str, Any]]:
    try:
        url, options = backend.url(namespace)
    except NotImplementedError:
        pytest.skip(f"{backend.name}: its stores are opened from a client object, not a URL")
    if url.startswith("sqlite://") and ":memory:" not in url:
        url = f"sqlite:///{tmp_path / 'state.db'}"
    return url, {**options, **extra}


def _run_until_exit(script: Path) -> tuple[str, int, float, str]:
    """Run ``script``: its first line of output, exit code, seconds from that line to the exit, stderr."""
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            returned = time.monotonic()
            _, stderr = child.communicate(timeout=30)
            exited = time.monotonic()
        finally:
            stop_process(child, timeout=1)
    return line, child.returncode, exited - returned, stderr


def test_process_whose_signal_channel_nobody_closed_exits_at_once(
    backend: Backend, namespace: str, tmp_path: Path
) -> None:
    url, options = _url(backend, namespace, tmp_path)
    script = tmp_path / "signals.py"
    script.write_text(textwrap.dedent(_SIGNALS_SCRIPT.format(url=url, options=options)))
    line, code, took, stderr = _run_until_exit(script)
    assert line.strip() == "returned", f"the script failed: {stderr}"
    assert code == 0, stderr
    assert took < EXIT_WITHIN, f"exit took {took:.1f}s after asyncio.run returned"
    assert stderr == "", f"the process wrote to stderr:\n{stderr}"


@pytest.mark.parametrize("keep", [True, False], ids=["held", "dropped"])
@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no-batching"])
def test_process_with_an_unclosed_store_exits_at_once_and_silently(
    backend: Backend, namespace: str, tmp_path: Path, batching: bool, keep: bool
) -> None:
    url, options = _url(backend, namespace, tmp_path, batching=batching)
    script = tmp_path / "unclosed.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(url=url, options=options, keep=keep)))
    line, code, took, stderr = _run_until_exit(script)
    assert line.strip() == "returned", f"the script failed: {stderr}"
    assert code == 0, stderr
    assert took < EXIT_WITHIN, f"exit took {took:.1f}s after asyncio.run returned"
    assert stderr == "", f"the process wrote to stderr:\n{stderr}"


def test_fastmcp_http_server_exits_on_sigint(backend: Backend, namespace: str, tmp_path: Path) -> None:
    """The README's headline server, store never closed, stops within 5 s of Ctrl-C."""
    url, options = _url(backend, namespace, tmp_path)
    port = free_port()
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(_SERVER.format(url=url, options=options, port=port)))
    log = tmp_path / "server.log"
    with log.open("w") as output:
        server = subprocess.Popen([sys.executable, str(script)], stdout=output, stderr=subprocess.STDOUT)
    try:
        _call_remember(port)
        server.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        code = server.wait(timeout=30)
        took = time.monotonic() - interrupted
    finally:
        stop_process(server, timeout=1)
    text = log.read_text()
    assert took < SIGINT_EXIT_WITHIN, f"the server took {took:.1f}s to exit after SIGINT:\n{text}"
    # FastMCP's mcp.run re-raises the interrupt once uvicorn has shut down (exit -SIGINT and a
    # KeyboardInterrupt traceback, whatever the store): anything beyond that is the store's
    assert code in (0, -signal.SIGINT), text
    assert "Finished server process" in text, text
    for sign in (
        "kvstores",
        "Exception ignored",
        "Event loop is closed",
        "RuntimeError",
        "Warning",
        "Task was destroyed",
    ):
        assert sign not in text, f"{sign!r} in the server's output:\n{text}"


def _call_remember(port: int) -> None:
    """One handshake-era tool call that writes session state, over real HTTP (waits for the server)."""
    url = f"http://127.0.0.1:{port}/mcp"
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    deadline = time.monotonic() + 60
    while True:
        try:
            response = httpx.post(url, json=initialize, headers=headers, timeout=10)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    response.raise_for_status()
    session = {**headers, "Mcp-Session-Id": response.headers["mcp-session-id"]}
    httpx.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session, timeout=10)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "remember", "arguments": {"value": "x"}},
    }
    reply = httpx.post(url, json=call, headers=session, timeout=10)
    assert reply.status_code == 200 and '"x"' in reply.text, reply.text
