"""PostgreSQL for the tests: the machine's server, and private servers the fault tests stop and start.

The table's row reaches the server at KVSTORES_POSTGRESQL_URL (default: the machine's
PostgreSQL 15 on 127.0.0.1:5432, trust auth), creates a database of its own for the session
and drops it at the end; each namespace is a table in that database (the store's ``table``
option). :class:`PostgresServer` runs a private server (``initdb`` / ``pg_ctl`` from
``pg_config --bindir``, as the ``postgres`` user when the tests run as root: the server
refuses root) in a temporary folder on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.support import Backend, Unavailable, free_port, run_in_thread

URL_VARIABLE = "KVSTORES_POSTGRESQL_URL"
"""Environment variable naming the server (and a database to connect to) the tests use."""

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The machine's PostgreSQL, as the machines of this project run it."""


def server_url() -> str:
    """The URL of the server the tests use (the database in it is only connected to)."""
    return os.environ.get(URL_VARIABLE, DEFAULT_URL)


def with_database(url: str, database: str) -> str:
    """``url`` naming ``database`` instead of its own."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def run_sql(url: str, *statements: str | tuple[str, Sequence[Any]]) -> list[Any]:
    """Run each statement (SQL, or (SQL, arguments)) on one new connection; return each one's rows.

    Runs on a thread of its own with its own event loop, so that sync code (fixtures, other
    threads) and async tests alike can call it.
    """

    async def work() -> list[Any]:
        results: list[Any] = []
        connection = await asyncpg.connect(url, timeout=10)
        try:
            for statement in statements:
                sql, arguments = (statement, ()) if isinstance(statement, str) else statement
                results.append(await connection.fetch(sql, *arguments, timeout=30))
        finally:
            await connection.close()
        return results

    return run_in_thread(work, f"SQL on {urlsplit(url).netloc}")


def create_database(url: str, prefix: str = "kvstores_tests") -> str:
    """Create a database with a new name on the server of ``url``; return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    run_sql(url, f'CREATE DATABASE "{name}"')
    return with_database(url, name)


def drop_database(url: str, database_url: str) -> None:
    """Drop the database of ``database_url`` (disconnecting its clients) through ``url``."""
    name = urlsplit(database_url).path.lstrip("/")
    run_sql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def table_name(namespace: str) -> str:
    """The table of ``namespace``: the name itself when it is an identifier, else a digest of it."""
    if re.fullmatch(r"[a-z_][a-z0-9_]{0,54}", namespace):
        return namespace
    return "ns_" + hashlib.sha256(namespace.encode()).hexdigest()[:40]


class PostgreSQLBackend(Backend):
    """PostgreSQLStore from a URL, on a database of the session's own; one table per namespace."""

    name = "postgresql"
    server = True
    proxied = True
    sql = True
    driver_errors = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)

    def start(self) -> None:
        self.server_url = server_url()
        try:
            self.database_url = create_database(self.server_url)
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(f"no PostgreSQL at {self.server_url}: {exc}") from exc

    def stop(self) -> None:
        drop_database(self.server_url, self.database_url)

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        return self.database_url, {"table": table_name(namespace)}

    def rows_of(self, table: str, collection: str) -> dict[str, str]:
        (exists,) = run_sql(self.database_url, ("SELECT to_regclass($1) IS NOT NULL", (f'"{table}"',)))
        if not exists[0][0]:
            return {}
        sql = f'SELECT key, value FROM "{table}" WHERE collection = $1'
        (found,) = run_sql(self.database_url, (sql, (collection.encode(),)))
        return {bytes(key).decode(): value for key, value in found}

    @staticmethod
    def private_server() -> PostgresServer:
        return PostgresServer()

    def tagged(self, tag: str) -> dict[str, Any]:
        return {"server_settings": {"application_name": tag}}

    async def connections(self, tag: str) -> int | None:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
        (rows,) = await asyncio.to_thread(run_sql, self.database_url, (sql, (tag,)))
        return int(rows[0][0])

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        if not isinstance(raw, str):
            import pytest

            pytest.skip("PostgreSQLStore's value column is text: bytes and numbers cannot be put there")
        sql = f"UPDATE {store.table} SET value = $1 WHERE collection = $2 AND key = $3 RETURNING 1"
        (updated,) = run_sql(self.database_url, (sql, (raw, b"default", key.encode())))
        assert len(updated) == 1


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
