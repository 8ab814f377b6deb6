"""``kvstores bench --signals``: how fast an event stored by one replica reaches a follower on another.

Per target URL, per number of concurrent streams (``--streams``, default 1,64) and per pace,
two rows. Paced rows measure latency: each stream sends ``--rate`` events per second (default
10, a progress notification every 100 ms) for :attr:`SignalsPlan.paced_seconds`; burst rows
measure throughput: each stream sends ``--events`` events back to back, so their latencies
include the queueing of the burst. The two rows:

- ``signal``: the raw signal channel (:mod:`kvstores.signals`). Replica A publishes
  its messages on each stream's channel name; replica B's ``listen()``
  callbacks receive them. Latency: from A's ``publish()`` call to B's callback.
- ``follow``: the live event store (:class:`kvstores.events.StoreEventStore`, ``live=True``),
  driven directly, without HTTP. Replica A stores a JSON-RPC notification per event on each
  stream (then a final response); replica B runs ``follow_events_after`` from
  each stream's first event, as a resumed request on another replica does. Latency: from A's
  ``store_event`` call (the write included: its return cannot be the origin, a follower may
  read the event before A's call has returned) to B's send callback. On Redis and PostgreSQL
  the row also holds mcp-persist's ``subscribe()`` (:data:`MCP_PERSIST`, its opt-in
  at-most-once pub/sub) under the same workload and clock points: its ``store_event`` on A,
  its ``subscribe()`` on B, one per stream.

Replica A is a subprocess (``python -m kvstores.bench._signals``) with its own store object
and connections; it talks to the benchmark over its stdin/stdout. An in-process backend
(``memory://``, ``sqlite:///:memory:``) cannot be shared between processes: there A is a task
of the benchmark's own process on the same store object. Before the timed events, A sends
warm-up events on every stream until B has received one on each (so every subscriber is
listening, whatever the contender); warm-up events are not counted.

Each row reports, per contender: p50 and p99 delivery latency, events/s (distinct events
delivered ÷ time from A's first timed call to B's last delivery), and the events lost (never
delivered within :data:`DRAIN_SECONDS` of A's last, including those whose call on A raised:
``errors`` counts these) and duplicated (delivered more than once); ``gaps`` counts the GAPs
the signal channel reported. Both processes stamp
``time.monotonic()`` (one system-wide clock on Linux). The targets are limits
(:data:`kvstores.bench._targets.SIGNAL_LIMITS`): p99 per backend, and no lost or duplicated
event, in every row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kvstores._urls import redact_text
from kvstores.bench._backends import bench_backend, family
from kvstores.bench._baselines import libpq_url, redis_driver_url
from kvstores.registry import open_store

__all__ = [
    "DRAIN_SECONDS",
    "MCP_PERSIST",
    "SIGNALS_GROUP",
    "SignalsPlan",
    "run_signals",
]

SIGNALS_GROUP = "signals"
"""The ``group`` of the rows this module writes."""

MCP_PERSIST = "mcp-persist"
"""The contender that is mcp-persist's event store ``subscribe()`` on the same backend."""

DRAIN_SECONDS = 10.0
"""How long B waits, after A's last timed event, for events still on their way; later ones count as lost."""

_READY_SECONDS = 30.0  # how long B may take to receive a warm-up event on every stream
_WARMUP_INTERVAL = 0.05
_COLLECTION = "kvbench_signals"  # where the follow rows' event stores write
_PERSIST_TABLE = "kvbench_persist_events"
_WARMUP = -1  # the sequence number of warm-up events
_URL_VARIABLE = "KVSTORES_BENCH_SIGNALS_URL"  # how replica A's subprocess gets its URL


@dataclass(frozen=True)
class SignalsPlan:
    """The cross-replica delivery run: ``events`` per stream at each number of concurrent ``streams``."""

    streams: tuple[int, ...]
    events: int
    """Timed events per stream of a burst row."""
    budget_seconds: float
    """Wall-clock cap of the whole run: rows that would start later are skipped and say so."""
    rate: float = 0.0
    """Events per second per stream of the paced rows (0: burst rows only)."""
    paced_seconds: float = 5.0
    """How long a paced row sends: ``rate * paced_seconds`` events per stream."""
    row_seconds: float = 180.0
    """A row that has not ended after this long fails (its figures are not kept)."""


# -- the link between the benchmark (replica B) and replica A ---------------------------------------------


class _Link:
    """One side of A <-> B: JSON objects in order, either over a child's pipes or two queues in process."""

    async def send(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    async def receive(self) -> dict[str, Any]:
        raise NotImplementedError


class _QueueLink(_Link):
    def __init__(self, outbox: asyncio.Queue[dict[str, Any]], inbox: asyncio.Queue[dict[str, Any]]) -> None:
        self._outbox, self._inbox = outbox, inbox

    async def send(self, message: dict[str, Any]) -> None:
        self._outbox.put_nowait(message)

    async def receive(self) -> dict[str, Any]:
        return await self._inbox.get()


class _StdioLink(_Link):
    """A's side in its subprocess: lines of JSON on stdout, commands on stdin."""

    async def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    async def receive(self) -> dict[str, Any]:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return {"command": "close"}  # the benchmark went away
        message: dict[str, Any] = json.loads(line)
        return message


class _ChildLink(_Link):
    """B's side of a subprocess replica A."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.errors = bytearray()
        assert process.stderr is not None
        self._drain = asyncio.ensure_future(self._collect(process.stderr))

    async def _collect(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65_536):
            self.errors += chunk[-8_000:]

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        with contextlib.suppress(ConnectionError):
            await self.process.stdin.drain()

    async def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            await self._drain
            raise RuntimeError(f"replica A ended: {self.errors.decode(errors='replace')[-1500:] or 'no output'}")
        message: dict[str, Any] = json.loads(line)
        return message

    async def finish(self) -> None:
        """Wait for A to exit (it does after ``close``); kill it if it does not within 10 s."""
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._drain, 5)


# -- the contenders: what A does to emit an event, and what B does to receive it ----------------------------


def _notification(stream: int, seq: int) -> Any:
    from mcp.types import JSONRPCNotification

    params = {"progressToken": f"s{stream}", "progress": seq, "stream": stream, "seq": seq}
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/progress", params=params)


def _stream_id(prefix: str, stream: int) -> str:
    return f"{prefix}-{stream}"


class _Emitter:
    """Replica A's side of one contender: ``emit(stream, seq)``; ``anchors`` for followers; ``finish``; ``aclose``."""

    async def anchors(self, streams: int) -> list[str]:
        return []

    async def emit(self, stream: int, seq: int) -> None:
        raise NotImplementedError

    async def finish(self, streams: int) -> None:
        """After the timed events."""

    async def aclose(self) -> None:
        """Release what it opened."""


class _SignalEmitter(_Emitter):
    def __init__(self, store: Any, prefix: str, owned: bool) -> None:
        from kvstores.signals import channel

        self._store, self._owned = store, owned
        self._channel = channel(store)
        self._prefix = prefix

    async def emit(self, stream: int, seq: int) -> None:
        await self._channel.publish(_stream_id(self._prefix, stream), str(seq))

    async def aclose(self) -> None:
        if self._owned:
            await self._channel.aclose()
            await self._store.aclose()


class _FollowEmitter(_Emitter):
    def __init__(self, store: Any, prefix: str, ring: int, owned: bool) -> None:
        from kvstores.events import StoreEventStore

        self._store, self._owned, self._prefix = store, owned, prefix
        self.events = StoreEventStore(store, collection=_COLLECTION, max_events_per_stream=ring, live=True)

    async def anchors(self, streams: int) -> list[str]:
        return [await self.events.store_event(_stream_id(self._prefix, i), None) for i in range(streams)]

    async def emit(self, stream: int, seq: int) -> None:
        await self.events.store_event(_stream_id(self._prefix, stream), _notification(stream, seq))

    async def finish(self, streams: int) -> None:
        from mcp.types import JSONRPCResponse

        for i in range(streams):
            final = JSONRPCResponse(jsonrpc="2.0", id=_stream_id(self._prefix, i), result={})
            await self.events.store_event(_stream_id(self._prefix, i), final)

    async def aclose(self) -> None:
        if self._owned:
            from kvstores.signals import channel

            await channel(self._store).aclose()
            await self._store.aclose()


@dataclass
class _Persist:
    """mcp-persist's event store with streaming on, and the client or pool it runs on."""

    events: Any
    connections: Any
    redis: bool

    async def drop(self, prefix: str) -> None:
        """Remove what the run wrote (best effort)."""
        if self.redis:
            async for key in self.connections.scan_iter(match=f"kvbench-persist:{prefix}:*", count=1000):
                await self.connections.delete(key)
        else:
            await self.connections.execute(f"DROP TABLE IF EXISTS {_PERSIST_TABLE}, {_PERSIST_TABLE}_forks")

    async def aclose(self) -> None:
        """Close the client or pool."""
        await (self.connections.aclose() if self.redis else self.connections.close())


async def _persist_store(url: str, prefix: str, pool_size: int) -> _Persist:
    """mcp-persist's event store on ``url``'s server, streaming on.

    ``pool_size`` bounds the pool, sized as mcp-persist's docs ask: a subscriber holds one
    connection for its subscription (and, on Redis, takes another for each fetch).
    """
    if family(url) == "redis":
        import redis.asyncio
        from mcp_persist.redis import RedisEventStore

        client = redis.asyncio.from_url(redis_driver_url(url), max_connections=pool_size)
        store = RedisEventStore(client, key_prefix=f"kvbench-persist:{prefix}:", ttl=600, enable_streaming=True)
        return _Persist(store, client, redis=True)
    import asyncpg
    from mcp_persist.postgres import PostgresEventStore

    pool = await asyncpg.create_pool(libpq_url(url), min_size=1, max_size=pool_size)
    events = PostgresEventStore(pool, table_name=_PERSIST_TABLE, ttl=600, enable_streaming=True)
    await events.initialize()
    return _Persist(events, pool, redis=False)


class _PersistEmitter(_Emitter):
    def __init__(self, persist: _Persist, prefix: str) -> None:
        self._persist, self._prefix = persist, prefix

    async def emit(self, stream: int, seq: int) -> None:
        await self._persist.events.store_event(_stream_id(self._prefix, stream), _notification(stream, seq))

    async def aclose(self) -> None:
        await self._persist.aclose()


async def _emitter(kind: str, url: str, store: Any | None, prefix: str, ring: int) -> _Emitter:
    """Replica A's side of contender ``kind``: on ``store`` when given (in process), else on a store of its own."""
    owned = store is None
    if kind == MCP_PERSIST:
        size = 100 if family(url) == "redis" else 10  # redis-py's default; PostgreSQL: B's subscribers need the room
        return _PersistEmitter(await _persist_store(url, prefix, size), prefix)
    mine = open_store(url) if store is None else store
    return _SignalEmitter(mine, prefix, owned) if kind == "signal" else _FollowEmitter(mine, prefix, ring, owned)


async def _replica_a(link: _Link, emitter: _Emitter, streams: int, events: int, rate: float) -> None:
    """Anchors, warm-up until B says go, the timed events (all streams at once), the stamps; then wait for close.

    ``rate`` > 0 paces each stream at that many events per second (the streams' schedules
    spread evenly; a late call goes at once, the schedule does not slip); 0 sends back to back.
    """
    try:
        await link.send({"anchors": await emitter.anchors(streams)})
        go = asyncio.ensure_future(link.receive())
        while not go.done():
            for i in range(streams):
                await emitter.emit(i, _WARMUP)
            await asyncio.wait([go], timeout=_WARMUP_INTERVAL)
        if go.result().get("command") != "go":
            return  # B gave up before it was ready
        stamps: list[list[float]] = [[0.0] * events for _ in range(streams)]
        errors: list[str] = []
        started = time.monotonic()

        async def one_stream(i: int) -> None:
            mine = stamps[i]
            first = started + i / (rate * streams) if rate else 0.0
            for seq in range(events):
                if rate and (pause := first + seq / rate - time.monotonic()) > 0:
                    await asyncio.sleep(pause)
                mine[seq] = time.monotonic()
                try:
                    await emitter.emit(i, seq)
                except Exception as exc:  # the event is lost (and counted so); the run goes on
                    errors.append(f"{type(exc).__name__}: {exc}")

        await asyncio.gather(*(one_stream(i) for i in range(streams)))
        ended = time.monotonic()
        await emitter.finish(streams)
        await link.send({"stamps": stamps, "started": started, "ended": ended, "errors": errors})
        await link.receive()  # close: B has drained (a live event store still signals in the background)
    finally:
        await emitter.aclose()


async def _child_main(kind: str, url: str, streams: int, events: int, rate: float, prefix: str, ring: int) -> None:
    link = _StdioLink()
    try:
        emitter = await _emitter(kind, url, None, prefix, ring)
    except Exception as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        raise SystemExit(1) from None
    await _replica_a(link, emitter, streams, events, rate)


# -- replica B: the receivers, one per contender ------------------------------------------------------------


class _Tally:
    """What B received: first delivery time per (stream, seq), duplicates, gaps, warm-ups seen per stream."""

    def __init__(self, streams: int, events: int) -> None:
        self.delivered: list[list[float | None]] = [[None] * events for _ in range(streams)]
        self.duplicated = 0
        self.gaps = 0
        self.unexpected = 0
        self.warm = [False] * streams
        self.ready = asyncio.Event()
        self.complete = asyncio.Event()
        self._missing = streams * events
        self._cold = streams

    def got(self, stream: int, seq: int) -> None:
        now = time.monotonic()
        if seq == _WARMUP:
            if not self.warm[stream]:
                self.warm[stream] = True
                self._cold -= 1
                if self._cold == 0:
                    self.ready.set()
            return
        if not 0 <= stream < len(self.delivered) or not 0 <= seq < len(self.delivered[stream]):
            self.unexpected += 1
            return
        if self.delivered[stream][seq] is not None:
            self.duplicated += 1
            return
        self.delivered[stream][seq] = now
        self._missing -= 1
        if self._missing == 0:
            self.complete.set()

    def gap(self) -> None:
        self.gaps += 1


def _seq_of(message: Any) -> tuple[int, int] | None:
    params = getattr(message, "params", None)
    if not isinstance(params, dict) or "seq" not in params:
        return None  # the final response
    return int(params["stream"]), int(params["seq"])


class _Receiver:
    """Replica B's side of one contender; ``start`` needs A's anchors (the follow row's first events)."""

    errors: tuple[str, ...] = ()
    """Why receiving tasks ended early, if any did."""

    async def start(self, anchors: list[str], tally: _Tally) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class _SignalReceiver(_Receiver):
    def __init__(self, store: Any, prefix: str, streams: int, owned: bool, tally: _Tally) -> None:
        from kvstores.signals import channel

        self._store, self._owned, self._prefix, self._streams = store, owned, prefix, streams
        self._channel = channel(store)
        self._unlisten: list[Callable[[], None]] = []
        self._tally = tally

    async def listen(self) -> None:
        """Subscribe before A starts (a message published earlier is not for this subscriber)."""
        for i in range(self._streams):

            def on_message(message: str, stream: int = i) -> None:
                self._tally.got(stream, int(message))

            self._unlisten.append(await self._channel.listen(_stream_id(self._prefix, i), on_message, self._tally.gap))

    async def start(self, anchors: list[str], tally: _Tally) -> None:
        """Already listening."""

    async def aclose(self) -> None:
        for unlisten in self._unlisten:
            unlisten()
        if self._owned:
            await self._channel.aclose()
            await self._store.aclose()


class _FollowReceiver(_Receiver):
    def __init__(self, store: Any, ring: int, owned: bool) -> None:
        from kvstores.events import StoreEventStore

        self._store, self._owned = store, owned
        self.events = StoreEventStore(store, collection=_COLLECTION, max_events_per_stream=ring, live=True)
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self, anchors: list[str], tally: _Tally) -> None:
        async def send(event: Any) -> None:
            seq = _seq_of(event.message)
            if seq is not None:
                tally.got(*seq)

        self._tasks = [asyncio.ensure_future(self.events.follow_events_after(anchor, send)) for anchor in anchors]

    async def ended(self) -> None:
        """Every follow has sent its stream's final response."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):  # best effort: the rows are what matters
            await self._store.destroy_collection(_COLLECTION)
        if self._owned:
            from kvstores.signals import channel

            await channel(self._store).aclose()
            await self._store.aclose()


class _PersistReceiver(_Receiver):
    def __init__(self, url: str, prefix: str, streams: int) -> None:
        self._url, self._prefix, self._streams = url, prefix, streams
        self._tasks: list[asyncio.Task[Any]] = []
        self._persist: _Persist | None = None

    async def listen(self, tally: _Tally) -> None:
        # one connection per subscriber (mcp-persist's design), and its fetches: on Redis one
        # more per subscriber, on PostgreSQL on the subscriber's own (the server allows 100)
        size = 2 * self._streams + 8 if family(self._url) == "redis" else self._streams + 4
        self._persist = persist = await _persist_store(self._url, self._prefix, size)

        async def follow(i: int) -> None:
            try:
                async for _, message in persist.events.subscribe(_stream_id(self._prefix, i)):
                    seq = _seq_of(message)
                    if seq is not None:
                        tally.got(*seq)
            except Exception as exc:
                self.errors += (f"{type(exc).__name__}: {exc}",)
                raise

        self._tasks = [asyncio.ensure_future(follow(i)) for i in range(self._streams)]

    async def start(self, anchors: list[str], tally: _Tally) -> None:
        """Already subscribing (its subscription is forward-only)."""

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._persist is not None:
            with contextlib.suppress(Exception):  # best effort
                await self._persist.drop(self._prefix)
            await self._persist.aclose()


# -- one row ------------------------------------------------------------------------------------------------


def _in_process(url: str) -> bool:
    """True when the URL's store lives in this process (two processes could not share it)."""
    return family(url) == "memory" or ":memory:" in url


async def _start_a(
    kind: str, url: str, shared: Any | None, streams: int, events: int, rate: float, prefix: str, ring: int
) -> tuple[_Link, Callable[[], Awaitable[None]]]:
    """Start replica A; return B's link to it and how to wait for its end."""
    if shared is not None:
        to_a: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        to_b: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        emitter = await _emitter(kind, url, shared, prefix, ring)
        task = asyncio.ensure_future(_replica_a(_QueueLink(to_b, to_a), emitter, streams, events, rate))

        async def finish() -> None:
            await asyncio.wait_for(task, 10)

        return _QueueLink(to_a, to_b), finish
    arguments = [kind, str(streams), str(events), str(rate), prefix, str(ring)]
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvstores.bench._signals",
        *arguments,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=64 * 1024 * 1024,  # A's last line holds every stamp
        env={**os.environ, _URL_VARIABLE: url},  # not argv: a URL may hold a password
    )
    link = _ChildLink(process)
    return link, link.finish


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _figures(tally: _Tally, report: dict[str, Any]) -> dict[str, Any]:
    latencies: list[float] = []
    last = report["ended"]
    for stamps, delivered in zip(report["stamps"], tally.delivered):
        for stamp, when in zip(stamps, delivered):
            if when is not None:
                latencies.append(when - stamp)
                last = max(last, when)
    ordered = sorted(latencies)
    sent = sum(len(stamps) for stamps in report["stamps"])
    figures: dict[str, Any] = {
        "sent": sent,
        "delivered": len(ordered),
        "lost": sent - len(ordered),
        "duplicated": tally.duplicated,
        "gaps": tally.gaps,
        "errors": len(report["errors"]),
        "events_per_second": round(len(ordered) / max(last - report["started"], 1e-9), 1),
        "seconds": round(last - report["started"], 3),
    }
    if report["errors"]:
        figures["first_error"] = report["errors"][0][:300]
    if tally.unexpected:
        figures["unexpected"] = tally.unexpected
    if ordered:
        figures |= {
            "p50_ms": round(_percentile(ordered, 0.5) * 1e3, 3),
            "p99_ms": round(_percentile(ordered, 0.99) * 1e3, 3),
            "max_ms": round(ordered[-1] * 1e3, 3),
            "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
        }
    return figures


async def _contender(kind: str, url: str, shared: Any | None, streams: int, events: int, rate: float) -> dict[str, Any]:
    """One contender's figures for one row: start B's receivers, then A, then drain and tally."""
    prefix = f"kvbench-{secrets.token_hex(4)}"
    ring = events + 1_000  # the ring never laps: this measures delivery, not retention
    tally = _Tally(streams, events)
    owned = shared is None
    receiver: _Receiver
    if kind == "signal":
        receiver = _SignalReceiver(open_store(url) if owned else shared, prefix, streams, owned, tally)
        await receiver.listen()
    elif kind == "follow":
        receiver = _FollowReceiver(open_store(url) if owned else shared, ring, owned)
    else:
        receiver = _PersistReceiver(url, prefix, streams)
        await receiver.listen(tally)
    finish: Callable[[], Awaitable[None]] | None = None
    link: _Link | None = None
    try:
        link, finish = await _start_a(kind, url, shared, streams, events, rate, prefix, ring)
        anchors = (await link.receive())["anchors"]
        await receiver.start(anchors, tally)
        try:
            await asyncio.wait_for(tally.ready.wait(), _READY_SECONDS)
        except TimeoutError:
            cold = tally.warm.count(False)
            why = f" ({receiver.errors[0]})" if receiver.errors else ""
            raise RuntimeError(
                f"{cold} of {streams} subscribers received no warm-up event in {_READY_SECONDS:g} s{why}"
            ) from None
        await link.send({"command": "go"})
        report = await link.receive()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tally.complete.wait(), max(0.0, report["ended"] + DRAIN_SECONDS - time.monotonic()))
        if isinstance(receiver, _FollowReceiver):  # the final responses: each follow ends
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(receiver.ended(), DRAIN_SECONDS)
        figures = _figures(tally, report)
        if receiver.errors:  # a subscriber that raised stops receiving: its stream's later events count as lost
            figures["receiver_errors"] = len(receiver.errors)
            figures["first_receiver_error"] = receiver.errors[0][:300]
        return figures
    finally:
        if link is not None:
            with contextlib.suppress(Exception):
                await link.send({"command": "close"})
        if finish is not None:
            with contextlib.suppress(Exception):
                await finish()
        await receiver.aclose()


def _contenders(url: str) -> dict[str, dict[str, str]]:
    """Operation -> {contender name -> kind}."""
    import importlib.util

    follow = {"kvstores": "follow"}
    if bench_backend(family(url)).mcp_persist and importlib.util.find_spec("mcp_persist") is not None:
        follow[MCP_PERSIST] = MCP_PERSIST
    return {"signal": {"kvstores": "signal"}, "follow": follow}


async def run_signals(label: str, url: str, plan: SignalsPlan, deadline: float, progress: Any) -> list[dict[str, Any]]:
    """The cross-replica delivery rows of the store at ``url`` (shown as ``label``), in row order.

    Rows that would start after ``deadline`` (``time.monotonic()``) are skipped and say so.
    """
    shared: Any = open_store(url) if _in_process(url) else None
    probe: Any = shared if shared is not None else open_store(url)
    described = {"target": label, "backend": family(url), "store": type(probe).__name__, "group": SIGNALS_GROUP}
    replicas = "one store object, A a task in-process" if shared is not None else "two processes"
    contenders = _contenders(url)
    rows: list[dict[str, Any]] = []
    try:
        shapes = [(streams, rate) for streams in plan.streams for rate in ((plan.rate, 0.0) if plan.rate else (0.0,))]
        progress.start(f"{label} signals", len(shapes) * sum(len(kinds) for kinds in contenders.values()))
        for streams, rate in shapes:
            events = max(2, round(rate * plan.paced_seconds)) if rate else plan.events
            for operation, kinds in contenders.items():
                row: dict[str, Any] = {
                    **described,
                    "operation": operation,
                    "value_bytes": None,
                    "concurrency": streams,
                    "rate": rate or None,
                    "events_per_stream": events,
                    "replicas": replicas,
                }
                if time.monotonic() >= deadline:
                    rows.append({**row, "skipped": f"the run's wall-clock cap ({plan.budget_seconds:g} s) was reached"})
                    continue
                figures: dict[str, Any] = {}
                failures: list[str] = []
                for name, kind in kinds.items():
                    try:
                        figures[name] = await asyncio.wait_for(
                            _contender(kind, url, shared, streams, events, rate), plan.row_seconds
                        )
                    except TimeoutError:
                        failures.append(f"{name} failed: the row took over {plan.row_seconds:g} s")
                    except Exception as exc:
                        failures.append(f"{name} failed: {type(exc).__name__}: {exc}")
                    progress.tick()
                if "kvstores" not in figures:
                    rows.append({**row, "skipped": redact_text("; ".join(failures), url)})
                    continue
                rows.append({**row, "contenders": figures, **({"failures": failures} if failures else {})})
    finally:
        if shared is None:
            await probe.aclose()
        else:
            from kvstores.signals import channel

            await channel(shared).aclose()
            await shared.aclose()
    for row in rows:  # a reason quotes an exception: a driver's may hold the URL's secrets
        if "failures" in row:
            row["failures"] = [redact_text(text, url) for text in row["failures"]]
        for figures in row.get("contenders", {}).values():
            for key in ("first_error", "first_receiver_error"):
                if key in figures:
                    figures[key] = redact_text(figures[key], url)
    return rows


if __name__ == "__main__":  # replica A, started by _start_a
    kind, streams, events, rate, prefix, ring = sys.argv[1:7]
    url = os.environ[_URL_VARIABLE]
    asyncio.run(_child_main(kind, url, int(streams), int(events), float(rate), prefix, int(ring)))
