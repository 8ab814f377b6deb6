"""Opportunistic batching: concurrent single-key calls ride together in one bulk call.

A :class:`Coalescer` serves one kind of call (get or put) of one store. When no call of its
kind is in flight, a call goes out at once, alone, in its caller's task: a lone caller pays
nothing (no timer, no sleep, no extra task). Calls that arrive while one is in flight wait in
a FIFO queue until the event loop has run everything ready (one ``call_soon``), so that every
call made in that turn of the loop is queued by then; the queue then goes out as one bulk call
(up to ``max_items`` calls and ``max_bytes`` of payload) beside the call in flight if the store
has a second connection (``capacity``), or else when that call lands. One bulk call flies at a
time: calls that arrive meanwhile ride the next. So a burst of up to ``max_items`` + 1 calls costs
one round trip, as with batching off (one call alone, the rest together, side by side),
and under load each round trip carries every call that arrived during the previous one; with
one caller nothing changes.

Calls with the same ``key`` (puts of one key) never fly at once: a queued call whose key is
in flight waits for that flight to land, so calls on one key keep their order (in one batch,
the store makes the last queued write win).

Each call keeps its own result: the bulk call's results are handed back one per call, a
failure of the bulk call (a lost connection) fails every call of that batch with the same
error, and a cancelled caller only withdraws its own call. Validation and decoding happen
in the caller, outside the batch, so one bad input or undecodable value never fails another.

:meth:`Coalescer.close` is final: the calls still queued fail with the error it is given, and
no batch starts afterwards (a batch already in flight completes or fails on its own).

The mixin :class:`Batching` gives :class:`kvstores.BaseStore` its two coalescers, one for gets
and one for puts, and the bulk calls they run on the backend's ``_get_pairs`` and ``_put_entries``.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import ClassVar, Generic, TypeVar

from kvstores import _telemetry
from kvstores._primitives import Entry, Stored
from kvstores._store_core import StoreCore

__all__ = ["Batching", "Coalescer"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Runs ``run_one`` for a lone call, ``run_batch`` for the calls that queued meanwhile.

    ``size`` measures an item for the ``max_bytes`` bound; ``key`` names what must keep its
    order (None: nothing); ``capacity`` is how many flights may be out at once, the store's
    connections (the default, one, makes a batch wait for the call in flight to land);
    ``on_batch`` hears each batch's size.
    """

    def __init__(
        self,
        run_one: Callable[[Item], Awaitable[Result]],
        run_batch: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]],
        *,
        size: Callable[[Item], int] = lambda item: 0,
        key: Callable[[Item], Hashable] | None = None,
        capacity: Callable[[], int] = lambda: 1,
        max_items: int = 1_000,
        max_bytes: int = 8 * 1024 * 1024,
        on_batch: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._run_one = run_one
        self._run_batch = run_batch
        self._size = size
        self._key = key
        self._capacity = capacity
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._on_batch = on_batch
        self._flights = 0
        self._flying: Counter[Hashable] = Counter()  # keys in flight (with ``key``)
        self._flush_soon = False
        self._closed: Callable[[], BaseException] | None = None
        self._queue: deque[tuple[Item, asyncio.Future[Result]]] = deque()
        self._batch: asyncio.Task[None] | None = None  # the one batch in flight

    async def __call__(self, item: Item) -> Result:
        """The result of ``item``, run alone when nothing is in flight, else in the next batch."""
        if self._closed is not None:
            raise self._closed()
        loop = asyncio.get_running_loop()
        if self._flights or self._queue:
            future: asyncio.Future[Result] = loop.create_future()
            self._queue.append((item, future))
            if not self._flush_soon:
                self._flush_soon = True
                loop.call_soon(self._flush)
            return await future
        keys = self._take_off([item])
        try:
            return await self._run_one(item)
        finally:
            self._land(keys)

    def close(self, error: Callable[[], BaseException]) -> None:
        """Fail every queued call with ``error()`` and start no batch from now on."""
        self._closed = error
        while self._queue:
            _, future = self._queue.popleft()
            if not future.done():
                future.set_exception(error())

    def _take_off(self, items: Sequence[Item]) -> list[Hashable]:
        """Count a flight of ``items`` out; return the keys it holds."""
        self._flights += 1
        if self._key is None:
            return []
        keys = [self._key(item) for item in items]
        self._flying.update(keys)
        return keys

    def _land(self, keys: list[Hashable]) -> None:
        """A flight of ``keys`` landed: send what it held back."""
        self._flights -= 1
        if keys:
            self._flying.subtract(keys)
            for key in keys:
                if self._flying[key] <= 0:
                    del self._flying[key]
        if self._queue:
            self._flush()

    def _flush(self) -> None:
        """Send the next batch of the queue, unless one is in flight or the connections are taken."""
        self._flush_soon = False
        if self._batch is not None or not self._queue or self._closed is not None:
            return
        if self._flights >= max(1, self._capacity()):
            return
        batch = self._take()
        if batch:
            keys = self._take_off([item for item, _ in batch])
            self._batch = asyncio.get_running_loop().create_task(self._fly(batch, keys))

    async def _fly(self, batch: list[tuple[Item, asyncio.Future[Result]]], keys: list[Hashable]) -> None:
        self._on_batch(len(batch))
        try:
            results = await self._run_batch([item for item, _ in batch])
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        except BaseException:  # the batch itself was cancelled (loop shutdown): so is every call left
            for _, future in (*batch, *self._queue):
                future.cancel()
            self._queue.clear()
            raise
        else:
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
        finally:
            self._batch = None
            self._land(keys)

    def _take(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        """The next batch: queued calls still awaited whose key is not in flight, bounded in count and bytes."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        waiting: list[tuple[Item, asyncio.Future[Result]]] = []  # their key is in flight: they keep their place
        total = 0
        while self._queue and len(batch) < self._max_items:
            item, future = self._queue[0]
            if future.done():  # its caller was cancelled
                self._queue.popleft()
                continue
            if self._key is not None and self._key(item) in self._flying:
                waiting.append(self._queue.popleft())
                continue
            total += self._size(item)
            if batch and total > self._max_bytes:
                break
            batch.append(self._queue.popleft())
        self._queue.extendleft(reversed(waiting))
        return batch


def _entry_size(entry: Entry) -> int:
    return len(entry[2])


class Batching(StoreCore):
    """A store's two coalescers (gets and puts) and the bulk calls they run (see the module's docstring)."""

    batching_default: ClassVar[bool] = True
    """Whether the backend coalesces concurrent calls unless told otherwise."""

    _reads: Coalescer[tuple[str, str], Stored | None] | None = None  # gets, while batching is on
    _writes: Coalescer[Entry, None] | None = None  # puts

    def _stop_batching(self) -> None:
        """Fail the calls still queued for a batch, with StoreClosedError (``aclose()`` calls it)."""
        for coalescer in (self._reads, self._writes):
            if coalescer is not None:
                coalescer.close(self._closed_error)

    def _start_batching(self) -> None:
        """Make the coalescers through which ``get`` and ``put`` go (``aclose()`` closes them)."""
        system = self.db_system
        # a lone call runs the primitive's own coroutine: no frame of the coalescer's between
        self._reads = Coalescer(
            lambda pair: self._get(*pair),
            self._read_batch,
            capacity=lambda: self.connections,
            on_batch=lambda size: _telemetry.record_batch(system, "get", size),
        )
        self._writes = Coalescer(
            lambda entry: self._put(*entry),
            self._write_batch,
            size=_entry_size,
            key=lambda entry: entry[:2],  # puts of one (collection, key) keep their order
            capacity=lambda: self.connections,
            on_batch=lambda size: _telemetry.record_batch(system, "put", size),
        )

    async def _read_batch(self, pairs: Sequence[tuple[str, str]]) -> list[Stored | None]:
        """The stored texts of a batch of gets: each distinct (collection, key) pair read once."""
        distinct = list(dict.fromkeys(pairs))
        found = dict(zip(distinct, await self._get_pairs(distinct)))
        return [found[pair] for pair in pairs]

    async def _write_batch(self, entries: Sequence[Entry]) -> list[None]:
        """Write a batch of puts: of several puts of one key, the last queued wins, whatever its TTL."""
        latest = {(collection, key): (collection, key, text, ttl) for collection, key, text, ttl in entries}
        await self._put_entries(list(latest.values()))
        return [None] * len(entries)
