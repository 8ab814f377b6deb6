"""Every helper of the project's tests; above all the table of backends the tests run against.

The package::

    __init__.py          the table (BACKENDS), the Backend contract, PrivateServer, free_port,
                         run_processes, run_in_thread, stop_process
    fixtures.py          the pytest side: rows of the table with their markers, the fixtures
                         (backend, namespace, store, peer_store), TableStores, skip_or_fail,
                         assert_connection_errors; tests/conftest.py registers it as a plugin
    local.py             memory and SQLite entries
    redis.py             the machine's Redis, a 3-master Cluster; RedisServer: a redis-server of a test's own
    mongodb.py           MongoDB (KVSTORES_MONGODB_URL) or a SecantusDB server, by pymongo and by motor
    sql.py               what the SQL-server entries share (SQLBackend), and the exercise of every operation
    postgresql.py        the machine's PostgreSQL, and private servers the fault tests stop and start
    mysql.py             MariaDB/MySQL (KVSTORES_MYSQL_URL) or a private MariaDB of the session's own,
                         and private servers the fault tests stop and crash
    haproxy.py           HAProxy from Debian's package in front of replicas (tests/test_replicas.py)
    faults.py            a fault-injecting TCP proxy on loopback (tests/test_faults.py)
    events.py            MCP servers, raw SSE and a failing store for the event-store tests
    sessions.py          durable-session tests: FastMCP servers in child processes, a client that picks one
    fastmcp_slots.py     FastMCP's store slots: a fake IdP, a scripted OAuth browser, loopback servers
    examples.py          the persistent_state example scripts run as processes
    check_targets.py     factories ``kvstores check`` is pointed at (tests/test_check.py)
    cli_targets.py       py-key-value stores as ``kvstores`` CLI targets
    workers.py           child processes of the crash, multi-process and SQL-server tests
    atomic_workers.py    child processes of the several-processes atomic-operations tests
    hypothesis_profiles.py  the "ci" (default) and "long" hypothesis profiles

This module imports neither pytest nor a driver: the child processes of workers.py import it
and must start fast (the crash test kills them at start-up).

Adding a backend = one ``tests/support/<backend>.py`` with a :class:`Backend` subclass + one
line in :data:`BACKENDS` (its marker also selects ``tests/test_<marker>.py`` for CI's rerun with
batching off: tests/conftest.py). Every test that takes the ``backend``, ``store`` or ``peer_store``
fixture, the conformance suites, the model test, the corrupt-data and multi-process tests
then run against it, and its marker selects or deselects it (``pytest -m "not mongodb"``).
A table entry (a :class:`Backend` subclass) implements:

- ``name``: the row's id, as in :data:`BACKENDS`.
- ``start()``: start or reach the service once per session; raise :class:`Unavailable` when it
  cannot be had (its tests are then skipped, or fail when KVSTORES_REQUIRE names the marker).
  ``stop()``: undo start() at the end of the session (drop what the tests created).
- ``url(namespace) -> (url, options)``: a URL and constructor options with which
  ``kvstores.open_store(url, **options)``, in this or another process, opens a store on
  ``namespace``: an isolated space (a key prefix, a database table or collection, a file) no
  other namespace sees. Two stores opened on one namespace share their data. A namespace is
  ``t`` + 12 hex digits, possibly followed by one of ``x``, ``*``, ``[x]`` or ``}`` (the tenants
  test in test_adversarial.py): quote or map it where the backend's names forbid such characters.
- ``open(namespace, **options)`` (async): a new store object on ``namespace``; ``options``
  override the store's constructor options. The default opens ``url(namespace)``; override it
  only to hand the store something a URL cannot carry (a client object).
- ``corrupt(store, key, raw)``: overwrite the stored value of ``key`` (default collection) with
  ``raw`` (a str, bytes or int) behind the store's back, so that reading it must raise
  DeserializationError; call ``pytest.skip`` for a ``raw`` the backend cannot hold.
- Attributes, when the defaults do not fit: ``persistent`` (False: each store object has its
  own data, so no peer_store, no tenants, no other process), ``processes`` (False: skip the
  several-processes test: nothing shared, or a row that differs from another only in the client
  object), ``process_operations`` (operations each process of that test runs), ``server``
  (True: the store talks to a server at a host and port), ``proxied`` (True: a loopback proxy can
  stand in for the row's one address, for the fault tests) and ``atomic_put_many`` (False: a
  put_many may be partly applied when the connection fails under it). Tests that run on "every
  persistent / networked / shared backend" pick their rows by these attributes
  (``fixtures.rows_with``), never by name, so a new backend joins them by its entry alone.
- For a ``proxied`` row (its URL names one server): ``password_user`` (a user its server accepts
  with any password) or an override of ``url_with_password(namespace, password)``, plus
  ``accepts_password``, ``slow_server`` and ``tls_url(url)`` where the defaults do not fit: the
  secrets test (tests/test_secrets_output.py) runs every command with a password in such URLs.
- For a store that keeps its entries in one table of an SQL server, a subclass of
  ``sql.SQLBackend`` (``sql = True``) with the driver's calls (``connect``, ``fetch``,
  ``close``), ``driver_errors``, ``sql_error``, what the server reports (``prepared``,
  ``waiting_on_locks``, ``lock_timeout``) and ``private_server()``: the server tests of
  tests/test_sql_servers.py (first use by several processes, a SIGKILLed writer, the table's
  name, schema versions, timeouts, a private server stopped, crashed and started) then run on
  the row.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import multiprocessing
import os
import random
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

T = TypeVar("T")

BACKENDS: dict[str, tuple[str, str]] = {
    "memory": ("memory", "tests.support.local:MemoryBackend"),
    "sqlite": ("sqlite", "tests.support.local:SQLiteBackend"),
    "redis": ("redis", "tests.support.redis:RedisBackend"),
    "redis-cluster": ("redis", "tests.support.redis:RedisClusterBackend"),
    "mongodb": ("mongodb", "tests.support.mongodb:MongoDBBackend"),
    "mongodb-motor": ("mongodb", "tests.support.mongodb:MotorBackend"),
    "postgresql": ("postgresql", "tests.support.postgresql:PostgreSQLBackend"),
    "mysql": ("mysql", "tests.support.mysql:MySQLBackend"),
}
"""Row id -> (pytest marker, "module:Class" of its entry). The marker also names the service
in KVSTORES_REQUIRE; classes are imported on first use, so a missing driver skips its rows."""


class Unavailable(Exception):
    """Raised when a service a test needs cannot be had on this machine."""


class PrivateServer(Protocol):
    """A server of a test's own, in a temporary folder, that the test may stop, crash and start."""

    @property
    def url(self) -> str:
        """A URL of a database on it that a store may use, as a user who may do anything."""

    @property
    def running(self) -> bool:
        """True while the server runs."""

    def init(self) -> None:
        """Create its data folder (once)."""

    def start(self) -> None:
        """Start it (again) and wait until it accepts connections; raise Unavailable when it cannot."""

    def stop(self) -> None:
        """A clean shutdown: clients disconnected, data kept."""

    def crash(self) -> None:
        """Stop it as a crash would: no shutdown; what was committed is recovered at the next start."""

    def remove(self) -> None:
        """Stop it if it runs and delete its folder."""


class Backend:
    """One entry of the table: how the tests reach one backend (the contract is in the module docstring)."""

    name = ""
    persistent = True
    """True when two store objects on one namespace share data (all but memory)."""
    processes = True
    """True when the several-processes test runs on this row."""
    process_operations = 2_000
    """Operations each process of the several-processes test runs."""
    server = False
    """True when the store talks to a server at a host and port (telemetry's ``server.address``)."""
    proxied = False
    """True when the row's URL names one TCP address a loopback proxy can stand in for (the fault tests)."""
    atomic_put_many = True
    """True when a put_many is all or nothing, also when the connection fails under it."""
    sql = False
    """True when the store keeps its entries in one table of an SQL server (tests/test_sql_servers.py)."""
    driver_errors: tuple[type[BaseException], ...] = ()
    """The driver's exceptions: a StoreConnectionError's ``__cause__`` is one of them (``sql`` rows)."""
    password_user: str | None = None
    """A user the server accepts with any password (no password set, or trust auth), which
    :meth:`url_with_password` names; a ``proxied`` row sets it or overrides that method."""
    accepts_password = True
    """False when the server refuses every user and password (SecantusDB): the secrets test then
    also reaches it with the password as a query option."""
    slow_server = False
    """True when the server is several times slower than the others (SecantusDB): tests that run
    many commands on it run fewer."""

    def start(self) -> None:
        """Start or reach the service; raise Unavailable when it cannot be had."""

    def stop(self) -> None:
        """Stop what start() started."""

    def url(self, namespace: str) -> tuple[str, dict[str, Any]]:
        """A URL and options that open a store on ``namespace``, from any process."""
        raise NotImplementedError(f"{self.name}: no URL opens its stores")

    def full_url(self, namespace: str) -> str:
        """One URL (what a command line takes) that opens a store on ``namespace``: the options of
        :meth:`url` in its query, a ``database`` option in its path."""
        url, options = self.url(namespace)
        options = dict(options)
        database = options.pop("database", None)
        if database is not None and urlsplit(url).path in ("", "/"):
            url = urlunsplit(urlsplit(url)._replace(path=f"/{database}"))
        if not options:
            return url  # as given: urlunsplit would turn sqlite:////abs.db into sqlite://abs.db
        return url + ("&" if "?" in url else "?") + urlencode(options)

    def url_with_password(self, namespace: str, password: str) -> str:
        """:meth:`full_url` with ``password`` in its user info, which the server accepts unless
        :attr:`accepts_password` is False (the secrets test; ``proxied`` rows)."""
        if self.password_user is None:
            raise NotImplementedError(f"{self.name}: its URLs carry no credentials")
        return with_user_info(self.full_url(namespace), f"{self.password_user}:{quote(password, safe='')}")

    def tls_url(self, url: str) -> str | None:
        """``url`` asking for TLS to the same server, which speaks none (None: no such URL)."""
        return None

    async def open(self, namespace: str, **options: Any) -> Any:
        """A new store object on ``namespace``: stores on one namespace share data."""
        from kvstores import open_store

        url, defaults = self.url(namespace)
        return open_store(url, **{**defaults, **options})

    def corrupt(self, store: Any, key: str, raw: str | bytes | int) -> None:
        """Overwrite the stored value of ``key`` (default collection) with ``raw``, bypassing ``store``."""
        raise NotImplementedError(f"{self.name}: corrupt() is not written")

    def rows_of(self, table: str, collection: str) -> dict[str, str]:
        """key -> stored text of ``collection``'s rows in ``table`` of the row's database, read
        behind the stores' backs, expired rows included ({} before the table exists; ``sql`` rows)."""
        raise NotImplementedError(f"{self.name}: rows_of() is not written")

    @staticmethod
    def private_server() -> PrivateServer:
        """A new (not yet initialised) server of the backend's kind (``sql`` rows); Unavailable when none can be had."""
        raise NotImplementedError("private_server() is not written")

    def tagged(self, tag: str) -> dict[str, Any]:
        """Store options under which the server names the store's connections ``tag`` ({}: it cannot)."""
        return {}

    async def connections(self, tag: str) -> int | None:
        """How many connections named ``tag`` the server holds now; None when it cannot tell."""
        return None


def with_user_info(url: str, user_info: str) -> str:
    """``url`` naming ``user_info`` (``user:password``, quoted; "" for none) before its host."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user_info}@{host}" if user_info else host))


def marker(name: str) -> str:
    """The pytest marker of row ``name`` (also its service's name in KVSTORES_REQUIRE)."""
    return BACKENDS[name][0]


def entry_class(name: str) -> type[Backend]:
    """The class of row ``name``'s entry (imports its module, and so its driver)."""
    module_name, _, class_name = BACKENDS[name][1].partition(":")
    entry: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return entry


def load(name: str) -> Backend:
    """Instantiate the entry of row ``name``."""
    return entry_class(name)()


def is_required(service: str) -> bool:
    """True if KVSTORES_REQUIRE (comma-separated) names ``service`` (a marker, e.g. 'redis')."""
    return service in {name.strip() for name in os.environ.get("KVSTORES_REQUIRE", "").split(",")}


def _listen_ports() -> range:
    """The ports :func:`free_port` hands out in this process: this xdist worker's share of the 10,000 below
    the 10,000 just below Linux's ephemeral range (32768-60999 by default).

    The kernel gives outgoing connections (and ``bind(("127.0.0.1", 0))``) ports from the ephemeral range,
    so a port chosen there can be taken before the test's server binds it (it then exits with "address
    already in use": seen in CI). Below it, only other tests choose, and each xdist worker has its own
    share; a port plus :data:`tests.support.redis.CLUSTER_BUS_OFFSET` (10,000: a Cluster node's bus) lands in
    the 10,000 no one hands out.
    """
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768
    first = ephemeral - 20_000
    if first < 1_024:
        return range(0)  # an unusual range: the kernel chooses
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = 10_000 // max(workers, 1)
    start = first + share * (int(worker) % max(workers, 1) if worker.isdigit() else 0)
    return range(start, start + share)


_LISTEN_PORTS = _listen_ports()
_next_port = itertools.count(random.randrange(max(len(_LISTEN_PORTS), 1)))  # a child process starts elsewhere


def free_port(*, plus: int = 0) -> int:
    """A free loopback port, never the same twice in a process; with ``plus``, port + plus is free too (a Redis
    Cluster node's bus). Taken from this worker's share below the ephemeral range (:func:`_listen_ports`)."""
    for _ in range(100):
        if _LISTEN_PORTS:
            port = _LISTEN_PORTS[next(_next_port) % len(_LISTEN_PORTS)]
        else:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        if all(_bindable(candidate) for candidate in ((port, port + plus) if plus else (port,))):
            return port
    raise Unavailable(f"no free loopback port (pair {plus} apart)")


def _bindable(port: int) -> bool:
    if port >= 65_536:
        return False
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_processes(
    target: Callable[..., None], arguments: Sequence[tuple[Any, ...]], timeout: float = 300
) -> dict[Any, Any]:
    """Run ``target(*args, barrier, results)`` in one spawned process per ``args`` of ``arguments``.

    The processes share a barrier (so that they can start together) and a results queue on
    which each puts one ``(worker, outcome)``; returns the outcomes by worker. Every process is
    joined (killed after 30 s) whatever happens.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(arguments), timeout=120)
    results = context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for args in arguments]
    for process in processes:
        process.start()
    try:
        outcomes = dict(results.get(timeout=timeout) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
    codes = [process.exitcode for process in processes]
    assert codes == [0] * len(processes), f"exit codes {codes}; outcomes {outcomes}"
    return outcomes


def run_in_thread(work: Callable[[], Coroutine[Any, Any, T]], what: str, timeout: float = 60) -> T:
    """``await work()`` on a thread of its own with its own event loop, within ``timeout`` seconds,
    so that sync code (fixtures, other threads) and async tests alike can call it (``what`` names it)."""
    results: list[T] = []
    failure: list[BaseException] = []

    def thread() -> None:
        try:
            results.append(asyncio.run(work()))
        except BaseException as exc:
            failure.append(exc)

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join(timeout=timeout)
    if runner.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout:g} s")
    if failure:
        raise failure[0]
    return results[0]


def interruptible() -> None:
    """``preexec_fn`` of a child the test stops with SIGINT: Ctrl-C as at a terminal, however the tests run.

    A shell's background job (``.ci/run &``, a CI runner) ignores SIGINT, and children inherit an
    ignored signal: Python then installs no KeyboardInterrupt handler, asyncio.run none of its own,
    and the child never hears the SIGINT.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_process(process: subprocess.Popen[Any], timeout: float = 15) -> None:
    """Stop a server process: SIGTERM (a clean shutdown), then SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
