"""The operator's commands of ``kvstores``: ls, get, put, delete, copy, ping, keygen and rekey.

Each takes a TARGET as ``kvstores check`` does (a store URL or ``package.module:factory``,
resolved once by :mod:`kvstores.targets`), so any ``key_value.aio`` store with
enumeration can be listed or copied. ``ls``, ``get`` and ``copy`` read the TARGET (for copy:
the SOURCE) from ``$KVSTORES_URL`` when it is left out; ``put`` and ``delete`` never do, a
write names its store. Every failure is one line on stderr: exit 2 for what the command
line got wrong (a bad TARGET, a missing extra, bad arguments), exit 1 for what the store did
not do (an unreachable or refusing server, a failed operation, an absent key, an entry
``copy`` could not copy), the same for every command, ``ping`` included.

``copy`` runs the engine of :mod:`kvstores._copy` and always ends with one summary line,
also when it fails or is interrupted (Ctrl-C: exit 130); the count is of acknowledged writes,
so after an interrupt the writes in flight may have landed too.

Every command opens its stores with the keys of ``$KVSTORES_ENCRYPTION_KEYS`` (encryption at
rest, :mod:`kvstores._sealing`); ``keygen`` prints a new key and ``rekey`` re-seals a store's
entries under the first key (:mod:`kvstores._rekey`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstores._copy import CHUNK, Copy, Progress
from kvstores._rekey import Rekey
from kvstores._sealing import generate_key
from kvstores._urls import redact, redact_text
from kvstores.base import BaseStore, chunks
from kvstores.registry import ENCRYPTION_KEYS_VARIABLE, URL_VARIABLE, open_store
from kvstores.targets import TargetError, close, is_url, resolve

__all__ = ["COMMANDS", "add_parsers", "run"]

_FAILURES_SHOWN = 20  # failed entries printed one per line; the rest are counted
_DEFAULT_LIMIT = 1_000
_LINE = 400  # characters of an error line
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class _Failed(Exception):
    """A command failed; the message is its one line, ``code`` its exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- targets -----------------------------------------------------------------------


def _looks_like_target(argument: str) -> bool:
    return is_url(argument) or _FACTORY.fullmatch(argument) is not None


def _from_environment(name: str) -> str:
    url = os.environ.get(URL_VARIABLE)
    if not url:
        raise _Failed(f"no {name} given and ${URL_VARIABLE} is not set", 2)
    return url


def _split(arguments: Sequence[str], names: Sequence[str], optional: int = 0) -> list[str]:
    """``arguments`` as ``names`` (TARGET first); TARGET from $KVSTORES_URL when one is missing.

    The last ``optional`` names may be left out too; an argument that could be either the
    TARGET or the next name is the TARGET when it looks like one (a URL or module:factory)
    or when $KVSTORES_URL is not set.
    """
    given = list(arguments)
    most, least = len(names), len(names) - optional
    if not least - 1 <= len(given) <= most:
        raise _Failed(f"expected {' '.join(names)}, got {len(given)} argument(s)", 2)
    lone = len(given) < most and not (given and _looks_like_target(given[0])) and os.environ.get(URL_VARIABLE)
    if len(given) < least or lone:
        given.insert(0, _from_environment(names[0]))
    return given + [""] * (most - len(given))


def _missing_sqlite_file(spec: str) -> str | None:
    """The path of an SQLite URL's file when it does not exist (reading must not create it)."""
    if not spec.lower().startswith("sqlite:"):
        return None
    try:
        store = open_store(spec)  # an unconnected store: nothing touches the file yet
    except Exception:
        return None  # resolve() reports a bad URL or a missing extra
    path = str(getattr(store, "path", ":memory:"))
    return None if path == ":memory:" or Path(path).exists() else path


async def _open(spec: str, *, reading: bool) -> Any:
    """A store from TARGET ``spec``, or _Failed saying in one line why not: exit 1 when its
    server cannot be reached (resolving the target probes it), else 2 (the TARGET is wrong)."""
    if reading and (path := _missing_sqlite_file(spec)) is not None:
        raise _Failed(f"{redact(spec)}: no such SQLite file {path!r}", 2)
    try:
        target = await resolve(spec)
        return await target.open()
    except TargetError as exc:
        unreachable = isinstance(exc.__cause__, (ConnectionError, OSError, TimeoutError))
        raise _Failed(str(exc), 1 if unreachable else 2) from exc


def _require(store: Any, capability: str, spec: str, why: str) -> None:
    if not callable(getattr(store, capability, None)):
        raise _Failed(f"{redact(spec)}: the store has no {capability}(), {why}", 2)


def _name(text: str) -> str:
    """``text`` as printed: as is when printable, else JSON-quoted (newlines, NUL, ...)."""
    return text if text.isprintable() and text.strip() == text and text else json.dumps(text, ensure_ascii=False)


def _seconds(ttl: float | None) -> str:
    return "never" if ttl is None else f"{ttl:.1f}s"


# -- ls, get, put, delete -----------------------------------------------------------


async def _ls(options: argparse.Namespace) -> int:
    spec, collection = _split(options.arguments, ("TARGET", "COLLECTION"), optional=1)
    limit = None if options.limit == 0 else options.limit
    store = await _open(spec, reading=True)
    try:
        if not collection:
            _require(store, "collections", spec, "so its collections cannot be listed")
            names = sorted(await store.collections(limit=limit))
            print(json.dumps(names, ensure_ascii=False, indent=2) if options.json else "\n".join(map(_name, names)))
            _note_limit(len(names), limit, "collections")
            return 0
        _require(store, "keys", spec, "so its keys cannot be listed")
        keys = sorted(await store.keys(collection, limit=limit))
        entries = await _ttls(store, collection, keys)
    finally:
        await close(store)
    if options.json:
        rows = [{"key": key, "ttl": None if ttl is None else round(ttl, 3)} for key, ttl in entries]
        print(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        for key, ttl in entries:
            print(f"{_seconds(ttl):>12}  {_name(key)}")
    _note_limit(len(keys), limit, "keys")
    return 0


async def _ttls(store: Any, collection: str, keys: list[str]) -> list[tuple[str, float | None]]:
    """Each key still present with its remaining TTL (None: never expires)."""
    found: list[tuple[str, float | None]] = []
    for chunk in chunks(keys, CHUNK):
        rows = await store.ttl_many(list(chunk), collection=collection)
        found += [(key, ttl) for key, (value, ttl) in zip(chunk, rows) if value is not None]
    return found


def _note_limit(count: int, limit: int | None, what: str) -> None:
    if limit is not None and count >= limit:
        print(f"(the first {limit} {what}: --limit N for more, --limit 0 for all)", file=sys.stderr)


async def _get(options: argparse.Namespace) -> int:
    spec, collection, key = _split(options.arguments, ("TARGET", "COLLECTION", "KEY"))
    store = await _open(spec, reading=True)
    try:
        value = await store.get(key, collection=collection)
    finally:
        await close(store)
    if value is None:
        raise _Failed(f"no key {key!r} in collection {collection!r}")
    print(json.dumps(value, ensure_ascii=False, indent=2))
    return 0


async def _put(options: argparse.Namespace) -> int:
    text = sys.stdin.read() if options.json == "-" else options.json
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _Failed(f"JSON is not valid JSON: {exc}", 2) from exc
    if not isinstance(value, dict):
        raise _Failed(f"JSON must be an object ({{...}}), got a {type(value).__name__}", 2)
    store = await _open(options.target, reading=False)
    try:
        await store.put(options.key, value, collection=options.collection, ttl=options.ttl)
    finally:
        await close(store)
    return 0


async def _delete(options: argparse.Namespace) -> int:
    store = await _open(options.target, reading=True)
    try:
        deleted = await store.delete(options.key, collection=options.collection)
    finally:
        await close(store)
    if not deleted:
        raise _Failed(f"no key {options.key!r} in collection {options.collection!r}")
    return 0


async def _ping(options: argparse.Namespace) -> int:
    (spec,) = _split(options.arguments, ("TARGET",))
    store = await _open(spec, reading=True)  # unreachable: exit 1, the probe's "no"
    started = time.monotonic()
    try:
        if not callable(getattr(store, "ping", None)):
            await store.get("\x00kvstores-ping")  # any store: one read of a key nobody writes
        else:
            await store.ping()
    finally:
        await close(store)
    print(f"{redact(spec)}: ok ({(time.monotonic() - started) * 1000:.1f} ms)")
    return 0


# -- copy -----------------------------------------------------------------------------


class _Quiet:
    """No progress bar: not a terminal, or rich is not installed."""

    def start(self, collection: str, total: int) -> None:
        """Nothing to show."""

    def advance(self, count: int) -> None:
        """Nothing to show."""

    def stop(self) -> None:
        """Nothing to stop."""


class _Bar:
    """A rich progress bar per collection on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self._progress = Progress(*columns, console=Console(stderr=True))
        self._progress.start()
        self._task: Any = None

    def start(self, collection: str, total: int) -> None:
        """A new bar for ``collection``."""
        self._task = self._progress.add_task(_name(collection), total=total)

    def advance(self, count: int) -> None:
        """``count`` more entries of the current collection handled."""
        self._progress.advance(self._task, count)

    def stop(self) -> None:
        """Leave the bars on screen."""
        self._progress.stop()


def _progress() -> Progress:
    if not sys.stderr.isatty():
        return _Quiet()
    try:
        return _Bar()
    except ImportError:
        return _Quiet()


async def _copy(options: argparse.Namespace) -> int:
    source_spec, dest_spec = _split(options.arguments, ("SOURCE", "DEST"))
    source = await _open(source_spec, reading=True)
    try:
        dest = await _open(dest_spec, reading=False)
    except BaseException:
        await close(source)
        raise
    copy = Copy(source, dest, options.no_overwrite, options.dry_run)
    progress = _progress()
    stopped: Exception | None = None
    interrupted: asyncio.CancelledError | None = None
    try:
        _require(source, "keys", source_spec, "so kvstores copy cannot list its entries")
        names = options.collection
        if not names:
            _require(source, "collections", source_spec, "so name the collections to copy with --collection")
            names = sorted(await source.collections())
        for name in dict.fromkeys(names):
            await copy.collection(name, progress)
    except _Failed:
        raise
    except Exception as exc:
        stopped = exc
    except asyncio.CancelledError as exc:  # Ctrl-C: asyncio.run cancels the command
        interrupted = exc
    finally:
        progress.stop()
        await close(source)
        await close(dest)
    for failure in copy.tally.failures[:_FAILURES_SHOWN]:
        print(f"kvstores copy: not copied: {redact_text(failure, source_spec, dest_spec)}", file=sys.stderr)
    if len(copy.tally.failures) > _FAILURES_SHOWN:
        print(f"kvstores copy: ... and {len(copy.tally.failures) - _FAILURES_SHOWN} more", file=sys.stderr)
    ending = " before it was interrupted" if interrupted else " before it stopped" if stopped else ""
    print(copy.tally.summary(options.dry_run) + ending, flush=True)
    if interrupted is not None:
        raise interrupted
    if stopped is not None:
        raise _Failed(_line(stopped)) from stopped
    return 1 if copy.tally.failures else 0


# -- keygen, rekey --------------------------------------------------------------------


async def _keygen(options: argparse.Namespace) -> int:
    print(generate_key())
    return 0


async def _rekey(options: argparse.Namespace) -> int:
    (spec,) = _split(options.arguments, ("TARGET",))
    if not os.environ.get(ENCRYPTION_KEYS_VARIABLE, "").strip():
        raise _Failed(f"${ENCRYPTION_KEYS_VARIABLE} is not set: it names the keys, the first one seals", 2)
    store = await _open(spec, reading=True)
    if not isinstance(store, BaseStore) or not store.encryption_key_ids:
        await close(store)
        raise _Failed(f"{redact(spec)}: not a kvstores store opened with encryption keys", 2)
    rekey = Rekey(store)
    progress = _progress()
    try:
        _require(store, "collections", spec, "so kvstores rekey cannot list its entries")
        for name in sorted(await store.collections()):
            await rekey.collection(name, progress)
    finally:
        progress.stop()
        await close(store)
        for failure in rekey.failures[:_FAILURES_SHOWN]:
            print(f"kvstores rekey: not re-sealed: {redact_text(failure, spec)}", file=sys.stderr)
        print(rekey.summary(store.encryption_key_ids[0]), flush=True)
    return 1 if rekey.failures else 0


# -- the command line -----------------------------------------------------------------


def _line(exc: BaseException) -> str:
    if isinstance(exc, _Failed):
        return str(exc)
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"


async def _tasks(options: argparse.Namespace) -> int:
    from kvstores.tasks._cli import tasks

    if options.target and options.task is None and not _looks_like_target(options.target):
        options.task, options.target = options.target, None  # TARGET left out: $KVSTORES_URL
    spec = options.target or _from_environment("TARGET")
    store = await _open(spec, reading=True)
    try:
        return await tasks(options, store)
    finally:
        await close(store)


async def _dashboard(options: argparse.Namespace) -> int:
    from kvstores.dashboard._cli import Refused, serve, settings

    try:
        chosen = settings(options)
    except Refused as exc:
        raise _Failed(str(exc), 2) from exc
    spec = options.target or _from_environment("TARGET")
    store = await _open(spec, reading=True)
    try:
        return await serve(store, spec, chosen)
    finally:
        await close(store)


async def _worker(options: argparse.Namespace) -> int:
    from kvstores.tasks._cli import worker

    return await worker(options)


@dataclass(frozen=True)
class _Command:
    run: Callable[[argparse.Namespace], Any]
    help: str
    examples: str
    notes: str = ""


_TARGETS = (
    "{names}: a store URL (sqlite:///state.db, redis://host:6379/0?prefix=app:, ...) or\n"
    "package.module:factory (a sync or async callable returning a store), as for kvstores check."
)
_FROM_ENVIRONMENT = f"\nLeft out, {{name}} is ${URL_VARIABLE}."

COMMANDS: dict[str, _Command] = {
    "ls": _Command(
        _ls,
        "list the collections of a store, or the keys of one collection with their remaining TTL",
        "  kvstores ls sqlite:///state.db\n"
        "  kvstores ls redis://localhost:6379/0 fastmcp_state --limit 50 --json\n"
        "  KVSTORES_URL=sqlite:///state.db kvstores ls fastmcp_state",
        _TARGETS.format(names="TARGET") + _FROM_ENVIRONMENT.format(name="TARGET"),
    ),
    "get": _Command(
        _get,
        "print the value of one key as JSON (exit 1 when absent)",
        "  kvstores get sqlite:///state.db fastmcp_state 'session-1::counter'",
        _TARGETS.format(names="TARGET") + _FROM_ENVIRONMENT.format(name="TARGET"),
    ),
    "put": _Command(
        _put,
        "store a JSON object under one key",
        "  kvstores put sqlite:///state.db settings theme '{\"dark\": true}' --ttl 3600\n"
        "  echo '{\"n\": 1}' | kvstores put redis://localhost:6379/0 counters visits -",
        _TARGETS.format(names="TARGET"),
    ),
    "delete": _Command(
        _delete,
        "delete one key (exit 1 when absent)",
        "  kvstores delete sqlite:///state.db fastmcp_state 'session-1::counter'",
        _TARGETS.format(names="TARGET"),
    ),
    "ping": _Command(
        _ping,
        "one cheap round trip to a store: exit 0 when it answers, 1 when it does not (a readiness probe)",
        "  kvstores ping redis://localhost:6379/0\n  KVSTORES_URL=postgresql://db/app kvstores ping",
        _TARGETS.format(names="TARGET") + _FROM_ENVIRONMENT.format(name="TARGET"),
    ),
    "copy": _Command(
        _copy,
        "copy every live entry (or the named collections) of SOURCE to DEST, keeping TTLs",
        "  kvstores copy sqlite:///state.db redis://redis.internal:6379/0\n"
        "  kvstores copy sqlite:///state.db postgresql://db/app --collection fastmcp_state --no-overwrite\n"
        "  kvstores copy myapp.stores:old_store mongodb://db/app --dry-run\n"
        "  KVSTORES_URL=sqlite:///state.db kvstores copy redis://redis.internal:6379/0",
        _TARGETS.format(names="SOURCE, DEST")
        + _FROM_ENVIRONMENT.format(name="SOURCE")
        + "\n\nEach entry keeps its remaining TTL, to the millisecond; expired entries are skipped."
        "\nSOURCE needs keys() (and collections() unless --collection is given). Memory: the key"
        "\nnames of the largest collection plus one chunk of 1,000 values. Prints one summary line;"
        "\neach entry DEST rejects is reported on stderr, and any failure exits 1.",
    ),
    "keygen": _Command(
        _keygen,
        "print a new encryption key (URL-safe base64 of 32 random bytes) for $KVSTORES_ENCRYPTION_KEYS",
        "  KVSTORES_ENCRYPTION_KEYS=$(kvstores keygen) kvstores put sqlite:///state.db tokens app '{...}'",
    ),
    "rekey": _Command(
        _rekey,
        "seal every entry of a store (plaintext ones included) under the first key of $KVSTORES_ENCRYPTION_KEYS",
        "  KVSTORES_ENCRYPTION_KEYS=NEWKEY,OLDKEY kvstores rekey postgresql://db/app",
        _TARGETS.format(names="TARGET")
        + _FROM_ENVIRONMENT.format(name="TARGET")
        + "\n\nEach entry keeps its TTL; a write made meanwhile is never overwritten. Run it again after"
        "\nan interruption: what was re-sealed is skipped. An entry no given key opens is reported and"
        "\nexits 1; keys and collection names stay plaintext.",
    ),
    "tasks": _Command(
        _tasks,
        "list, show or cancel the background tasks (kvstores.tasks) kept on a store",
        "  kvstores tasks ls postgresql://db/app\n"
        "  kvstores tasks show postgresql://db/app '#0123456789ab'\n"
        "  kvstores tasks cancel postgresql://db/app '#0123456789ab'",
        _TARGETS.format(names="TARGET")
        + "\n\nTasks are named by label (# and 12 hex digits of the id's SHA-256; the id also works). ls"
        "\nprints state, age, tool, the worker holding the lease and attempts; show adds the principal,"
        "\nthe lease's time left, the status message and error. Arguments, results, the caller's token"
        "\nand headers and input answers are never printed. cancel ends a non-terminal task at once.",
    ),
    "dashboard": _Command(
        _dashboard,
        "serve the operator's dashboard of a store: tasks, sessions, streams, signals, latency (one page)",
        "  kvstores dashboard sqlite:///state.db\n"
        "  KVSTORES_DASHBOARD_TOKEN=$(kvstores keygen) kvstores dashboard redis://cache:6379/0 --port 9000",
        _TARGETS.format(names="TARGET")
        + _FROM_ENVIRONMENT.format(name="TARGET")
        + "\n\nBinds 127.0.0.1 and answers only requests addressed to a loopback name (or --allow-host)."
        "\nRead-only unless $KVSTORES_DASHBOARD_TOKEN (or --token-file) gives an operator token; cancelling"
        "\na task then needs it. A non-loopback --host needs the token. See kvstores.dashboard.",
    ),
    "worker": _Command(
        _worker,
        "run the background tasks of a FastMCP app with StoreTasks, serving no HTTP (extra workers)",
        "  kvstores worker myapp.server:mcp\n  kvstores worker myapp.server:mcp --concurrency 32",
        "APP is module:attribute, the FastMCP server (mcp.add_extension(StoreTasks(store))); its store"
        "\nis the one the workers serve. Stop it with SIGTERM or Ctrl-C: its running tasks run again"
        "\nelsewhere after their lease.",
    ),
}
"""Each operator command: what runs it, its one-line help, its examples and notes for ``--help``."""


def add_parsers(commands: Any) -> None:
    """Add a sub-parser per operator command to ``commands`` (argparse sub-parsers)."""
    parsers = {
        name: commands.add_parser(
            name,
            help=command.help,
            description=command.help[0].upper() + command.help[1:] + ".",
            epilog=f"{command.notes}\n\nexamples:\n{command.examples}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for name, command in COMMANDS.items()
    }
    ls = parsers["ls"]
    ls.add_argument("arguments", nargs="*", metavar="[TARGET] [COLLECTION]", help="TARGET defaults to $KVSTORES_URL")
    ls.add_argument(
        "--limit", type=_count, default=_DEFAULT_LIMIT, metavar="N", help="at most N (0: all; default 1000)"
    )
    ls.add_argument("--json", action="store_true", help="print JSON: names, or [{key, ttl}] (ttl in seconds or null)")
    get = parsers["get"]
    get.add_argument("arguments", nargs="+", metavar="[TARGET] COLLECTION KEY", help="TARGET defaults to $KVSTORES_URL")
    put = parsers["put"]
    for positional in ("target", "collection", "key"):
        put.add_argument(positional, metavar=positional.upper())
    put.add_argument("json", metavar="JSON", help="a JSON object, or - to read it from stdin")
    put.add_argument("--ttl", type=float, metavar="S", help="expire after S seconds (default: never)")
    delete = parsers["delete"]
    for positional in ("target", "collection", "key"):
        delete.add_argument(positional, metavar=positional.upper())
    parsers["ping"].add_argument("arguments", nargs="*", metavar="[TARGET]", help="TARGET defaults to $KVSTORES_URL")
    copy = parsers["copy"]
    copy.add_argument("arguments", nargs="+", metavar="[SOURCE] DEST", help="SOURCE defaults to $KVSTORES_URL")
    copy.add_argument("--collection", action="append", metavar="NAME", help="copy only this collection (repeatable)")
    copy.add_argument("--no-overwrite", action="store_true", help="keep entries DEST already has")
    copy.add_argument("--dry-run", action="store_true", help="read and count, write nothing")
    parsers["rekey"].add_argument("arguments", nargs="*", metavar="[TARGET]", help="TARGET defaults to $KVSTORES_URL")
    tasks = parsers["tasks"]
    tasks.add_argument("action", choices=("ls", "show", "cancel"))
    tasks.add_argument("target", nargs="?", metavar="TARGET", help="TARGET defaults to $KVSTORES_URL")
    tasks.add_argument("task", nargs="?", metavar="TASK", help="a task's label (or id): show and cancel")
    tasks.add_argument("--json", action="store_true", help="print JSON")
    from kvstores.dashboard._cli import add_arguments as add_dashboard_arguments

    add_dashboard_arguments(parsers["dashboard"])
    worker = parsers["worker"]
    worker.add_argument("app", metavar="APP", help="module:attribute of the FastMCP server")
    worker.add_argument("--concurrency", type=int, default=None, metavar="N", help="tasks run at once")


def _count(text: str) -> int:
    number = int(text)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {number}")
    return number


def run(options: argparse.Namespace) -> int:
    """Run the operator command ``options.command``; print one line on failure; return the exit code."""
    try:
        return int(asyncio.run(COMMANDS[options.command].run(options)))
    except _Failed as exc:
        _complain(options, str(exc))
        return exc.code
    except ImportError as exc:  # a missing extra (rich, a driver): the message names it
        _complain(options, str(exc))
        return 2
    except Exception as exc:
        _complain(options, _line(exc))
        return 1
    except KeyboardInterrupt:
        _complain(options, "interrupted")
        return 130


def _urls(options: argparse.Namespace) -> list[str]:
    """Every store URL the command was given, $KVSTORES_URL included: the secrets to keep out of messages."""
    given = [*getattr(options, "arguments", ()), getattr(options, "target", ""), os.environ.get(URL_VARIABLE, "")]
    return [argument for argument in given if isinstance(argument, str) and is_url(argument)]


def _complain(options: argparse.Namespace, message: str) -> None:
    """Print ``message``, without secrets, as one line of at most :data:`_LINE` characters (drivers' run long)."""
    line = " ".join(redact_text(message, *_urls(options)).split())
    print(f"kvstores {options.command}: {line if len(line) <= _LINE else line[: _LINE - 3] + '...'}", file=sys.stderr)
