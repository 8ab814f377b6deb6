"""StoreSubscriptionBus: the MCP SDK's ``SubscriptionBus`` over any kvstores store, across replicas.

::

    from mcp.server.mcpserver import MCPServer
    from kvstores.subscriptions import StoreSubscriptionBus

    bus = StoreSubscriptionBus(store)                 # async-closable, like a store
    server = MCPServer("app", subscriptions=bus)      # or lowlevel: on_subscriptions_listen=ListenHandler(bus)

A publish on any replica reaches the ``subscriptions/listen`` streams of every replica whose
bus is on the same backend namespace: the event goes to this replica's listeners at once
(exactly once: the bus ignores its own echo), then as one small JSON message on the store's
signal channel (:mod:`kvstores.signals`) to the others. Filtering and subscription-id stamping
stay in the SDK's ``ListenHandler``; listeners run synchronously on the event loop and one that
raises is logged, never raised into the bus; buffers are the SDK's (bounded per stream) and the
channel's (bounded).

Delivery is the SDK's: fire-and-forget, no replay. While the backend is down, events
published elsewhere are lost (a publish that cannot reach the backend is logged and still
delivered locally); the channel reconnects by itself and the bus carries on, so a backend
restart costs at most the events published while it was down. Events are level triggers
("this changed, refetch"): clients that must not miss one re-listen and refetch, as the spec says.

FastMCP (4.2) has no seam for a subscription bus (it does not serve ``subscriptions/listen``):
use the SDK's ``MCPServer`` or lowlevel ``Server`` for this.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final

import anyio.lowlevel
from mcp.shared.subscriptions import (
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)

from kvstores import signals
from kvstores.errors import KVStoreError

__all__ = ["CHANNEL", "StoreSubscriptionBus"]

logger = logging.getLogger(__name__)

CHANNEL: Final = "mcp.subscriptions"
"""The signal channel's name the buses use unless told another."""

_KINDS: Final[dict[str, ServerEvent]] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


def _encoded(origin: str, event: ServerEvent) -> str:
    if isinstance(event, ResourceUpdated):
        return json.dumps({"o": origin, "k": "resource", "u": event.uri})
    for kind, instance in _KINDS.items():
        if type(event) is type(instance):
            return json.dumps({"o": origin, "k": kind})
    raise TypeError(f"not a ServerEvent: {event!r}")


def _decoded(message: str) -> tuple[str, ServerEvent]:
    """(origin, event) of a message; ValueError when it is not one of ours."""
    data = json.loads(message)
    if not isinstance(data, dict) or not isinstance(data.get("o"), str):
        raise ValueError("not a bus message")
    kind = data.get("k")
    if kind == "resource" and isinstance(data.get("u"), str):
        return data["o"], ResourceUpdated(uri=data["u"])
    if isinstance(kind, str) and kind in _KINDS:
        return data["o"], _KINDS[kind]
    raise ValueError(f"unknown event kind {kind!r}")


class StoreSubscriptionBus:
    """The SDK's ``SubscriptionBus`` (publish / subscribe) shared by every replica on ``store``.

    ``channel``: the signal channel's name, to run several independent buses on one store.
    Closing the bus never closes the store.
    """

    def __init__(self, store: Any, *, channel: str = CHANNEL) -> None:
        self._store = store  # the channel holds it weakly; StoreSubscriptionBus(open_store(url)) must keep it
        self._signals = signals.channel(store)
        self._channel = channel
        self._origin = secrets.token_hex(8)
        self._listeners: dict[object, Callable[[ServerEvent], None]] = {}
        self._unlisten: Callable[[], None] | None = None
        self._starting: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Start receiving other replicas' events (``subscribe`` and ``async with`` do it; idempotent)."""
        if self._unlisten is None and not self._closed:
            unlisten = await self._signals.listen(self._channel, self._received, self._gap)
            if self._unlisten is None and not self._closed:
                self._unlisten = unlisten
            else:
                unlisten()

    async def publish(self, event: ServerEvent) -> None:
        """Deliver ``event`` to this replica's listeners, then send it to every other replica."""
        self._deliver(event)
        message = _encoded(self._origin, event)
        try:
            await self._signals.publish(self._channel, message)
        except (KVStoreError, ValueError) as exc:  # unreachable backend, or a URI too long for a signal
            logger.warning("event %r reached this replica only: %s", event, exc)
        await anyio.lowlevel.checkpoint()

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        """Register ``listener`` and return an idempotent unsubscribe callable."""
        token = object()
        self._listeners[token] = listener
        if self._unlisten is None and self._starting is None and not self._closed:
            self._starting = asyncio.get_running_loop().create_task(self._start_quietly())

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe

    async def aclose(self) -> None:
        """Stop receiving other replicas' events; closing twice is fine."""
        self._closed = True
        self._listeners.clear()
        if self._starting is not None:
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None

    async def __aenter__(self) -> StoreSubscriptionBus:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _start_quietly(self) -> None:
        try:
            await self.start()
        except Exception:
            logger.exception("the subscription bus could not start receiving other replicas' events")
        finally:
            self._starting = None

    def _received(self, message: str) -> None:
        try:
            origin, event = _decoded(message)
        except ValueError as exc:  # json.JSONDecodeError included
            logger.warning("dropped an undecodable subscription bus message: %s", exc)
            return
        if origin != self._origin:  # our own publishes were delivered locally already
            self._deliver(event)

    def _gap(self) -> None:
        logger.warning("the subscription bus may have missed events from other replicas (backend reconnected)")

    def _deliver(self, event: ServerEvent) -> None:
        for listener in list(self._listeners.values()):
            try:
                listener(event)
            except Exception:  # fan-out boundary: isolate listeners from each other
                logger.exception("subscription listener raised; continuing")
