"""Background tasks on a kvstores store: records, the queue, leases and fencing (no MCP import).

A task is one :class:`~kvstores.tasks._record.TaskRecord` in :data:`RECORDS`, keyed by its ref
(the SHA-256 of its id: the id, ``secrets.token_urlsafe(32)``, is a capability and is never a
key, a signal or a log line), holding everything about it: the tool and its arguments, the
caller's identity, its state, progress, outcome and lease. A runnable or running task also has
an entry in :data:`QUEUE` (same key), which workers scan; the signal channel (:data:`SIGNALS`)
wakes them, but never decides anything: a missed signal costs latency, not a task.

- The record is written before its queue entry, so no queue entry ever names a task that was
  never stored; an entry whose record is gone (expired) is dropped by the first worker that sees it.
- Claims, renewals and fenced writes follow :mod:`kvstores._lease` (its docstring is the whole
  mechanism): a worker whose lease was taken over can no longer change the task, and a lease
  that lapsed only because the store was unreachable is not taken from a live holder.
- Every change is one compare-and-set that checks the state table
  (:func:`~kvstores.tasks._record.check_transition`); a terminal state is final. A change that
  is declined (ended, fenced off, nothing to do) writes nothing, so it never extends the record's
  TTL: a task is unknown everywhere ``ttl`` seconds after its last real change.
- The holder's renewals refresh the queue entry too, so a task may run longer than its TTL.

A worker that cannot open a record (EncryptionKeyError: its keys are not the submitter's) leaves
a fault report beside it (key ``fault/<ref>``), which every server that can open the record
turns into a ``failed`` task naming the key mismatch; the tool never runs.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from kvstores._lease import Lease
from kvstores._telemetry import span
from kvstores.errors import KVStoreError
from kvstores.tasks._book import DEFAULT_LEASE, DEFAULT_TTL, QUEUE, RECORDS, SIGNALS, logger
from kvstores.tasks._claims import Claim, Claims
from kvstores.tasks._record import TaskRecord, TaskState, label, ref

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "QUEUE",
    "RECORDS",
    "SIGNALS",
    "Claim",
    "TaskEngine",
    "iso",
    "label",
    "ref",
]


def iso(seconds: float) -> str:
    """``seconds`` since the epoch as an ISO 8601 UTC timestamp."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC).isoformat()


class TaskEngine(Claims):
    """The store side of background tasks: submit, read, cancel and answer input (this class), claim,
    renew and end leases (:class:`~kvstores.tasks._claims.Claims`), on the records of
    :class:`~kvstores.tasks._book.TaskBook`."""

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
        claim: bool = False,
    ) -> TaskRecord:
        """Write a new task and return its record; once this returns, every replica knows the task.

        ``claim``: the task is written already leased to this engine (token 1, first attempt), for
        a worker of this process to run at once (:meth:`Worker.run_claimed`): no claim's round
        trips, no signal. Should that worker die, the lease lapses and another takes the task over,
        as any lease.

        The record is written first, then its queue entry: a record the store refuses (too
        large, not JSON) leaves nothing behind, and a queue entry always names a stored task.
        Raises the store's error (nothing is reported to the client as created) when either
        write fails; the record of a failed queue write is deleted (best effort: nobody runs it,
        and it expires).
        """
        now = time.time()
        record = TaskRecord(
            id=secrets.token_urlsafe(32),
            scope=scope,
            tool=tool,
            version=version,
            arguments=dict(arguments),
            caller=dict(caller),
            rerun=rerun,
            created=now,
            updated=now,
            ttl_ms=int(self.ttl * 1000),
            poll_ms=poll_interval_ms,
        )
        if claim:
            record = dataclasses.replace(record, lease=Lease(self.worker_id, 1, now + self.lease), token=1, attempts=1)
        task_ref = record.ref
        with span("kvstores.tasks submit", {"kvstores.task": label(task_ref), "kvstores.task.tool": tool}):
            if not await self._atomic.put_if_absent(task_ref, record.to_json(), collection=RECORDS, ttl=self.ttl):
                raise KVStoreError("a new task id collided with a stored one")  # 256 random bits: never
            try:
                await self.store.put(task_ref, {"at": now}, collection=QUEUE, ttl=self.ttl)
            except BaseException:
                try:
                    await self.store.delete(task_ref, collection=RECORDS)
                except KVStoreError as exc:
                    logger.warning("tasks: could not delete task %s after a failed submit: %s", label(task_ref), exc)
                raise
            if claim:
                self._queued[task_ref] = time.monotonic()
            else:
                await self.wake(task_ref)
        return record

    async def read(self, task_id: str, scope: str | None) -> TaskRecord | None:
        """The record of ``task_id``, its result loaded, when it exists and belongs to ``scope``; else None
        (the same answer). A worker's fault report beside a live record fails the task here (see the module
        docstring).
        """
        if not isinstance(task_id, str) or not task_id:
            return None
        task_ref = ref(task_id)
        record, fault = await self._with_fault(task_ref)
        if record is None or record.scope != scope or record.id != task_id:
            return None
        if fault is not None and not record.state.terminal:
            record = await self._fail_unfenced(task_ref, fault) or record
        if record.result_token is None:
            return record
        outcome = await self.store.get(self._result_key(task_ref, record.result_token), collection=RECORDS)
        if outcome is None:  # expired a moment before its record: the task is gone
            return None
        return dataclasses.replace(record, result=outcome.get("result"))

    async def cancel(self, task_id: str, scope: str | None) -> bool:
        """Cancel a task of ``scope``; False when unknown. A terminal task is left as it is (and True):
        nothing is written, so its TTL runs from its last real change."""
        record = await self.read(task_id, scope)
        if record is None:
            return False
        if record.state.terminal:
            return True
        changed = await self._change(record.ref, None, lambda record: record.entering(TaskState.CANCELLED))
        if changed is not None:
            self.changes.changed(record.ref, changed)
            await self._unqueue(record.ref)
            await self._signal("cancel", record.ref)
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
        record = await self.read(task_id, scope)
        if record is None:
            return False

        def answered(record: TaskRecord) -> TaskRecord | None:
            outstanding = dict(record.input_requests or {})
            if record.state is not TaskState.INPUT_REQUIRED or not outstanding:
                return None
            matched = {key: value for key, value in responses.items() if key in outstanding}
            if not matched:
                return None
            keys = dict(record.input_keys or {})
            collected = dict(record.input_responses or {})
            for key, value in matched.items():
                method = outstanding[key].get("method")
                result = value if check is None else check(method, value)
                collected[keys.get(key, key)] = {"method": method, "result": result}
                del outstanding[key]
            if outstanding:
                return dataclasses.replace(record, input_requests=outstanding, input_responses=collected)
            return record.entering(TaskState.WORKING, input_requests=None, input_responses=collected, message=None)

        changed = await self._change(record.ref, None, answered)
        if changed is not None and changed.state is TaskState.WORKING:
            await self.store.put(record.ref, {"at": time.time()}, collection=QUEUE, ttl=self.ttl)
            await self.wake(record.ref)
        return True
