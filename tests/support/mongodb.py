"""MongoDB entries of the table: a real server from KVSTORES_MONGODB_URL, else SecantusDB.

SecantusDB (a MongoDB-wire server, test-only) runs in a subprocess so that a hang in it
can never block the test process. Each namespace is its own MongoDB collection (the
store's ``collection`` option) in one database, so a real server needs rights on one
database only; collections the tests created there are dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import tempfile
from typing import IO, Any

from pymongo import MongoClient
from pymongo.uri_parser import parse_uri

from kvstores.backends.mongodb import MongoDBStore
from tests.support import Backend, Unavailable, stop_process

URL_VARIABLE = "KVSTORES_MONGODB_URL"
"""Environment variable naming a real MongoDB to test against."""

TEST_DATABASE = "kvstores_tests"
"""Database the tests use when the URL names none."""

_SERVER_SCRIPT = """
import signal, sys, threading
from secantus import SecantusDBServer

server = SecantusDBServer(host="127.0.0.1", port=int(sys.argv[1]), storage_path=sys.argv[2], ttl_sweep_seconds=1)
server.start()
print(server.port, flush=True)
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())
stopping.wait()
server.stop()
"""


class SecantusServer:
    """A SecantusDB server in a subprocess on 127.0.0.1 (``port=0``: any free port)."""

    def __init__(self, port: int = 0, storage_path: str = ":memory:", start_timeout: float = 30.0) -> None:
        self.port = port
        self.storage_path = storage_path
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    @property
    def url(self) -> str:
        """``mongodb://127.0.0.1:PORT/``."""
        return f"mongodb://127.0.0.1:{self.port}/"

    def start(self) -> None:
        """Start the server (again on the same port after a stop); raise Unavailable if it cannot."""
        self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed by stop())
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SERVER_SCRIPT, str(self.port), self.storage_path],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], self.start_timeout)
        line = self._process.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            self._log.seek(0)
            reason = self._log.read()[-2000:] or "no output"
            self.stop()
            raise Unavailable(f"SecantusDB did not start: {reason}")
        self.port = int(line)

    def stop(self) -> None:
        """Stop the server gracefully, so that a storage path on disk stays intact."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process)
            if process.stdout is not None:
                process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


class _Shared:
    """The session's one SecantusDB, shared by both backends: the first starts it, the last stops it."""

    server: SecantusServer | None = None
    users = 0


def _acquire_secantus() -> SecantusServer:
    if _Shared.server is None:
        server = SecantusServer()
        server.start()
        _Shared.server = server
    _Shared.users += 1
    return _Shared.server


def _release_secantus() -> None:
    _Shared.users -= 1
    if _Shared.users == 0 and _Shared.server is not None:
        _Shared.server.stop()
        _Shared.server = None


class MongoDBBackend(Backend):
    """MongoDBStore from a URL: it creates and closes its own pymongo AsyncMongoClient."""

    name = "mongodb"
    server = True
    proxied = True
    password_user = "app"
    accepts_password = False  # SecantusDB refuses every user, and a MongoDB of KVSTORES_MONGODB_URL knows no "app"
    atomic_put_many = False  # an unordered bulk write may be partly applied
    process_operations = 500
    """A quarter of the default: SecantusDB is several times slower than the other servers (4 x 2,000
    operations take over 10 s there). A real MongoDB (KVSTORES_MONGODB_URL) runs the full count."""

    def start(self) -> None:
        self.server: SecantusServer | None = None
        self.created: set[str] = set()
        url = os.environ.get(URL_VARIABLE)
        if url is None:
            self.server = _acquire_secantus()
            url = self.server.url
        else:
            self.process_operations = Backend.process_operations
        self.slow_server = self.server is not None
        self.server_url = url
        self.database = str(parse_uri(url)["database"] or TEST_DATABASE)

    def stop(self) -> None:
        if self.server is not None:
            _release_secantus()
        elif self.created:
            self._drop_created()

    def _drop_created(self) -> None:
        with self._client() as client:
            database = client[self.database]
            for name in self.created:
                database.drop_collection(name)

    def _client(self) -> MongoClient[dict[str, Any]]:
        return MongoClient(self.server_url, serverSelectionTimeoutMS=5000)

    def options(self, namespace: str, options: dict[str, Any]) -> dict[str, Any]:
        """Store options isolating ``namespace``; explicit ``options`` win."""
        self.created.add(namespace)
        return {"database": self.database, "collection": namespace, **options}

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return self.server_url, self.options(namespace, {})

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        with self._client() as client:
            entries = client[store.database][store.mongo_collection]
            # the layout test_mongodb.py pins: _id = <length of the collection>:<collection><key>
            assert entries.update_one({"_id": f"7:default{key}"}, {"$set": {"v": raw}}).matched_count == 1


class MotorBackend(MongoDBBackend):
    """MongoDBStore on the session's one motor AsyncIOMotorClient, which the tests own."""

    name = "mongodb-motor"
    processes = False
    """Other processes open the "mongodb" row's URL: the client object is all this row adds."""

    def start(self) -> None:
        from motor.motor_asyncio import AsyncIOMotorClient

        super().start()
        self.client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
            self.server_url, serverSelectionTimeoutMS=5000
        )

    def stop(self) -> None:
        self.client.close()
        super().stop()

    async def open(self, namespace: str, **options: Any) -> MongoDBStore:
        # motor binds a client to the event loop of its first use and keeps no other per-loop
        # state; each test runs in a new loop, so rebind the client rather than open one per test
        # (a closed motor client's threads linger for half a second: the resource tests would see them)
        self.client._io_loop = asyncio.get_running_loop()
        return MongoDBStore(self.client, **self.options(namespace, options))
