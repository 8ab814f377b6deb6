"""Termination everywhere: a DELETE's session refused by every process once the DELETE has answered.

The mechanism, written once:

- **The record decides.** A DELETE writes a tombstone into the session's registry record before
  its response is sent (:meth:`Terminations.record`), and a process serves a request of a held
  session only on a reading of its record that began less than :data:`READ_WINDOW` seconds
  before (:meth:`Terminations.ended`: a ``get`` when the last reading is older, or once per
  ``refresh_interval`` the ``touch`` that keeps the record alive). When the record says that
  another process than the session's creator adopted it (``shared``), the DELETE waits out that
  window after its tombstone is written, before it answers: every reading that began before the
  tombstone then has expired, in every process. So no request sent after the DELETE's answer is
  served anywhere, whatever any signal did, and a busy session costs one read per window, not
  one per request. A registry that cannot be read leaves the session served (logged): an
  outage is not a termination.
- **The signal is a doorbell.** After the DELETE the process announces it on the store's signal
  channel :data:`TERMINATIONS` (the id's SHA-256), so that every process holding the session
  drops it at once and ends its open streams; after a signal GAP each re-reads the records of
  the sessions it holds (:meth:`SessionRegistry.ended`), and a kvstores store without a signal
  transport is re-read every :data:`_POLL` seconds. A missed signal costs an open stream some
  time, never a refusal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from kvstores.base import BaseStore
from kvstores.sessions._registry import SessionRecord, SessionRegistry, digest, label, scrubbed
from kvstores.signals import SignalChannel
from kvstores.signals import channel as signals_channel

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

__all__ = ["TERMINATIONS", "Terminations"]

logger = logging.getLogger("kvstores.sessions")  # the public name, whatever module logs

TERMINATIONS = "sessions"
"""The signal channel (kvstores.signals) on which a DELETE names its session (by the SHA-256 of its id)."""

BOOKKEEPING_TIMEOUT = 10.0
"""Seconds shielded registry bookkeeping may take after a request before it is given up."""

_POLL = 0.5
"""Seconds between two checks of the sessions held, on a kvstores store without a signal channel."""

READ_WINDOW = 0.25
"""Seconds a process serves a held session on one reading of its record (counted from before the read)."""

_WINDOW_MARGIN = 0.01
"""Seconds a DELETE of a shared session waits beyond :data:`READ_WINDOW` (for clocks running at other rates)."""

_GONE = object()
"""What a read returns when the registry has no record of the session (expired or never written)."""


class Terminations:
    """Records, announces and watches for the end of the sessions this process holds.

    ``held`` is the process's table of live sessions (id -> transport, read only here) and
    ``drop(session_id)`` forgets one of them and ends its transport.
    """

    def __init__(self, registry: SessionRegistry, held: Mapping[str, Any], drop: Callable[[str], None]) -> None:
        self.registry = registry
        self.held = held
        self.drop = drop
        self._checked: dict[str, float] = {}  # session id -> monotonic time of its last refresh
        self._read: dict[str, float] = {}  # session id -> monotonic time before its last reading that found it live
        self._digests: dict[str, str] = {}  # digest(id) -> id of each session held here
        self._tasks: TaskGroup | None = None

    def hold(self, session_id: str) -> None:
        """``session_id`` is served here from now on (its record was just written or read)."""
        self._checked[session_id] = time.monotonic()
        self._digests[digest(session_id)] = session_id

    def release(self, session_id: str) -> None:
        """``session_id`` is no longer served here."""
        self._checked.pop(session_id, None)
        self._read.pop(session_id, None)
        self._digests.pop(digest(session_id), None)

    # -- before each request -------------------------------------------------------------

    async def ended(self, session_id: str, *, adopted: bool = False) -> bool:
        """True (and the session dropped here) when its record says it ended or is gone.

        Reads the record unless a reading of it began within :data:`READ_WINDOW`, or refreshes it
        once per refresh interval; ``adopted``: this process just adopted the session (the record
        is refreshed at once, and marked shared).
        """
        started = time.monotonic()
        last = self._checked.get(session_id)
        due = adopted or last is None or started - last >= self.registry.refresh_interval
        if not due and started - self._read.get(session_id, -READ_WINDOW) < READ_WINDOW:
            return False
        if due:
            self._checked[session_id] = started
        record = await self._look_up(session_id, touch=due, adopted=adopted)
        if record is None:
            return False
        if isinstance(record, SessionRecord) and not record.terminated:
            self._read[session_id] = started
            return False
        logger.info("Session %s was terminated or expired elsewhere; closing it here", label(session_id))
        self.drop(session_id)
        return True

    async def _look_up(self, session_id: str, *, touch: bool, adopted: bool) -> SessionRecord | object | None:
        """The record (touched when ``touch``), ``_GONE`` when absent, None when the registry could not say."""
        try:
            record = await (
                self.registry.touch(session_id, adopted=adopted) if touch else self.registry.get(session_id)
            )
        except Exception as exc:
            logger.warning(
                "Could not %s session %s in the session registry: %s",
                "refresh" if touch else "read",
                label(session_id),
                scrubbed(exc, session_id),
            )
            return None
        return _GONE if record is None else record

    # -- recording and announcing ------------------------------------------------------------

    async def record(self, session_id: str, *, announce: bool = True) -> bool:
        """Record (and announce) that ``session_id`` ended; False (logged) when the registry could not record it.

        Returns once no process serves the session on a reading of its record older than the
        tombstone (a shared session's readings expire :data:`READ_WINDOW` after they began).
        """
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(BOOKKEEPING_TIMEOUT):
                if await self.registry.terminate(session_id):
                    await anyio.sleep(READ_WINDOW + _WINDOW_MARGIN)
        except Exception as exc:
            logger.error(
                "Could not record the termination of session %s: %s", label(session_id), scrubbed(exc, session_id)
            )
            return False
        if announce:
            await self.announce(session_id)
        return True

    async def announce(self, session_id: str) -> None:
        """Ring the doorbell: every process holding ``session_id`` drops it now rather than at its next request."""
        signals = self._channel()
        if signals is None:
            return
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(BOOKKEEPING_TIMEOUT):
                await signals.publish(TERMINATIONS, digest(session_id))
        except Exception as exc:
            logger.warning(
                "Could not announce the termination of session %s (%s); processes holding it refuse it "
                "at its next request, and drop it after a signal gap",
                label(session_id),
                scrubbed(exc, session_id),
            )

    # -- watching -----------------------------------------------------------------------------

    async def watch(self, tasks: TaskGroup) -> Callable[[], None]:
        """Drop held sessions as other processes end them (tasks in ``tasks``); return what stops watching."""
        self._tasks = tasks
        signals = self._channel()
        if signals is not None:
            try:
                return await signals.listen(TERMINATIONS, self._terminated_elsewhere, self._recheck_soon)
            except Exception as exc:
                logger.warning("Cannot listen for session terminations (%s); polling the registry instead", exc)
        if signals is not None or isinstance(self.registry.store, BaseStore):
            tasks.start_soon(self._poll)
        return lambda: None

    def _channel(self) -> SignalChannel | None:
        """The registry store's signal channel; None for a store without one (not one of kvstores' own)."""
        try:
            return signals_channel(self.registry.store)
        except TypeError:
            return None

    def _terminated_elsewhere(self, named: str) -> None:
        """A DELETE somewhere ended the session whose digest is ``named``: if it is held here, drop it."""
        session_id = self._digests.get(named)
        if session_id is not None and session_id in self.held:
            logger.info("Session %s was terminated on another process; closing it here", label(session_id))
            self.drop(session_id)

    def _recheck_soon(self) -> None:
        """Termination signals may have been lost: read the records of the sessions held."""
        if self._tasks is not None:
            self._tasks.start_soon(self._recheck_held)

    async def _poll(self) -> None:
        while True:
            await anyio.sleep(_POLL)
            await self._recheck_held()

    async def _recheck_held(self) -> None:
        """Drop each held session whose record is terminated or gone."""
        try:
            ended = await self.registry.ended(list(self.held))
        except Exception as exc:
            logger.warning("Could not check the sessions held against the session registry: %s", type(exc).__name__)
            return
        for session_id in ended:
            if session_id in self.held:
                logger.info("Session %s was terminated or expired elsewhere; closing it here", label(session_id))
                self.drop(session_id)
