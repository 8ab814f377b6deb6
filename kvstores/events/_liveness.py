"""A live event store's lease while it runs requests, and how it gives up the requests it may no longer answer.

The lease is a presence lease (:mod:`kvstores._lease`: its docstring describes the mechanism):
``"replica:<id>"`` in the event store's collection, put with a :data:`LEASE_TTL` TTL at once
and then every :data:`LEASE_REFRESH` seconds while this process has request streams without
a final response (one per process, whatever the number of streams); each entry the process
writes names its replica, so a follower knows whose lease to read.

The runner's side of one final answer per request: a process whose lease may have lapsed (no
renewal returned for :data:`LEASE_TTL` seconds: a freeze, a stall, a failing store) gives up
every request it runs before it stores anything more for them: it records each one's end
itself (:mod:`kvstores.events._ring`: at the first event whose put had not returned in time, so
that an event held in a frozen write transaction does not count), refuses their later events
(logged, not written, not served from memory) and calls each request's ``on_fence`` (under
:mod:`kvstores.sessions`, the request is cancelled as by the client's
``notifications/cancelled``). Each lease renewal also reads the end records of the requests
it runs (one ``get_many``), so a runner learns within :data:`LEASE_REFRESH` of an end recorded
elsewhere. Writing an event stays one ``put``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from kvstores._lease import PresenceLease, RenewalFailed, keep
from kvstores.events._handover import Streams
from kvstores.events._ring import STOPPED_MESSAGE, EventRecord, Ring, presence_key, request_id_of

LEASE_TTL = 3.0
"""Seconds a live :class:`StoreEventStore`'s lease outlives its last refresh: how long a dead runner looks alive."""

LEASE_REFRESH = 1.0
"""Seconds between two refreshes of that lease while the process runs requests."""

logger = logging.getLogger("kvstores.events")


class Liveness:
    """This process's lease while it runs requests, and the requests it gave up (their later events refused)."""

    def __init__(
        self, ring: Ring, streams: Streams, replica: str, keep_only: Callable[[Collection[str]], None]
    ) -> None:
        """``keep_only(tokens)``: what else forgets the streams evicted from memory, at each renewal."""
        self._ring = ring
        self._streams = streams
        self.replica = replica
        self._keep_only = keep_only
        self.lease = PresenceLease(
            ring.store, presence_key(replica), {"replica": replica}, LEASE_TTL, collection=ring.collection
        )
        self.open: set[str] = set()  # tokens of request streams appended here that have no final response yet
        self.fenced: set[str] = set()  # tokens of request streams given up here: later events are refused
        self._on_fence: dict[str, Callable[[], Awaitable[None]]] = {}  # token -> what cancels its request here
        self.renewing: asyncio.Task[None] | None = None
        self._settling: set[asyncio.Task[None]] = set()  # end records being written for streams given up

    def run(self, token: str, on_fence: Callable[[], Awaitable[None]] | None, *, request: bool, now: float) -> None:
        """An event of the stream ``token`` is about to be stored; ``request``: it awaits a final response."""
        if on_fence is not None:
            self._on_fence[token] = on_fence
        if request:
            if not self.open:
                self.lease.start()  # a new lease: its first put is on its way
            self.open.add(token)
            self.hold()

    def answered(self, token: str) -> None:
        """The stream ``token``'s final response is stored: its request no longer needs the lease."""
        self.open.discard(token)
        self._on_fence.pop(token, None)

    def hold(self) -> None:
        """Hold the lease in the background while requests run here (once: a running renewal goes on)."""
        if self.renewing is None or self.renewing.done():
            self.renewing = asyncio.get_running_loop().create_task(
                keep(self._renew, self.lease.length, name=self.lease.key, every=LEASE_REFRESH, at_once=True)
            )

    def check(self, now: float, floors: dict[str, int]) -> None:
        """Give up every request run here when this process's lease may have lapsed (a freeze, a failing store).

        ``floors`` names, per stream, the first event that may have been stored too late to count.
        """
        if self.open and self.lease.lapsed(now):
            logger.warning(
                "event store's lease lapsed (the process stalled, or the store failed): giving up %d request(s);"
                " their later events are refused",
                len(self.open),
            )
            self._give_up(list(self.open), floors)

    async def _renew(self) -> bool:
        """Renew the lease while requests run here, and give up those whose end another process recorded (two
        round trips, whatever the number of streams). False once none runs: the lease is let go."""
        by_token = self._streams.by_token
        self.open.intersection_update(by_token)  # streams evicted from memory are not run here
        self.fenced.intersection_update(by_token)
        self._keep_only(by_token.keys())
        for evicted in self._on_fence.keys() - by_token.keys():
            del self._on_fence[evicted]
        self.check(time.monotonic(), {})
        if not self.open:
            return False
        tokens = list(self.open)
        try:
            with self._ring.deadline():
                await self.lease.renew()
            ended = await self._ring.ended_streams(tokens)
        except Exception as exc:
            self._ring.failed("renew its lease", exc)
            raise RenewalFailed(f"event store lease {self.lease.key}") from exc
        self._ring.answered()
        ended = [token for token in ended if token in self.open]
        if ended:
            logger.warning("event store: %d request(s) run here were ended elsewhere; cancelling", len(ended))
            self._give_up(ended, None)
        return True

    def _give_up(self, tokens: list[str], floors: dict[str, int] | None) -> None:
        """Refuse every later event of these request streams and cancel their requests here; with ``floors``,
        also record each one's end (unless a follower recorded it first) at its first event not surely stored."""
        for token in tokens:
            self.open.discard(token)
            self.fenced.add(token)
            stream = self._streams.by_token.get(token)
            if floors is not None and stream is not None:
                seq = floors.get(token, min(stream.in_flight, default=stream.next_seq))
                request_id = stream.request_id
                if request_id is None:
                    request_id = request_id_of(stream.stream_id)
                end = EventRecord.end(seq, stream.stream_id, request_id, STOPPED_MESSAGE, self.replica)
                self._spawn(self._ring.record_end(token, end, self._ring.timeout))
            cancel = self._on_fence.pop(token, None)
            if cancel is not None:
                self._spawn(cancel())

    def _spawn(self, work: Awaitable[Any]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                logger.exception("event store: giving up a request failed")

        task = asyncio.get_running_loop().create_task(run())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
