"""StoreSubscriptionBus: the SDK's MCPServer on three replicas sharing one backend, clients listening on each."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from mcp.client.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated, ServerEvent, ToolsListChanged

from kvstores import signals
from kvstores.subscriptions import StoreSubscriptionBus
from tests.support import Backend, marker
from tests.support.events import serving
from tests.support.fixtures import private_server, skip_or_fail

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_signal_task_left")]

REPLICAS = 3


def _replica(bus: StoreSubscriptionBus, number: int) -> MCPServer:
    server = MCPServer(f"replica-{number}", subscriptions=bus)

    @server.tool()
    async def touch(uri: str, ctx: Context) -> str:
        """Publish that ``uri`` and the resource list changed, and that the tools did when asked."""
        await ctx.notify_resource_updated(uri)
        await ctx.notify_resources_changed()
        if uri.endswith("tools"):
            await ctx.notify_tools_changed()
        return uri

    return server


async def _collect(client: Client, into: list[ServerEvent], ready: asyncio.Event, **wanted: Any) -> None:
    async with client.listen(**wanted) as subscription:
        ready.set()
        async for event in subscription:
            into.append(event)


async def _until(predicate: Any, within: float = 20.0) -> None:
    async with asyncio.timeout(within):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)


async def test_every_client_of_every_replica_gets_what_its_filter_asks(
    backend: Backend, namespace: str, store: Any
) -> None:
    try:
        signals.channel(store)
    except TypeError as exc:
        skip_or_fail(marker(backend.name), str(exc))
    stores = [store] + [await backend.open(namespace) if backend.persistent else store for _ in range(REPLICAS - 1)]
    try:
        await _every_client_gets_what_its_filter_asks(stores)
    finally:
        for each in stores[1:]:
            if each is not store:
                await each.aclose()


async def _every_client_gets_what_its_filter_asks(stores: list[Any]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        buses = [await stack.enter_async_context(StoreSubscriptionBus(each)) for each in stores]
        urls = [
            await stack.enter_async_context(serving(_replica(bus, n).streamable_http_app()))
            for n, bus in enumerate(buses)
        ]
        resources: list[list[ServerEvent]] = []
        tools: list[list[ServerEvent]] = []
        tasks = []
        for url in urls:
            for into, wanted in (
                (resources, {"resources_list_changed": True, "resource_subscriptions": ["res://0", "res://2tools"]}),
                (tools, {"tools_list_changed": True}),
            ):
                client = await stack.enter_async_context(Client(url))
                events: list[ServerEvent] = []
                into.append(events)
                ready = asyncio.Event()
                tasks.append(asyncio.create_task(_collect(client, events, ready, **wanted)))
                await asyncio.wait_for(ready.wait(), 20)
        callers = [await stack.enter_async_context(Client(url)) for url in urls]
        for number, caller in enumerate(callers):  # one publish from each replica
            await caller.call_tool("touch", {"uri": f"res://{number}" + ("tools" if number == 2 else "")})
        expected_resources = {ResourceUpdated("res://0"), ResourceUpdated("res://2tools"), ResourcesListChanged()}
        await _until(lambda: all(expected_resources <= set(events) for events in resources))
        await _until(lambda: all(ToolsListChanged() in events for events in tools))
        await asyncio.sleep(0.5)  # anything that should not come has had time to
        for events in resources:
            assert set(events) == expected_resources  # never res://1, never a tools event
            updates = [event for event in events if isinstance(event, ResourceUpdated)]
            assert sorted(event.uri for event in updates) == ["res://0", "res://2tools"]  # exactly once each
        for events in tools:
            assert events == [ToolsListChanged()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _bus_recovers(stores: list[Any], stop: Any, start: Any) -> None:
    """Three buses; the backend goes down and comes back; every bus delivers again without a restart."""
    received: list[list[ServerEvent]] = [[] for _ in stores]
    async with contextlib.AsyncExitStack() as stack:
        buses = [await stack.enter_async_context(StoreSubscriptionBus(each)) for each in stores]
        for bus, events in zip(buses, received):
            bus.subscribe(events.append)
        await buses[0].publish(ResourceUpdated("before"))
        await _until(lambda: all(ResourceUpdated("before") in events for events in received))
        await asyncio.to_thread(stop)
        await buses[1].publish(ResourceUpdated("while-down"))  # logged; reaches replica 1 only
        assert ResourceUpdated("while-down") in received[1]
        await asyncio.to_thread(start)
        after = 0

        def everyone_heard() -> bool:
            return all(ResourceUpdated(f"after-{after}") in events for events in received)

        async with asyncio.timeout(30):  # publishes until every replica hears one: the bus is back
            while True:
                await buses[2].publish(ResourceUpdated(f"after-{after}"))
                with contextlib.suppress(TimeoutError):
                    await _until(everyone_heard, within=1)
                    break
                after += 1
        for events in received:  # exactly once each, on every replica
            assert events.count(ResourceUpdated("before")) == 1


@pytest.mark.redis
async def test_bus_survives_a_redis_restart(tmp_path: Path) -> None:
    from kvstores.backends.redis import RedisStore
    from tests.support.redis import own_redis

    with own_redis(tmp_path) as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        stores = [RedisStore(url, prefix="bus") for _ in range(REPLICAS)]
        try:
            await _bus_recovers(stores, server.kill, server.start)
        finally:
            for each in stores:
                await each.aclose()


@pytest.mark.postgresql
async def test_bus_survives_a_postgresql_restart() -> None:
    from kvstores.backends.postgresql import PostgreSQLStore

    with private_server("postgresql") as server:
        stores = [PostgreSQLStore(server.url) for _ in range(REPLICAS)]
        try:
            await _bus_recovers(stores, server.stop, server.start)
        finally:
            for each in stores:
                await each.aclose()
