"""RedisStore's clients: made from a URL (standalone, Cluster or Sentinel), gated, retried, closed.

What :mod:`kvstores.backends.redis` says of URLs, timeouts and retries is done here: the retry
policy that never repeats an at-most-once command (:data:`AT_MOST_ONCE`), the :class:`Gate`
every command passes, the signal transport's own client (:func:`listener`), and
:func:`close_client`, which closes a Cluster's node connections too.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final, TypeVar, cast
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff

from kvstores.errors import StoreClosedError
from kvstores.loop import wait_event

__all__ = ["AT_MOST_ONCE", "Client", "Gate", "close_client", "connect", "listener"]

Client = Redis | RedisCluster
"""A redis-py asyncio client a store works through."""

_CLUSTER_SCHEME = "redis+cluster"
_SENTINEL_SCHEME = "redis+sentinel"
_SENTINEL_PORT: Final = 26379
_T = TypeVar("_T")

AT_MOST_ONCE: ContextVar[bool] = ContextVar("kvstores_redis_at_most_once", default=False)
"""True while the current task sends a command that must not be retried (see _Retry)."""


async def close_client(client: Client) -> None:
    """Close ``client`` and every connection it holds.

    redis-py's ``RedisCluster.aclose()`` closes nothing once a timeout or a connection error has
    marked the client for re-initialization (until its next command rebuilds the node table): its
    nodes' sockets would stay open until the garbage collector finds them. A cluster's nodes are
    closed here whatever that mark says (closing a closed node does nothing).
    """
    await client.aclose()
    if isinstance(client, RedisCluster):
        await client.nodes_manager.aclose()
        await client.nodes_manager.aclose("startup_nodes")


async def _keep() -> None:
    """Let go of a client the store shares with its signal transport: the store closes it."""


def _never(error: Exception) -> bool:
    return False


class _Retry(Retry):
    """redis-py's Retry, except for commands sent while ``AT_MOST_ONCE`` is set: never retried.

    Standalone clients retry through ``call_with_retry``; RedisCluster counts its own
    attempts with ``get_retries()``: both are covered.
    """

    def get_retries(self) -> int:
        return 0 if AT_MOST_ONCE.get() else super().get_retries()

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[_T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _T:
        if AT_MOST_ONCE.get():
            is_retryable = _never  # the error is raised at once; redis-py has dropped the connection
        return await super().call_with_retry(do, fail, is_retryable, with_failure_count)


def _unknown_option(exc: TypeError) -> ValueError:
    """The error for a URL option redis-py's constructors refuse (``exc`` names it)."""
    return ValueError(f"a Redis URL option is unknown to redis-py: {exc}")


def connect(url: str, timeout: float, max_connections: int, options: dict[str, Any]) -> tuple[Client, Sentinel | None]:
    """The client of ``url`` (and the Sentinel it asks, for a ``redis+sentinel://`` URL): nothing connects yet."""
    backoff = ExponentialBackoff(cap=0.5, base=0.05)
    options = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "max_connections": max_connections,
        **options,
    }
    scheme, separator, rest = url.partition("://")
    if scheme.lower() == _CLUSTER_SCHEME:
        # one retry: enough to follow a failover or a restarted node (it rediscovers the nodes)
        options.setdefault("retry", _Retry(backoff, 1))
        try:
            return RedisCluster.from_url(f"redis{separator}{rest}", **options), None
        except TypeError as exc:  # an option redis-py does not know
            raise _unknown_option(exc) from None
    # a refused or reset connection is retried (a restarted server); a timeout is not
    options.setdefault("retry", _Retry(backoff, 2, (redis_errors.ConnectionError,)))
    if scheme.lower() == _SENTINEL_SCHEME:
        return _connect_sentinel(url, options)
    pool = ConnectionPool.from_url(url, **options)
    try:  # redis-py takes any option here and fails at the first connect: fail now, nothing opened
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        raise _unknown_option(exc) from None
    return Redis.from_pool(pool), None


class _Sentinel(Sentinel):
    """redis-py's Sentinel, asking its sentinels for the primary one look-up at a time.

    redis-py's ``discover_master`` moves the sentinel that answered to the front of its list,
    after an await: two look-ups in flight at once (each new connection makes one, so a failover
    under load makes several) can write one sentinel's client over another's. The client that
    falls out of the list is never asked again, and ``aclose()`` never closes it: its sockets are
    left to the garbage collector. One look-up at a time keeps the list whole.
    """

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        super().__init__(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8.2
        self._looking_up = asyncio.Lock()

    async def discover_master(self, service_name: str) -> Any:
        """The primary's (host, port), as the first sentinel that knows it says."""
        async with self._looking_up:
            return await super().discover_master(service_name)


def _connect_sentinel(url: str, options: dict[str, Any]) -> tuple[Redis, Sentinel]:
    """A client of the primary of ``redis+sentinel://[user:password@]host:port[,...]/service[/db]``."""
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, has_password, password = credentials.partition(":")
    path = [unquote(segment) for segment in parts.path.split("/")[1:]]
    if not path or not path[0] or len(path) > 2 or not hosts:
        raise ValueError("expected redis+sentinel://host:port[,host:port...]/service_name[/db]")
    if parts.query:
        raise ValueError("redis+sentinel:// URLs take no options other than the store's own")
    sentinels = []
    for address in hosts.split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():  # no port: the sentinels' default
            host, port = address, str(_SENTINEL_PORT)
        sentinels.append((host.strip("[]"), int(port)))
    sentinel_options = options.pop("sentinel_kwargs", None) or {
        name: value for name, value in options.items() if name.startswith("socket_")
    }
    # each sentinel is asked once per look-up, the next one on failure: redis-py's default
    # (3 retries with backoff up to 10 s per sentinel) would hold a call for tens of seconds
    sentinel_options.setdefault("retry", Retry(NoBackoff(), 0))
    sentinel = _Sentinel(sentinels, sentinel_kwargs=sentinel_options)
    if username:
        options.setdefault("username", unquote(username))
    if has_password:
        options.setdefault("password", unquote(password))
    db = int(path[1]) if len(path) == 2 and path[1] else 0
    return cast(Redis, sentinel.master_for(path[0], db=db, **options)), sentinel


def listener(client: Client) -> tuple[Client, Callable[[], Awaitable[None]]]:
    """A client of ``client``'s server(s) for a signal transport's pub/sub connection, and what lets it go.

    A client with a pool of its own, so that closing the store never pulls the connection from
    under the reader (letting it go closes it); a Sentinel-managed client (its pool follows
    failovers) is the store's own, and letting it go does nothing.
    """
    if isinstance(client, RedisCluster):
        nodes = [ClusterNode(node.host, node.port) for node in client.startup_nodes]
        accepted = inspect.signature(RedisCluster).parameters
        options = {name: value for name, value in client.connection_kwargs.items() if name in accepted}
        cluster = RedisCluster(startup_nodes=nodes, **options)
        return cluster, functools.partial(close_client, cluster)
    pool = client.connection_pool
    if type(pool) is ConnectionPool:
        own_pool = ConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)
        own = Redis(connection_pool=own_pool)
        return own, functools.partial(close_client, own)
    return client, _keep


class Gate:
    """Entered around every command; the store's own clients get a bound, Clusters discovery.

    With ``limit``, at most that many commands run at once, so the client's pool (sized
    alike) never runs out of connections; the others wait in FIFO order. This costs a
    fraction of asyncio.Semaphore per command. redis-py's RedisCluster discovers its nodes
    on first use, and commands that race that discovery can find their connection closed
    under them, so on a Cluster each command first awaits ``initialize()`` (a no-op once done).
    """

    def __init__(self, limit: int | None, cluster: RedisCluster | None) -> None:
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._cluster = cluster
        self._inside = 0  # commands past the gate, not yet out
        self._closed = False
        self._left: asyncio.Event | None = None  # set when the last command leaves a closed gate
        self.used = False
        """True once a command has been sent: the client may hold connections from then on."""

    async def __aenter__(self) -> None:
        if self._closed:
            raise StoreClosedError("RedisStore is closed")
        self.used = True
        if self._free is not None:
            if self._free > 0:
                self._free -= 1
            else:
                await self._wait()
        self._inside += 1
        if self._cluster is not None:
            try:
                await self._cluster.initialize()
            except BaseException:
                self._leave()
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._leave()

    async def close(self, within: float) -> None:
        """Let no command in from now on, and wait (up to ``within`` seconds) for those inside to leave.

        Commands waiting for a slot fail with StoreClosedError.
        """
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(StoreClosedError("RedisStore is closed"))
        if self._inside:
            self._left = asyncio.Event()
            await wait_event(self._left, within)

    def _leave(self) -> None:
        self._inside -= 1
        if self._left is not None and not self._inside:
            self._left.set()
        self._release()

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot as it was cancelled: hand it on
            raise

    def _release(self) -> None:
        if self._free is None:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the next waiter
                return
        self._free += 1
