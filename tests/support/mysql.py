"""MariaDB/MySQL for the tests: a server at KVSTORES_MYSQL_URL, or a private MariaDB of the session's own.

The table's row reaches the server at KVSTORES_MYSQL_URL when it is set (a user allowed to
create and drop databases and users); otherwise it starts a private MariaDB server
(:class:`MariaDBServer`: ``mariadb-install-db`` into a temporary folder, then ``mariadbd
--user=mysql`` on a free loopback port; the machine's own server, if any, is never used) once
per session and removes it at the end. Either way the row does what every SQL row does there
(tests/support/sql.py). The fault tests run private servers of their own, which they stop, kill and restart.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import anyio
import asyncmy

from kvstores.backends.mysql import MySQLStore
from tests.support import Unavailable, free_port, stop_process, with_user_info
from tests.support.sql import SQLBackend

URL_VARIABLE = "KVSTORES_MYSQL_URL"
"""Environment variable naming a server (and a database to connect to) the tests use instead of a private one."""

MAX_ALLOWED_PACKET = "64M"
"""The private server's max_allowed_packet: a value of kvstores' largest size travels in one statement."""


def connect_options(url: str) -> dict[str, Any]:
    """asyncmy.connect's arguments for ``mysql://user:password@host:port/database``."""
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "database": unquote(parts.path.lstrip("/")) or None,
        "autocommit": True,
        "charset": "utf8mb4",
        "binary_prefix": True,
        "connect_timeout": 10,
    }


class _PortTaken(Exception):
    """The private server's port was taken by another process before the server could bind it."""


def _program(*names: str) -> str:
    for name in names:
        for folder in (None, "/usr/sbin", "/usr/bin"):
            found = shutil.which(name, path=folder)
            if found:
                return found
    raise Unavailable(f"none of {', '.join(names)} is installed (Debian's mariadb-server package)")


class MariaDBServer:
    """A private MariaDB server on 127.0.0.1 in a temporary folder; data survives stop/start and kills.

    Its ``root`` user (from 127.0.0.1, no password) may do anything; ``url`` is its ``test`` database.
    """

    def __init__(self) -> None:
        self.daemon = _program("mariadbd", "mysqld")
        self.install = _program("mariadb-install-db", "mysql_install_db")
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="kvstores-mariadb-"))
        self.data = self.folder / "data"
        self.tmp = self.folder / "tmp"  # its own: servers installed at once (test workers) collide in /tmp
        self.tmp.mkdir()
        self.log = self.folder / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._started = False  # once it has run, its port is the one stores name: it stays
        self._user: list[str] = []
        if os.geteuid() == 0:  # the server refuses to run as root: it runs as mysql, which owns the folder
            self._user = ["--user=mysql"]
            try:
                shutil.chown(self.folder, "mysql", "mysql")
                shutil.chown(self.tmp, "mysql", "mysql")
            except LookupError as exc:
                shutil.rmtree(self.folder, ignore_errors=True)
                raise Unavailable("no mysql user to run the server as (Debian's mariadb-server makes it)") from exc
        init = self.folder / "init.sql"  # run at every start: root over TCP, and a database to connect to
        init.write_text(
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';\n"
            "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n"
            "CREATE DATABASE IF NOT EXISTS test;\n"
        )

    @property
    def url(self) -> str:
        """A URL of the server's ``test`` database, as ``root``."""
        return f"mysql://root@127.0.0.1:{self.port}/test"

    def init(self) -> None:
        """Create the data folder."""
        command = [
            self.install,
            "--no-defaults",
            *self._user,
            f"--datadir={self.data}",
            f"--tmpdir={self.tmp}",
            "--skip-test-db",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.folder)
        if result.returncode != 0:
            raise Unavailable(f"mariadb-install-db failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")

    def start(self, timeout: float = 60) -> None:
        """Start the server (again, after a stop) and wait until it accepts connections.

        The port was free when :func:`free_port` chose it, but another test worker may have taken
        it since: a first start that finds it in use moves to another (a restart keeps its port,
        which the stores on it name).
        """
        for attempt in range(3):
            try:
                self._start(timeout)
                self._started = True
                return
            except _PortTaken:
                if self._started or attempt == 2:
                    raise Unavailable(f"port {self.port} stayed in use") from None
                self.port = free_port()

    def _start(self, timeout: float) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        logged = self.log.stat().st_size if self.log.exists() else 0
        command = [
            self.daemon,
            "--no-defaults",
            *self._user,
            f"--datadir={self.data}",
            f"--tmpdir={self.tmp}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.folder / 'mysqld.sock'}",
            f"--pid-file={self.folder / 'mysqld.pid'}",
            f"--log-error={self.log}",
            f"--init-file={self.folder / 'init.sql'}",
            f"--max-allowed-packet={MAX_ALLOWED_PACKET}",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2",  # the tests need speed, not durability of the last second
            "--max-connections=500",
        ]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.folder
        )
        deadline = time.monotonic() + timeout
        while True:  # until the server says it is ready (then it holds the port), or exits
            log = self.log.read_bytes()[logged:].decode(errors="replace") if self.log.exists() else ""
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.crash()
                if "Address already in use" in log:
                    raise _PortTaken
                raise Unavailable(f"mariadbd did not start:\n{log[-2000:]}")
            if "ready for connections" in log:
                run_sql(self.url, "SELECT 1")
                return
            time.sleep(0.1)

    def stop(self) -> None:
        """A clean shutdown (clients disconnected)."""
        if self.process is not None:
            stop_process(self.process, timeout=60)
            self.process = None

    def crash(self) -> None:
        """SIGKILL the server (a crash)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    @property
    def running(self) -> bool:
        """True while the server process runs."""
        return self.process is not None and self.process.poll() is None

    def remove(self) -> None:
        """Kill the server if it runs, and delete its folder."""
        self.crash()
        shutil.rmtree(self.folder, ignore_errors=True)


class MySQLBackend(SQLBackend):
    """MySQLStore from a URL, on a database of the session's own; one table per namespace."""

    name = "mysql"
    store_class = MySQLStore
    quote = "`"
    sql_error = asyncmy.MySQLError
    create_options = " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    driver_errors = (OSError, asyncmy.MySQLError)

    @classmethod
    async def connect(cls, url: str) -> Any:
        return await asyncmy.connect(**connect_options(url))

    @staticmethod
    async def fetch(connection: Any, sql: str, arguments: Sequence[Any]) -> list[Any]:
        async with connection.cursor() as cursor:
            await cursor.execute(sql, arguments or None)
            return list(await cursor.fetchall()) if cursor.description else []

    @staticmethod
    async def close(connection: Any) -> None:
        connection.close()

    def start(self) -> None:
        self.own_server: MariaDBServer | None = None
        self.users: set[str] = set()  # made by url_with_password, dropped by stop
        self.server_url = os.environ.get(URL_VARIABLE, "")
        if not self.server_url:
            self.own_server = MariaDBServer()
            try:
                self.own_server.init()
                self.own_server.start()
            except Unavailable:
                self.own_server.remove()
                raise
            self.server_url = self.own_server.url
        try:
            self.create_database()
        except (OSError, asyncmy.MySQLError) as exc:
            if self.own_server is not None:
                self.own_server.remove()
            raise Unavailable(f"no MariaDB/MySQL at {urlsplit(self.server_url).netloc}: {exc}") from exc

    def stop(self) -> None:
        try:
            for user in self.users:
                self.run_sql(self.server_url, ("DROP USER IF EXISTS %s@'%%'", (user,)))
            self.drop_database()
        finally:
            if self.own_server is not None:
                self.own_server.remove()

    def url_with_password(self, namespace: str, password: str) -> str:
        """As a user of the row's database created with ``password`` (no server user takes any password)."""
        user = "kvstores_" + hashlib.sha256(password.encode()).hexdigest()[:12]
        database = urlsplit(self.database_url).path.lstrip("/")
        self.run_sql(
            self.server_url,
            ("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (user, password)),
            (f"GRANT ALL PRIVILEGES ON `{database}`.* TO %s@'%%'", (user,)),
        )
        self.users.add(user)
        return with_user_info(self.full_url(namespace), f"{user}:{quote(password, safe='')}")

    @staticmethod
    def private_server() -> MariaDBServer:
        return MariaDBServer()

    async def prepared(self, store: Any) -> int:
        async with store.pool.acquire() as connection, connection.cursor() as cursor:
            await cursor.execute("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'")
            ((_, count),) = await cursor.fetchall()
            return int(count)

    async def waiting_on_locks(self) -> int:
        # the store's statements waiting (asyncmy formats no % when a statement has no arguments)
        sql = "SELECT count(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'INSERT INTO%' AND COMMAND = 'Query'"
        (found,) = await anyio.to_thread.run_sync(run_sql, self.database_url, sql)
        return int(found[0][0])

    def lock_timeout(self, seconds: float) -> dict[str, Any]:
        return {"init_command": f"SET SESSION innodb_lock_wait_timeout = {max(1, round(seconds))}"}


run_sql = MySQLBackend.run_sql
table_name = MySQLBackend.table_name
