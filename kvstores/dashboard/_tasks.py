"""The dashboard's view of background tasks: rows without secrets, stuck tasks, attempts, bounded pages.

A row names a task by its label (``#`` and 12 hex digits of its ref), never its id (a capability),
and carries nothing a task holds for its tool: no arguments, result, caller, token, headers or
input answers. Every read here is a page: ``keys(RECORDS, limit=, after=)`` then one ``get_many``.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from kvstores.errors import EncryptionKeyError
from kvstores.protocol import EnumerateKeysStore
from kvstores.tasks._book import RECORDS
from kvstores.tasks._engine import TaskEngine
from kvstores.tasks._record import TaskRecord, TaskRecordError, TaskState, label

__all__ = ["Attempts", "Limits", "Read", "TaskView", "cursor_of", "read_records", "sealed_key_id", "stuck"]

_LABEL = re.compile(r"#?([0-9a-f]{12})")
_CURSOR = re.compile(r"(?:[a-z]+/)?[0-9a-f]{12}g")
_KEY_ID = re.compile(r"key id '([^']{1,64})'")


@dataclass(frozen=True)
class Limits:
    """When a task counts as stuck (seconds)."""

    lease_grace: float = 5.0
    """A ``working`` task whose lease expired this long ago: its worker stopped renewing and nobody re-claimed it."""
    unclaimed: float = 60.0
    """A ``working`` task no worker has claimed for this long since its last change: no worker is running."""
    input_wait: float = 600.0
    """An ``input_required`` task the client has not answered for this long."""


def stuck(record: TaskRecord, now: float, limits: Limits) -> str | None:
    """Why ``record`` looks stuck, in words, or None."""
    lease = record.lease
    if record.state is TaskState.WORKING and lease is not None and now - lease.expires > limits.lease_grace:
        return f"lease expired {now - lease.expires:.0f}s ago: its worker stopped renewing and nobody took it over"
    if record.state is TaskState.WORKING and lease is None and now - record.updated > limits.unclaimed:
        return f"unclaimed for {now - record.updated:.0f}s: is any worker running?"
    if record.state is TaskState.INPUT_REQUIRED and now - record.updated > limits.input_wait:
        return f"waiting {now - record.updated:.0f}s for the client's input"
    return None


def sealed_key_id(exc: EncryptionKeyError) -> str:
    """The key id an EncryptionKeyError names (never the key: sealed values name ids only)."""
    found = _KEY_ID.search(str(exc))
    return found.group(1) if found else "?"


@dataclass(frozen=True)
class Read:
    """What reading one task record gave: the record, or why it could not be read."""

    ref: str
    record: TaskRecord | None
    sealed: str | None = None
    """The key id of a record sealed under a key this dashboard lacks (or that does not open)."""
    unreadable: bool = False
    """A record of another layout version, or corrupt."""


async def read_records(engine: TaskEngine, refs: Sequence[str]) -> list[Read]:
    """The records of ``refs`` in one round trip; one at a time only when a sealed one fails the batch."""
    try:
        records = await engine.records(refs)
        return [Read(ref, record) for ref, record in zip(refs, records, strict=True)]
    except (EncryptionKeyError, TaskRecordError):
        pass
    reads = []
    for ref in refs:
        try:
            reads.append(Read(ref, (await engine.records([ref]))[0]))
        except EncryptionKeyError as exc:
            reads.append(Read(ref, None, sealed=sealed_key_id(exc)))
        except TaskRecordError:
            reads.append(Read(ref, None, unreadable=True))
    return reads


class Attempts:
    """Each task's attempts as this dashboard saw them (a record keeps only their count): bounded, LRU."""

    def __init__(self, tasks: int = 10_000, per_task: int = 50) -> None:
        self._seen: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._tasks = tasks
        self._per_task = per_task

    def observe(self, record: TaskRecord, now: float) -> None:
        """Note the lease ``record`` holds now (a new attempt when its fencing token is new)."""
        lease = record.lease
        if lease is None:
            if record.state.terminal and record.ref in self._seen and self._seen[record.ref]:
                self._seen[record.ref][-1].setdefault("ended", record.state.value)
            return
        attempts = self._seen.setdefault(record.ref, [])
        self._seen.move_to_end(record.ref)
        if not attempts or attempts[-1]["token"] != lease.token:
            attempts.append({"token": lease.token, "worker": lease.holder, "first_seen": now})
            del attempts[: -self._per_task]
        attempts[-1].update(last_seen=now, lease_expires=lease.expires)
        while len(self._seen) > self._tasks:
            self._seen.popitem(last=False)

    def of(self, task_ref: str) -> list[dict[str, Any]]:
        """The attempts seen of ``task_ref``, oldest first."""
        return [dict(attempt) for attempt in self._seen.get(task_ref, [])]


def row(read: Read, now: float, limits: Limits) -> dict[str, Any]:
    """One line of the tasks table (nothing the task holds for its tool)."""
    record = read.record
    if record is None:
        state = "sealed" if read.sealed else "unreadable"
        return {"task": label(read.ref), "state": state, "sealed": read.sealed, "tool": None}
    progress = record.progress or {}
    message = progress.get("message") or record.message
    return {
        **record.summary(now),
        "message": message if isinstance(message, str) else None,
        "progress": _progress(progress),
        "stuck": stuck(record, now, limits),
        "terminal": record.state.terminal,
    }


def _progress(progress: dict[str, Any]) -> list[float] | None:
    current, total = progress.get("current"), progress.get("total")
    if isinstance(current, (int, float)) and isinstance(total, (int, float)) and total > 0:
        return [float(current), float(total)]
    return None


def cursor_of(key: str) -> str:
    """The position after ``key`` as a page hands it out: at most 12 hex digits of a ref, never a whole one."""
    head, slash, rest = key.partition("/")
    return f"{head}/{rest[:12]}g" if slash else f"{key[:12]}g"


class TaskView:
    """Pages, details and cancellation of tasks, each a bounded number of store round trips."""

    def __init__(
        self, store: Any, limits: Limits, *, page: int = 50, scan: int = 200, pages: int = 5, fresh_for: float = 0.0
    ) -> None:
        self.engine = TaskEngine(store)
        self.fresh_for = fresh_for
        """Seconds a page read is served again to whoever asks the same (viewers share reads, as samples)."""
        self._served: OrderedDict[tuple[str | None, ...], tuple[float, dict[str, Any]]] = OrderedDict()
        self.limits = limits
        self.attempts = Attempts()
        self._keys = cast(EnumerateKeysStore, store)
        self._page = page
        self._scan = scan
        self._pages = pages

    async def page(self, after: str | None, state: str | None, tool: str | None) -> dict[str, Any]:
        """Up to ``page`` rows after the cursor ``after`` matching ``state`` and ``tool``, in label order.

        Reads at most ``pages`` pages of ``scan`` keys: a filter that matches little returns fewer
        rows and the cursor where it stopped, never a scan of the whole store. The same question
        asked again within ``fresh_for`` seconds gets the same answer, without a read.
        """
        question = (after, state, tool)
        served = self._served.get(question)
        if served is not None and time.monotonic() - served[0] < self.fresh_for:
            return served[1]
        answer = await self._read_page(after, state, tool)
        self._served[question] = (time.monotonic(), answer)
        self._served.move_to_end(question)
        while len(self._served) > 64:
            self._served.popitem(last=False)
        return answer

    async def _read_page(self, after: str | None, state: str | None, tool: str | None) -> dict[str, Any]:
        position = after if after is not None and _CURSOR.fullmatch(after) else None
        rows: list[dict[str, Any]] = []
        scanned = 0
        now = time.time()
        for _ in range(self._pages):
            keys = await self._keys.keys(RECORDS, limit=self._scan, after=position)
            scanned += len(keys)
            refs = [key for key in keys if "/" not in key]
            for read in await read_records(self.engine, refs) if refs else []:
                if read.record is not None:
                    self.attempts.observe(read.record, now)
                line = row(read, now, self.limits)
                if (state and line["state"] != state) or (tool and line["tool"] != tool):
                    continue
                rows.append(line)
                if len(rows) == self._page:
                    return {"rows": rows, "next": cursor_of(read.ref), "scanned": scanned}
            if len(keys) < self._scan:
                return {"rows": rows, "next": None, "scanned": scanned}
            position = cursor_of(keys[-1])
        return {"rows": rows, "next": position, "scanned": scanned}

    async def find(self, wanted: str) -> Read | None:
        """The task labelled ``wanted`` (``#`` and 12 hex digits): one ``keys`` call and one read."""
        match = _LABEL.fullmatch(wanted)
        if match is None:
            return None
        prefix = match.group(1)
        keys = await self._keys.keys(RECORDS, limit=1, after=prefix)
        if not keys or not keys[0].startswith(prefix) or "/" in keys[0]:
            return None
        return (await read_records(self.engine, keys))[0]

    async def detail(self, wanted: str) -> dict[str, Any] | None:
        """The task labelled ``wanted`` as the page's detail shows it: its row, times, error and attempts."""
        read = await self.find(wanted)
        if read is None:
            return None
        now = time.time()
        line = row(read, now, self.limits)
        record = read.record
        if record is None:
            return line
        self.attempts.observe(record, now)
        error = (record.error or {}).get("message")
        return {
            **line,
            "created": record.created,
            "last_change": record.updated,
            "ttl": record.ttl_ms / 1000,
            "error": error if isinstance(error, str) else None,
            "reruns": record.rerun,
            "history": self.attempts.of(record.ref),
        }

    async def cancel(self, wanted: str) -> str | None:
        """Cancel the task labelled ``wanted``; its state afterwards, None when there is no such task."""
        read = await self.find(wanted)
        if read is None or read.record is None:
            return None
        record = read.record
        await self.engine.cancel(record.id, record.scope)
        self._served.clear()
        after = (await self.engine.records([record.ref]))[0]
        return (after or record).state.value
