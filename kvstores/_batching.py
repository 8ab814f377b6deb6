"""Opportunistic batching: concurrent single-key calls ride together in one bulk call.

A :class:`Coalescer` serves one kind of call (get or put) of one store. When no call of its
kind is in flight, a call goes out at once, alone, in its caller's task: a lone caller pays
nothing (no timer, no sleep, no extra task). Calls that arrive while one is in flight wait in
a FIFO queue; when the flight lands, one task takes the queue (up to ``max_items`` calls and
``max_bytes`` of payload) and runs it as a single bulk call, then the next batch, until the
queue is empty. So under load each round trip carries every call that arrived during the
previous one, and with one caller nothing changes.

Each call keeps its own result: the bulk call's results are handed back one per call, a
failure of the bulk call (a lost connection) fails every call of that batch with the same
error, and a cancelled caller only withdraws its own call. Validation and decoding happen
in the caller, outside the batch, so one bad input or undecodable value never fails another.

:meth:`Coalescer.close` is final: the calls still queued fail with the error it is given, and
no batch starts afterwards (a batch already in flight completes or fails on its own).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Runs ``run_one`` for a lone call, ``run_batch`` for the calls that queued meanwhile.

    ``size`` measures an item for the ``max_bytes`` bound; ``on_batch`` hears each batch's size.
    """

    def __init__(
        self,
        run_one: Callable[[Item], Awaitable[Result]],
        run_batch: Callable[[Sequence[Item]], Awaitable[Sequence[Result]]],
        *,
        size: Callable[[Item], int] = lambda item: 0,
        max_items: int = 1_000,
        max_bytes: int = 8 * 1024 * 1024,
        on_batch: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._run_one = run_one
        self._run_batch = run_batch
        self._size = size
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._on_batch = on_batch
        self._busy = False
        self._closed: Callable[[], BaseException] | None = None
        self._queue: deque[tuple[Item, asyncio.Future[Result]]] = deque()
        self._flusher: asyncio.Task[None] | None = None

    async def __call__(self, item: Item) -> Result:
        """The result of ``item``, run alone when nothing is in flight, else in the next batch."""
        if self._closed is not None:
            raise self._closed()
        if self._busy:
            future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
            self._queue.append((item, future))
            return await future
        self._busy = True
        try:
            return await self._run_one(item)
        finally:
            self._hand_over()

    def close(self, error: Callable[[], BaseException]) -> None:
        """Fail every queued call with ``error()`` and start no batch from now on."""
        self._closed = error
        while self._queue:
            _, future = self._queue.popleft()
            if not future.done():
                future.set_exception(error())

    def _hand_over(self) -> None:
        """The flight landed: start a task that runs what queued meanwhile, or go idle."""
        if self._queue and self._closed is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        else:
            self._busy = False

    async def _flush(self) -> None:
        try:
            while self._queue and self._closed is None:
                batch = self._take()
                if not batch:
                    continue
                self._on_batch(len(batch))
                try:
                    results = await self._run_batch([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                else:
                    for (_, future), result in zip(batch, results):
                        if not future.done():
                            future.set_result(result)
        finally:
            self._busy = False
            self._flusher = None
            for _, future in self._queue:  # only if the flush itself was cancelled (loop shutdown)
                future.cancel()
            self._queue.clear()

    def _take(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        """The next batch: queued calls still awaited, bounded in count and bytes (at least one)."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        total = 0
        while self._queue and len(batch) < self._max_items:
            item, future = self._queue[0]
            if future.done():  # its caller was cancelled
                self._queue.popleft()
                continue
            total += self._size(item)
            if batch and total > self._max_bytes:
                break
            batch.append(self._queue.popleft())
        return batch
