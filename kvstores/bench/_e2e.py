"""``kvstores bench --e2e``: tools/call through a real uvicorn process, durable sessions beside FastMCP's own app.

For each TARGET, each round starts one server process per mode (:mod:`kvstores.bench._e2e_server`:
the same FastMCP server with the same :class:`~kvstores.events.StoreEventStore` on the same
store, served by FastMCP's own stateful ``http_app`` and by :func:`kvstores.sessions.http_app`),
one after the other, the order alternating between rounds. Against each, ``sessions``
concurrent clients (default 16) each open a handshake session (``initialize``,
``notifications/initialized``), then call ``remember`` and ``recall`` in turn
(``ctx.set_state`` / ``ctx.get_state``) back to back for ``seconds`` (after a one-second
warm-up), with a plain HTTP client (httpx) that reads each SSE response to its end. A row holds,
per mode, the median over the rounds of calls/s, p50 and p99, each round's figures, and the
ratio durable ÷ FastMCP (``kvstores`` is the durable contender, ``fastmcp`` FastMCP's app).

With ``replicas`` above 1, each mode runs that many server processes behind HAProxy (Debian's
``haproxy``, started here on loopback): durable sessions balanced round-robin without
stickiness (any replica serves any call), FastMCP's own app sticky by ``Mcp-Session-Id`` (a
stick table learns each session's replica from the response that opened it: its sessions live
in one process). The CPU per call is then the sum over the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstores._loopback import bound_socket
from kvstores._urls import redact_text
from kvstores.bench._backends import family

__all__ = ["E2E_GROUP", "E2E_OPERATION", "MODES", "PROFILE_VARIABLE", "URL_VARIABLE", "E2EPlan", "run_e2e"]

E2E_GROUP = "e2e"
"""The group of the end-to-end rows."""

E2E_OPERATION = "tools/call"
"""The operation of an end-to-end row: remember and recall, alternating."""

URL_VARIABLE = "KVSTORES_BENCH_E2E_URL"
"""Where the server process finds its store's URL (out of ``ps``)."""

PROFILE_VARIABLE = "KVSTORES_BENCH_E2E_PROFILE"
"""When set, the file the server process writes its cProfile statistics to."""

_CONTENDERS = {"fastmcp": "fastmcp", "durable": "kvstores"}
"""Server mode (FastMCP's own stateful app, kvstores' durable sessions) -> contender name in a row."""

MODES = tuple(_CONTENDERS)
"""The server modes of :mod:`kvstores.bench._e2e_server`."""

_WARMUP = 1.0
_START_TIMEOUT = 30.0
_PROTOCOL_VERSION = "2025-11-25"
_ACCEPT = "application/json, text/event-stream"


@dataclass(frozen=True)
class E2EPlan:
    """What an end-to-end run measures."""

    sessions: int
    """Concurrent handshake sessions, each one call at a time."""
    seconds: float
    """Measured seconds per mode and round (after the warm-up)."""
    rounds: int
    budget_seconds: float
    """Wall-clock cap of the whole run: targets that would start later are skipped and say so."""
    profile_dir: str | None = None
    """When set, each server process runs under cProfile and writes ``<backend>-<mode>-<round>.prof`` there."""
    replicas: int = 1
    """Server processes per mode; above 1, behind HAProxy."""


class _Session:
    """One handshake session of the plain HTTP client."""

    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url
        self.headers = {"accept": _ACCEPT, "content-type": "application/json"}
        self.next_id = 0

    async def open(self) -> None:
        client = {"name": "kvstores-bench", "version": "1"}
        params = {"protocolVersion": _PROTOCOL_VERSION, "capabilities": {}, "clientInfo": client}
        response = await self._post("initialize", params)
        self.headers["mcp-session-id"] = response.headers["mcp-session-id"]
        self.headers["mcp-protocol-version"] = _PROTOCOL_VERSION
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        (await self.client.post(self.url, json=note, headers=self.headers)).raise_for_status()

    async def call(self, tool: str, arguments: dict[str, Any]) -> None:
        await self._post("tools/call", {"name": tool, "arguments": arguments})

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.delete(self.url, headers=self.headers)

    async def _post(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        response = await self.client.post(self.url, json=body, headers=self.headers)
        response.raise_for_status()
        answer = _answer(response.text)
        if "error" in answer or answer.get("result", {}).get("isError"):
            raise RuntimeError(f"{method} failed: {json.dumps(answer)[:300]}")
        return response


def _answer(text: str) -> dict[str, Any]:
    """The JSON-RPC message of a response body: plain JSON, or the last ``data:`` line of an SSE stream."""
    if text.lstrip().startswith("{"):
        answer: dict[str, Any] = json.loads(text)
        return answer
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
    if not data:
        raise RuntimeError(f"no message in the response: {text[:200]!r}")
    answer = json.loads(data[-1])
    return answer


def _cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system, every thread) process ``pid`` used so far; None where /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, sessions: int, seconds: float, pids: list[int]) -> dict[str, Any]:
    """``sessions`` clients alternating remember/recall for a warm-up then ``seconds``: calls/s, p50, p99
    and the server process's CPU time per call."""
    import httpx

    limits = httpx.Limits(max_connections=sessions * 2, max_keepalive_connections=sessions * 2)
    async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
        opened = [_Session(client, url) for _ in range(sessions)]
        await asyncio.gather(*(session.open() for session in opened))
        latencies: list[float] = []
        start = time.perf_counter()
        measure_from, stop = start + _WARMUP, start + _WARMUP + seconds

        async def one(index: int, session: _Session) -> None:
            turn = 0
            while (now := time.perf_counter()) < stop:
                key = f"k{turn % 4}"
                if turn % 2 == 0:
                    await session.call("remember", {"key": key, "value": f"v{index}-{turn}"})
                else:
                    await session.call("recall", {"key": key})
                if now >= measure_from:
                    latencies.append(time.perf_counter() - now)
                turn += 1

        def cpu() -> float | None:
            used = [_cpu_seconds(pid) for pid in pids]
            return None if None in used else sum(u for u in used if u is not None)

        async def cpu_window() -> tuple[float | None, float | None]:
            await asyncio.sleep(measure_from - time.perf_counter())
            before = cpu()
            await asyncio.sleep(stop - time.perf_counter())
            return before, cpu()

        window = asyncio.ensure_future(cpu_window())
        await asyncio.gather(*(one(index, session) for index, session in enumerate(opened)))
        before, after = await window
        await asyncio.gather(*(session.close() for session in opened))
    if not latencies:
        raise RuntimeError(f"no call started within the measured {seconds:g} s: each took longer (a loaded machine?)")
    latencies.sort()
    figures: dict[str, Any] = {
        "calls": len(latencies),
        "ops_per_second": round(len(latencies) / seconds, 1),
        "p50_us": round(statistics.median(latencies) * 1e6, 1),
        "p99_us": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6, 1),
    }
    if before is not None and after is not None:
        figures["cpu_us"] = round((after - before) / len(latencies) * 1e6, 1)
    return figures


async def _wait_ready(process: asyncio.subprocess.Process, port: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"the server process exited with {process.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise RuntimeError(f"the server process did not listen within {_START_TIMEOUT:g} s")


async def stop_server(process: asyncio.subprocess.Process) -> None:
    """SIGTERM a bench server process, then SIGKILL after 15 s."""
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()


def _haproxy_config(fd: int, ports: list[int], sticky: bool) -> str:
    """Listen on the inherited socket ``fd``; round-robin over ``ports``, each request balanced on its own;
    ``sticky``: by Mcp-Session-Id."""
    servers = "\n".join(f"    server r{index} 127.0.0.1:{server}" for index, server in enumerate(ports))
    stick = (
        "    stick-table type string len 64 size 100k expire 10m\n"
        "    stick store-response res.hdr(mcp-session-id)\n"
        "    stick match req.hdr(mcp-session-id)\n"
    )
    return f"""global
    maxconn 2000

defaults
    mode http
    option http-server-close
    timeout connect 1s
    timeout client 120s
    timeout server 120s

frontend mcp
    bind fd@{fd}
    default_backend replicas

backend replicas
    balance roundrobin
{stick if sticky else ""}{servers}
"""


async def _start_haproxy(folder: str, ports: list[int], sticky: bool) -> tuple[asyncio.subprocess.Process, int]:
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
    if binary is None:
        raise RuntimeError("--replicas needs haproxy (apt-get install -y haproxy)")
    with bound_socket() as listener:
        port: int = listener.getsockname()[1]
        config = Path(folder) / "haproxy.cfg"
        config.write_text(_haproxy_config(listener.fileno(), ports, sticky))
        process = await asyncio.create_subprocess_exec(
            binary,
            "-db",
            "-f",
            str(config),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=[listener.fileno()],
        )
    await _wait_ready(process, port)
    return process, port


async def _measure_mode(url: str, mode: str, plan: E2EPlan, profile: str | None) -> dict[str, Any]:
    """Start the server process(es) in ``mode`` on ``url`` (behind HAProxy if several), drive them, stop them."""
    ports: list[int] = []
    processes = []
    for index in range(plan.replicas):
        environment = {**os.environ, URL_VARIABLE: url}
        if profile is not None:
            environment[PROFILE_VARIABLE] = profile if plan.replicas == 1 else f"{profile[:-5]}-r{index}.prof"
        with bound_socket() as listener:  # the server listens on it: no other process can take the port meanwhile
            ports.append(listener.getsockname()[1])
            processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "kvstores.bench._e2e_server",
                    mode,
                    str(listener.fileno()),
                    env=environment,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                    pass_fds=[listener.fileno()],
                )
            )
    with tempfile.TemporaryDirectory(prefix="kvbench-e2e-") as folder:
        try:
            for process, port in zip(processes, ports):
                await _wait_ready(process, port)
            if plan.replicas > 1:
                proxy, port = await _start_haproxy(folder, ports, sticky=mode == "fastmcp")
                processes.append(proxy)  # stopped with the servers
            else:
                port = ports[0]
            pids = [process.pid for process in processes[: plan.replicas]]
            return await _drive(f"http://127.0.0.1:{port}/mcp", plan.sessions, plan.seconds, pids)
        except Exception as exc:
            errors = ""
            for process in processes:
                await stop_server(process)
                assert process.stderr is not None
                errors += (await process.stderr.read())[-1500:].decode(errors="replace")
            raise RuntimeError(f"{mode}: {type(exc).__name__}: {exc}\n{errors[-3000:]}") from exc
        finally:
            for process in processes:
                await stop_server(process)


async def _clean(url: str) -> None:
    """Remove what the servers wrote (state, events, session records, signals' rows expire on their own)."""
    from kvstores.registry import open_store
    from kvstores.sessions import REGISTRY_COLLECTION

    async with open_store(url) as store:
        for collection in ("kvstores_events", REGISTRY_COLLECTION, "fastmcp_state"):
            with contextlib.suppress(Exception):
                await store.destroy_collection(collection)


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, and the rounds themselves."""
    names = [name for name in ("ops_per_second", "p50_us", "p99_us", "cpu_us") if all(name in r for r in rounds)]
    return {**{name: round(statistics.median(r[name] for r in rounds), 1) for name in names}, "rounds": rounds}


async def run_e2e(label: str, url: str, plan: E2EPlan, deadline: float, progress: Any) -> list[dict[str, Any]]:
    """The end-to-end row of one target: both modes, ``plan.rounds`` rounds, the order alternating."""
    row: dict[str, Any] = {
        "target": label,
        "backend": family(url),
        "store": "http_app",
        "group": E2E_GROUP,
        "operation": E2E_OPERATION,
        "value_bytes": None,
        "concurrency": plan.sessions,
        "replicas": plan.replicas,
        "seconds": plan.seconds,
    }
    if time.monotonic() + 2 * plan.rounds * (plan.seconds + 5 * plan.replicas) > deadline:
        return [{**row, "skipped": "the run's wall-clock cap was reached"}]
    progress.start(f"{label} end to end", 2 * plan.rounds)
    if plan.profile_dir is not None:
        os.makedirs(plan.profile_dir, exist_ok=True)
    figures: dict[str, list[dict[str, Any]]] = {mode: [] for mode in _CONTENDERS}
    try:
        for round_number in range(plan.rounds):
            order = list(_CONTENDERS) if round_number % 2 == 0 else list(reversed(_CONTENDERS))
            for mode in order:
                profile = None
                if plan.profile_dir is not None:
                    profile = os.path.join(plan.profile_dir, f"{row['backend']}-{mode}-{round_number}.prof")
                figures[mode].append(await _measure_mode(url, mode, plan, profile))
                progress.tick()
    except Exception as exc:
        return [{**row, "skipped": f"failed: {redact_text(str(exc), url)}"}]
    finally:
        await _clean(url)
    contenders = {_CONTENDERS[mode]: _median(rounds) for mode, rounds in figures.items()}
    ours, theirs = contenders["kvstores"], contenders["fastmcp"]
    ratios = {"fastmcp": round(ours["ops_per_second"] / theirs["ops_per_second"], 3)}
    return [{**row, "contenders": contenders, "ratios": ratios}]
