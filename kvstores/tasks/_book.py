"""The task records on a store: where they live, how they are read, and the one compare-and-set that changes them.

:class:`TaskBook` is the base of :class:`~kvstores.tasks._engine.TaskEngine`: what both its sides
(submitting, :mod:`kvstores.tasks._engine`; working, :mod:`kvstores.tasks._claims`) share.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from kvstores._lease import LapseWatch
from kvstores.errors import EncryptionKeyError, KVStoreError
from kvstores.protocol import UNCHANGED, AtomicStore, EnumerateKeysStore, Unchanged, missing_methods
from kvstores.tasks._changes import Changes
from kvstores.tasks._record import TaskRecord, TaskState, check_transition, label

__all__ = ["DEFAULT_LEASE", "DEFAULT_TTL", "QUEUE", "RECORDS", "SCAN_PAGE", "SIGNALS", "Change", "TaskBook"]

logger = logging.getLogger("kvstores.tasks")

RECORDS = "kvstores-tasks"
"""The collection of task records, their results over 1 KiB (``outcome/<ref>/<token>``: a listing reads no large one)
and workers' fault reports (``fault/<ref>``)."""

QUEUE = "kvstores-tasks-queue"
"""The collection of runnable and running tasks' refs: what workers scan."""

SIGNALS = "kvstores-tasks"
"""The signal channel's name: ``submit <ref>`` wakes workers, ``cancel <ref>`` reaches the holder."""

DEFAULT_LEASE = 10.0
"""Seconds a claim lasts without a renewal. A SIGKILLed worker's task runs again within this plus
:func:`kvstores._lease.confirm_after` (5 s) plus one rescan, whatever the traffic."""

DEFAULT_TTL = 900.0
"""Seconds a task is kept after its last change: 900, Docket's execution TTL, as ``fastmcp-tasks`` reports it."""

SCAN_PAGE = 1_000
"""Queue entries one scan reads."""

_FAULT = "fault/"
_OUTCOME = "outcome/"


Change = Callable[[TaskRecord], "TaskRecord | None"]
"""A change to a record: the record as it should be, or None to write nothing."""


class TaskBook:
    """A store's task records, queue and signals, for one engine (see the subclasses for each side)."""

    def __init__(self, store: Any, *, lease: float = DEFAULT_LEASE, ttl: float = DEFAULT_TTL) -> None:
        lacks = missing_methods(store, AtomicStore) + missing_methods(store, EnumerateKeysStore)
        if lacks:
            raise TypeError(
                f"background tasks need a store with atomic operations and keys() (kvstores.AtomicStore, "
                f"EnumerateKeysStore); {type(store).__name__} has no {', '.join(f'{name}()' for name in lacks)}"
            )
        for name, value in (("lease", lease), ("ttl", ttl)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number of seconds, not {value!r}")
        self.store = store
        self.lease = float(lease)
        self.ttl = float(ttl)
        self.worker_id = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        """This engine's name as a lease holder: host, process id and a random part."""
        self._lapses = LapseWatch(self.lease)
        self._queued: dict[str, float] = {}  # ref -> when this holder last refreshed its queue entry
        self.changes = Changes()
        """The readers of this process waiting for a task to change (held ``tasks/get``)."""

    @property
    def _atomic(self) -> AtomicStore:
        return cast(AtomicStore, self.store)

    async def wake(self, task_ref: str) -> None:
        """Tell the workers that ``task_ref`` is runnable (best effort: their rescan finds it anyway)."""
        await self._signal("submit", task_ref)

    async def _signal(self, kind: str, task_ref: str) -> None:
        from kvstores.signals import channel

        try:
            await channel(self.store).publish(SIGNALS, f"{kind} {task_ref}")
        except (KVStoreError, TypeError, OSError) as exc:
            logger.warning("tasks: could not signal %s of task %s (%s); rescans catch up", kind, label(task_ref), exc)

    async def _with_fault(self, task_ref: str) -> tuple[TaskRecord | None, str | None]:
        """The record and the text of a worker's fault report on it (None: no report)."""
        try:
            stored, fault = await self.store.get_many([task_ref, self._fault_key(task_ref)], collection=RECORDS)
        except EncryptionKeyError:  # one of the two cannot be opened here: read them apart
            stored = await self.store.get(task_ref, collection=RECORDS)
            try:
                fault = await self.store.get(self._fault_key(task_ref), collection=RECORDS)
            except EncryptionKeyError as exc:
                return _typed(stored, task_ref), (
                    "a worker could not open this task and failed it; its report is sealed with a key this "
                    f"server lacks ({exc}): the servers and workers of this store do not share encryption keys"
                )
        return _typed(stored, task_ref), None if fault is None else str(fault.get("error", "a worker failed the task"))

    async def _fail_unfenced(self, task_ref: str, message: str) -> TaskRecord | None:
        error = {"code": -32603, "message": message}
        return await self._change(
            task_ref, None, lambda record: record.entering(TaskState.FAILED, error=error, message=message)
        )

    async def _unqueue(self, task_ref: str) -> None:
        try:
            await self.store.delete(task_ref, collection=QUEUE)
        except KVStoreError as exc:  # the entry expires anyway; workers skip what is not runnable
            logger.warning("tasks: could not drop task %s from the queue: %s", label(task_ref), exc)

    async def _change(self, task_ref: str, token: int | None, change: Change) -> TaskRecord | None:
        """Compare-and-set the record: ``change`` (fenced on ``token`` when given) or nothing.

        Returns the record as written, None when nothing was written (absent, ended, fenced off,
        or ``change`` declined): a declined change is no write at all, so it keeps the TTL.
        ``update`` may run the function more than once: the last run's verdict is the one written.
        """
        written: list[TaskRecord] = []

        def fn(old: dict[str, Any] | None) -> dict[str, Any] | Unchanged:
            written.clear()
            record = _typed(old, task_ref)
            if record is None or record.state.terminal:
                return UNCHANGED
            if token is not None and not record.held_by(token):
                return UNCHANGED
            new = change(record)
            if new is None:
                return UNCHANGED
            check_transition(record.state, new.state)
            new = dataclasses.replace(new, updated=time.time())
            written.append(new)
            return new.to_json()

        await self._atomic.update(task_ref, fn, collection=RECORDS, ttl=self.ttl)
        return written[0] if written else None

    @staticmethod
    def _fault_key(task_ref: str) -> str:
        """Where a worker that cannot open a task reports it."""
        return _FAULT + task_ref

    @staticmethod
    def _result_key(task_ref: str, token: int) -> str:
        """Where the run of lease ``token`` keeps its result."""
        return f"{_OUTCOME}{task_ref}/{token}"

    async def records(self, refs: Sequence[str]) -> list[TaskRecord | None]:
        """The records of ``refs`` (operators' listing), None where gone."""
        stored = await self.store.get_many(list(refs), collection=RECORDS) if refs else []
        return [_typed(value, task_ref) for value, task_ref in zip(stored, refs, strict=True)]

    async def all_refs(self, limit: int = 10_000) -> list[str]:
        """Refs of every stored task (fault reports left out), at most ``limit``."""
        keys = await cast(EnumerateKeysStore, self.store).keys(RECORDS, limit=limit)
        return [key for key in keys if "/" not in key]  # records, not fault reports or results


def _typed(stored: Mapping[str, Any] | None, task_ref: str) -> TaskRecord | None:
    return None if stored is None else TaskRecord.from_json(stored, task_ref)
