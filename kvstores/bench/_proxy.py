"""A latency-adding TCP proxy on loopback, for the batching-through-latency rows.

:class:`LatencyProxy` listens on a free 127.0.0.1 port and relays every connection to one
upstream ``host:port``, delivering each chunk ``delay`` seconds after it arrived, in each
direction (a round trip gains twice the delay); order is kept and throughput is not limited,
as on a long but fast link. It runs an event loop in a thread of its own, so the benchmark's
loop being busy never holds back a delivery (beyond the GIL's switch interval).
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from kvstores.bench._backends import bench_backend, family

__all__ = ["LatencyProxy", "proxy_target", "through"]

_CHUNK = 65_536


def proxy_target(url: str) -> tuple[str, int] | str:
    """The ``(host, port)`` a proxy in front of ``url``'s server forwards to, or why there can be none.

    Only a URL of one of its backend's ``tcp_schemes`` (kvstores.bench._backends) names one server.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in bench_backend(family(url)).tcp_schemes:
        return f"{scheme}:// is not a plain TCP link to one server (cluster, sentinel, TLS, socket or in-process)"
    if "," in parts.netloc:
        return "the URL names several hosts"
    try:
        port = parts.port
    except ValueError:
        return "the URL's port is not a number"
    if parts.hostname is None or port is None:
        return "the URL names no host and port"
    return parts.hostname, port


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:port``, and its backend's ``direct_options``
    (else a driver may follow the address the server reports, past the proxy: pymongo does)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    query = urlencode([*parse_qsl(parts.query), *bench_backend(family(url)).direct_options.items()])
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class LatencyProxy:
    """A TCP relay from a free loopback port to ``host:port`` that delays every chunk by ``delay`` seconds."""

    def __init__(self, host: str, port: int, delay: float) -> None:
        self.upstream = (host, port)
        self.delay = delay
        self.port = 0
        """The port it listens on (once started)."""
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[Any]] = set()
        """One per accepted connection (asyncio's own: ended, never cancelled, by ending its pipes)."""
        self._pipes: set[asyncio.Future[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvbench-latency-proxy", daemon=True)

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        try:
            self.port = self._call(self._listen())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread.is_alive():
            with suppress(Exception):
                self._call(self._shut())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        if self._relays:
            await asyncio.wait(self._relays, timeout=5)

    async def _accept(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await self._relay(client_reader, client)
        finally:
            self._relays.discard(task)
            client.close()

    async def _relay(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        try:
            server_reader, server = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 10)
        except (TimeoutError, OSError):
            return
        up: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        down: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        pipes = [
            asyncio.ensure_future(self._read(client_reader, up)),
            asyncio.ensure_future(self._read(server_reader, down)),
            asyncio.ensure_future(self._write(server, up)),
            asyncio.ensure_future(self._write(client, down)),
        ]
        self._pipes.update(pipes)
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        # one side ended (EOF, error or the proxy's shutdown): end the whole connection, as a TCP relay does
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes.difference_update(pipes)
        server.close()

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        with suppress(OSError):
            while data := await reader.read(_CHUNK):
                queue.put_nowait((time.monotonic() + self.delay, data))
        await queue.join()  # what arrived before the EOF is still delivered, late

    async def _write(self, writer: asyncio.StreamWriter, queue: asyncio.Queue[tuple[float, bytes]]) -> None:
        with suppress(OSError):
            while True:
                due, data = await queue.get()
                if (pause := due - time.monotonic()) > 0:
                    await asyncio.sleep(pause)
                writer.write(data)
                await writer.drain()
                queue.task_done()
