"""One signal channel per store: small text messages between every process that shares a backend.

::

    signals = kvstores.signals.channel(store)        # the one SignalChannel of this store object
    await signals.publish("streams", "s1")            # reaches every subscriber of "streams", every replica
    async with await signals.subscribe("streams") as subscription:
        async for message in subscription:
            if message is GAP:
                ...                                   # messages may have been lost: catch up from the store
            else:
                ...                                   # a str, as published
    unsubscribe = await signals.listen("streams", on_message, on_gap)   # the callback form

A message is a str of at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes (no NUL: PostgreSQL's
NOTIFY cannot carry it) on a named channel (a non-empty str of at most :data:`MAX_NAME_BYTES`
UTF-8 bytes); neither may hold a lone surrogate (it has no UTF-8 form). Both are checked here,
once, the same for every backend: a bad one is a ValueError (a TypeError for a non-str) and
nothing is sent or subscribed. Channels of one store are isolated from every other store's
whatever isolates their data: the Redis database and prefix, the PostgreSQL database, schema
and table, the MariaDB/MySQL database and table, the MongoDB database and collection, the
SQLite file.

Delivery: once ``subscribe()``/``listen()`` has returned, every message published afterwards on
that name, by any process, is delivered, in the order each publisher published them, or a
:data:`GAP` tells the subscriber that some may have been lost. The transport drops messages
when its connection drops or the backend restarts, a subscriber falls behind its bounded
buffer, or a poll falls behind retention; each of these is detected (the driver's own signal,
a heartbeat every :data:`HEARTBEAT` seconds, an id that jumps) and turns into a GAP once the
transport is listening again, so a consumer never relies on the channel alone: it keeps its
truth in the store and catches up from it after a GAP. A message may also arrive after the
GAP that already covered it (consumers are idempotent). ``subscribe()`` never fails because
the backend is down: the GAP comes when it is back.

Transports, one per store object whatever the number of subscribers (kvstores.signals._<backend>):

- Redis: pub/sub on one connection; on a Cluster, sharded pub/sub (SPUBLISH/SSUBSCRIBE), every
  channel of a store in one hash slot (one connection to one node).
- PostgreSQL: LISTEN/NOTIFY on one dedicated connection (channel names are digests).
- SQLite: a table in the store's file, appended by publish and polled every 10-40 ms by one task.
- MongoDB: a sequenced collection with a TTL index, polled every 20-50 ms by one task.
- MariaDB/MySQL: a table beside the store's, polled every 20-50 ms by one task on the store's pool.
- memory (and ``sqlite://:memory:``): in-process fan-out.

Subscriber callbacks never raise into the channel (they are logged), buffers are bounded (a slow
iterator gets a GAP, never unbounded memory), and no transport holds a database lock while it
waits.

Ownership: the store owns its channel. ``channel(store)`` makes it on first use and hands it to
the store (``BaseStore._signal_channel``); the store's ``aclose()`` closes it, its subscriptions
ending and its transport's tasks and connections gone by the time ``aclose()`` returns. Nothing
else holds a channel: no registry, no watchdog. The channel and its transport hold the store
weakly (it never keeps its store alive; objects built on a store hold the store, DESIGN §9), so
a store nobody closed can be collected, or outlive its event loop:

- collected: a ``weakref.finalize`` on the store, made when the channel is first used, schedules
  the channel's ``aclose()`` on the channel's loop (from whatever thread the collector ran on);
  the transport's tasks stop by themselves too, as each of their loops checks that the store is
  still there and open;
- its loop ends (``asyncio.run`` returns, uvicorn shuts down): the loop cancels the transport's
  tasks, which let go of their connections, and finalizes the guard the channel left on it
  (:func:`kvstores.loop.release_with_loop`), which closes the channel; so a process that never
  closes its store exits at once and silently. The store, still open, makes a new channel on its
  next use, on whatever loop then runs.

``aclose()`` on the channel itself closes it at once and ends every subscription; the store then
makes a new one on the next ``channel(store)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from types import TracebackType
from typing import Any, Final

from kvstores._signal_host import SignalHost, Sink, Transport
from kvstores.base import BaseStore
from kvstores.errors import StoreClosedError
from kvstores.loop import release_with_loop
from kvstores.signals._transport import HEARTBEAT, NumberedPoll

__all__ = [
    "DEFAULT_BUFFER",
    "GAP",
    "HEARTBEAT",
    "MAX_MESSAGE_BYTES",
    "MAX_NAME_BYTES",
    "Gap",
    "NumberedPoll",
    "SignalChannel",
    "SignalHost",
    "Sink",
    "Subscription",
    "Transport",
    "channel",
]

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES: Final = 7_000
"""The largest message, in UTF-8 bytes (PostgreSQL's NOTIFY takes 8,000 with the channel's name)."""

MAX_NAME_BYTES: Final = 1_024
"""The longest channel name, in UTF-8 bytes (MariaDB/MySQL's signal table holds no more)."""

DEFAULT_BUFFER: Final = 1_000
"""Messages an iterator subscription holds before a slow reader gets a GAP instead."""


class Gap:
    """The type of :data:`GAP`."""

    _instance: Gap | None = None

    def __new__(cls) -> Gap:
        """The one GAP."""
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "GAP"


GAP: Final = Gap()
"""Yielded by a subscription (and reported to ``on_gap``) when messages may have been lost."""


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} cannot hold a lone surrogate (it has no UTF-8 form)") from None


def _check_message(message: str) -> None:
    if not isinstance(message, str):
        raise TypeError(f"a signal message is a str, not {type(message).__name__}")
    if "\x00" in message:
        raise ValueError("a signal message cannot contain NUL")
    if _utf8_size(message, "a signal message") > MAX_MESSAGE_BYTES:
        raise ValueError(f"a signal message holds at most {MAX_MESSAGE_BYTES} UTF-8 bytes")


def _check_name(name: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"a signal channel's name is a str, not {type(name).__name__}")
    if not name or "\x00" in name or _utf8_size(name, "a signal channel's name") > MAX_NAME_BYTES:
        raise ValueError(f"a signal channel's name is a non-empty str of at most {MAX_NAME_BYTES} UTF-8 bytes, no NUL")


class _Callbacks:
    """A ``listen()`` receiver: runs the caller's callbacks, never letting them raise into the channel."""

    def __init__(self, on_message: Callable[[str], None], on_gap: Callable[[], None] | None) -> None:
        self.on_message = on_message
        self.on_gap = on_gap

    def message(self, message: str) -> None:
        try:
            self.on_message(message)
        except Exception:
            logger.exception("a signal callback raised; the channel carries on")

    def gap(self) -> None:
        if self.on_gap is not None:
            try:
                self.on_gap()
            except Exception:
                logger.exception("a signal gap callback raised; the channel carries on")

    def end(self) -> None:
        """The channel closed: nothing more will come."""


class Subscription:
    """Messages of one channel name as an async iterator of ``str`` and :data:`GAP`; async-closable."""

    def __init__(self, signals: SignalChannel, name: str, buffer: int) -> None:
        if buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {buffer}")
        self.name = name
        self._signals = signals
        self._buffer = buffer
        self._items: deque[str | Gap] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False

    def message(self, message: str) -> None:
        if len(self._items) >= self._buffer:  # a slow reader: forget the backlog, it catches up instead
            self._items.clear()
            self._items.append(GAP)
        else:
            self._items.append(message)
        self._wake()

    def gap(self) -> None:
        if not self._items or self._items[-1] is not GAP:
            self._items.append(GAP)
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> str | Gap:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def pending(self) -> int:
        """How many items wait to be read."""
        return len(self._items)

    async def aclose(self) -> None:
        """Stop receiving; the iteration ends after the items already received."""
        self.close()

    def close(self) -> None:
        """The same as ``aclose()``, from synchronous code."""
        if not self._ended:
            self._signals._remove(self.name, self)
            self.end()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


_Receiver = _Callbacks | Subscription


class SignalChannel(Sink):
    """Named channels of small text messages shared by every store object on one backend namespace.

    Get the one of a store with :func:`channel`: the store owns it and closes it. ``publish``,
    ``subscribe`` and ``listen`` are the whole API; the transport (one per channel object) is made
    by the store (``_signal_transport``); each backend's lives beside it (``kvstores/backends/_<name>_signals.py``),
    on the base classes of :mod:`kvstores.signals._transport`.
    """

    def __init__(self, store: Any) -> None:
        """The channel of ``store`` (TypeError when its backend has no transport); see :func:`channel`."""
        factory = getattr(type(store), "_signal_transport", None)  # the class's: a forwarding wrapper has none
        transport = None if factory is None else factory(store, self)
        if transport is None:
            raise TypeError(f"no signal transport for {type(store).__name__}: its backend declares none")
        self._store = weakref.ref(store)
        self._receivers: dict[str, dict[_Receiver, None]] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loop_guard: AsyncGenerator[None, None] | None = None
        self._orphaned: weakref.finalize[Any, Any] | None = None  # closes the channel once the store is collected
        self.transport: Transport[Any] = transport

    @property
    def closed(self) -> bool:
        """True once the channel, or its store, is closed."""
        store = self._store()
        return self._closed or store is None or bool(getattr(store, "closed", False))

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosedError("the signal channel's store is closed")

    async def publish(self, name: str, message: str) -> None:
        """Send ``message`` to every subscriber of ``name`` in every process (this one included).

        Raises StoreConnectionError when the backend cannot be reached (the message is then lost).
        """
        self._check_open()
        _check_name(name)
        _check_message(message)
        await self._close_unowned()
        await self.transport.publish(name, message)

    async def _close_unowned(self) -> None:
        """On first use: close as the event loop shuts down, or once the store is collected, if its
        owner never closed it (the process can then exit at once; see the module's docstring)."""
        if self._orphaned is None:
            store = self._store()
            if store is not None:
                loop = asyncio.get_running_loop()
                self._orphaned = weakref.finalize(store, _close_orphan, loop, self)
                self._orphaned.atexit = False  # at exit the loop's end has closed it, or no loop runs it
        if self._loop_guard is None:
            self._loop_guard = await release_with_loop(self._close_at_loop_end)

    async def _close_at_loop_end(self) -> None:
        self._loop_guard = None  # the guard is running this: aclose() must not close it again
        await self.aclose()

    async def subscribe(self, name: str, *, buffer: int = DEFAULT_BUFFER) -> Subscription:
        """An async iterator of the messages published on ``name`` from now on (and GAPs)."""
        _check_name(name)
        subscription = Subscription(self, name, buffer)
        await self._add(name, subscription)
        return subscription

    async def listen(
        self, name: str, on_message: Callable[[str], None], on_gap: Callable[[], None] | None = None
    ) -> Callable[[], None]:
        """Call ``on_message(message)`` for each message on ``name`` from now on, ``on_gap()`` for each GAP.

        Callbacks run on the event loop and must not block; one that raises is logged. Returns an
        idempotent unsubscribe callable.
        """
        _check_name(name)
        receiver = _Callbacks(on_message, on_gap)
        await self._add(name, receiver)
        return lambda: self._remove(name, receiver)

    async def aclose(self) -> None:
        """End every subscription and release the transport's connections and tasks; closing twice is fine."""
        if self._closed:
            return
        self._closed = True
        if self._orphaned is not None:
            self._orphaned.detach()
        guard, self._loop_guard = self._loop_guard, None
        if guard is not None:
            await guard.aclose()  # runs _close_at_loop_end, whose aclose() returns at once
        for receivers in self._receivers.values():
            for receiver in receivers:
                receiver.end()
        self._receivers.clear()
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.transport.aclose()

    async def __aenter__(self) -> SignalChannel:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- receivers ---------------------------------------------------------------------

    async def _add(self, name: str, receiver: _Receiver) -> None:
        self._check_open()
        await self._close_unowned()
        async with self._lock:
            receivers = self._receivers.setdefault(name, {})
            receivers[receiver] = None
            if len(receivers) == 1:
                try:
                    await self.transport.listen(name)
                except BaseException:
                    receivers.pop(receiver, None)
                    raise

    def _remove(self, name: str, receiver: _Receiver) -> None:
        receivers = self._receivers.get(name)
        if receivers is None or receivers.pop(receiver, False) is False:
            return
        if not receivers and not self._closed:
            self._spawn(self._forget(name))

    async def _forget(self, name: str) -> None:
        async with self._lock:
            if name in self._receivers and not self._receivers[name]:
                del self._receivers[name]
                await self.transport.unlisten(name)

    # -- Sink: what the transport calls --------------------------------------------------

    def deliver(self, name: str, message: str) -> None:
        """Hand ``message`` to the receivers of ``name``."""
        for receiver in list(self._receivers.get(name, ())):
            receiver.message(message)

    def gap(self) -> None:
        """Tell every receiver that messages may have been lost."""
        for receivers in list(self._receivers.values()):
            for receiver in list(receivers):
                receiver.gap()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task that ``aclose()`` cancels."""
        return self._spawn(coroutine)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        if self._closed:  # a call that began before aclose() spawns nothing that outlives the channel
            task.cancel()
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _orphan(self) -> None:
        """Its store was collected with the channel open: close the channel (on its loop)."""
        if not self._closed:
            self._spawn(self._close_orphaned())

    async def _close_orphaned(self) -> None:
        try:
            await self.aclose()
        except Exception:
            logger.exception("closing the signal channel of a collected store failed")


def _close_orphan(loop: asyncio.AbstractEventLoop, signals: SignalChannel) -> None:
    """The finalizer of a store whose channel is open: close the channel on its loop (from any thread)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: its end closed the channel
        loop.call_soon_threadsafe(signals._orphan)


def channel(store: Any) -> SignalChannel:
    """The signal channel of ``store``, the store's own: made on first use, closed by the store's ``aclose()``.

    One per store object while it lasts; a new one once it was closed (by itself, or at the end of
    its event loop) while the store stays open. TypeError for a store whose backend has no transport.
    """
    if not isinstance(store, BaseStore):
        raise TypeError(f"no signal transport for {type(store).__name__}: its backend declares none")
    own = store._signal_channel
    if isinstance(own, SignalChannel) and not own._closed:
        return own
    made = SignalChannel(store)
    if not store.closed:  # a closed store's channel is closed at once, and nobody need close it
        store._signal_channel = made
    return made
