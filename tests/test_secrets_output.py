"""Credentials never appear in output: every CLI verb, kvstores check and bench, with a password in the URL.

Each case runs the real ``kvstores`` command in a child process with every logger at DEBUG
(on stderr) and warnings shown, against a reachable server, an unreachable one (a closed
loopback port) and with bad options, the URL given as an argument and through KVSTORES_URL;
it fails if the password, as written or decoded, appears anywhere in stdout or stderr.
The unit tests pin :func:`kvstores._urls.redact` and :func:`kvstores._urls.redact_text`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import pytest

from kvstores import open_store
from kvstores._urls import redact, redact_text
from kvstores.targets import Target
from tests.support import Backend, free_port, with_user_info
from tests.support.fixtures import rows_with, start_row

ROOT = Path(__file__).resolve().parent.parent
SECRET = "kvS3cretPw91"
"""The password of every URL here; a case fails when it appears in the output."""
ENCODED = quote(f"{SECRET}/@?#x", safe="")
"""A password that must be percent-encoded: the output must show neither form."""

_RUN = (
    "import logging, sys; logging.basicConfig(level=logging.DEBUG, stream=sys.stderr);"
    " from kvstores.cli import main; sys.exit(main())"
)
_WORKERS = 4  # child processes at once


# -- redact() and redact_text() -------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@127.0.0.1:1/0", "redis://:***@127.0.0.1:1/0"),
        ("redis://app:pw@host:6379/0?prefix=a", "redis://app:***@host:6379/0?prefix=a"),
        ("rediss://app:p%40ss%2Fw@host/0", "rediss://app:***@host/0"),
        ("redis://onlyaword@host/0", "redis://***@host/0"),
        ("postgresql://postgres@127.0.0.1/test", "postgresql://***@127.0.0.1/test"),
        ("postgresql://u:a:b@[::1]:5432/db?sslmode=require", "postgresql://u:***@[::1]:5432/db?sslmode=require"),
        ("mongodb://u:p@h1,h2:27018/db?replicaSet=rs", "mongodb://u:***@h1,h2:27018/db?replicaSet=rs"),
        ("mongodb+srv://u:p@cluster0.example.net/db", "mongodb+srv://u:***@cluster0.example.net/db"),
        ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("unix:///run/redis.sock?password=pw&db=1", "unix:///run/redis.sock?password=***&db=1"),
        ("redis://h/0?password=pw&token=t&api_key=k&x=1", "redis://h/0?password=***&token=***&api_key=***&x=1"),
        (
            "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=pw&authMechanismProperties=AWS_SESSION_TOKEN:t",
            "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=***&authMechanismProperties=***",
        ),
        ("postgresql://h/db?sslpassword=pw&sslkey=/k.pem", "postgresql://h/db?sslpassword=***&sslkey=***"),
        ("redis://h/0?ssl_keyfile_password=pw&SECRET=s", "redis://h/0?ssl_keyfile_password=***&SECRET=***"),
        # unescaped characters a URL parser would split on: masked up to the last "@"
        ("redis://:p/w#o?r@d@host:1/0", "redis://:***@host:1/0"),
        ("redis://host/0?client_name=a@b", "redis://***@b"),
        # no user info, or not a URL at all
        ("sqlite:///dir/a@b.db", "sqlite:///dir/a@b.db"),
        ("sqlite://:memory:", "sqlite://:memory:"),
        ("memory://", "memory://"),
        ("package.module:factory", "package.module:factory"),
        ("redis:/:pw@host", "redis:***@host"),
        ("", ""),
        ("@", "@"),
        ("://@", "://@"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert redact(shown) == shown


@pytest.mark.parametrize(
    "url", ["redis://[::1:pw@x", "http://[bad", "a://b:c@[", "\udcff://u:\udcff@h", "%zz://:%zz@h"]
)
def test_redact_never_raises_on_garbage(url: str) -> None:
    redacted = redact(url)
    redact_text(url, url)
    assert ":pw@" not in redacted


def test_redact_text_masks_the_secrets_of_a_url_as_written_and_decoded() -> None:
    url = f"redis://app:{ENCODED}@host:1/0?password=pw%2Bq"
    text = (
        f"AUTH failed for {SECRET}/@?#x ({ENCODED}); option pw+q; "
        f"while opening '{url}' after redis://:other@elsewhere/1"
    )
    scrubbed = redact_text(text, url)
    assert SECRET not in scrubbed
    assert "pw+q" not in scrubbed and "pw%2Bq" not in scrubbed
    assert "other" not in scrubbed  # any URL in the text is redacted too
    assert "'redis://app:***@host:1/0?password=***'" in scrubbed
    assert redact_text("no URL here: timeout", "redis://app@host/0") == "no URL here: timeout"


def test_a_check_target_shows_its_url_redacted() -> None:
    # pytest prints a failed check's arguments, the target among them, with kvstores check -v
    target = Target(f"redis://:{SECRET}@host/0", dict, "store", "kvstores.backends.redis.RedisStore", frozenset())
    assert SECRET not in repr(target) and "redis://:***@host/0" in repr(target)


# -- the command line ---------------------------------------------------------------------------


def _kvstores(*args: str, url_variable: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name != "KVSTORES_URL"}
    environment |= {"PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default", "COLUMNS": "400"}
    if url_variable is not None:
        environment["KVSTORES_URL"] = url_variable
    return subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=120,
    )


ALL = ("some", "rest", "check", "bench")
"""Every verb: the groups of :func:`_commands`."""


def _commands(url: str, sqlite: str, groups: tuple[str, ...]) -> list[tuple[list[str], str | None]]:
    """The verbs of ``groups`` on ``url`` as (arguments, $KVSTORES_URL), in an order that makes reads find data.

    Groups: "some" (put, get, ping, copy), "rest" (the other operator verbs), "check" (the kv
    suite: seconds on a reachable store) and "bench" (``--quick``, one round).
    """
    bench = ["bench", "--quick", "--no-events", "--no-atomic", "--stream-lengths", "", "--rounds", "1", url]
    verbs: dict[str, list[tuple[list[str], str | None]]] = {
        "some": [
            (["put", url, "secrets", "k", '{"n": 1}'], None),
            (["get", url, "secrets", "k"], None),
            (["ping", url], None),
            (["ping"], url),
            (["copy", url, sqlite], None),
        ],
        "rest": [
            (["get", "secrets", "k"], url),
            (["ls", url], None),
            (["ls", url, "secrets", "--json"], None),
            (["ls", "secrets"], url),
            (["copy", sqlite], url),
            (["copy", sqlite, url, "--dry-run"], None),
            (["delete", url, "secrets", "k"], None),
            (["delete", url, "secrets", "gone"], None),
        ],
        "check": [(["check", url, "--json", os.devnull], None)],
        "bench": [(bench, None)],
    }
    return [command for group in groups for command in verbs[group]]


def _leaks(url: str, sqlite: str, groups: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """Each command on ``url`` whose output shows the password (or its decoded form), and the verbs that succeeded."""
    found, succeeded = [], set()
    for arguments, variable in _commands(url, sqlite, groups):
        result = _kvstores(*arguments, url_variable=variable)
        if result.returncode == 0:
            succeeded.add(arguments[0])
        output = result.stdout + result.stderr
        squeezed = "".join(output.split())  # a wrapped line may split the password
        if SECRET in output or SECRET in squeezed or ENCODED in squeezed:
            shown = [arguments[0], *(redact(argument) for argument in arguments[1:])]
            via = " (URL from $KVSTORES_URL)" if variable else ""
            lines = [line for line in output.splitlines() if SECRET in line or ENCODED in line] or [output[-500:]]
            found.append(f"kvstores {' '.join(shown)}{via}: {lines[0][:400]}")
    return found, succeeded


def _with_query(url: str, **query: str) -> str:
    """``url`` with the query options ``query`` added."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query="&".join(filter(None, [parts.query, urlencode(query)]))))


def _cases(backend: Backend, namespace: str) -> list[tuple[str, tuple[str, ...]]]:
    """(URL, groups of verbs) of each case of one row, every URL carrying the password.

    Every verb runs on a reachable store, an unreachable one (a closed port) and with a bad
    option value; the cases that only vary what the driver is given run a few. A server that
    refuses every user (:attr:`~tests.support.Backend.accepts_password`) is also reached with
    the password as an option; a slow one runs check only unreachable.
    """
    reachable = backend.url_with_password(namespace, SECRET)
    parts = urlsplit(reachable)
    user_info = parts.netloc.rpartition("@")[0]
    unreachable = urlunsplit(parts._replace(netloc=f"{user_info}@127.0.0.1:{free_port()}"))
    some: tuple[str, ...] = ("some",)
    probe: tuple[str, ...] = ("some", "check")
    slow = backend.slow_server
    cases: list[tuple[str, tuple[str, ...]]] = [
        (reachable, ALL if backend.accepts_password else some),
        (_with_query(unreachable, timeout="1"), probe if slow else ALL),
        (_with_query(reachable, timeout="abc"), ALL),
        (_with_query(reachable, nonsense="1"), some),
        (backend.url_with_password(namespace, f"{SECRET}/@?#x"), some),
    ]
    assert ENCODED in cases[-1][0]
    user = user_info.partition(":")[0]
    host, port = parts.hostname, parts.port
    cases += [
        (with_user_info(reachable, f"{user}:{SECRET}/x?y#z"), some),  # unescaped: a parser would cut it
        (with_user_info(reachable, f"{user}:{SECRET}@:x"), some),  # an unescaped "@" and ":"
        (with_user_info(reachable, f"{user}:{SECRET}é€"), some),  # non-ASCII, as typed
        (_with_query(with_user_info(reachable, user), password=SECRET), some),  # in the query
        (urlunsplit(parts._replace(netloc=f"{user_info}@{host}:{port},127.0.0.1:{free_port()}")), some),
    ]
    tls = (backend.tls_url(reachable), backend.tls_url(unreachable))
    if tls[0] is not None and tls[1] is not None:  # TLS to a server that speaks none, and to no server
        cases += [(_with_query(tls[0], timeout="1"), some), (tls[1], probe)]
    if not backend.accepts_password:
        cases.append((_with_query(with_user_info(reachable, ""), password=SECRET), ("some", "rest", "bench")))
    return cases


def _destroy(url: str) -> None:
    async def destroy() -> None:
        async with open_store(url) as store:
            await store.destroy()

    asyncio.run(destroy())


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[str]:
    """An SQLite store holding one entry, for copy to and from."""
    url = f"sqlite:///{tmp_path / 'scratch.db'}"

    async def seed() -> None:
        async with open_store(url) as store:
            await store.put("copied", {"n": 2}, collection="secrets")

    asyncio.run(seed())
    yield url


@pytest.mark.parametrize("name", rows_with("proxied", "processes"))
def test_no_command_ever_shows_the_password(
    name: str, namespace: str, scratch: str, started: dict[str, Backend | str]
) -> None:
    """Every row whose URL names one server (and that differs from the others in more than its
    client object, which the command line never sees): the password in its URL never shows."""
    backend = start_row(name, started)
    cases = _cases(backend, namespace)
    try:
        with ThreadPoolExecutor(_WORKERS) as pool:
            results = list(pool.map(lambda case: _leaks(case[0], scratch, case[1]), cases))
    finally:
        _destroy(backend.full_url(namespace))
    leaks = [leak for found, _ in results for leak in found]
    assert not leaks, "the password was shown:\n" + "\n".join(leaks)
    succeeded = set().union(*(verbs for _, verbs in results))
    assert {"put", "get", "ping", "ls", "copy"} <= succeeded, "the reachable store was not reached"


def test_a_bad_url_and_bad_arguments_never_show_the_password(tmp_path: Path) -> None:
    sqlite = f"sqlite://app:{SECRET}@host/{tmp_path}/x.db"
    leaks = []
    for arguments in (
        ["ping", sqlite],
        ["ls", f"nosuchscheme://:{SECRET}@host/0"],
        ["get", f"redis:/:{SECRET}@host/0", "c", "k"],
        ["delete", "memory://", "c", "k", f"redis://:{SECRET}@host/0"],
        ["check", f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"],
        ["bench", "--quick", f"redis://:{SECRET}@127.0.0.1:{free_port()}/0?timeout=1"],
    ):
        result = _kvstores(*arguments)
        assert result.returncode != 0, arguments
        output = result.stdout + result.stderr
        if SECRET in output:
            leaks.append(f"kvstores {arguments[0]}: {output[-400:]}")
    assert not leaks, "\n".join(leaks)


@pytest.mark.redis
def test_ping_prints_the_url_redacted(namespace: str, started: dict[str, Backend | str]) -> None:
    url = _with_query(start_row("redis", started).url_with_password(namespace, SECRET), password=SECRET)
    result = _kvstores("ping", url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{redact(url)}: ok ("), result.stdout
    assert redact(url).startswith("redis://:***@127.0.0.1:6379/15?prefix=") and redact(url).endswith("&password=***")
