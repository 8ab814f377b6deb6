"""kvstores._lease: the renewal loop's options and the presence lease (the task engine's leases: test_tasks*)."""

from __future__ import annotations

import asyncio
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
