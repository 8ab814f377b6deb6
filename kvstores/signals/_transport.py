"""The contract between a SignalChannel and its backend's transport."""

from __future__ import annotations

import abc
import asyncio
import hashlib
import weakref
from collections.abc import Coroutine
from typing import Any, Final

HEARTBEAT: Final = 1.0
"""Seconds between a connected transport's liveness checks; a link silent for 3 of them is redone."""

BACKOFF: Final = (0.05, 1.0)
"""First and longest wait between reconnection attempts."""


class Sink(abc.ABC):
    """What a transport calls: the channel object that owns it."""

    @abc.abstractmethod
    def deliver(self, name: str, message: str) -> None:
        """A message arrived on ``name``."""

    @abc.abstractmethod
    def gap(self) -> None:
        """Messages may have been lost, on any name."""

    @abc.abstractmethod
    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task that the channel cancels when it closes."""


class Transport(abc.ABC):
    """Moves messages between processes for one channel object.

    ``listen(name)`` returns once a message published on ``name`` afterwards will be delivered,
    or, when the backend is down, after arranging a ``sink.gap()`` for when it is back.
    Transports deliver from one task (or synchronously, in process) and never raise into it.
    """

    def __init__(self, store: Any, sink: Sink) -> None:
        self.sink = sink
        self._store = weakref.ref(store)

    @property
    def store_open(self) -> bool:
        """False once the store is closed or collected: a transport then stops reconnecting."""
        store = self._store()
        return store is not None and not store.closed

    @abc.abstractmethod
    async def listen(self, name: str) -> None:
        """Start receiving ``name``."""

    @abc.abstractmethod
    async def unlisten(self, name: str) -> None:
        """Stop receiving ``name``."""

    @abc.abstractmethod
    async def publish(self, name: str, message: str) -> None:
        """Send ``message`` on ``name`` to every process (this one included)."""

    async def aclose(self) -> None:  # noqa: B027 - optional: in-process transports hold nothing
        """Release connections (the channel has cancelled the tasks it spawned)."""


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
