"""What a backend needs from the running event loop: a bound its driver cannot outlast, and release at its end.

Both are public for backend authors (README: Writing a backend): bound each call with
:class:`deadline`; :meth:`kvstores.base.BaseStore._release_with_loop` uses
:func:`release_with_loop`, and so can anything else that holds a loop-bound connection.

Cancels that Python 3.11 loses: its ``asyncio.wait_for`` swallows a cancel that arrives as its
awaitable completes (it returns the result; fixed in 3.12), so a task cancelled there runs on,
and whoever awaits it, or the loop closing, waits forever. Nothing in kvstores waits with
``wait_for``: :func:`wait_event` waits for an event, :func:`stop` ends a task it started, and a
loop that keeps running (a reader that reconnects) calls :func:`raise_if_cancelled` every round,
since drivers call ``wait_for`` inside (redis-py sending a command, asyncmy connecting).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import Any

__all__ = ["deadline", "raise_if_cancelled", "release_with_loop", "stop", "wait_event"]

_RECANCEL_SECONDS = 0.1
"""How often :class:`deadline` cancels again while the block it bounds has not left."""


class deadline:
    """``async with deadline(seconds)``: ``asyncio.timeout`` that a driver cannot outlast.

    ``asyncio.timeout`` cancels once. On Python 3.11 ``asyncio.wait_for`` swallows a cancel that
    arrives as its awaitable completes (fixed in 3.12), and drivers call it inside their connect
    and read paths (asyncmy's connect, for one), so a call could run on past its timeout: through
    a half-open handshake that was the server's connect_timeout, 10 s. This one cancels at the
    deadline and again every 0.1 s until the block leaves, then raises ``TimeoutError`` as
    ``asyncio.timeout`` does; a cancel from outside still propagates as ``CancelledError``.
    """

    __slots__ = ("_cancelling", "_handle", "_issued", "_seconds", "_task")

    def __init__(self, seconds: float) -> None:
        """Bound the block to ``seconds``."""
        self._seconds = seconds
        self._issued = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "deadline is used inside a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = asyncio.get_running_loop().call_later(self._seconds, self._expire)

    def _expire(self) -> None:
        self._issued += 1
        self._task.cancel()
        self._handle = asyncio.get_running_loop().call_later(_RECANCEL_SECONDS, self._expire)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._handle.cancel()
        if self._issued:
            remaining = self._task.cancelling()
            for _ in range(self._issued):  # ours, delivered or swallowed: withdraw them all
                remaining = self._task.uncancel()
            if exc_type is asyncio.CancelledError and remaining <= self._cancelling:
                raise TimeoutError from exc


async def _at_loop_end(release: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    """Suspended until the event loop finalizes it, then runs ``release``.

    asyncio finalizes the async generators still suspended as ``asyncio.run`` (or a Runner)
    ends, while the loop still runs (and any it finds unreachable before): that is where what
    nobody closed lets go of its connections, so the process can exit at once.
    """
    try:
        yield
    finally:
        await release()


async def release_with_loop(release: Callable[[], Awaitable[None]]) -> AsyncGenerator[None, None]:
    """Have the running loop run ``release`` as it shuts down; return the guard that arranges it.

    The caller keeps the guard (one nobody holds is finalized at once) and may ``aclose()`` it
    itself, which runs ``release`` then: so ``release`` must be idempotent.
    """
    guard = _at_loop_end(release)
    await anext(guard)
    return guard


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set, at most ``seconds``: True once it is set, False at the timeout.

    ``asyncio.wait_for(event.wait(), seconds)`` without its 3.11 flaw: a cancel that arrives as the
    event is set propagates. Always a checkpoint, as ``wait_for`` was, even when the event is set.
    """
    try:
        async with asyncio.timeout(seconds):
            await asyncio.sleep(0)
            await event.wait()
    except TimeoutError:
        return False
    return True


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` when the current task was cancelled and runs on: a cancel something swallowed.

    ``Task.cancelling()`` still counts a cancel that 3.11's ``wait_for`` dropped. For loops that stop
    only when cancelled; not for code that caught a cancel and cleans up (it counts that one too).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and return once it has ended; its exception, other than the cancel, is raised here.

    A cancel of the caller meanwhile propagates, but only once the task has ended: what the caller
    started never outlives it (``with suppress(CancelledError): await task`` swallowed that cancel).
    """
    task.cancel()
    interrupted: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted
    if not task.cancelled():
        task.result()
