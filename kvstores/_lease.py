"""Leases: one holder at a time, fenced, that survive the store's absence: of a stored record, or a presence.

The mechanism, written once. Record leases (background tasks use them; see :mod:`kvstores.tasks._engine`):

- **Where it lives.** A lease is a field of the record it guards, ``{holder, token, expires}``,
  beside the record's fencing counter. Every change to it is one ``AtomicStore.update`` of that
  record, so the lease and what it guards can never disagree.
- **Claim.** A record whose lease is absent, or lapsed *and confirmed lapsed* (below), is claimed
  by writing a new lease whose token is the counter plus one. Of concurrent claimers exactly one
  wins: the others' compare-and-set sees the new token and declines (``UNCHANGED``: no write).
- **Renew and fenced writes.** The holder renews every third of the lease's length, and every
  write it makes afterwards (renewal, progress, outcome, release) applies only while the record
  still carries its token. A holder that froze past its lease and woke after another claimed
  (a new token) can change nothing, however late it wakes: the token, not the clock, decides.
  A declined write writes nothing, so it never refreshes the record's TTL.
- **Renewal through an outage.** A renewal the store refused because it could not be reached is
  retried every :func:`retry_interval` seconds (at most a second), not every third of the lease,
  and a renewal is accepted whenever the token still matches, even after the wall-clock expiry:
  a holder that lived through an outage keeps its lease if nobody claimed it meanwhile.
- **Confirmed lapse.** Nobody can claim while the store is down, so a lapse seen right after an
  outage says nothing about the holder. A claimer therefore claims a lapsed lease only when it
  has seen *the same* lapsed lease (same token, same expiry) for at least :func:`confirm_after`
  seconds, with no store error of its own in between (:class:`LapseWatch`). That window is
  longer than the holder's renewal retry, so a live holder renews first and the claimer sees a
  new expiry. The claimer tries the record again when that window ends (:meth:`LapseWatch.due`),
  not at a later scan, so a dead holder's record is claimed within ``lease + one scan +
  confirm_after``.

Presence leases (a process's liveness; live event streams use one, see :mod:`kvstores.events`):

- **Where it lives.** A key of its own that the holder re-puts with the lease's length as its
  TTL (:class:`PresenceLease`): held while the key is there. There is no counter: what the
  holder guards is fenced by a write-once record instead (below).
- **Claim and renew** are the same ``put``: the first is made at once, then one every
  ``every`` seconds through :func:`keep` (``at_once``), retried through an outage as above.
- **Expiry, both sides.** Whoever reads the key missing (for a grace: a put may lag) may act for
  the holder. The holder counts its own lease lapsed once no renewal has *returned* for the
  lease's length (a monotonic clock, from the start of the last renewal that returned), which is
  never later than the key's expiry: a holder that froze or lost the store knows it may have
  been acted for, and stops writing.
- **Fenced writes.** Both sides race to write the guarded work's end with ``put_if_absent``
  (one record, written once) and every reader applies that record over whatever else is
  stored, so a holder that thawed late changes nothing anyone reads. Releasing is not needed:
  the key expires once renewals stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvstores.errors import KVStoreError
from kvstores.loop import raise_if_cancelled
from kvstores.protocol import AsyncKeyValue

__all__ = ["Lease", "LapseWatch", "PresenceLease", "RenewalFailed", "confirm_after", "keep", "retry_interval"]

logger = logging.getLogger("kvstores.lease")


@dataclass(frozen=True)
class Lease:
    """A holder's claim on a record: who, its fencing token, and the wall-clock time it lapses at."""

    holder: str
    token: int
    expires: float

    def lapsed(self, now: float) -> bool:
        """True when the lease was not renewed before ``now`` (wall-clock seconds)."""
        return self.expires <= now

    def renewed(self, now: float, length: float) -> Lease:
        """The same lease, expiring ``length`` seconds after ``now``."""
        return Lease(self.holder, self.token, now + length)

    def to_json(self) -> dict[str, Any]:
        """The lease as stored in its record."""
        return {"worker": self.holder, "token": self.token, "expires": self.expires}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Lease | None:
        """The lease a record stores (None: no lease)."""
        if data is None:
            return None
        return cls(str(data["worker"]), int(data["token"]), float(data["expires"]))


def retry_interval(length: float) -> float:
    """Seconds between two renewal attempts after a failed one (the store unreachable)."""
    return min(length / 3, 1.0)


def confirm_after(length: float) -> float:
    """Seconds a claimer must see one lapsed lease unchanged before it claims: half the lease, and at
    least twice the holder's renewal retry (a renewal in flight as the store came back may take one)."""
    return max(2 * retry_interval(length), length / 2)


class LapseWatch:
    """A claimer's memory of the lapsed leases it saw: what :meth:`confirmed` lets it claim.

    ``confirmed(item, lease)`` is True only when this process saw the very same lapsed lease at
    least :func:`confirm_after` seconds ago and had no store error since (:meth:`outage`).
    """

    def __init__(self, length: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = confirm_after(length)
        self._clock = clock
        self._seen: dict[str, tuple[Lease, float]] = {}

    def outage(self) -> None:
        """This process could not reach the store: every lapse seen before may be the store's absence."""
        self._seen.clear()

    def confirmed(self, item: str, lease: Lease) -> bool:
        """True when ``lease`` of ``item`` has been seen lapsed, unchanged, for the whole window."""
        now = self._clock()
        seen = self._seen.get(item)
        if seen is None or seen[0] != lease:
            if len(self._seen) >= 100_000:  # bounded: forget the oldest sightings (they are seen again)
                self._seen.clear()
            self._seen[item] = (lease, now)
            return False
        return now - seen[1] >= self.window

    def due(self, item: str) -> float | None:
        """The clock's time at which the sighting of ``item`` has lasted the window (None: none seen).

        A claimer tries ``item`` again at that time rather than at its next scan, so a dead holder's
        record is claimed ``confirm_after`` after it was first seen lapsed, not up to a scan later."""
        seen = self._seen.get(item)
        return None if seen is None else seen[1] + self.window

    def forget(self, item: str) -> None:
        """``item`` was claimed or ended: drop its sighting."""
        self._seen.pop(item, None)


class PresenceLease:
    """A holder's liveness as one key it re-puts with a TTL (the presence leases above)."""

    def __init__(
        self,
        store: AsyncKeyValue,
        key: str,
        value: Mapping[str, Any],
        length: float,
        *,
        collection: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.key, self.value, self.length, self.collection = store, key, value, length, collection
        self._clock = clock
        self.until = 0.0
        """The clock's time from which the holder counts its lease lapsed."""

    def start(self) -> None:
        """A new lease: held for its length from now (its first put is on its way)."""
        self.until = self._clock() + self.length

    def lapsed(self, now: float) -> bool:
        """True when no renewal returned for the lease's length before ``now`` (the clock's time)."""
        return now > self.until

    async def renew(self) -> None:
        """Put the key with the lease's length as TTL; once that returned, the lease holds that long from the start."""
        started = self._clock()
        await self.store.put(self.key, self.value, collection=self.collection, ttl=self.length)
        self.until = started + self.length


class RenewalFailed(Exception):
    """Raised by a ``renew`` that could not reach the store and reported it itself: :func:`keep` retries quietly."""


async def keep(
    renew: Callable[[], Awaitable[bool]],
    length: float,
    *,
    name: str,
    every: float | None = None,
    at_once: bool = False,
) -> None:
    """Renew a lease every third of ``length`` (or every ``every`` seconds) until it is lost; return when it is.

    ``renew()`` is the holder's fenced renewal: False when the lease is no longer held. A renewal
    that fails because the store cannot be reached is retried every :func:`retry_interval`
    seconds (at most ``every``): the lease may outlive the outage, as nobody can claim while the
    store is down. ``at_once``: the first renewal is made before the first wait (a presence
    lease's claim).

    A cancel ends it even when a renewal swallowed it: Python 3.11's ``wait_for``, which drivers
    call inside a command, drops a cancel that lands as the command completes, and a holder that
    renewed on after its run was stopped would keep a finished run's lease forever.
    """
    interval = length / 3 if every is None else every
    retry = min(interval, retry_interval(length))
    delay = 0.0 if at_once else interval
    while True:
        await asyncio.sleep(delay)
        try:
            held = await renew()
        except RenewalFailed:
            delay = retry
            continue
        except (KVStoreError, OSError, TimeoutError) as exc:
            logger.warning("lease: renewing %s failed (%s); retrying", name, exc)
            delay = retry
            continue
        finally:
            raise_if_cancelled()  # a cancel the renewal swallowed (see above) ends the loop here
        if not held:
            return
        delay = interval
