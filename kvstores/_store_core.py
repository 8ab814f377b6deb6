"""A store's life and its guards: open until ``aclose()``, released with the loop, traced once OpenTelemetry is on.

A backend that opens a connection bound to the event loop (a thread, a pool) calls
:meth:`StoreCore._release_with_loop` once it has; if nobody closes the store, the connection
is then released as the loop shuts down (``asyncio.run``'s end, uvicorn's shutdown), so the
process exits at once and silently, and the store reconnects on a later loop. ``aclose()`` is
final: queued calls fail with StoreClosedError, a backend's open path checks
:meth:`StoreCore._check_open` under its opening lock, so nothing reopens.

:class:`StoreCore` is what the capability mixins of :class:`kvstores.BaseStore` build on
(:mod:`kvstores._atomic`, :mod:`kvstores._encryption`, :mod:`kvstores._batching`): the
backend's primitives, this life cycle, and the value hooks they share (``_encoded``,
``_sealed``, ``_decoded``: :class:`kvstores._encryption.Encryption` implements them).
"""

from __future__ import annotations

import abc
import functools
import warnings
from collections.abc import AsyncGenerator, Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from kvstores import _telemetry
from kvstores._codec import check_collection
from kvstores._primitives import Stored, StorePrimitives
from kvstores.loop import release_with_loop

if TYPE_CHECKING:
    from kvstores._sealing import Sealer
    from kvstores._signal_host import OwnedChannel

__all__ = ["StoreCore"]


@functools.cache
def _observed(cls: type) -> tuple[str, ...]:
    """The names of the public methods a traced store of ``cls`` wraps (those marked by ``observed``)."""
    return tuple(
        dict.fromkeys(
            name for base in cls.__mro__ for name, method in vars(base).items() if hasattr(method, _telemetry.SHAPE)
        )
    )


class StoreCore(StorePrimitives):
    """The primitives, the store's life cycle and guards, and the value hooks every capability uses."""

    _telemetry_decided = False
    _loop_guard: AsyncGenerator[None, None] | None = None
    _signal_channel: OwnedChannel | None = None  # made by kvstores.signals.channel(); the store's aclose() closes it
    _sealer: Sealer | None = None  # encryption keys (kvstores._encryption)

    @functools.cached_property
    def _observer(self) -> _telemetry.Observer:
        """Traces and measures this store's calls (made on first use, once OpenTelemetry is active)."""
        attributes: dict[str, Any] = {"db.system.name": self.db_system}
        try:
            server = self._server_address()
        except ValueError:  # a URL only its driver reads (several hosts): no single address to name
            server = None
        if server is not None:
            attributes["server.address"], attributes["server.port"] = server
        return _telemetry.Observer(attributes)

    async def __aenter__(self) -> Self:
        """Check the store is open and return it."""
        self._check_open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the store."""
        await self.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        """Warn, as aiosqlite and asyncio transports do, when a store holding a connection is never closed."""
        try:
            unclosed = not self._closed and self._holds_connection()
        except AttributeError:  # __init__ raised before the store was complete: nothing to release
            return
        if unclosed:
            _warn(f"unclosed {type(self).__name__}: close it with aclose() or async with", ResourceWarning, source=self)

    async def aclose(self) -> None:
        """Release the store's resources; closing twice is fine, using it afterwards is not.

        Calls still queued for a batch fail with StoreClosedError; a call already in flight
        completes or fails; nothing reconnects afterwards.
        """
        if self._closed:
            return
        self._closed = True  # first: a transport's reader stops even where a cancellation was swallowed
        channel, self._signal_channel = self._signal_channel, None
        if channel is not None:  # its reader and tasks end now, on this loop, before the connections go
            await channel.aclose()
        self._stop_batching()
        guard, self._loop_guard = self._loop_guard, None
        if guard is not None:
            await guard.aclose()
        await self._close()

    def _stop_batching(self) -> None:
        """Fail the calls still queued for a batch (kvstores._batching), with StoreClosedError."""

    async def close(self) -> None:
        """The same as ``aclose()``: py-key-value's stores are closed with ``close()``."""
        await self.aclose()

    @property
    def closed(self) -> bool:
        """True once ``aclose()`` has been called."""
        return self._closed

    async def _release_with_loop(self) -> None:
        """Have the running event loop release this store's connection as it shuts down.

        A backend calls this when it has opened a connection bound to the running loop. Once
        per loop: a store used again on a later loop reconnects and calls it again.
        """
        self._loop_guard = await release_with_loop(self._release_unless_closed)

    async def _release_unless_closed(self) -> None:
        if not self._closed:  # aclose() releases, and finalizes the guard
            await self._close()

    def _check_open(self) -> None:
        """Raise StoreClosedError once the store is closed (backends call it before (re)connecting).

        Every call of the protocol passes here first. Whether a store's calls are traced
        (:mod:`kvstores._telemetry`) is decided once: when it is made, if an SDK is installed by
        then, else at its first call, for the calls after it.
        """
        if self._closed:
            raise self._closed_error()
        if not self._telemetry_decided:
            self._telemetry_decided = True
            self._trace_if_active()

    def _collection(self, collection: str | None) -> str:
        """The validated name of ``collection`` (the default for None); raise if the store is closed."""
        if self._closed or not self._telemetry_decided:
            self._check_open()
        if collection is None:
            return self.default_collection
        check_collection(collection)
        return collection

    # -- telemetry -------------------------------------------------------------------------

    def _trace_if_active(self) -> None:
        """Bind traced versions of the protocol's methods on this store if an SDK is installed."""
        if _telemetry.active():
            self._telemetry_decided = True
            for name in _observed(type(self)):
                setattr(self, name, _telemetry.traced(self, getattr(type(self), name), lambda: self._observer))

    def trace_calls(self, on: bool = True) -> None:
        """Decide again whether this store's calls are traced (kvstores._telemetry).

        ``on``: traced from now on if an OpenTelemetry SDK is installed, as a store made after it
        is; otherwise back to the plain methods. A store decides by itself once, when it is made or
        at its first call; this is for a store already in use when an SDK comes or goes (the
        benchmark's with- and without-SDK rows, kvstores.bench._otel).
        """
        if on:
            self._trace_if_active()
        else:
            for name in _observed(type(self)):
                self.__dict__.pop(name, None)

    # -- values: what the capabilities share (kvstores._encryption.Encryption implements them) --

    @abc.abstractmethod
    def _encoded(self, value: Mapping[str, Any]) -> str:
        """``value`` validated and encoded as the backend keeps it: its JSON text."""
        raise NotImplementedError

    @abc.abstractmethod
    def _sealed(self, text: str, collection: str, key: str) -> str:
        """``text`` as the backend stores it: sealed when the store has encryption keys."""
        raise NotImplementedError

    @abc.abstractmethod
    def _decoded(self, stored: Stored, collection: str, key: str) -> dict[str, Any]:
        """The value of ``stored`` (opened first when sealed)."""
        raise NotImplementedError
