"""TLS, least privilege and secrets.

- TLS: a CA and a server certificate (127.0.0.1 / localhost) generated here with the openssl
  CLI, with the extensions a real CA puts in them (:data:`CA_EXTENSIONS`,
  :data:`SERVER_EXTENSIONS`), which Python 3.13's strict default verification requires; a
  redis-server with ``--tls-port`` and a private PostgreSQL with ``ssl=on``. Verification is on
  by default; a wrong CA, or none, fails with StoreConnectionError saying why.
- Redis ACL: the store works for a user allowed only ``~<prefix>{*`` and :data:`REDIS_COMMANDS`;
  every one of those commands is needed (without any one, some operation is refused), and
  ``keys()``/``destroy()`` never touch a key outside the prefix (the user would be refused).
- Secrets: passwords never appear in ``repr(store)``, in error messages or in the logs.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from kvstores import open_store
from kvstores.backends.redis import RedisStore
from kvstores.errors import KVStoreError, StoreConnectionError
from tests.support import Unavailable, free_port
from tests.support.fixtures import skip_or_fail
from tests.support.redis import RedisServer

pytestmark = pytest.mark.anyio

REDIS_COMMANDS = ("get", "set", "del", "mget", "pttl", "getdel", "evalsha", "script|load", "scan")
"""Every command RedisStore's operations send (db 0; add ``+select`` for another database)."""
PREFIX = "app"
SECRET = "s3cr3t-Pa55word"


def redis_acl(user: str, password: str, commands: tuple[str, ...] = REDIS_COMMANDS, prefix: str = PREFIX) -> list[str]:
    """The ACL SETUSER arguments that allow ``commands`` on ``<prefix>{*`` keys only."""
    return [
        user,
        "reset",
        "on",
        f">{password}",
        f"~{prefix}{{*",
        "resetchannels",
        "-@all",
        *(f"+{c}" for c in commands),
    ]


CA_EXTENSIONS = """\
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""
"""A CA certificate's extensions: Python 3.13's VERIFY_X509_STRICT refuses a CA without keyUsage, SKI or AKI."""
SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""
"""The server certificate's: its names, its use, and the key identifier of the CA that signed it."""


@dataclass
class Certificates:
    """A CA, a server certificate it signed (for 127.0.0.1 and localhost), and an unrelated CA."""

    folder: Path
    ca: Path
    cert: Path
    key: Path
    wrong_ca: Path


def _openssl(folder: Path, *arguments: str) -> None:
    result = subprocess.run(["openssl", *arguments], cwd=folder, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise Unavailable(f"openssl {arguments[0]} failed: {result.stderr}")


def _certificates_for(service: str, request: pytest.FixtureRequest) -> Certificates:
    """The module's certificates, for the TLS server of ``service``: without the openssl CLI its
    tests skip, or fail when KVSTORES_REQUIRE names ``service``."""
    if shutil.which("openssl") is None:
        skip_or_fail(service, "the openssl CLI is not installed")
    certificates: Certificates = request.getfixturevalue("certificates")
    return certificates


@pytest.fixture(scope="module")
def certificates() -> Iterator[Certificates]:
    """Made once per module; a TLS server's fixture (listed first by its tests) checks for openssl."""
    folder = Path(tempfile.mkdtemp(prefix="kvstores-tls-"))
    (folder / "ca.ext").write_text(CA_EXTENSIONS)
    (folder / "server.ext").write_text(SERVER_EXTENSIONS)
    try:
        for name, subject in (("ca", "/CN=kvstores test ca"), ("wrong-ca", "/CN=kvstores test wrong-ca"),
                              ("server", "/CN=localhost")):  # fmt: skip
            _openssl(folder, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                     "-out", f"{name}.csr", "-subj", subject)  # fmt: skip
        for ca in ("ca", "wrong-ca"):  # self-signed, with the CA's extensions
            _openssl(folder, "x509", "-req", "-in", f"{ca}.csr", "-signkey", f"{ca}.key", "-out", f"{ca}.crt",
                     "-days", "2", "-extfile", "ca.ext")  # fmt: skip
        _openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.crt", "-days", "2", "-extfile", "server.ext")  # fmt: skip
    except Unavailable as exc:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.fail(str(exc))
    yield Certificates(folder, folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "wrong-ca.crt")
    shutil.rmtree(folder, ignore_errors=True)


# -- Redis TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_redis(request: pytest.FixtureRequest) -> Iterator[tuple[RedisServer, int]]:
    certificates = _certificates_for("redis", request)
    tls_port = free_port()
    server = RedisServer(
        certificates.folder,
        *("--tls-port", str(tls_port), "--tls-cert-file", str(certificates.cert)),
        *("--tls-key-file", str(certificates.key), "--tls-ca-cert-file", str(certificates.ca)),
        *("--tls-auth-clients", "no"),
    )
    try:
        server.start()
    except Unavailable as exc:
        skip_or_fail("redis", f"cannot start redis-server with TLS: {exc}")
    yield server, tls_port
    server.stop()


@pytest.mark.redis
async def test_rediss_verifies_the_server(tls_redis: tuple[RedisServer, int], certificates: Certificates) -> None:
    _, port = tls_redis
    store = open_store(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certificates.ca}&prefix=tls&timeout=2")
    try:
        await store.put("k", {"v": 1}, ttl=10)
        assert await store.get("k") == {"v": 1}
        await store.destroy()
    finally:
        await store.aclose()


@pytest.mark.redis
def test_the_certificates_pass_strict_verification(
    tls_redis: tuple[RedisServer, int], certificates: Certificates
) -> None:
    """What Python 3.13's default context demands (VERIFY_X509_STRICT), checked on every Python."""
    _, port = tls_redis
    context = ssl.create_default_context(cafile=certificates.ca)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as connection,
        context.wrap_socket(connection, server_hostname="localhost") as tls,
    ):
        peer = tls.getpeercert()
    assert dict(peer["subjectAltName"]) == {"IP Address": "127.0.0.1", "DNS": "localhost"}


@pytest.mark.redis
@pytest.mark.parametrize("ca", ["wrong", "system"])
async def test_rediss_refuses_a_server_it_cannot_verify(
    tls_redis: tuple[RedisServer, int], certificates: Certificates, ca: str
) -> None:
    _, port = tls_redis
    query = f"ssl_ca_certs={certificates.wrong_ca}&" if ca == "wrong" else ""  # system: the machine's CAs
    store = open_store(f"rediss://127.0.0.1:{port}/0?{query}prefix=tls&timeout=2")
    try:
        with pytest.raises(StoreConnectionError, match="certificate verify failed"):
            await store.get("k")
    finally:
        await store.aclose()


# -- PostgreSQL TLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_postgres(request: pytest.FixtureRequest) -> Iterator[Any]:
    from tests.support.postgresql import PostgresServer

    certificates = _certificates_for("postgresql", request)

    try:
        server = PostgresServer()
        server.init()
    except Unavailable as exc:
        skip_or_fail("postgresql", f"cannot run a private PostgreSQL: {exc}")
    try:
        for name in ("server.crt", "server.key"):
            shutil.copy(certificates.folder / name, server.folder / name)
            if os.geteuid() == 0:
                shutil.chown(server.folder / name, "postgres", "postgres")
        (server.folder / "server.key").chmod(0o600)
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write(f"ssl = on\nssl_cert_file = '{server.folder / 'server.crt'}'\n")
            conf.write(f"ssl_key_file = '{server.folder / 'server.key'}'\n")
        server.start()
    except Unavailable as exc:
        server.remove()
        skip_or_fail("postgresql", f"cannot start PostgreSQL with TLS: {exc}")
    yield server
    server.remove()


@pytest.mark.postgresql
async def test_postgresql_verify_full(tls_postgres: Any, certificates: Certificates) -> None:
    url = f"{tls_postgres.url}?sslmode=verify-full&sslrootcert={certificates.ca}&timeout=5"
    store = open_store(url, table="tls")
    try:
        await store.put("k", {"v": 1})
        assert await store.get("k") == {"v": 1}
        await store.destroy()
    finally:
        await store.aclose()


@pytest.mark.postgresql
async def test_postgresql_verify_full_refuses_a_wrong_ca(tls_postgres: Any, certificates: Certificates) -> None:
    url = f"{tls_postgres.url}?sslmode=verify-full&sslrootcert={certificates.wrong_ca}&timeout=5"
    store = open_store(url, table="tls")
    try:
        with pytest.raises(StoreConnectionError, match="certificate verify failed"):
            await store.get("k")
    finally:
        await store.aclose()


# -- Redis ACL: least privilege ----------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[RedisServer]:
    folder = Path(tempfile.mkdtemp(prefix="kvstores-acl-"))
    server = RedisServer(folder)
    try:
        server.start()
    except Unavailable as exc:
        skip_or_fail("redis", f"cannot start redis-server: {exc}")
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


def _admin(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=5, decode_responses=True)


async def _every_operation(store: Any) -> None:
    """Every operation of the store once, checked."""
    await store.put("a", {"v": 1})
    await store.put("b", {"v": 2}, ttl=30)
    assert await store.get("a") == {"v": 1}
    assert (await store.ttl("b"))[0] == {"v": 2}
    await store.put_many(["c", "d"], [{"v": 3}, {"v": 4}], collection="other")
    assert await store.get_many(["c", "d"], collection="other") == [{"v": 3}, {"v": 4}]
    assert [value for value, _ in await store.ttl_many(["a", "b"])] == [{"v": 1}, {"v": 2}]
    assert sorted(await store.keys()) == ["a", "b"]
    assert sorted(await store.collections()) == ["default", "other"]
    assert await store.put_if_absent("e", {"v": 5})
    assert await store.pop("e") == {"v": 5}
    assert await store.update("a", lambda old: {"v": (old or {"v": 0})["v"] + 1}) == {"v": 2}
    assert await store.delete("a")
    assert await store.delete_many(["c", "zz"], collection="other") == 1
    assert await store.destroy_collection("other")
    assert await store.destroy()
    await store.cull()


@pytest.mark.redis
async def test_minimal_acl_is_enough(acl_redis: RedisServer) -> None:
    with _admin(acl_redis) as admin:
        admin.execute_command("ACL", "SETUSER", *redis_acl("app", SECRET))
        admin.script_flush()  # the store loads its scripts itself (SCRIPT LOAD)
    store = RedisStore(f"redis://app:{SECRET}@127.0.0.1:{acl_redis.port}/0", prefix=PREFIX, timeout=2)
    try:
        await _every_operation(store)
    finally:
        await store.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("missing", REDIS_COMMANDS)
async def test_every_command_of_the_acl_is_needed(acl_redis: RedisServer, missing: str) -> None:
    commands = tuple(command for command in REDIS_COMMANDS if command != missing)
    with _admin(acl_redis) as admin:
        admin.execute_command("ACL", "SETUSER", *redis_acl("lacking", SECRET, commands))
        admin.script_flush()
    store = RedisStore(f"redis://lacking:{SECRET}@127.0.0.1:{acl_redis.port}/0", prefix=PREFIX, timeout=2)
    try:
        with pytest.raises(KVStoreError, match=r"(?i)permission|NOPERM"):
            await _every_operation(store)
    finally:
        await store.aclose()
        with _admin(acl_redis) as admin:
            admin.delete(*admin.keys(f"{PREFIX}{{*") or ["-"])


@pytest.mark.redis
async def test_listing_and_destroy_never_touch_other_keys(acl_redis: RedisServer) -> None:
    others = ["other{default}a", "ap{default}a", "appx{default}a", "app", "app}{", "App{default}a"]
    with _admin(acl_redis) as admin:
        admin.execute_command("ACL", "SETUSER", *redis_acl("app", SECRET))
        for name in others:
            admin.set(name, '{"v": 0}')
    store = RedisStore(f"redis://app:{SECRET}@127.0.0.1:{acl_redis.port}/0", prefix=PREFIX, timeout=2)
    try:
        await store.put_many(["a", "b"], [{"v": 1}, {"v": 2}])
        assert sorted(await store.keys()) == ["a", "b"]  # SCAN sees every key: only ours are listed
        assert await store.collections() == ["default"]
        assert await store.destroy()  # a DEL of any other key would raise NOPERM
        assert await store.keys() == []
    finally:
        await store.aclose()
    with _admin(acl_redis) as admin:
        assert admin.exists(*others) == len(others)
        admin.delete(*others)


# -- secrets --------------------------------------------------------------------------------


SECRET_URLS = [
    pytest.param(f"redis://app:{SECRET}@127.0.0.1:{{port}}/0", marks=pytest.mark.redis, id="redis"),
    pytest.param(f"rediss://app:{SECRET}@127.0.0.1:{{port}}/0", marks=pytest.mark.redis, id="rediss"),
    pytest.param(f"redis+sentinel://app:{SECRET}@127.0.0.1:{{port}}/primary/0", marks=pytest.mark.redis, id="sentinel"),
    pytest.param(f"mongodb://app:{SECRET}@127.0.0.1:{{port}}/db", marks=pytest.mark.mongodb, id="mongodb"),
    pytest.param(f"postgresql://app:{SECRET}@127.0.0.1:{{port}}/db", marks=pytest.mark.postgresql, id="postgresql"),
]
"""URLs with a password, of a server that accepts connections and never answers (``{port}``)."""


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port whose listener never accepts: connections hang until the client times out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("template", SECRET_URLS)
async def test_secrets_stay_out_of_repr_errors_and_logs(
    template: str, silent_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url, options = template.format(port=silent_port), {"timeout": 1}
    # redis+sentinel:// through RedisStore until the registry names the scheme
    store = RedisStore.from_url(url, **options) if url.startswith("redis+sentinel") else open_store(url, **options)
    try:
        assert SECRET not in repr(store)
        with pytest.raises(StoreConnectionError) as caught:
            await store.put("k", {"v": 1})
        chain: list[BaseException] = []
        error: BaseException | None = caught.value
        while error is not None and len(chain) < 10:
            chain.append(error)
            error = error.__cause__ or error.__context__
        for error in chain:
            assert SECRET not in str(error), f"{type(error).__name__} shows the password: {error}"
            assert SECRET not in repr(error)
    finally:
        await store.aclose()
    assert SECRET not in caplog.text


@pytest.mark.redis
async def test_wrong_password_is_a_clear_error_without_the_password(acl_redis: RedisServer) -> None:
    with _admin(acl_redis) as admin:
        admin.execute_command("ACL", "SETUSER", *redis_acl("app", SECRET))
    store = RedisStore(f"redis://app:{SECRET}x@127.0.0.1:{acl_redis.port}/0", prefix=PREFIX, timeout=2)
    try:
        with pytest.raises(KVStoreError, match=r"(?i)password|auth") as caught:
            await store.get("k")
        assert SECRET not in str(caught.value)
    finally:
        await store.aclose()
