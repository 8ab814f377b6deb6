"""How live event stores on one store wake each other: signals name streams, the store stays the truth.

Both sides use the store's signal channel (:mod:`kvstores.signals`):

- **A follower** names the stream it follows on the channel ``"events.follow"``, in the
  background (it polls meanwhile), and wakes whenever the stream is named on :data:`SIGNALS`,
  and after a GAP there.
- **The runner** (the process that appends) listens to ``"events.follow"`` from its first
  append. Once it hears a stream it appends to, it names that stream on :data:`SIGNALS` at
  once (what was stored before it heard) and after each later event it stored; the message is
  the stream's token, publishes are coalesced and never awaited by ``store_event``. A stream
  nobody follows costs no signal; after a GAP on ``"events.follow"`` every request stream run
  here counts as followed, and a process that could not listen signals every stream.

A signal only wakes a reader: a lost one delays an event, never drops or repeats it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

import anyio

from kvstores.events._handover import Streams
from kvstores.protocol import AsyncKeyValue
from kvstores.signals import SignalChannel
from kvstores.signals import channel as signals_channel

SIGNALS = "events"
"""The signal channel (kvstores.signals) on which a live StoreEventStore names each followed stream it appended to."""

_FOLLOWS = "events.follow"
"""The signal channel on which a follower names the stream it follows, so that its runner signals that stream."""

logger = logging.getLogger("kvstores.events")


class Waiter:
    """One follow in progress: the event its stream's signals set."""

    __slots__ = ("wake",)

    def __init__(self) -> None:
        self.wake = anyio.Event()


class StreamSignals:
    """One event store's signals: which of its streams are followed and named, and which follows wait for one."""

    def __init__(self, store: AsyncKeyValue, streams: Streams, running: Callable[[], Collection[str]]) -> None:
        """``running()``: the tokens of the request streams run here that have no final response yet."""
        self.store = store
        self._streams = streams
        self._running = running
        self._no_channel = False
        self._lock = anyio.Lock()
        self.followed: set[str] = set()  # tokens of streams appended here that a follower named
        self._unsignalled: set[str] = set()  # tokens to name on the channel
        self._publisher: asyncio.Task[None] | None = None
        self._follows_heard: SignalChannel | None = None  # the channel this object hears followers on
        self._follows_unheard: SignalChannel | None = None  # a channel it could not listen on: signal all
        self._waiters: dict[str, set[Waiter]] = {}
        self._unlisten: Callable[[], None] | None = None

    def channel(self) -> SignalChannel | None:
        """The store's signal channel, or None when the store has none (a foreign store)."""
        if self._no_channel:
            return None
        try:
            return signals_channel(self.store)
        except TypeError:
            self._no_channel = True
            return None

    # -- the runner's side --------------------------------------------------------------

    async def hear_follows(self) -> None:
        """Listen (once per channel) for the streams followers name, before this process appends a first event."""
        signals = self.channel()
        if signals is None or signals is self._follows_heard or signals is self._follows_unheard:
            return
        async with self._lock:
            if signals is self._follows_heard or signals is self._follows_unheard:
                return
            try:
                await signals.listen(_FOLLOWS, self._followed_elsewhere, self._follows_lost)
            except Exception as exc:
                logger.debug("event store cannot hear followers (%r); it signals every stream", exc)
                self._follows_unheard = signals
            else:
                self._follows_heard = signals

    def signal(self, token: str) -> None:
        """Name ``token`` on the channel soon, if followed; several events stored meanwhile share one message."""
        signals = self.channel()
        if signals is None or (token not in self.followed and signals is not self._follows_unheard):
            return
        self._unsignalled.add(token)
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish())

    def keep_only(self, tokens: Collection[str]) -> None:
        """Forget the followed streams not among ``tokens`` (evicted from memory, or answered)."""
        self.followed.intersection_update(tokens)

    def _followed_elsewhere(self, token: str) -> None:
        """A follower named ``token``: if this process appends to it, signal it now and after each event."""
        if token in self._streams.by_token and token not in self.followed:
            self.followed.add(token)
            self.signal(token)  # what was stored before this was heard

    def _follows_lost(self) -> None:
        """Follows may have been named unheard: every request stream run here counts as followed."""
        for token in set(self._running()) - self.followed:
            self.followed.add(token)
            self.signal(token)

    async def _publish(self) -> None:
        while self._unsignalled and (signals := self.channel()) is not None:
            token = self._unsignalled.pop()
            try:
                await signals.publish(SIGNALS, token)
            except Exception as exc:
                logger.debug("event store could not signal a stream (%r); followers poll", exc)

    # -- the follower's side ------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """True once signals wake this store's follows (without them, follows poll faster)."""
        return self._unlisten is not None

    async def listen(self) -> None:
        """Start waking follows on this store's signals (once; without a channel, follows poll faster)."""
        if self._unlisten is not None or self._no_channel:
            return
        async with self._lock:
            signals = self.channel()
            if self._unlisten is None and signals is not None:
                try:
                    self._unlisten = await signals.listen(SIGNALS, self._wake, self._wake_all)
                except Exception as exc:
                    logger.debug("event store cannot listen to signals (%r); followers poll", exc)

    @contextmanager
    def waiting(self, token: str) -> Iterator[Waiter]:
        """A waiter that the signals naming ``token`` wake, for as long as the block runs."""
        waiter = Waiter()
        self._waiters.setdefault(token, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(token)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[token]

    def announce(self, token: str) -> None:
        """Name the stream ``token`` on the follows channel: its runner signals it from then on.

        In the background: the follower polls meanwhile, so a store whose write lock another (frozen) process
        holds delays the runner's signals, never the follow.
        """
        signals = self.channel()
        if signals is None:
            return

        async def announce(channel: SignalChannel) -> None:
            try:
                await channel.publish(_FOLLOWS, token)
            except Exception as exc:
                logger.debug("event store could not announce a follow (%r); the follower polls", exc)

        signals.spawn(announce(signals))

    def _wake(self, token: str) -> None:
        for waiter in self._waiters.get(token, ()):
            waiter.wake.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake.set()
