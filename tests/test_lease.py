"""kvstores._lease: the renewal loop's options and the presence lease (the task engine's leases: test_tasks*)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from kvstores._lease import PresenceLease, RenewalFailed, keep
from kvstores.backends.memory import MemoryStore

pytestmark = pytest.mark.anyio


async def test_keep_renews_at_once_when_asked() -> None:
    calls: list[str] = []

    async def renew() -> bool:
        calls.append("renew")
        return False

    await asyncio.wait_for(keep(renew, 3600.0, name="a lease", at_once=True), 5)  # no 20-minute wait first
    assert calls == ["renew"]


async def test_keep_retries_a_renewal_that_reported_its_own_failure_quietly(caplog: pytest.LogCaptureFixture) -> None:
    results: list[bool | Exception] = [RenewalFailed("down"), RenewalFailed("down"), True, False]

    async def renew() -> bool:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    with caplog.at_level(logging.DEBUG, logger="kvstores.lease"):
        await asyncio.wait_for(keep(renew, 3600.0, name="a lease", every=0.01, at_once=True), 5)
    assert results == []
    assert [r for r in caplog.records if r.name == "kvstores.lease"] == []


async def test_a_presence_lease_is_its_key_and_lapses_by_the_holders_clock() -> None:
    now = [100.0]
    store = MemoryStore()
    lease = PresenceLease(store, "replica:r1", {"replica": "r1"}, 3.0, collection="c", clock=lambda: now[0])
    lease.start()
    assert not lease.lapsed(103.0) and lease.lapsed(103.5)
    assert await store.get("replica:r1", collection="c") is None  # start() writes nothing: the claim is renew()
    now[0] = 110.0
    await lease.renew()
    value, ttl = await store.ttl("replica:r1", collection="c")
    assert value == {"replica": "r1"} and ttl is not None and 0 < ttl <= 3.0
    assert not lease.lapsed(113.0) and lease.lapsed(113.5)
    await store.aclose()


@pytest.mark.parametrize("outcome", ["renewed", "failed"])
async def test_keep_ends_on_a_cancel_its_renewal_swallowed(outcome: str) -> None:
    """Python 3.11's wait_for, inside a driver's command, drops a cancel that lands as the command completes:
    the renewal returns (or fails) as if nothing happened. The loop must end all the same (a worker stopped
    the run: renewing on would keep a finished run's lease forever, as CI's 3.11 lane once saw)."""
    in_renewal = asyncio.Event()
    renewals = 0

    async def renew() -> bool:
        nonlocal renewals
        renewals += 1
        in_renewal.set()
        if renewals > 1:
            return True  # renewing on after the cancel: the defect (the assertions below say so)
        with contextlib.suppress(asyncio.CancelledError):  # swallowed, as 3.11's wait_for does when the
            await asyncio.Event().wait()  # command in flight completes as the cancel lands
        if outcome == "failed":
            raise ConnectionError("the store went away")
        return True

    task = asyncio.create_task(keep(renew, 3600.0, name="a lease", every=0.01, at_once=True))
    await in_renewal.wait()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)  # the loop ends at once; the bound only stops a defect
    if not done:
        task.cancel()  # a loop that renewed on stops at its next sleep
        await asyncio.wait([task])
    assert task.cancelled()
    assert renewals == 1, f"keep() renewed {renewals - 1} more times after its cancel"
