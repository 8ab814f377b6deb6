"""The one fix kvstores makes to asyncpg: a TLS probe cut short no longer logs an error from the collector.

asyncpg opens every connection, and every cancel request it sends for a statement cut short,
with a TLS probe (an SSLRequest: ``sslmode=prefer``, libpq's default, and stronger modes). Its
probe protocol, ``asyncpg.connect_utils.TLSUpgradeProto``, reports the server's answer or a lost
connection through a future, ``on_data``. When the task opening the connection is cancelled just
after the socket connects (asyncpg cancels its own cancel requests when it closes or terminates
a connection; a caller's deadline can land there too), the transport is closed, the future gets
``ConnectionError('unexpected connection_lost() call')``, and nobody awaits it: asyncio logs
"Future exception was never retrieved" with a traceback at ERROR when the future is collected
(MagicStack/asyncpg#1211 and #1310, open upstream). Seen here as a store closed with calls in
flight printing that traceback (tests/test_resources.py, ``test_aclose_is_final``, on a loaded
machine), and by any deadline cutting a connect.

The fix marks the future's exception retrieved as it is set: an opener awaiting it still gets the
exception. It is applied to asyncpg's class once, when kvstores.backends.postgresql is imported,
so it holds for every asyncpg connection in the process; it changes nothing but that log line.
Fenced as every private name kvstores relies on: pyproject.toml caps asyncpg below its next minor
release and tests/test_private_names.py names the attribute.
"""

from __future__ import annotations

import asyncio
from typing import Any

from asyncpg import connect_utils

_made = connect_utils.TLSUpgradeProto.__init__  # asyncpg's own, taken once


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # marks it retrieved; whoever awaits the future still gets it


def _made_quiet(self: Any, *args: Any, **kwargs: Any) -> None:
    _made(self, *args, **kwargs)
    self.on_data.add_done_callback(_retrieve)


def quiet_cut_tls_probes() -> None:
    """Mark the exception of every asyncpg TLS probe retrieved as it is set (see the module); idempotent."""
    probe: Any = connect_utils.TLSUpgradeProto
    probe.__init__ = _made_quiet
