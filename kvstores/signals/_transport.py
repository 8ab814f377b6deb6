"""What transports share: their constants, channel-name digests, backoff, and the numbered poll.

The contract itself (:class:`Sink`, :class:`Transport`, what a transport may ask of its store)
is :mod:`kvstores._signal_host`'s, which imports no store: a transport imports it and this
module, never its backend's.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import logging
from typing import Final

from kvstores._signal_host import HostT, SignalHost, Sink, Transport
from kvstores.loop import raise_if_cancelled

__all__ = ["BACKOFF", "HEARTBEAT", "HOLE_WAIT", "Backoff", "NumberedPoll", "SignalHost", "Sink", "Transport", "digest"]

HEARTBEAT: Final = 1.0
"""Seconds between a connected transport's liveness checks; a link silent for 3 of them is redone."""

BACKOFF: Final = (0.05, 1.0)
"""First and longest wait between reconnection attempts."""

HOLE_WAIT: Final = 1.0
"""Seconds a :class:`NumberedPoll` waits for a missing number before it reports a GAP."""

logger = logging.getLogger("kvstores.signals")


def digest(*parts: str) -> str:
    """A hex digest of ``parts`` (joined unambiguously): a fixed-size name for a channel."""
    hasher = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        hasher.update(len(data).to_bytes(8, "big") + data)
    return hasher.hexdigest()


class Backoff:
    """Waits that double from BACKOFF[0] to BACKOFF[1] between failed attempts; reset on success."""

    def __init__(self) -> None:
        self.delay = BACKOFF[0]

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, BACKOFF[1])

    def reset(self) -> None:
        self.delay = BACKOFF[0]


class NumberedPoll(Transport[HostT]):
    """A transport whose messages are numbered rows, read in order by one polling task.

    For backends with no push (MongoDB, MariaDB/MySQL): a subclass stores each message under
    the next number and reads those after a number (:meth:`_since`). Numbers are handed out
    before the row is visible, so a hole can be a publisher still inserting: the poller waits
    for it up to :data:`HOLE_WAIT` seconds, keeping order, then reports a GAP and moves on (the
    publisher died in between, or the poller fell behind the retention). It polls every
    ``intervals[0]`` seconds after traffic, backing off to ``intervals[1]`` when idle.
    """

    intervals: tuple[float, float] = (0.02, 0.05)

    def __init__(self, store: HostT, sink: Sink) -> None:
        super().__init__(store, sink)
        self._names: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._last: int | None = 0  # None: not known yet (the backend was down at the first listen)

    @abc.abstractmethod
    async def _latest(self) -> int:
        """The number of the last message published so far (0 for none)."""

    @abc.abstractmethod
    async def _since(self, number: int) -> list[tuple[int, str, str]]:
        """(number, channel name, message) of the messages numbered above ``number``, in order, a batch of them."""

    async def listen(self, name: str) -> None:
        self._names.add(name)
        if self._task is None:
            try:
                self._last = await self._latest()
            except Exception as exc:  # down: the poller starts from the latest once it is back, with a GAP
                logger.debug("%s: %s: %s; a GAP follows when it is back", type(self).__name__, type(exc).__name__, exc)
                self._last = None
            self._task = self.sink.spawn(self._poll())

    async def unlisten(self, name: str) -> None:
        self._names.discard(name)

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        interval = self.intervals[0]
        hole_since: float | None = None
        while self.store_open:
            raise_if_cancelled()  # one that the driver swallowed on 3.11 (asyncmy's connect): stop polling
            try:
                if self._last is None:
                    self._last = await self._latest()
                    self.sink.gap()  # what was published while the backend was down is not here
                rows = await self._since(self._last)
            except Exception as exc:
                logger.warning("%s: %s: %s; polling again", type(self).__name__, type(exc).__name__, exc)
                await backoff.wait()
                continue
            backoff.reset()
            interval = min(interval * 1.5, self.intervals[1])
            for number, name, message in rows:
                if number != self._last + 1:
                    now = loop.time()
                    hole_since = now if hole_since is None else hole_since
                    if now - hole_since < HOLE_WAIT:
                        break  # perhaps a publisher between its number and its insert: wait for it
                    self.sink.gap()
                hole_since = None
                interval = self.intervals[0]
                self._last = number
                if name in self._names:
                    self.sink.deliver(name, message)
            await asyncio.sleep(interval)
