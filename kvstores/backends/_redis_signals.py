"""Redis signals: pub/sub on one connection per channel object; sharded pub/sub on a Cluster.

A channel ``name`` of a store with prefix P is the Redis channel ``{P'}signals:<name>`` (P' is
P with ``% { }`` escaped, so the hash tag is P' alone), ``{P'}signals@D:<name>`` on database D
other than 0 (pub/sub ignores the database: two stores with one prefix on two databases would
share their channels): on a Cluster every channel of a store
hashes to one slot, so SSUBSCRIBE needs one connection to one node, and SPUBLISH goes to that
node alone instead of every node. ``{P'}signals`` carries the heartbeat: the reader publishes
its own nonce there every HEARTBEAT seconds and redoes its connection when it has not heard it
back for three; a reconnection (redis-py's own silent one included, seen through its connect
callback) ends with a GAP once every channel is subscribed again.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from redis.asyncio import RedisCluster

from kvstores._signal_host import SignalHost, Sink, Transport
from kvstores.errors import StoreClosedError
from kvstores.loop import raise_if_cancelled
from kvstores.signals._transport import HEARTBEAT, Backoff

logger = logging.getLogger(__name__)

_TAG_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_READ_TIMEOUT: Final = 0.25  # one wait for a message: the loop checks its heartbeat between them
_CONFIRM_TIMEOUT: Final = 5.0  # listen() waits this long for the server's confirmation
_SUBSCRIBED = frozenset({"subscribe", "ssubscribe"})
_MESSAGES = frozenset({"message", "smessage"})


class RedisHost(SignalHost, Protocol):
    """What the Redis transport may ask of its store besides: a client to read pub/sub on."""

    def listener(self) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """A client of the store's server(s) for the pub/sub connection, and what lets it go."""
        ...


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisTransport(Transport[RedisHost]):
    """One pub/sub connection (a task reading it) for every subscriber of one channel object."""

    def __init__(self, store: RedisHost, sink: Sink, *, client: Any, gate: Any, prefix: str) -> None:
        """``gate``: the store's bound on connections in use, which publishes share."""
        super().__init__(store, sink)
        self._client = client
        self._gate = gate
        self._sharded = isinstance(self._client, RedisCluster)
        database = 0 if self._sharded else int(client.connection_pool.connection_kwargs.get("db") or 0)
        self._beat = "{" + prefix.translate(_TAG_ESCAPES) + "}signals" + (f"@{database}" if database else "")
        self._head = self._beat + ":"
        self._wanted: set[str] = set()  # Redis channels listened to (the heartbeat's aside)
        self._confirmed: set[str] = set()  # ... that the server has confirmed on this connection
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._pubsub: Any = None
        self._connections: list[Any] = []  # whose reconnections we watch
        self._lock = asyncio.Lock()  # one subscribe command at a time
        self._task: asyncio.Task[None] | None = None
        self._owe_gap = False
        self._nonce = secrets.token_hex(8)
        self._heard = 0.0

    async def listen(self, name: str) -> None:
        key = self._head + name
        self._wanted.add(key)
        if self._task is None or self._task.done():
            self._task = self.sink.spawn(self._run())
        if key in self._confirmed:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(waiter)
        try:
            async with self._lock:
                if self._pubsub is not None:
                    await self._subscribe(self._pubsub, key)
            async with asyncio.timeout(_CONFIRM_TIMEOUT):
                await waiter
        except (Exception, TimeoutError) as exc:  # the reader notices a broken connection and redoes it
            logger.debug("signals: subscribing to %r did not complete (%s); a GAP follows", name, exc)
            self._owe_gap = True
        finally:
            waiters = self._waiters.get(key, [])
            if waiter in waiters:
                waiters.remove(waiter)

    async def unlisten(self, name: str) -> None:
        key = self._head + name
        self._wanted.discard(key)
        self._confirmed.discard(key)
        async with self._lock:
            pubsub = self._pubsub
            if pubsub is not None:
                try:
                    await (pubsub.sunsubscribe(key) if self._sharded else pubsub.unsubscribe(key))
                except Exception as exc:  # the reconnection will not subscribe it again
                    logger.debug("signals: unsubscribing from %r failed: %s", name, exc)

    async def publish(self, name: str, message: str) -> None:
        await self._send(self._head + name, message)

    async def _send(self, key: str, message: str) -> None:
        with self.translated():
            async with self._gate:
                await (self._client.spublish(key, message) if self._sharded else self._client.publish(key, message))

    async def _subscribe(self, pubsub: Any, *keys: str) -> None:
        await (pubsub.ssubscribe(*keys) if self._sharded else pubsub.subscribe(*keys))

    # -- the reader ----------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = Backoff()
        while self.store_open:
            raise_if_cancelled()  # redis-py's wait_for swallowed it on 3.11: stop, never reconnect through it
            try:
                listener, release = self.live_store().listener()
            except StoreClosedError:
                return
            pubsub = listener.pubsub()
            try:
                if self._sharded:
                    await listener.initialize()  # the slots map that routes SSUBSCRIBE
                async with self._lock:
                    await self._subscribe(pubsub, self._beat, *self._wanted)
                    self._pubsub = pubsub
                self._watch(pubsub)
                self._heard = asyncio.get_running_loop().time()
                await self._read(pubsub, backoff)
            except Exception as exc:
                logger.warning("Redis signals: %s: %s; reconnecting", type(exc).__name__, exc)
            finally:
                self._pubsub = None
                self._confirmed.clear()
                self._owe_gap = True
                self._unwatch()
                try:
                    try:
                        await pubsub.aclose()
                    finally:  # even when that close failed or was cancelled: the own client holds sockets too
                        await release()
                except Exception as exc:
                    logger.debug("Redis signals: closing the pub/sub connection: %s", exc)
            await backoff.wait()

    async def _read(self, pubsub: Any, backoff: Backoff) -> None:
        loop = asyncio.get_running_loop()
        next_beat = 0.0
        while self.store_open:
            raise_if_cancelled()
            now = loop.time()
            if now >= next_beat:
                if now - self._heard > 3 * HEARTBEAT:
                    raise ConnectionError(f"no heartbeat for {now - self._heard:.1f} s")
                await self._send(self._beat, self._nonce)
                next_beat = now + HEARTBEAT
            if self._sharded:
                message = await pubsub.get_sharded_message(timeout=_READ_TIMEOUT)
            else:
                message = await pubsub.get_message(timeout=_READ_TIMEOUT)
            if message is not None:
                self._handle(message, backoff)

    def _handle(self, message: dict[str, Any], backoff: Backoff) -> None:
        kind = _text(message["type"])
        key = _text(message["channel"])
        if kind in _MESSAGES:
            data = _text(message["data"])
            if key == self._beat:
                if data == self._nonce:
                    self._heard = asyncio.get_running_loop().time()
            elif key.startswith(self._head):
                self.sink.deliver(key[len(self._head) :], data)
        elif kind in _SUBSCRIBED:
            backoff.reset()
            self._confirmed.add(key)
            for waiter in self._waiters.pop(key, []):
                if not waiter.done():
                    waiter.set_result(None)
            if self._owe_gap and self._beat in self._confirmed and self._wanted <= self._confirmed:
                self._owe_gap = False
                self.sink.gap()

    # -- redis-py's own reconnections --------------------------------------------------

    def _watch(self, pubsub: Any) -> None:
        """Hear of every reconnection redis-py makes behind our back (it resubscribes silently)."""
        nodes = getattr(pubsub, "node_pubsub_mapping", {})
        connections = [pubsub.connection, *(node.connection for node in nodes.values())]
        self._connections = [connection for connection in connections if connection is not None]
        for connection in self._connections:
            connection.register_connect_callback(self._reconnected)

    def _unwatch(self) -> None:
        for connection in self._connections:
            connection.deregister_connect_callback(self._reconnected)
        self._connections = []

    async def _reconnected(self, connection: Any) -> None:
        self._confirmed.clear()
        self._owe_gap = True
