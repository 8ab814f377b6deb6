"""MongoDB signals: a sequenced collection beside the store's, polled by one task per channel object.

Layout, for a store in MongoDB collection C: ``C.signals`` holds one document per message,
``{_id: <sequence number>, c: <channel>, m: <message>, t: <date>}`` with a TTL index removing it
after RETENTION seconds, and ``C.signals_sequence`` the counter (``$inc``) that numbers them.
The poller reads ``_id > last`` every 20 ms after traffic, backing off to every 50 ms when idle.
Numbers are taken before the insert, so a hole can be a publisher still inserting: the poller
waits for it up to HOLE_WAIT seconds (keeping order), then reports a GAP and moves on (the
publisher died in between, or the poller fell behind the TTL). This works on any MongoDB,
standalone included (change streams need a replica set; they are a later optimisation).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Final

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from kvstores.backends.mongodb import _translated_error
from kvstores.base import translated
from kvstores.signals._transport import Backoff, Sink, Transport

logger = logging.getLogger(__name__)

RETENTION: Final = 300
"""Seconds a published document is kept (MongoDB's TTL monitor removes it within a minute after)."""

HOLE_WAIT: Final = 1.0
"""Seconds the poller waits for a missing sequence number before it reports a GAP."""

_POLL: Final = (0.02, 0.05)  # poll interval after traffic, and when idle
_BATCH: Final = 1_000
_COUNTER: Final = "signals"


class MongoDBTransport(Transport):
    """One polling task for every subscriber of one channel object."""

    def __init__(self, store: Any, sink: Sink) -> None:
        super().__init__(store, sink)
        entries = store._entries
        self._signals: Any = entries.database.get_collection(f"{entries.name}.signals")
        self._sequence: Any = entries.database.get_collection(f"{entries.name}.signals_sequence")
        self._names: set[str] = set()
        self._indexed = False
        self._task: asyncio.Task[None] | None = None
        self._last = 0

    async def _ready(self) -> None:
        if not self._indexed:
            with translated(_translated_error):
                await self._signals.create_index("t", expireAfterSeconds=RETENTION)
            self._indexed = True

    async def listen(self, name: str) -> None:
        self._names.add(name)
        if self._task is None:
            await self._ready()
            with translated(_translated_error):
                counter = await self._sequence.find_one({"_id": _COUNTER})
            self._last = 0 if counter is None else int(counter["n"])
            self._task = self.sink.spawn(self._poll())

    async def unlisten(self, name: str) -> None:
        self._names.discard(name)

    async def publish(self, name: str, message: str) -> None:
        await self._ready()
        with translated(_translated_error):
            number = await self._number()
            document = {"_id": number, "c": name, "m": message, "t": datetime.datetime.now(datetime.UTC)}
            await self._signals.insert_one(document)

    async def _number(self) -> int:
        for attempt in range(2):  # two first upserts at once: one of them loses, and runs again
            try:
                counter = await self._sequence.find_one_and_update(
                    {"_id": _COUNTER}, {"$inc": {"n": 1}}, upsert=True, return_document=ReturnDocument.AFTER
                )
                return int(counter["n"])
            except DuplicateKeyError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        interval = _POLL[0]
        hole_since: float | None = None
        while self.store_open:
            try:
                cursor = self._signals.find({"_id": {"$gt": self._last}}).sort("_id", 1).limit(_BATCH)
                documents = await cursor.to_list(_BATCH)
            except Exception as exc:
                logger.warning("MongoDB signals: %s: %s; polling again", type(exc).__name__, exc)
                await backoff.wait()
                continue
            backoff.reset()
            interval = min(interval * 1.5, _POLL[1])
            for document in documents:
                number = int(document["_id"])
                if number != self._last + 1:
                    now = loop.time()
                    hole_since = now if hole_since is None else hole_since
                    if now - hole_since < HOLE_WAIT:
                        break  # perhaps a publisher between its number and its insert: wait for it
                    self.sink.gap()
                hole_since = None
                interval = _POLL[0]
                self._last = number
                name = document.get("c")
                if name in self._names:
                    self.sink.deliver(str(name), str(document.get("m")))
            await asyncio.sleep(interval)
