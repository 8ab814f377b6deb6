"""A fault-injecting TCP proxy on loopback, for the network-fault tests (tests/test_faults.py).

:class:`FaultProxy` listens on a free 127.0.0.1 port and forwards every connection to one
upstream loopback port, on an event loop in a thread of its own (so a test's loop being busy
never stalls it, and it never stalls the test). Faults are switched on and off from the test:

- ``latency(seconds)``: every chunk is delivered ``seconds`` after it arrived, in each
  direction (a round trip gains twice that); order is kept, throughput is not limited.
- ``blackhole()``: nothing is forwarded any more, in either direction, and connections stay
  open (new ones are accepted too); ``heal()`` delivers what was held, as TCP would after a
  partition, so a client that reuses a connection it gave up on reads a stale reply.
- ``reset_replies(count)``: the next ``count`` server-to-client chunks are cut in half: the
  first half is delivered, then both sides of that connection are reset (RST, not FIN).
- ``truncate_requests(count)``: the next ``count`` client-to-server chunks lose their second
  half and the connection stays open, so the server waits for the rest of a request (or reads
  the next request as its continuation) while the client waits for a reply.

Only loopback is ever targeted, and every wait in here is bounded.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.support import Unavailable

__all__ = ["FaultProxy", "proxied", "through"]

T = TypeVar("T")

_CHUNK = 65_536
_UP, _DOWN = "up", "down"  # client -> server, server -> client


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s connection with a RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One proxied connection: the client's streams and the upstream server's."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.tasks: list[asyncio.Task[None]] = []

    def reset(self) -> None:
        _reset(self.client)
        _reset(self.server)
        for task in self.tasks:
            task.cancel()


class FaultProxy:
    """A TCP proxy from a free loopback port to ``127.0.0.1:upstream_port``, with faults on demand."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.connections = 0
        """Connections accepted so far."""
        self.resets = 0
        """Connections reset by ``reset_replies``."""
        self.truncated = 0
        """Requests cut by ``truncate_requests``."""
        self._delay = 0.0
        self._reset_replies = 0
        self._truncate_requests = 0
        self._flowing: asyncio.Event | None = None
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    # -- lifecycle (from the test) -----------------------------------------------------

    def start(self) -> None:
        """Listen on a free loopback port (``self.port``)."""
        self._thread.start()
        self._call(self._listen)

    def stop(self) -> None:
        """Reset every connection, stop listening and end the proxy's thread."""
        if not self._thread.is_alive():
            return
        self._call(self._shut)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- faults (from the test) --------------------------------------------------------

    def latency(self, seconds: float) -> None:
        """Deliver every chunk ``seconds`` late, in each direction (0: no added latency)."""
        self._delay = seconds

    def blackhole(self) -> None:
        """Forward nothing, keeping every connection open, until ``heal()``."""
        self._call(self._stop_flowing)

    def reset_replies(self, count: int = 1) -> None:
        """Cut each of the next ``count`` replies in half and reset its connection."""
        self._reset_replies = count

    def truncate_requests(self, count: int = 1) -> None:
        """Drop the second half of each of the next ``count`` requests; the connection stays open."""
        self._truncate_requests = count

    def heal(self) -> None:
        """End every fault: deliver what the blackhole held, no added latency, no more cuts."""
        self._delay = 0.0
        self._reset_replies = self._truncate_requests = 0
        self._call(self._start_flowing)

    def reset_all(self) -> None:
        """Reset every open connection (as a crashed middlebox would)."""
        self._call(self._reset_links)

    # -- the proxy's loop ----------------------------------------------------------------

    def _call(self, function: Callable[[], Awaitable[T]]) -> T:
        async def run() -> T:
            return await function()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        try:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        except OSError as exc:
            raise Unavailable(f"the fault proxy cannot listen: {exc}") from exc
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_links()
        if self._server is not None:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _reset_links(self) -> None:
        links, self._links = list(self._links), set()
        for link in links:
            link.reset()

    async def _stop_flowing(self) -> None:
        assert self._flowing is not None
        self._flowing.clear()

    async def _start_flowing(self) -> None:
        assert self._flowing is not None
        self._flowing.set()

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_reader, server = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.upstream_port), 10)
        except (TimeoutError, OSError):
            _reset(client)
            return
        link = _Link(client, server)
        self._links.add(link)
        queues: dict[str, asyncio.Queue[tuple[float, bytes]]] = {_UP: asyncio.Queue(), _DOWN: asyncio.Queue()}
        link.tasks = [
            asyncio.create_task(self._read(client_reader, queues[_UP])),
            asyncio.create_task(self._read(server_reader, queues[_DOWN])),
            asyncio.create_task(self._write(link, _UP, queues[_UP])),
            asyncio.create_task(self._write(link, _DOWN, queues[_DOWN])),
        ]
        await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        # one side ended (EOF or error): end the whole connection, as a TCP relay does
        self._links.discard(link)
        for task in link.tasks:
            task.cancel()
        for writer in (client, server):
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        with suppress(OSError):
            while data := await reader.read(_CHUNK):
                queue.put_nowait((time.monotonic() + self._delay, data))

    async def _write(self, link: _Link, direction: str, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        assert self._flowing is not None
        writer = link.server if direction == _UP else link.client
        with suppress(OSError):
            while True:
                due, data = await queue.get()
                await self._flowing.wait()
                if (pause := due - time.monotonic()) > 0:
                    await asyncio.sleep(pause)
                await self._flowing.wait()
                if direction == _DOWN and self._reset_replies > 0:
                    self._reset_replies -= 1
                    self.resets += 1
                    writer.write(data[: max(1, len(data) // 2)] if len(data) > 1 else b"")
                    with suppress(OSError, asyncio.TimeoutError):
                        await asyncio.wait_for(writer.drain(), 1)
                    self._links.discard(link)
                    link.reset()
                    return
                if direction == _UP and self._truncate_requests > 0 and len(data) > 1:
                    self._truncate_requests -= 1
                    self.truncated += 1
                    data = data[: len(data) // 2]
                writer.write(data)
                await writer.drain()


def through(url: str, proxy: FaultProxy) -> str:
    """``url`` with its (loopback) host and port replaced by the proxy's, and what its driver needs there.

    MongoDB: ``directConnection=true``, the proxy's address is the only one pymongo may use.
    PostgreSQL: ``sslmode=disable`` (the servers here have no TLS): with asyncpg's default, ``prefer``,
    every connection (a statement's cancel request too) first asks for TLS, one more exchange for a
    fault to land in than the test means (tests/test_postgresql.py checks that a cut probe is quiet).
    """
    parts = urlsplit(url)
    host = parts.hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"the fault proxy only targets loopback, not {host!r}")
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{proxy.port}" if credentials else f"127.0.0.1:{proxy.port}"
    parts = parts._replace(netloc=netloc)
    if parts.scheme.startswith(("mongodb", "postgres")):
        option = ("directConnection", "true") if parts.scheme.startswith("mongodb") else ("sslmode", "disable")
        parts = parts._replace(query=urlencode([*parse_qsl(parts.query), option]))
    return urlunsplit(parts)


@contextmanager
def proxied(url: str) -> Iterator[tuple[FaultProxy, str]]:
    """A started FaultProxy in front of ``url``'s loopback server, and ``url`` through it."""
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"{url!r} names no port")
    proxy = FaultProxy(port)
    proxy.start()
    try:
        yield proxy, through(url, proxy)
    finally:
        proxy.stop()


def wait_until(condition: Callable[[], Any], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it is true or ``timeout`` seconds pass; return whether it became true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())
