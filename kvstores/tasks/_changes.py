"""Held reads: a ``tasks/get`` of a running task waits a moment for the task to end, here or on any replica.

A reader registers with :meth:`Changes.watching` *before* it reads the record, so a change that
lands between its read and its wait is not missed. The engine wakes it when this process ends a
task's run (:meth:`Changes.changed`) and publishes ``done <ref>`` on the tasks' signal channel,
which wakes the readers of every other replica (:meth:`Changes.on_message`); a cancel's
``cancel <ref>`` wakes them too, and a GAP of the channel wakes every reader (it re-reads). A
missed signal costs the reader its hold, never a wrong answer: it reads the record again either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Changes"]


class Changes:
    """The readers of this process waiting for a task to change, by task ref."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[asyncio.Event]] = {}

    @contextmanager
    def watching(self, task_ref: str) -> Iterator[asyncio.Event]:
        """An event set when ``task_ref`` changes while the block runs."""
        event = asyncio.Event()
        self._waiting.setdefault(task_ref, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._waiting.get(task_ref)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiting[task_ref]

    def changed(self, task_ref: str) -> None:
        """``task_ref`` ended its run or was cancelled: wake its readers."""
        for event in self._waiting.get(task_ref, ()):
            event.set()

    def on_message(self, message: str) -> None:
        """A message of the tasks' signal channel: ``done <ref>`` and ``cancel <ref>`` wake that task's readers."""
        kind, _, task_ref = message.partition(" ")
        if kind in ("done", "cancel"):
            self.changed(task_ref)

    def on_gap(self) -> None:
        """Signals may have been lost: wake every reader (each reads its record again)."""
        for waiting in self._waiting.values():
            for event in waiting:
                event.set()
