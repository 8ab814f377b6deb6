"""Objects built on a store hold it: ``X(open_store(url))`` works as written, after garbage collection.

A store made inline and handed over is referenced by nothing but the object built on it; if that
object held it weakly (as the signal channel does, so that a store nobody uses can go), the store
would be collected and every cross-replica message dropped.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import cast

import pytest
from mcp.shared.auth import OAuthToken
from mcp.shared.subscriptions import ResourceUpdated, ServerEvent

from kvstores import open_store
from kvstores._codec import MAX_TTL_SECONDS
from kvstores.base import BaseStore
from kvstores.client import StoreTokenStorage
from kvstores.events import StoreEventStore
from kvstores.sessions import MAX_REFRESH_INTERVAL, SessionRegistry
from kvstores.subscriptions import StoreSubscriptionBus

pytestmark = pytest.mark.anyio


async def test_a_bus_on_an_inline_store_reaches_another_replica(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bus.db'}"
    received: list[ServerEvent] = []
    async with StoreSubscriptionBus(open_store(url)) as listening, StoreSubscriptionBus(open_store(url)) as publishing:
        listening.subscribe(received.append)
        gc.collect()
        async with asyncio.timeout(15):
            while not received:  # the listener may start after a first publish: send until one arrives
                await publishing.publish(ResourceUpdated(uri="file:///a"))
                await asyncio.sleep(0.2)
    assert ResourceUpdated(uri="file:///a") in received


async def test_registry_event_store_and_client_slots_on_inline_stores_keep_working(tmp_path: Path) -> None:
    registry = SessionRegistry(open_store(f"sqlite:///{tmp_path / 'sessions.db'}"))
    events = StoreEventStore(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    tokens = StoreTokenStorage(open_store(f"sqlite:///{tmp_path / 'tokens.db'}"), key="https://mcp.example/mcp")
    gc.collect()
    await tokens.set_tokens(OAuthToken(access_token="a", token_type="Bearer"))
    assert (await tokens.get_tokens()) == OAuthToken(access_token="a", token_type="Bearer")
    assert await registry.register("s1", owner=None, handshake=None, protocol_version=None)
    record = await registry.get("s1")
    assert record is not None and not record.terminated
    assert await events.store_event("stream", None)
    for store in (registry.store, events.store, tokens.store):
        await cast(BaseStore, store).aclose()


def test_idle_ttl_beyond_what_a_store_keeps_is_refused_at_construction() -> None:
    largest = MAX_TTL_SECONDS - MAX_REFRESH_INTERVAL
    assert SessionRegistry(open_store("memory://"), idle_ttl=largest).record_ttl <= MAX_TTL_SECONDS
    for wrong in (largest + 1, MAX_TTL_SECONDS, 0, -1.0):
        with pytest.raises(ValueError, match="idle_ttl"):
            SessionRegistry(open_store("memory://"), idle_ttl=wrong)
