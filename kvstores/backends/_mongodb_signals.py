"""MongoDB signals: a sequenced collection beside the store's, polled by one task per channel object.

Layout, for a store in MongoDB collection C: ``C.signals`` holds one document per message,
``{_id: <sequence number>, c: <channel>, m: <message>, t: <date>}`` with a TTL index removing it
after RETENTION seconds, and ``C.signals_sequence`` the counter (``$inc``) that numbers them.
The poller reads ``_id > last`` every 20 ms after traffic, backing off to every 50 ms when idle.
Numbers are taken before the insert, so a hole can be a publisher still inserting: the poller
(:class:`kvstores.signals._transport.NumberedPoll`) waits for it up to a second, keeping order,
then reports a GAP and moves on (the publisher died in between, or the poller fell behind the
TTL). This works on any MongoDB, standalone included (change streams need a replica set; they
are a later optimisation).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from kvstores._signal_host import SignalHost, Sink
from kvstores.errors import KVStoreError
from kvstores.signals._transport import NumberedPoll

logger = logging.getLogger(__name__)

RETENTION: Final = 300
"""Seconds a published document is kept (MongoDB's TTL monitor removes it within a minute after)."""

_BATCH: Final = 1_000
_COUNTER: Final = "signals"
_NUMBER_ATTEMPTS: Final = 5


class MongoDBTransport(NumberedPoll[SignalHost]):
    """One polling task for every subscriber of one channel object."""

    def __init__(self, store: SignalHost, sink: Sink, entries: Any) -> None:
        """``entries``: the store's collection, beside which the signals' live."""
        super().__init__(store, sink)
        self._signals: Any = entries.database.get_collection(f"{entries.name}.signals")
        self._sequence: Any = entries.database.get_collection(f"{entries.name}.signals_sequence")
        self._indexed = False

    async def _ready(self) -> None:
        if not self._indexed:
            with self.translated():
                await self._signals.create_index("t", expireAfterSeconds=RETENTION)
            self._indexed = True

    async def _latest(self) -> int:
        await self._ready()
        with self.translated():
            counter = await self._sequence.find_one({"_id": _COUNTER})
        return 0 if counter is None else int(counter["n"])

    async def _since(self, number: int) -> list[tuple[int, str, str]]:
        cursor = self._signals.find({"_id": {"$gt": number}}).sort("_id", 1).limit(_BATCH)
        return [(int(doc["_id"]), str(doc.get("c")), str(doc.get("m"))) for doc in await cursor.to_list(_BATCH)]

    async def publish(self, name: str, message: str) -> None:
        await self._ready()
        with self.translated():
            number = await self._number()
            document = {"_id": number, "c": name, "m": message, "t": datetime.datetime.now(datetime.UTC)}
            await self._signals.insert_one(document)

    async def _number(self) -> int:
        for attempt in range(_NUMBER_ATTEMPTS):
            # first upserts at once: all but one lose (DuplicateKeyError) and run again; a wire
            # server under that race may also answer with no document, which is retried alike
            try:
                counter = await self._sequence.find_one_and_update(
                    {"_id": _COUNTER}, {"$inc": {"n": 1}}, upsert=True, return_document=ReturnDocument.AFTER
                )
            except DuplicateKeyError:
                if attempt == _NUMBER_ATTEMPTS - 1:
                    raise
                continue
            if counter is not None:
                return int(counter["n"])
        raise KVStoreError("MongoDB signals: the sequence counter gave no number")
