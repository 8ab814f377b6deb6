"""PostgreSQL for the tests: the machine's server, and private servers the fault tests stop and start.

The table's row reaches the server at KVSTORES_POSTGRESQL_URL (default: the machine's
PostgreSQL 15 on 127.0.0.1:5432, trust auth), and does what every SQL row does there
(tests/support/sql.py). :class:`PostgresServer` runs a private server (``initdb`` / ``pg_ctl`` from
``pg_config --bindir``, as the ``postgres`` user when the tests run as root: the server
refuses root) in a temporary folder on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from kvstores.backends.postgresql import PostgreSQLStore
from tests.support import Unavailable, free_port
from tests.support.sql import SQLBackend

URL_VARIABLE = "KVSTORES_POSTGRESQL_URL"
"""Environment variable naming the server (and a database to connect to) the tests use."""

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The machine's PostgreSQL, as the machines of this project run it."""


def server_url() -> str:
    """The URL of the server the tests use (the database in it is only connected to)."""
    return os.environ.get(URL_VARIABLE, DEFAULT_URL)


class PostgreSQLBackend(SQLBackend):
    """PostgreSQLStore from a URL, on a database of the session's own; one table per namespace."""

    name = "postgresql"
    store_class = PostgreSQLStore
    quote = '"'
    sql_error = asyncpg.PostgresError
    drop_options = " WITH (FORCE)"
    password_user = "postgres"  # trust auth
    driver_errors = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)

    @classmethod
    async def connect(cls, url: str) -> Any:
        return await asyncpg.connect(url, timeout=10)

    @staticmethod
    async def fetch(connection: Any, sql: str, arguments: Sequence[Any]) -> list[Any]:
        return list(await connection.fetch(sql, *arguments, timeout=30))

    @staticmethod
    async def close(connection: Any) -> None:
        await connection.close()

    def start(self) -> None:
        self.server_url = server_url()
        try:
            self.create_database()
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(f"no PostgreSQL at {self.server_url}: {exc}") from exc

    def stop(self) -> None:
        self.drop_database()

    @staticmethod
    def private_server() -> PostgresServer:
        return PostgresServer()

    def tagged(self, tag: str) -> dict[str, Any]:
        return {"server_settings": {"application_name": tag}}

    async def connections(self, tag: str) -> int | None:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        (rows,) = await asyncio.to_thread(run_sql, self.database_url, (sql, (tag,)))
        return int(rows[0][0])

    async def prepared(self, store: Any) -> int:
        async with store.pool.acquire() as connection:  # the pool's one connection
            return int(await connection.fetchval("SELECT count(*) FROM pg_prepared_statements"))

    async def waiting_on_locks(self) -> int:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        (rows,) = await asyncio.to_thread(run_sql, self.database_url, sql)
        return int(rows[0][0])

    def lock_timeout(self, seconds: float) -> dict[str, Any]:
        return {"server_settings": {"lock_timeout": str(round(seconds * 1000))}}


run_sql = PostgreSQLBackend.run_sql
table_name = PostgreSQLBackend.table_name


def bindir() -> Path:
    """The folder of the server's programs, as ``pg_config --bindir`` prints it."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        raise Unavailable("pg_config is not installed (PostgreSQL's server package)")
    folder = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
    if not (folder / "initdb").exists():
        raise Unavailable(f"no initdb in {folder}")
    return folder


class PostgresServer:
    """A private PostgreSQL server on 127.0.0.1 in a temporary folder; data survives stop/start."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-pg-"))
        self.data = self.folder / "data"
        self.log = self.folder / "server.log"
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:  # the server refuses to run as root
            if shutil.which("runuser") is None:
                raise Unavailable("running as root without runuser: cannot start PostgreSQL as postgres")
            shutil.chown(self.folder, "postgres", "postgres")
            self._as_postgres = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        """A URL of the server's ``postgres`` database, as the ``postgres`` role."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [*self._as_postgres, *command], capture_output=True, text=True, timeout=timeout, cwd=self.folder
        )
        if result.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise Unavailable(f"{Path(command[0]).name} failed: {result.stdout}{result.stderr}{log}")

    def init(self) -> None:
        """Create the data folder (trust auth, no fsync: the tests need speed, not durability)."""
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        """Start the server (again, after a stop) and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` disconnects the clients, ``immediate`` is a crash."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def crash(self) -> None:
        """An immediate shutdown: no checkpoint, so the next start recovers from the WAL."""
        self.stop("immediate")

    @property
    def running(self) -> bool:
        """True while the server runs (its pid file exists)."""
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        """Stop the server if it runs, and delete its folder."""
        if self.running:
            with contextlib.suppress(Unavailable):
                self.crash()
        shutil.rmtree(self.folder, ignore_errors=True)
