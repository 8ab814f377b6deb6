"""Held reads: a ``tasks/get`` of a running task waits a moment for the task to end, here or on any replica.

A reader registers with :meth:`Changes.watching` *before* it reads the record, so a change that
lands between its read and its wait is not missed. The engine wakes it when this process ends a
task's run or cancels it (:meth:`Changes.changed`), handing it the final record as written (with
its result): a quick task run where it was submitted is answered with no read of the store. The
engine also publishes ``done <ref>`` on the tasks' signal channel,
which wakes the readers of every other replica (:meth:`Changes.on_message`); a cancel's
``cancel <ref>`` wakes them too, and a GAP of the channel wakes every reader (it re-reads). A
missed signal costs the reader its hold, never a wrong answer: it reads the record again either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kvstores.tasks._record import TaskRecord

__all__ = ["Changes", "Watch"]


@dataclass(eq=False)
class Watch:
    """One held reader's wait for its task to change."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the task changed (or may have: a GAP), here or on another replica."""
    final: TaskRecord | None = None
    """The task's final record, result loaded, when this process wrote it: answer with it, unread."""


class Changes:
    """The readers of this process waiting for a task to change, by task ref."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[Watch]] = {}

    @contextmanager
    def watching(self, task_ref: str) -> Iterator[Watch]:
        """A watch woken when ``task_ref`` changes while the block runs."""
        watch = Watch()
        self._waiting.setdefault(task_ref, set()).add(watch)
        try:
            yield watch
        finally:
            waiting = self._waiting.get(task_ref)
            if waiting is not None:
                waiting.discard(watch)
                if not waiting:
                    del self._waiting[task_ref]

    def changed(self, task_ref: str, final: TaskRecord | None = None) -> None:
        """``task_ref`` ended its run or was cancelled: wake its readers. ``final``: the record this
        process wrote, when it is final (a final record never changes again, so it cannot go stale)."""
        for watch in self._waiting.get(task_ref, ()):
            if final is not None and final.state.terminal:
                watch.final = final
            watch.event.set()

    def on_message(self, message: str) -> None:
        """A message of the tasks' signal channel: ``done <ref>`` and ``cancel <ref>`` wake that task's readers."""
        kind, _, task_ref = message.partition(" ")
        if kind in ("done", "cancel"):
            self.changed(task_ref)

    def on_gap(self) -> None:
        """Signals may have been lost: wake every reader (each reads its record again)."""
        for waiting in self._waiting.values():
            for watch in waiting:
                watch.event.set()
