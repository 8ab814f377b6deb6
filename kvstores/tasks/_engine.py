"""Background tasks on a kvstores store: records, the queue, leases and fencing (no MCP import).

A task is one record in :data:`RECORDS` keyed by its id (``secrets.token_urlsafe(32)``: 256
random bits), holding everything about it: the tool and its arguments, the caller's identity,
its state, progress, outcome and lease. A non-terminal, runnable task also has an entry in
:data:`QUEUE` (same key), which workers list; the signal channel (:data:`SIGNALS`) wakes them.

Every change is a compare-and-set (``update``) of the record:

- a claim writes a lease ``{worker, token, expires}``, where ``token`` is the record's
  fencing counter plus one;
- everything the running worker writes afterwards (heartbeat, progress, result, failure,
  input_required) is applied only while the record still holds that token and is not terminal,
  so a worker that froze past its lease and woke up after another took the task over (a new
  token) can never overwrite what the re-run wrote;
- a terminal state (completed, failed, cancelled) is final: nothing changes it afterwards.

Each write gives the record (and its queue entry) the engine's TTL again: a task is kept
``ttl`` seconds after its last change, then it is unknown everywhere and the backend reclaims it.
A worker that cannot open a record (EncryptionKeyError: its keys are not the submitter's)
leaves a fault report beside it (key ``fault/<id>``), which every server that can open the
record turns into a ``failed`` task naming the key mismatch; the tool never runs.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kvstores._telemetry import span
from kvstores.errors import EncryptionKeyError, InvalidKeyError, KVStoreError, SerializationError, StoreConnectionError
from kvstores.protocol import AtomicStore, EnumerateKeysStore, missing_methods

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "QUEUE",
    "RECORDS",
    "SIGNALS",
    "TERMINAL",
    "Claim",
    "TaskEngine",
    "label",
]

logger = logging.getLogger("kvstores.tasks")

RECORDS = "kvstores-tasks"
"""The collection of task records (and workers' fault reports, ``fault/<id>``)."""

QUEUE = "kvstores-tasks-queue"
"""The collection of runnable tasks' ids: what workers list."""

SIGNALS = "kvstores-tasks"
"""The signal channel's name: ``submit <id>`` wakes workers, ``cancel <id>`` reaches the holder."""

DEFAULT_LEASE = 10.0
"""Seconds a claim lasts without a heartbeat: a SIGKILLed worker's task runs again within this plus one rescan."""

DEFAULT_TTL = 900.0
"""Seconds a task is kept after its last change: 900, Docket's execution TTL, as ``fastmcp-tasks`` reports it."""

TERMINAL = frozenset({"completed", "failed", "cancelled"})
"""The states nothing changes afterwards."""

RECORD_VERSION = 1
"""The layout version of the records."""

_FAULT = "fault/"
_RETRY_CAP = 2.0


def label(task_id: str) -> str:
    """How kvstores names a task in logs: the first 12 hex digits of the id's SHA-256 (the id is a capability)."""
    return "#" + hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def iso(seconds: float) -> str:
    """``seconds`` since the epoch as an ISO 8601 UTC timestamp."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat()


@dataclass(frozen=True)
class Claim:
    """A lease this worker holds on a task: the record as claimed, and the fencing token."""

    record: dict[str, Any]
    token: int

    @property
    def task_id(self) -> str:
        """The task's id."""
        return cast(str, self.record["id"])


class TaskEngine:
    """The store side of background tasks: submit, read, claim, fenced writes, cancel, answer input."""

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

    @property
    def _atomic(self) -> AtomicStore:
        return cast(AtomicStore, self.store)

    # -- the submitting side ---------------------------------------------------------

    async def submit(
        self,
        *,
        tool: str,
        version: str | None,
        arguments: Mapping[str, Any],
        scope: str | None,
        caller: Mapping[str, Any],
        poll_interval_ms: int,
        rerun: bool = True,
    ) -> dict[str, Any]:
        """Write a new task and return its record; once this returns, every replica knows the task.

        The queue entry is written first: a failure between the two writes leaves an entry with
        no record (which workers ignore and which expires), never a record nobody runs. Raises
        the store's error (nothing is reported to the client as created) when either write fails.
        """
        now = time.time()
        task_id = secrets.token_urlsafe(32)
        record = {
            "v": RECORD_VERSION,
            "id": task_id,
            "scope": scope,
            "tool": tool,
            "version": version,
            "arguments": dict(arguments),
            "caller": dict(caller),
            "rerun": rerun,
            "created": now,
            "updated": now,
            "ttl_ms": int(self.ttl * 1000),
            "poll_ms": poll_interval_ms,
            "state": "working",
            "message": None,
            "progress": None,
            "result": None,
            "error": None,
            "input_requests": None,
            "input_keys": None,
            "request_state": None,
            "input_responses": None,
            "lease": None,
            "token": 0,
            "attempts": 0,
        }
        with span("kvstores.tasks submit", {"kvstores.task": label(task_id), "kvstores.task.tool": tool}):
            await self.store.put(task_id, {"at": now}, collection=QUEUE, ttl=self.ttl)
            if not await self._atomic.put_if_absent(task_id, record, collection=RECORDS, ttl=self.ttl):
                raise KVStoreError("a new task id collided with a stored one")  # 256 random bits: never
            await self.wake(task_id)
        return record

    async def wake(self, task_id: str) -> None:
        """Tell the workers that ``task_id`` is runnable (best effort: their rescan finds it anyway)."""
        await self._signal("submit", task_id)

    async def _signal(self, kind: str, task_id: str) -> None:
        from kvstores.signals import channel

        try:
            await channel(self.store).publish(SIGNALS, f"{kind} {task_id}")
        except (KVStoreError, TypeError, OSError) as exc:
            logger.warning("tasks: could not signal %s of task %s (%s); rescans catch up", kind, label(task_id), exc)

    async def read(self, task_id: str, scope: str | None) -> dict[str, Any] | None:
        """The record of ``task_id`` when it exists and belongs to ``scope``; else None (the same answer).

        A worker's fault report beside a live record fails the task here (see the module docstring).
        """
        if not isinstance(task_id, str) or not task_id or task_id.startswith(_FAULT):
            return None
        try:
            record, fault = await self._with_fault(task_id)
        except InvalidKeyError:  # no task has such an id (too long, a lone surrogate): unknown, like any other
            return None
        if record is None or record.get("scope") != scope:
            return None
        if fault is not None and record["state"] not in TERMINAL:
            record = await self._fail_unfenced(task_id, fault) or record
        return record

    async def _with_fault(self, task_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """The record and the text of a worker's fault report on it (None: no report)."""
        try:
            record, fault = await self.store.get_many([task_id, _FAULT + task_id], collection=RECORDS)
        except EncryptionKeyError:  # one of the two cannot be opened here: read them apart
            record = await self.store.get(task_id, collection=RECORDS)
            try:
                fault = await self.store.get(_FAULT + task_id, collection=RECORDS)
            except EncryptionKeyError as exc:
                return record, (
                    "a worker could not open this task and failed it; its report is sealed with a key this "
                    f"server lacks ({exc}): the servers and workers of this store do not share encryption keys"
                )
        return record, None if fault is None else str(fault.get("error", "a worker failed the task"))

    async def _fail_unfenced(self, task_id: str, message: str) -> dict[str, Any] | None:
        error = {"code": -32603, "message": message}
        return await self._change(task_id, None, lambda record: _ended(record, "failed", error=error, message=message))

    async def cancel(self, task_id: str, scope: str | None) -> bool:
        """Cancel a task of ``scope``; False when unknown. A terminal task is left as it is (and True)."""
        if await self.read(task_id, scope) is None:
            return False
        changed = await self._change(task_id, None, lambda record: _ended(record, "cancelled"))
        if changed is not None and changed["state"] == "cancelled":
            await self._unqueue(task_id)
            await self._signal("cancel", task_id)
        return True

    async def answer(
        self,
        task_id: str,
        scope: str | None,
        responses: Mapping[str, Any],
        check: Callable[[str | None, Any], Any] | None = None,
    ) -> bool:
        """Store the client's answers to an ``input_required`` task; False when unknown.

        Keys that name no outstanding request are ignored; once every request is answered the
        task is runnable again (the tool is re-entered with the answers). Anything else is a no-op.
        ``check(method, answer)`` returns the answer as stored, or raises (then nothing is stored).
        """
        if await self.read(task_id, scope) is None:
            return False

        def answered(record: dict[str, Any]) -> dict[str, Any] | None:
            outstanding = dict(record.get("input_requests") or {})
            if record["state"] != "input_required" or not outstanding:
                return None
            matched = {key: value for key, value in responses.items() if key in outstanding}
            if not matched:
                return None
            keys = dict(record.get("input_keys") or {})
            collected = {**(record.get("input_responses") or {})}
            for key, value in matched.items():
                method = outstanding[key].get("method")
                result = value if check is None else check(method, value)
                collected[keys.get(key, key)] = {"method": method, "result": result}
                del outstanding[key]
            if outstanding:
                return {**record, "input_requests": outstanding, "input_responses": collected}
            return {**record, "state": "working", "input_requests": None, "input_responses": collected, "message": None}

        changed = await self._change(task_id, None, answered)
        if changed is not None and changed["state"] == "working":
            await self.store.put(task_id, {"at": time.time()}, collection=QUEUE, ttl=self.ttl)
            await self.wake(task_id)
        return True

    # -- the working side --------------------------------------------------------------

    async def runnable(self, limit: int = 1_000) -> list[str]:
        """Ids of the queue (runnable or running tasks), at most ``limit``."""
        return await cast(EnumerateKeysStore, self.store).keys(QUEUE, limit=limit)

    async def claim(self, task_id: str) -> Claim | None:
        """Take the lease of ``task_id`` when it is runnable (never leased, or its lease expired).

        A task whose lease expired and whose tool opted out of re-runs is failed instead. A
        terminal or vanished task leaves the queue. Raises EncryptionKeyError (after leaving a
        fault report) when this worker cannot open the record.
        """
        try:
            record, fault = await self._with_fault(task_id)
        except EncryptionKeyError as exc:
            await self._report_fault(task_id, exc)
            raise
        if record is None:
            return None
        if fault is not None:
            await self._fail_unfenced(task_id, fault)
            await self._unqueue(task_id)
            return None
        if record["state"] in TERMINAL:
            await self._unqueue(task_id)
            return None
        if not _claimable(record, time.time()):
            return None
        now = time.time()
        worker = self.worker_id
        wanted: list[int] = []

        def claimed(record: dict[str, Any]) -> dict[str, Any] | None:
            if not _claimable(record, now):
                return None
            if record.get("lease") is not None and not record.get("rerun", True):
                message = (
                    f"the worker running this task stopped renewing its lease (attempt {record['attempts']}); "
                    "the tool opts out of re-runs, so the task fails instead of running again"
                )
                return _ended(record, "failed", error={"code": -32603, "message": message}, message=message)
            token = int(record["token"]) + 1
            wanted.append(token)
            lease = {"worker": worker, "token": token, "expires": now + self.lease}
            return {**record, "lease": lease, "token": token, "attempts": int(record["attempts"]) + 1, "updated": now}

        changed = await self._change(task_id, None, claimed)
        if changed is None or changed["state"] in TERMINAL:
            if changed is not None:
                await self._unqueue(task_id)
            return None
        lease = changed.get("lease") or {}
        if not wanted or lease.get("worker") != worker or lease.get("token") != wanted[-1]:
            return None
        return Claim(changed, wanted[-1])

    async def _report_fault(self, task_id: str, exc: EncryptionKeyError) -> None:
        message = (
            f"worker {self.worker_id} cannot open this task ({exc}); every server and worker of this store "
            "must share its encryption keys. The tool was not run."
        )
        logger.error("tasks: task %s cannot be opened here: %s", label(task_id), exc)
        try:
            await self._atomic.put_if_absent(_FAULT + task_id, {"error": message}, collection=RECORDS, ttl=self.ttl)
            await self._unqueue(task_id)
        except KVStoreError as failure:
            logger.warning("tasks: could not report the fault of task %s: %s", label(task_id), failure)

    async def fenced(self, claim: Claim, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
        """Apply ``change`` to the record while ``claim`` still holds it; None when it does not (lost or ended)."""
        return await self._change(claim.task_id, claim.token, change)

    async def release(self, claim: Claim) -> bool:
        """Give the task back (its worker stops): runnable again at once, or failed for a tool that opts out
        of re-runs. False when the lease was already lost."""
        message = "the worker stopped while it ran this task; the tool opts out of re-runs, so the task fails"

        def released(record: dict[str, Any]) -> dict[str, Any]:
            if record.get("rerun", True):
                return {**record, "lease": None}
            return _ended(record, "failed", error={"code": -32603, "message": message}, message=message)

        changed = await self.fenced(claim, released)
        if changed is not None and changed["state"] == "working":
            await self.wake(claim.task_id)
        return changed is not None

    async def heartbeat(self, claim: Claim) -> bool:
        """Push back the lease's expiry; False when the lease is lost (taken over, cancelled, ended, expired away)."""
        expires = time.time() + self.lease
        changed = await self.fenced(claim, lambda record: {**record, "lease": {**record["lease"], "expires": expires}})
        return changed is not None

    async def finish(self, claim: Claim, state: str, **fields: Any) -> bool:
        """Write the run's outcome (``state`` and its fields), retrying while the store is down.

        An outcome the store refuses (too large, not JSON) fails the task instead, naming why,
        with nothing of the outcome written. False when the lease was lost: a re-run or a
        cancel owns the task, and this outcome is dropped.
        """
        attributes = {"kvstores.task": label(claim.task_id), "kvstores.task.state": state}
        with span("kvstores.tasks finish", attributes) as current:
            written = await self._finish(claim, state, fields)
            if current is not None:
                current.set_attribute("kvstores.task.written", written)
        return written

    async def _finish(self, claim: Claim, state: str, fields: Mapping[str, Any]) -> bool:
        delay = 0.05
        outcome = (state, dict(fields))
        while True:
            try:
                changed = await self.fenced(claim, functools.partial(_outcome, state=outcome[0], fields=outcome[1]))
                break
            except SerializationError as exc:
                if outcome[0] == "failed":
                    raise
                message = f"the task's outcome cannot be stored: {exc}"
                outcome = ("failed", {"error": {"code": -32603, "message": message}, "message": message})
            except (TimeoutError, StoreConnectionError) as exc:
                logger.warning("tasks: storing the outcome of task %s failed (%s); retrying", label(claim.task_id), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_CAP)
        if changed is None:
            return False
        if outcome[0] in TERMINAL or outcome[0] == "input_required":
            await self._unqueue(claim.task_id)
        return True

    async def _unqueue(self, task_id: str) -> None:
        try:
            await self.store.delete(task_id, collection=QUEUE)
        except KVStoreError as exc:  # the entry expires anyway; workers skip what is not runnable
            logger.warning("tasks: could not drop task %s from the queue: %s", label(task_id), exc)

    async def _change(
        self, task_id: str, token: int | None, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Compare-and-set the record: ``change`` (fenced on ``token`` when given) or nothing.

        Returns the record as written, None when nothing was written (absent, ended, fenced
        off, or ``change`` declined). ``update`` may run the function more than once: the last
        run's verdict is the one written.
        """
        verdict: list[bool] = []

        def fn(old: dict[str, Any] | None) -> dict[str, Any] | None:
            verdict.clear()
            if old is None:
                return None
            if old["state"] in TERMINAL:
                return old
            if token is not None and (old.get("lease") or {}).get("token") != token:
                return old
            new = change(old)
            if new is None:
                return old
            verdict.append(True)
            return {**new, "updated": time.time()}

        written = await self._atomic.update(task_id, fn, collection=RECORDS, ttl=self.ttl)
        return written if verdict else None

    async def records(self, ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The records of ``ids`` (operators' listing), None where gone."""
        return await self.store.get_many(list(ids), collection=RECORDS) if ids else []

    async def all_ids(self, limit: int = 10_000) -> list[str]:
        """Ids of every stored task (fault reports left out), at most ``limit``."""
        keys = await cast(EnumerateKeysStore, self.store).keys(RECORDS, limit=limit)
        return [key for key in keys if not key.startswith(_FAULT)]


def _claimable(record: Mapping[str, Any], now: float) -> bool:
    if record["state"] != "working":
        return False
    lease = record.get("lease")
    return lease is None or float(lease["expires"]) <= now


def _ended(record: dict[str, Any], state: str, **fields: Any) -> dict[str, Any]:
    """``record`` in the terminal ``state``: lease released, nothing left to answer."""
    return {**record, **fields, "state": state, "lease": None, "input_requests": None}


def _outcome(record: dict[str, Any], state: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    if state in TERMINAL:
        return _ended(record, state, **fields)
    if state == "input_required":
        return {**record, **fields, "state": state, "lease": None}
    return {**record, **fields}
