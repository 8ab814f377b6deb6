"""The operator's commands: kvstores ls, get, put, delete and copy, in-process and as a process."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from kvstores import open_store
from kvstores.cli import main
from tests.support import Backend, free_port, interruptible
from tests.support import cli_targets as targets
from tests.support.fixtures import rows_with, start_row

ROOT = Path(__file__).resolve().parent.parent


def kvstores(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m kvstores.cli ARGS`` in a child process, from the repository's root."""
    environment = {name: value for name, value in os.environ.items() if name != "KVSTORES_URL"}
    environment.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "kvstores.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        input=stdin,
        timeout=300,
    )


def one_line_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The failed command's one line on stderr (asserting there is exactly one, no traceback)."""
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"kvstores {command}: "), result.stderr
    return lines[0]


def run(coroutine: Any) -> Any:
    """Run ``coroutine`` in a new event loop (these tests are sync: the CLI runs its own loop)."""
    return asyncio.run(coroutine)


async def destroy(url: str) -> None:
    async with open_store(url, timeout=60) as store:  # the clean-up waits out a loaded server (SecantusDB)
        await store.destroy()


@pytest.fixture
def table(started: dict[str, Backend | str]) -> Iterator[Callable[[str, str], str]]:
    """``table(row, namespace)``: the URL of a store on ``namespace`` of a row of the backend table.

    Starts the row as the ``backend`` fixture does (skip, or fail when KVSTORES_REQUIRE names it);
    every store handed out is destroyed afterwards.
    """
    urls: list[str] = []

    def url(name: str, namespace: str) -> str:
        urls.append(start_row(name, started).full_url(namespace))
        return urls[-1]

    yield url
    for created in urls:
        run(destroy(created))


def sqlite_url(tmp_path: Path, name: str = "state") -> str:
    return f"sqlite:///{tmp_path / name}.db"


async def seed(url: str, entries: dict[str, dict[str, tuple[dict[str, Any], float | None]]]) -> None:
    """Write ``entries`` (collection -> key -> (value, ttl)) with one put_many per (collection, ttl)."""
    async with open_store(url) as store:
        for collection, items in entries.items():
            by_ttl: dict[float | None, dict[str, dict[str, Any]]] = {}
            for key, (value, ttl) in items.items():
                by_ttl.setdefault(ttl, {})[key] = value
            for ttl, values in by_ttl.items():
                await store.put_many(list(values), list(values.values()), collection=collection, ttl=ttl)


async def dump(url: str, collections: list[str] | None = None) -> dict[str, dict[str, tuple[Any, float | None]]]:
    """Every live entry of the store at ``url``: collection -> key -> (value, remaining TTL)."""
    async with open_store(url) as store:
        found: dict[str, dict[str, tuple[Any, float | None]]] = {}
        for collection in collections or await store.collections():
            keys = await store.keys(collection)
            found[collection] = dict(zip(keys, await store.ttl_many(keys, collection=collection)))
        return found


# -- help and one-line errors -------------------------------------------------------------


@pytest.mark.parametrize("command", ["ls", "get", "put", "delete", "copy", "ping"])
def test_every_command_has_help_with_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: kvstores {command}" in out
    assert f"examples:\n  kvstores {command} " in out or f"KVSTORES_URL=sqlite:///state.db kvstores {command}" in out


def test_the_console_script_lists_the_operator_commands() -> None:
    result = kvstores("--help")
    assert result.returncode == 0
    for command in ["ls", "get", "put", "delete", "copy", "check", "demo", "bench"]:
        assert command in result.stdout


def test_a_bad_url_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(kvstores("ls", "nosuch://host/db"), "ls")
    assert "no kvstores backend for URL scheme 'nosuch'" in line
    line = one_line_error(kvstores("copy", "not-a-target", sqlite_url(tmp_path)), "copy")
    assert "neither a store URL" in line


def test_an_unreachable_server_is_one_line() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = kvstores("get", f"redis://127.0.0.1:{port}/0?timeout=0.5", "c", "k")
    line = one_line_error(result, "get")
    assert result.returncode == 1, "the store did not answer: 1, as for ping (2 is for a TARGET that is wrong)"
    assert "cannot reach the store" in line
    assert "StoreConnectionError" in line
    assert time.monotonic() - started < 30


def test_a_missing_extra_is_one_line_naming_it() -> None:
    script = "import sys; sys.modules['redis'] = None; from kvstores.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", script, "ls", "redis://127.0.0.1:6379/15"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 2
    assert 'pip install "kvstores[redis]"' in one_line_error(result, "ls")


def test_a_missing_key_is_one_line(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert main(["put", url, "c", "present", "{}"]) == 0
    assert (
        one_line_error(kvstores("get", url, "c", "absent"), "get") == "kvstores get: no key 'absent' in collection 'c'"
    )
    result = kvstores("delete", url, "c", "absent")
    assert result.returncode == 1
    assert one_line_error(result, "delete") == "kvstores delete: no key 'absent' in collection 'c'"


def test_reading_a_missing_sqlite_file_does_not_create_it(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path, "typo")
    assert "no such SQLite file" in one_line_error(kvstores("ls", url), "ls")
    assert not (tmp_path / "typo.db").exists()


def test_bad_json_and_bad_ttl_are_one_line(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert "not valid JSON" in one_line_error(kvstores("put", url, "c", "k", "{nope"), "put")
    assert "must be an object" in one_line_error(kvstores("put", url, "c", "k", "[1, 2]"), "put")
    assert "InvalidTTLError" in one_line_error(kvstores("put", url, "c", "k", "{}", "--ttl", "-1"), "put")
    assert "SerializationError" in one_line_error(kvstores("put", url, "c", "k", '{"x": NaN}'), "put")


# -- ls, get, put, delete -----------------------------------------------------------------


@pytest.mark.parametrize("row", rows_with("persistent", "processes"))
def test_put_ls_get_delete(
    row: str, namespace: str, table: Callable[[str, str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = table(row, namespace)
    assert main(["put", url, "sessions", "alpha", '{"user": "alice", "n": 1}', "--ttl", "120"]) == 0
    assert main(["put", url, "sessions", "line\nbreak", '{"big": 123456789012345678901234567890}']) == 0
    assert main(["put", url, "other", "x", "{}"]) == 0
    capsys.readouterr()

    assert main(["ls", url]) == 0
    assert capsys.readouterr().out.split() == ["other", "sessions"]
    assert main(["ls", url, "sessions"]) == 0
    listing = capsys.readouterr().out.splitlines()  # sorted by key
    ttl, key = listing[0].split()
    assert key == "alpha" and 110 < float(ttl.rstrip("s")) <= 120  # 2.6 s went by on a loaded Cluster row
    assert listing[1].split() == ["never", '"line\\nbreak"']

    assert main(["get", url, "sessions", "line\nbreak"]) == 0
    assert capsys.readouterr().out == '{\n  "big": 123456789012345678901234567890\n}\n'
    assert main(["delete", url, "sessions", "alpha"]) == 0
    assert main(["get", url, "sessions", "alpha"]) == 1
    assert capsys.readouterr().err == "kvstores get: no key 'alpha' in collection 'sessions'\n"


def test_ls_json_and_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = sqlite_url(tmp_path)
    run(seed(url, {"c": {f"k{index}": ({"n": index}, 60.0 if index % 2 else None) for index in range(5)}}))
    assert main(["ls", url, "c", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [row["key"] for row in listed] == [f"k{index}" for index in range(5)]
    assert listed[0]["ttl"] is None and 59 < listed[1]["ttl"] <= 60
    assert main(["ls", url, "c", "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    assert "--limit N for more" in captured.err
    assert main(["ls", url, "--json"]) == 0
    assert capsys.readouterr().out == '[\n  "c"\n]\n'


def test_put_reads_json_from_stdin(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    assert kvstores("put", url, "c", "k", "-", stdin='{"from": "stdin"}').returncode == 0
    assert kvstores("get", url, "c", "k").stdout == '{\n  "from": "stdin"\n}\n'


def test_ls_get_copy_and_demo_read_kvstores_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(url, {"c": {"k": ({"v": 1}, None)}}))
    monkeypatch.setenv("KVSTORES_URL", url)
    assert main(["ls"]) == 0
    assert capsys.readouterr().out == "c\n"
    assert main(["ls", "c"]) == 0
    assert capsys.readouterr().out.split() == ["never", "k"]
    assert main(["get", "c", "k"]) == 0
    assert capsys.readouterr().out == '{\n  "v": 1\n}\n'
    assert main(["copy", dest]) == 0
    assert capsys.readouterr().out == "copied 1 entries in 1 collections, skipped 0\n"
    assert run(dump(dest)) == {"c": {"k": ({"v": 1}, None)}}
    monkeypatch.delenv("KVSTORES_URL")
    assert main(["get", "c", "k"]) == 2
    assert "$KVSTORES_URL is not set" in capsys.readouterr().err


def test_demo_on_an_unreachable_store_stops_at_once_in_one_line() -> None:
    """Before any scene: the servers' tools would log each failed call of an unreachable store as a traceback."""
    unreachable = f"redis://:s3cretPW@127.0.0.1:{free_port()}/0?timeout=0.5"
    result = kvstores("demo", "--store", unreachable)
    assert result.returncode == 1, result.stdout
    assert result.stderr == "", result.stderr
    assert result.stdout.splitlines()[-1].startswith("demo stopped: cannot reach the store: "), result.stdout
    assert "s3cretPW" not in result.stdout


def test_demo_takes_its_store_from_kvstores_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvstores import cli

    monkeypatch.setenv("KVSTORES_URL", "redis://example:6379/0")
    assert cli._demo_arguments([]) == ["--store", "redis://example:6379/0"]
    assert cli._demo_arguments(["--store", "memory://"]) == ["--store", "memory://"]
    monkeypatch.delenv("KVSTORES_URL")
    assert cli._demo_arguments([]) == []


# -- copy ---------------------------------------------------------------------------------

ROUND_TRIP_COLLECTIONS = ("sessions", "tokens", "cache")
ROUND_TRIP_ENTRIES = 10_000


def round_trip_entries() -> dict[str, dict[str, tuple[dict[str, Any], float | None]]]:
    """10,000 entries in 3 collections: a third never expire, the rest on 20 different fractional TTLs."""
    entries: dict[str, dict[str, tuple[dict[str, Any], float | None]]] = {name: {} for name in ROUND_TRIP_COLLECTIONS}
    for index in range(ROUND_TRIP_ENTRIES):
        collection = ROUND_TRIP_COLLECTIONS[index % 3]
        ttl = None if index % 3 == 0 else 600.25 + (index % 20) * 37.7
        value = {"i": index, "big": 2**80 + index, "text": f"é {index}\n", "list": [index, None, True, 1.5]}
        entries[collection][f"key:{index}/{'x' * (index % 7)}"] = (value, ttl)
    return entries


def expiries(url: str) -> dict[tuple[str, str], float | None]:
    """When each entry of the store at ``url`` expires (wall clock; None: never).

    Each collection's TTLs are read in one ttl_many and turned into times with the clock read
    in the middle of that call: off by at most half its duration (milliseconds on a quiet
    machine, up to a second on a loaded one).
    """

    async def read() -> dict[tuple[str, str], float | None]:
        found: dict[tuple[str, str], float | None] = {}
        async with open_store(url) as store:
            for collection in await store.collections():
                keys = await store.keys(collection)
                started = time.time()
                rows = await store.ttl_many(keys, collection=collection)
                middle = (started + time.time()) / 2
                found.update(
                    {(collection, key): None if ttl is None else middle + ttl for key, (_, ttl) in zip(keys, rows)}
                )
        return found

    return run(read())  # type: ignore[no-any-return]


@pytest.mark.redis
@pytest.mark.mongodb
def test_round_trip_sqlite_redis_mongodb_sqlite_keeps_values_and_ttls(
    tmp_path: Path, namespace: str, table: Callable[[str, str], str]
) -> None:
    first, last = sqlite_url(tmp_path, "first"), sqlite_url(tmp_path, "last")
    redis_url, mongodb_url = table("redis", namespace), table("mongodb", namespace)
    entries = round_trip_entries()
    run(seed(first, entries))
    expected = expiries(first)

    hop = kvstores("copy", first, redis_url)  # one hop as a process, the others in-process
    assert hop.returncode == 0, hop.stderr
    assert hop.stdout == f"copied {ROUND_TRIP_ENTRIES} entries in 3 collections, skipped 0\n"
    assert main(["copy", redis_url, mongodb_url]) == 0
    assert main(["copy", mongodb_url, last]) == 0

    copied = run(dump(last))
    assert sorted(copied) == sorted(ROUND_TRIP_COLLECTIONS)
    for collection, items in entries.items():
        assert copied[collection].keys() == items.keys()
        assert {key: value for key, (value, _) in copied[collection].items()} == {
            key: value for key, (value, _) in items.items()
        }
    for (collection, key), expiry in expiries(last).items():
        original = expected[collection, key]
        if original is None:
            assert expiry is None, (collection, key)
        else:
            assert expiry is not None, (collection, key)
            # each expiry is read as a clock read around one ttl_many of 3,333 keys: +-1 s on a loaded machine
            assert abs(expiry - original) < 2.5, (collection, key, expiry - original)


def test_copy_from_py_key_value_memory_store(tmp_path: Path) -> None:
    dest = sqlite_url(tmp_path)
    started = time.time()
    result = kvstores("copy", "tests.support.cli_targets:memory_source", dest)
    finished = time.time()
    assert result.returncode == 0, result.stderr
    total = sum(targets.MEMORY_ENTRIES.values())
    assert result.stdout == f"copied {total} entries in 2 collections, skipped 0\n"
    copied = run(dump(dest))
    for collection, count in targets.MEMORY_ENTRIES.items():
        assert len(copied[collection]) == count
        for index in range(count):
            value, remaining = copied[collection][f"{collection}-{index}"]
            assert value == targets.memory_value(collection, index)
            if collection == "tokens":  # seeded (in the child) after started, copied before finished
                assert remaining is not None
                assert started + targets.MEMORY_TTL - 1 < time.time() + remaining < finished + targets.MEMORY_TTL + 1
            else:
                assert remaining is None


@pytest.mark.redis
def test_copy_from_a_py_key_value_file_tree_store(
    tmp_path: Path, namespace: str, table: Callable[[str, str], str]
) -> None:
    folder = tmp_path / "filetree"
    os.environ[targets.FOLDER_VARIABLE] = str(folder)  # the factories read it, here and in the child

    async def write() -> None:
        store = targets.filetree_plain()
        await store.put_many(["a", "b"], [{"n": 1}, {"n": 2}], collection="oauth", ttl=900)
        await store.put("c", {"n": 3}, collection="clients")

    try:
        written = time.time()
        run(write())
        dest = table("redis", namespace)
        result = kvstores("copy", "tests.support.cli_targets:filetree_listed", dest)
        assert result.returncode == 0, result.stderr
        assert result.stdout == "copied 3 entries in 2 collections, skipped 0\n"
        copied = run(dump(dest))
        assert copied["clients"] == {"c": ({"n": 3}, None)}
        assert {key: value for key, (value, _) in copied["oauth"].items()} == {"a": {"n": 1}, "b": {"n": 2}}
        assert all(900 - (time.time() - written) - 1 < ttl <= 900 for _, ttl in copied["oauth"].values())

        # py-key-value's own file stores cannot list their entries: one line, exit 2
        plain = kvstores("copy", "tests.support.cli_targets:filetree_plain", sqlite_url(tmp_path))
        assert plain.returncode == 2
        assert "the store has no keys()" in one_line_error(plain, "copy")
    finally:
        del os.environ[targets.FOLDER_VARIABLE]


def test_copy_reports_a_source_page_limit(tmp_path: Path) -> None:
    result = kvstores("copy", "tests.support.cli_targets:paged_source", sqlite_url(tmp_path))
    assert result.returncode == 1
    assert "listed exactly 10000 keys, possibly a page limit" in result.stderr
    assert result.stdout == "copied 10000 entries in 1 collections, skipped 0, failed 1\n"


def test_copy_reports_each_entry_the_destination_rejects(tmp_path: Path) -> None:
    dest = sqlite_url(tmp_path)
    result = kvstores("copy", "tests.support.cli_targets:long_key_source", dest)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"kvstores copy: not copied: collection 'mixed' key '{targets.LONG_KEY}': InvalidKeyError"
    )
    assert result.stdout == "copied 2 entries in 1 collections, skipped 0, failed 1\n"
    assert run(dump(dest)) == {"mixed": {"good-1": ({"n": 1}, None), "good-2": ({"n": 3}, None)}}


def test_copy_reports_an_entry_the_source_cannot_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"c": {"good": ({"n": 1}, None), "bad": ({"n": 2}, None)}}))
    with closing(sqlite3.connect(tmp_path / "state.db")) as db, db:
        db.execute("UPDATE kvstores_entries SET value = 'not json' WHERE key = 'bad'")
    assert main(["copy", source, dest]) == 1
    captured = capsys.readouterr()
    assert "not copied: collection 'c' key 'bad': DeserializationError" in captured.err
    assert captured.out == "copied 1 entries in 1 collections, skipped 0, failed 1\n"


def test_copy_skips_expired_entries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"c": {"short": ({"n": 1}, 0.2), "long": ({"n": 2}, 60.0), "never": ({"n": 3}, None)}}))
    time.sleep(0.4)
    assert main(["copy", source, dest]) == 0
    assert capsys.readouterr().out == "copied 2 entries in 1 collections, skipped 0\n"
    copied = run(dump(dest))
    assert sorted(copied["c"]) == ["long", "never"]


def test_copy_no_overwrite_keeps_what_dest_has(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"c": {"a": ({"from": "source"}, None), "b": ({"from": "source"}, None)}}))
    run(seed(dest, {"c": {"a": ({"from": "dest"}, None)}}))
    assert main(["copy", source, dest, "--no-overwrite"]) == 0
    assert capsys.readouterr().out == "copied 1 entries in 1 collections, skipped 1 (0 expired, 1 already in DEST)\n"
    assert run(dump(dest)) == {"c": {"a": ({"from": "dest"}, None), "b": ({"from": "source"}, None)}}
    assert main(["copy", source, dest]) == 0
    assert run(dump(dest))["c"]["a"] == ({"from": "source"}, None)


def test_copy_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"c": {"a": ({"n": 1}, None)}, "d": {"b": ({"n": 2}, 60.0)}}))
    assert main(["copy", source, dest, "--dry-run"]) == 0
    assert capsys.readouterr().out == "would copy 2 entries in 2 collections, skipped 0 (dry run: nothing written)\n"
    assert run(dump(dest)) == {}


def test_copy_only_the_named_collections(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"a": {"k": ({"n": 1}, None)}, "b": {"k": ({"n": 2}, None)}, "c": {"k": ({"n": 3}, None)}}))
    assert main(["copy", source, dest, "--collection", "a", "--collection", "c"]) == 0
    assert capsys.readouterr().out == "copied 2 entries in 2 collections, skipped 0\n"
    assert sorted(run(dump(dest))) == ["a", "c"]


def test_copy_shows_a_progress_bar_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, dest = sqlite_url(tmp_path), sqlite_url(tmp_path, "dest")
    run(seed(source, {"c": {f"k{index}": ({"n": index}, None) for index in range(2_500)}}))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["copy", source, dest]) == 0
    captured = capsys.readouterr()
    assert captured.out == "copied 2500 entries in 1 collections, skipped 0\n"
    assert "2500/2500" in captured.err


def test_copy_stops_with_one_line_when_dest_goes_away(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = sqlite_url(tmp_path)
    run(seed(source, {"c": {"k": ({"n": 1}, None)}}))
    port = free_port()
    assert main(["copy", source, f"redis://127.0.0.1:{port}/0?timeout=0.5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the store" in err


# -- ping: a readiness probe ------------------------------------------------------------------


_PAUSING_COPY = """
import asyncio, faulthandler, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack if it hangs
from kvstores import _copy
from kvstores.cli import main

put_group = _copy.Copy._put_group

async def pausing(self, *args):
    if self.tally.copied:  # a chunk has landed: hold the next write until Ctrl-C cancels the command
        os.write(int(sys.argv[1]), b"paused")
        await asyncio.Event().wait()
    await put_group(self, *args)

_copy.Copy._put_group = pausing
sys.exit(main(sys.argv[2:]))
"""
"""``kvstores copy`` in a child process that holds its second write until it is interrupted, having said so
on the pipe whose descriptor is its first argument: the test interrupts a copy it knows to be half done."""


def test_copy_interrupted_by_sigint_still_ends_with_its_summary(tmp_path: Path) -> None:
    source, dest = tmp_path / "source.db", tmp_path / "dest.db"

    async def fill() -> None:
        async with open_store(f"sqlite:///{source}") as store:
            for batch in range(8):
                keys = [f"k{batch}-{i}" for i in range(1_000)]
                await store.put_many(keys, [{"i": i} for i in range(1_000)], collection=f"c{batch % 4}")

    asyncio.run(fill())
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    environment.pop("KVSTORES_URL", None)
    paused, pausing = os.pipe()
    try:
        with subprocess.Popen(
            [sys.executable, "-c", _PAUSING_COPY, str(pausing), "copy", f"sqlite:///{source}", f"sqlite:///{dest}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=environment,
            pass_fds=(pausing,),
            preexec_fn=interruptible,
        ) as child:
            os.close(pausing)
            pausing = -1
            try:
                said = _read_within(paused, 120)
            finally:
                child.send_signal(signal.SIGINT)  # mid-copy: one chunk has landed, the next write waits
                stdout, stderr = _communicate_or_dump(child, 120)
    finally:
        os.close(paused)
        if pausing != -1:
            os.close(pausing)
    assert said == b"paused", (said, stdout, stderr)
    lines = stdout.strip().splitlines()
    assert lines == ["copied 1000 entries in 1 collections, skipped 0 before it was interrupted"], stdout
    assert _rows(dest) == 1_000  # the summary counts the acknowledged writes, and the held one never ran
    assert child.returncode == 130, stderr
    assert stderr.strip() == "kvstores copy: interrupted", stderr


def _communicate_or_dump(child: subprocess.Popen[str], seconds: float) -> tuple[str, str]:
    """The child's output once it exits within ``seconds``; else fail with every thread's stack
    (its faulthandler answers SIGUSR1), the child killed."""
    try:
        return child.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGUSR1)
        try:
            _, stderr = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            _, stderr = child.communicate()
        child.kill()
        child.wait()
        pytest.fail(f"the child did not exit within {seconds} s of SIGINT; its threads:\n{stderr}")


def _read_within(descriptor: int, seconds: float) -> bytes:
    """What the pipe's writer sent first, waiting up to ``seconds`` for it (b"": it closed without a word)."""
    ready, _, _ = select.select([descriptor], [], [], seconds)
    return os.read(descriptor, 64) if ready else b""


def _rows(path: Path) -> int:
    """Entries in a kvstores SQLite file (0 while it does not exist yet)."""
    try:
        with closing(sqlite3.connect(path, timeout=10)) as db:
            return int(db.execute("SELECT count(*) FROM kvstores_entries").fetchone()[0])
    except sqlite3.OperationalError:  # no file or no table yet
        return 0


def test_ping_exits_0_when_the_store_answers_and_1_when_it_does_not(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    main(["put", url, "c", "k", "{}"])
    answered = kvstores("ping", url)
    assert answered.returncode == 0 and answered.stdout.startswith(f"{url}: ok ("), answered.stderr
    assert kvstores("ping", env={"KVSTORES_URL": "redis://127.0.0.1:6379/15"}).returncode == 0
    port = free_port()  # nothing listens there
    started = time.monotonic()
    down = kvstores("ping", f"redis://127.0.0.1:{port}/0?timeout=0.5")
    assert down.returncode == 1
    assert "StoreConnectionError" in one_line_error(down, "ping")
    assert time.monotonic() - started < 30
    assert "KVSTORES_URL is not set" in one_line_error(kvstores("ping"), "ping")


def test_tasks_with_the_url_from_the_environment_fails_in_one_line() -> None:
    url = f"redis://:s3cretPW@127.0.0.1:{free_port()}/0?timeout=0.5"  # nothing listens there
    for arguments in (("tasks", "ls"), ("tasks", "ls", "--json"), ("tasks", "show", "#0123456789ab")):
        failed = kvstores(*arguments, env={"KVSTORES_URL": url})
        assert failed.returncode == 1, failed.stderr
        line = one_line_error(failed, "tasks")
        assert "s3cretPW" not in line + failed.stdout
