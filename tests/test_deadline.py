"""kvstores.loop.deadline: the PostgreSQL and MySQL stores' per-call bound holds even when a driver
swallows a cancel (Python 3.11's ``asyncio.wait_for`` does, when its awaitable completes as the
cancel arrives: asyncmy's connect ran on through a half-open handshake for the server's 10 s)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from kvstores.loop import deadline

pytestmark = pytest.mark.anyio


async def _swallow_one_cancel(then: float) -> str:
    """A driver step that eats the first cancel, as 3.11's wait_for can, then waits ``then`` s."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(30)
    await asyncio.sleep(then)
    return "done"


async def test_a_swallowed_cancel_still_ends_the_block_on_time() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        async with deadline(0.05):
            await _swallow_one_cancel(then=30)
    assert time.monotonic() - started < 2
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_asyncio_timeout_alone_would_have_run_on() -> None:
    """The failure the class exists for: asyncio.timeout cancels once, and the step runs to its end."""
    async with asyncio.timeout(0.05):
        assert await _swallow_one_cancel(then=0.3) == "done"
    task = asyncio.current_task()
    assert task is not None and task.uncancel() == 0  # what asyncio.timeout left behind, withdrawn


async def test_a_block_that_finishes_after_swallowing_returns_and_leaves_no_cancel_behind() -> None:
    async with deadline(0.05):
        assert await _swallow_one_cancel(then=0.01) == "done"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.2)  # no cancel arrives later either


async def test_a_block_within_its_time_is_untouched() -> None:
    """It runs to its end, and its timer dies with it: nothing cancels the task after the block."""
    steps = []
    async with deadline(0.1):
        await asyncio.sleep(0.01)
        steps.append("block")
    await asyncio.sleep(0.3)  # past the deadline: a timer left running would cancel this sleep
    steps.append("after")
    task = asyncio.current_task()
    assert steps == ["block", "after"]
    assert task is not None and task.cancelling() == 0


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    async def bounded() -> None:
        async with deadline(5):
            await asyncio.sleep(30)

    task = asyncio.create_task(bounded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_outside_cancel_after_expiry_is_not_taken_for_a_timeout() -> None:
    async def bounded() -> None:
        async with deadline(0.01):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                asyncio.current_task().cancel()  # type: ignore[union-attr]  # the caller cancels too
                raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(bounded())
