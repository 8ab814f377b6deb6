"""The worker: claims runnable tasks from the store and runs them, ``concurrency`` at a time.

Pickup is woken by the signal channel (``submit <ref>`` names the task, so a free worker claims
it at once); a scan of the queue every ``rescan`` seconds on a fixed schedule (wake-ups never
postpone it, however many arrive), and at once after a GAP of the channel, finds what a lost
signal or a lapsed lease left runnable. A running task's lease is kept by
:func:`kvstores._lease.keep`; a ``cancel <ref>`` signal, or a renewal that finds the lease lost,
cancels the tool's asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kvstores._lease import keep
from kvstores._telemetry import span
from kvstores.errors import EncryptionKeyError, KVStoreError
from kvstores.loop import raise_if_cancelled, wait_event
from kvstores.tasks._book import SCAN_PAGE
from kvstores.tasks._engine import SIGNALS, Claim, TaskEngine
from kvstores.tasks._record import TaskState, label

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_RESCAN", "Outcome", "Worker"]

logger = logging.getLogger("kvstores.tasks")

DEFAULT_CONCURRENCY = 10
"""Tasks one worker runs at once."""

DEFAULT_RESCAN = 2.5
"""Seconds between two rescans of the queue (lost signals, expired leases)."""


_RELEASE_SECONDS = 1.0


@dataclass(frozen=True)
class Outcome:
    """How a run ended: a state (completed, failed or input_required) and the record fields it sets."""

    state: TaskState
    fields: dict[str, Any] = field(default_factory=dict)


Execute = Callable[[Claim, TaskEngine], Coroutine[Any, Any, Outcome]]
"""Runs a claimed task's tool and says how it ended (the FastMCP side provides it)."""


class Worker:
    """Runs the tasks of one store: ``await worker.run()`` until cancelled."""

    scan_page: int = SCAN_PAGE
    """Queue entries one read of a scan lists (a scan reads as many pages as it needs)."""

    def __init__(
        self,
        engine: TaskEngine,
        execute: Execute,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        rescan: float = DEFAULT_RESCAN,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, not {concurrency!r}")
        if isinstance(rescan, bool) or not isinstance(rescan, (int, float)) or not 0 < rescan < 3_600:
            raise ValueError(f"rescan must be a number of seconds in (0, 3600), not {rescan!r}")
        self.engine = engine
        self.execute = execute
        self.concurrency = concurrency
        self.rescan = float(rescan)
        self.running: dict[str, asyncio.Task[None]] = {}
        self._tools: dict[str, asyncio.Task[Outcome]] = {}
        self._hints: list[str] = []
        self._wake = asyncio.Event()
        self._full_scan = True
        self._reserved = 0  # slots taken by tasks this process is submitting already claimed (reserve())
        self._stopped = False
        self._cursor: str | None = None  # where the next scan of the queue starts (None: at its start)
        self._rechecks: dict[str, asyncio.TimerHandle] = {}  # lapses seen, tried again when confirmable
        self._context: contextvars.Context | None = None  # the run loop's: every tool runs in a copy of it

    async def run(self) -> None:
        """Serve until cancelled; running tools are cancelled with it (their tasks run again elsewhere)."""
        from kvstores.signals import channel

        self._context = contextvars.copy_context()
        unsubscribe = None
        try:
            unsubscribe = await channel(self.engine.store).listen(SIGNALS, self._on_message, self._on_gap)
        except (KVStoreError, TypeError, OSError) as exc:
            logger.warning("tasks: no signal channel (%s); the worker rescans every %g s", exc, self.rescan)
        loop = asyncio.get_running_loop()
        next_scan = loop.time()  # the first scan at once: what an earlier run left
        try:
            while True:
                raise_if_cancelled()  # one that a store's driver swallowed (Python 3.11's wait_for)
                await wait_event(self._wake, next_scan - loop.time())  # a wake-up, or the scan's time
                self._wake.clear()
                if loop.time() >= next_scan:  # on its schedule, whatever woke the worker meanwhile
                    self._full_scan = True
                    next_scan = loop.time() + self.rescan
                try:
                    await self._fill()
                except (KVStoreError, OSError) as exc:
                    logger.warning("tasks: pickup failed (%s); retrying at the next rescan", exc)
                except Exception:  # a defect must not end the worker in silence: it would never run a task again
                    logger.exception("tasks: pickup failed; retrying at the next rescan")
        finally:
            self._stopped = True
            if unsubscribe is not None:
                unsubscribe()
            for handle in self._rechecks.values():
                handle.cancel()
            tasks = list(self.running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def reserve(self) -> bool:
        """Take a free slot for a task this process submits already claimed (``submit(claim=True)``);
        False when none is free. Hand the slot to :meth:`run_claimed`, or give it back with :meth:`unreserve`."""
        if self._stopped or len(self.running) + self._reserved >= self.concurrency:
            return False
        self._reserved += 1
        return True

    def unreserve(self) -> None:
        """Give back a slot :meth:`reserve` took (the submit failed)."""
        self._reserved -= 1
        self._wake.set()

    def run_claimed(self, claim: Claim) -> None:
        """Run a task submitted here already claimed, in the slot :meth:`reserve` took (a stopped worker
        runs nothing: the lease lapses and another worker takes the task over)."""
        self._reserved -= 1
        if not self._stopped:
            self._start(claim)

    def offer(self, task_ref: str) -> None:
        """A task just submitted in this process (by its ref): claim it at the next turn if a slot is free."""
        self._hints.append(task_ref)
        self._wake.set()

    def _on_message(self, message: str) -> None:
        kind, _, task_ref = message.partition(" ")
        if kind == "submit":
            self.offer(task_ref)
        elif kind == "cancel" and task_ref in self._tools:
            logger.info("tasks: task %s cancelled; stopping its tool", label(task_ref))
            self._tools[task_ref].cancel()

    def _on_gap(self) -> None:
        self._full_scan = True
        self._wake.set()

    async def _fill(self) -> None:
        """Claim runnable tasks while a slot is free: the signalled ones, then (when due) the whole queue."""
        hints, self._hints = self._hints, []
        candidates = list(dict.fromkeys(hints))
        hinted = len(candidates)
        if self._full_scan:
            self._full_scan = False
            candidates += [task_ref for task_ref in await self._scan() if task_ref not in candidates]
        for index, task_ref in enumerate(candidates):
            if len(self.running) + self._reserved >= self.concurrency:
                # what did not fit waits for a free slot: the hinted refs as they are, the rest by a scan
                self._hints[:0] = candidates[index:hinted]
                self._full_scan = self._full_scan or len(candidates) > hinted
                return
            if task_ref in self.running:
                continue
            try:
                claim = await self.engine.claim(task_ref)
            except EncryptionKeyError:
                continue  # reported beside the record by claim(): the task fails, the tool never runs
            if claim is not None:
                self._start(claim)
            else:
                self._recheck(task_ref)

    def _recheck(self, task_ref: str) -> None:
        """Try ``task_ref`` again the moment a lapse seen of it is confirmed (not a scan later)."""
        due = self.engine.confirmable_at(task_ref)
        delay = None if due is None else due - time.monotonic()
        if delay is None or delay <= 0 or task_ref in self._rechecks:
            return  # nothing waits for its window (a past one was judged by this very claim)

        def offer() -> None:
            del self._rechecks[task_ref]
            self.offer(task_ref)

        self._rechecks[task_ref] = asyncio.get_running_loop().call_later(delay, offer)

    async def _scan(self) -> list[str]:
        """Claimable refs of the queue, a page at a time from where the last scan stopped, until
        they fill the free slots or the queue was read once round: every entry is seen within a
        pass, however many there are, and a busy start of the queue cannot hide its end."""
        found: list[str] = []
        start = after = self._cursor
        wrapped = False  # past the queue's end, reading from its start up to ``start``
        while len(found) < self.concurrency - len(self.running) - self._reserved:
            page = await self.engine.runnable(self.scan_page, after=after)
            last = len(page) < self.scan_page
            if wrapped and start is not None and page and page[-1] >= start:
                page, last = [task_ref for task_ref in page if task_ref <= start], True
            found += await self.engine.claimable(page)
            if not last:
                after = page[-1]
            elif wrapped or start is None:  # read once round: the next scan starts where this one did
                after = start
                break
            else:
                after, wrapped = None, True
        self._cursor = after
        return found

    def _start(self, claim: Claim) -> None:
        # in the worker's context, also when run_claimed() is called from a tools/call: a background
        # tool sees no request, session or caller of the submitting request (the runner sets its own)
        context = None if self._context is None else self._context.copy()
        name = f"kvstores task {label(claim.task_ref)}"
        task = asyncio.get_running_loop().create_task(self._run(claim), name=name, context=context)
        self.running[claim.task_ref] = task

        def done(_: asyncio.Task[None]) -> None:
            self.running.pop(claim.task_ref, None)
            if self._hints or self._full_scan:  # a slot is free for what waits (a lone finish lists nothing)
                self._wake.set()

        task.add_done_callback(done)

    async def _run(self, claim: Claim) -> None:
        """Run one claimed task: the tool beside its lease's heartbeat, then its outcome, fenced."""
        attributes = {
            "kvstores.task": label(claim.task_ref),
            "kvstores.task.tool": claim.record.tool,
            "kvstores.task.attempt": claim.record.attempts,
            "kvstores.worker": self.engine.worker_id,
        }
        with span("kvstores.tasks run", attributes):
            await self._run_claimed(claim)

    async def _run_claimed(self, claim: Claim) -> None:
        tool: asyncio.Task[Outcome] = asyncio.get_running_loop().create_task(self.execute(claim, self.engine))
        self._tools[claim.task_ref] = tool
        beat = asyncio.get_running_loop().create_task(self._heartbeat(claim, tool))
        try:
            outcome = await tool
        except Exception as exc:  # the run itself broke (not the tool: execute turns its errors into outcomes)
            logger.exception("tasks: running task %s failed", label(claim.task_ref))
            message = f"the worker could not run the task: {type(exc).__name__}: {exc}"
            outcome = Outcome(TaskState.FAILED, {"error": {"code": -32603, "message": message}, "message": message})
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                await self._release(claim)  # the worker stops: the task runs again elsewhere at once
                raise
            return  # the task was cancelled (or its lease lost): nothing of this run is written
        finally:
            self._tools.pop(claim.task_ref, None)
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        if not await self.engine.finish(claim, outcome.state, **outcome.fields):
            logger.warning("tasks: the lease of task %s was lost; this run's outcome is dropped", label(claim.task_ref))

    async def _release(self, claim: Claim) -> None:
        """Give the task back within a second, or leave it to its lease (the store may be down)."""
        try:
            await asyncio.wait_for(asyncio.shield(self.engine.release(claim)), _RELEASE_SECONDS)
        except (TimeoutError, KVStoreError, OSError) as exc:
            logger.warning(
                "tasks: could not give back task %s (%s); it runs again after its lease", label(claim.task_ref), exc
            )

    async def _heartbeat(self, claim: Claim, tool: asyncio.Task[Outcome]) -> None:
        """Keep the lease while the tool runs; cancel the tool once the lease is lost."""
        await keep(functools.partial(self.engine.heartbeat, claim), self.engine.lease, name=label(claim.task_ref))
        if not tool.done():
            logger.warning(
                "tasks: task %s is no longer ours (cancelled, or re-run after our lease lapsed)", label(claim.task_ref)
            )
            tool.cancel()
