"""In-process signals: a MemoryStore (and ``sqlite://:memory:``) is private to one process."""

from __future__ import annotations

from kvstores._signal_host import SignalHost, Transport


class MemoryTransport(Transport[SignalHost]):
    """Delivers each message to this channel's receivers at once, in publish order."""

    async def listen(self, name: str) -> None:
        """Nothing to set up."""

    async def unlisten(self, name: str) -> None:
        """Nothing to tear down."""

    async def publish(self, name: str, message: str) -> None:
        self.sink.deliver(name, message)
