"""Progress of a running task, written to its record so that ``tasks/get`` shows it while the client polls.

FastMCP 4.2.3 makes ``Progress`` and ``ctx.report_progress`` observable only in a Docket worker
(``docket.dependencies.current_execution``); elsewhere they stay in memory. So the worker runs a
function tool with its ``Progress`` parameters' default swapped for :class:`StoreProgress` (a
``Progress`` whose state goes to the record, fenced on the task's lease), and gives it a
:class:`TaskContext` whose ``report_progress`` does the same. The task's ``statusMessage`` is the
last message, or ``current/total`` when there is none. Progress is best effort: a write the store
refuses (down, frozen past its timeout) is logged and dropped, never raised into the tool.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastmcp.server.context import Context
from fastmcp.server.dependencies import Progress

from kvstores.errors import KVStoreError
from kvstores.tasks._engine import Claim, TaskEngine
from kvstores.tasks._record import label

__all__ = ["ProgressRecorder", "StoreProgress", "TaskContext", "with_store_progress"]

logger = logging.getLogger("kvstores.tasks")


class ProgressRecorder:
    """The progress of one claimed task (FastMCP's ``ProgressLike``), each change a fenced write."""

    def __init__(self, engine: TaskEngine, claim: Claim) -> None:
        self.engine = engine
        self.claim = claim
        self._current: float | None = None
        self._total: float = 1
        self._message: str | None = None

    @property
    def current(self) -> int | None:
        """The progress so far."""
        return None if self._current is None else int(self._current)

    @property
    def total(self) -> int:
        """The total."""
        return int(self._total)

    @property
    def message(self) -> str | None:
        """The last message."""
        return self._message

    async def set_total(self, total: int) -> None:
        """Set the total (at least 1)."""
        if total < 1:
            raise ValueError("Total must be at least 1")
        self._total = total
        await self._write()

    async def increment(self, amount: int = 1) -> None:
        """Add ``amount`` (at least 1) to the progress."""
        if amount < 1:
            raise ValueError("Amount must be at least 1")
        self._current = (self._current or 0) + amount
        await self._write()

    async def set_message(self, message: str | None) -> None:
        """Set the status message."""
        self._message = message
        await self._write()

    async def report(self, progress: float, total: float | None, message: str | None) -> None:
        """``ctx.report_progress``: absolute progress, optional total and message."""
        self._current = progress
        if total is not None:
            self._total = total
        if message is not None:
            self._message = message
        await self._write()

    async def _write(self) -> None:
        shown = self._message
        if shown is None and self._current is not None:
            shown = f"{self._current:g}/{self._total:g}"
        progress = {"current": self._current, "total": self._total, "message": self._message}
        try:
            await self.engine.fenced(self.claim, lambda record: replace(record, progress=progress, message=shown))
        except (KVStoreError, OSError, TimeoutError) as exc:  # best effort: the tool goes on, the next write catches up
            logger.warning("tasks: progress of task %s not stored (%s)", label(self.claim.task_ref), exc)


class StoreProgress(Progress):
    """FastMCP's ``Progress`` dependency, recording to the running task's record."""

    def __init__(self, recorder: ProgressRecorder) -> None:
        self._recorder = recorder

    async def __aenter__(self) -> Progress:
        instance = StoreProgress(self._recorder)
        instance._impl = self._recorder
        return instance


class TaskContext(Context):
    """The worker's ``Context`` of a task: ``report_progress`` records to the task."""

    recorder: ProgressRecorder | None = None

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Record the task's progress (what ``tasks/get`` shows)."""
        if self.recorder is not None:
            await self.recorder.report(progress, total, message)


def with_store_progress(fn: Callable[..., Any], recorder: ProgressRecorder) -> Callable[..., Any] | None:
    """``fn`` with its ``Progress`` parameters defaulting to :class:`StoreProgress`; None when it has none."""
    signature = inspect.signature(fn)
    swapped = [
        parameter.replace(default=StoreProgress(recorder)) if isinstance(parameter.default, Progress) else parameter
        for parameter in signature.parameters.values()
    ]
    if all(new is old for new, old in zip(swapped, signature.parameters.values(), strict=True)):
        return None

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=swapped)  # type: ignore[attr-defined]
    return wrapper
