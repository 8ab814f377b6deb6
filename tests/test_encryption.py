"""Encryption at rest (``open_store(url, encryption_keys=[...])``) on every backend of the table.

What is stored is read back raw through the backend's own read primitive: every value must be
sealed under the first key and hold none of the secrets written, while every operation
(single and bulk, atomic, batched, with TTLs) answers exactly as without keys. FastMCP's OAuth
proxy and client, session state, StoreEventStore and StoreTokenStorage run on sealed stores.
``kvstores rekey`` runs as users run it: the command in a child process, with writers running.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fastmcp import Client, Context, FastMCP
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.auth import OAuthToken

from kvstores import EncryptionKeyError
from kvstores._sealing import SEALED_PREFIX, Sealer, generate_key
from kvstores.client import StoreTokenStorage
from kvstores.events import StoreEventStore
from tests.support import Backend
from tests.support.events import serving
from tests.support.fastmcp_slots import BrowserOAuth, FakeIdP, Loopback, oauth_proxy, protected_server

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

NEW, OLD = generate_key(), generate_key()
SECRET = "s3cret-tool-result-0123"
VALUE = {"token": SECRET, "n": 1, "big": 2**80, "nested": {"list": [1.5, None, True]}}


async def raw_values(store: Any) -> dict[tuple[str, str], str]:
    """Every live entry of ``store`` as the backend holds it (collection, key) -> stored text."""
    found = {}
    for collection in await store.collections():
        for key in await store.keys(collection):
            stored = await store._get(collection, key)
            if stored is not None:
                found[collection, key] = stored if isinstance(stored, str) else stored.decode()
    return found


def assert_sealed(raw: dict[tuple[str, str], str], key_id: str, *secrets: str) -> None:
    assert raw, "nothing was stored"
    for name, text in raw.items():
        assert text.startswith(f"{SEALED_PREFIX}{key_id}:"), name
        assert not any(secret in text for secret in secrets), name


@pytest.fixture
async def sealed(backend: Backend, namespace: str) -> AsyncIterator[Any]:
    """A store on the row's namespace that seals under NEW and opens NEW and OLD."""
    opened = await backend.open(namespace, encryption_keys=[NEW, OLD])
    yield opened
    await opened.destroy()
    await opened.aclose()


async def test_every_operation_works_on_sealed_values(sealed: Any) -> None:
    await sealed.put("k", VALUE, ttl=60)
    assert await sealed.get("k") == VALUE
    value, remaining = await sealed.ttl("k")
    assert value == VALUE and remaining is not None and 55 < remaining <= 60
    await sealed.put_many(["a", "b", "a"], [{"v": 1}, {"v": 2}, {"v": 3}], collection="bulk")
    assert await sealed.get_many(["a", "b", "c"], collection="bulk") == [{"v": 3}, {"v": 2}, None]
    assert [row[0] for row in await sealed.ttl_many(["a", "b"], collection="bulk")] == [{"v": 3}, {"v": 2}]
    assert await sealed.put_if_absent("once", {"v": 1}) and not await sealed.put_if_absent("once", {"v": 2})

    async def increment() -> None:
        await sealed.update("counter", lambda old: {"n": (old or {"n": 0})["n"] + 1})

    await asyncio.gather(*(increment() for _ in range(20)))
    assert await sealed.get("counter") == {"n": 20}
    concurrent = await asyncio.gather(*(sealed.get(key) for key in ["k", "once", "counter", "none"] * 10))
    assert concurrent == [VALUE, {"v": 1}, {"n": 20}, None] * 10  # batched reads open each value
    await asyncio.gather(*(sealed.put(f"p{i}", {"i": i}, ttl=30) for i in range(20)))
    assert await sealed.get_many([f"p{i}" for i in range(20)]) == [{"i": i} for i in range(20)]
    assert await sealed.pop("k") == VALUE and await sealed.get("k") is None
    assert_sealed(await raw_values(sealed), Sealer([NEW]).key_id, SECRET, "1208925819614629174706176")


async def test_keys_rotate_and_a_key_not_given_fails_closed(backend: Backend, namespace: str, sealed: Any) -> None:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: two store objects do not share data")
    plain = await backend.open(namespace)
    old = await backend.open(namespace, encryption_keys=[OLD])
    try:
        await old.put("old", VALUE)  # sealed under OLD: still opened by a store that lists it
        await plain.put("plain", VALUE)  # written before encryption was turned on: still read
        await sealed.put("new", VALUE)
        assert await sealed.get_many(["old", "plain", "new"]) == [VALUE] * 3
        new_id = Sealer([NEW]).key_id
        for store in (plain, old):
            with pytest.raises(EncryptionKeyError, match=new_id):
                await store.get("new")
            with pytest.raises(EncryptionKeyError, match=new_id):
                await store.update("new", lambda current: current)
        stored = await sealed._get(sealed.default_collection, "new")
        await plain._put(sealed.default_collection, "moved", stored, None)  # a sealed value copied elsewhere
        with pytest.raises(EncryptionKeyError, match="altered, or sealed for another key"):
            await sealed.get("moved")
        assert await sealed.get("new") == VALUE  # nothing changed by the refusals
    finally:
        await plain.aclose()
        await old.aclose()


async def test_fastmcp_and_sdk_slots_keep_nothing_in_plaintext(backend: Backend, namespace: str, sealed: Any) -> None:
    client_side = await backend.open(f"{namespace}c", encryption_keys=[NEW])
    try:
        idp = FakeIdP()
        mcp_port, idp_port = Loopback(), Loopback()
        oauth = BrowserOAuth(f"{mcp_port.base_url}/mcp", token_storage=client_side)
        async with idp_port.serving(idp.app()) as idp_url:
            app = protected_server(oauth_proxy(mcp_port.base_url, idp_url, idp, sealed)).http_app(path="/mcp")
            async with mcp_port.serving(app), Client(f"{mcp_port.base_url}/mcp", auth=oauth) as client:
                assert (await client.call_tool("whoami", {})).data == "an authenticated client"
        tokens = await oauth.token_storage_adapter.get_tokens()
        assert tokens is not None and tokens.refresh_token is not None
        secrets = [*idp.secrets_issued(), tokens.access_token, tokens.refresh_token]

        state_server = FastMCP("sealed-state", session_state_store=sealed)

        @state_server.tool
        async def remember(ctx: Context) -> str | None:
            await ctx.set_state("secret", SECRET)
            answer: str | None = await ctx.get_state("secret")
            return answer

        async with serving(state_server.http_app(path="/mcp")) as url, Client(url) as client:
            assert (await client.call_tool("remember", {})).data == SECRET

        events = StoreEventStore(sealed)
        from mcp.types import JSONRPCNotification

        await events.store_event("stream", JSONRPCNotification(jsonrpc="2.0", method="notify", params={"s": SECRET}))
        token_storage = StoreTokenStorage(client_side, key="https://mcp.example/mcp")
        await token_storage.set_tokens(OAuthToken(access_token=f"{SECRET}-access", token_type="Bearer"))
        assert (await token_storage.get_tokens()) is not None

        key_id = Sealer([NEW]).key_id
        assert_sealed(await raw_values(sealed), key_id, SECRET, *secrets)
        assert_sealed(await raw_values(client_side), key_id, SECRET, *secrets)
    finally:
        await client_side.destroy()
        await client_side.aclose()


def _rekey(url: str, keys: list[str]) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "KVSTORES_ENCRYPTION_KEYS": ",".join(keys)}
    command = [sys.executable, "-m", "kvstores.cli", "rekey", url]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)


async def test_rekey_seals_everything_under_the_first_key_and_loses_no_write(
    backend: Backend, namespace: str, sealed: Any
) -> None:
    if not backend.persistent:
        pytest.skip(f"{backend.name}: another process cannot see this store's data")
    url = backend.full_url(namespace)
    plain = await backend.open(namespace)
    old = await backend.open(namespace, encryption_keys=[OLD])
    try:
        await plain.put_many([f"p{i}" for i in range(150)], [{"i": i} for i in range(150)], ttl=600)
        await old.put_many([f"o{i}" for i in range(150)], [{"i": i} for i in range(150)], collection="other")
        last: dict[str, int] = {}
        done = asyncio.Event()

        async def write_meanwhile() -> None:  # a replica already given the new key, racing the rekey
            for n in range(1_000):
                if done.is_set():
                    return  # stopped between writes: a cancelled put might land after all
                key = f"p{n % 150}"
                await sealed.put(key, {"i": -n}, ttl=600)
                last[key] = -n
                await asyncio.sleep(0.002)

        writer = asyncio.create_task(write_meanwhile())
        result = await asyncio.to_thread(_rekey, url, [NEW, OLD])
        done.set()
        await writer
        assert result.returncode == 0, result.stderr
        assert "could not be opened" in result.stdout and NEW not in result.stdout + result.stderr

        again = await asyncio.to_thread(_rekey, url, [NEW, OLD])  # resumable: what was re-sealed is skipped
        assert again.returncode == 0 and again.stdout.startswith("0 entries re-sealed"), again.stdout
        values = await sealed.get_many([f"p{i}" for i in range(150)])
        assert values == [{"i": last.get(f"p{i}", i)} for i in range(150)]  # no write was lost
        assert await sealed.get_many([f"o{i}" for i in range(150)], collection="other") == [
            {"i": i} for i in range(150)
        ]
        remaining = [row[1] for row in await sealed.ttl_many([f"p{i}" for i in range(150)])]
        assert all(ttl is not None and 500 < ttl <= 600 for ttl in remaining)  # TTLs kept
        assert_sealed(await raw_values(sealed), Sealer([NEW]).key_id)
    finally:
        await plain.aclose()
        await old.aclose()


async def test_a_store_names_its_key_ids_and_reseals_an_entry(backend: Backend, namespace: str, sealed: Any) -> None:
    """``encryption_key_ids`` and ``reseal()``: what ``kvstores rekey`` uses, public on every store."""
    assert sealed.encryption_key_ids == (Sealer([NEW]).key_id, Sealer([OLD]).key_id)
    assert not any(key in repr(sealed.encryption_key_ids) for key in (NEW, OLD))
    await sealed._put("c", "plain", json.dumps(VALUE), 60)  # written before encryption was turned on
    assert await sealed.reseal("plain", collection="c")
    assert not await sealed.reseal("plain", collection="c")  # sealed under the first key already
    assert not await sealed.reseal("absent", collection="c")
    assert_sealed(await raw_values(sealed), Sealer([NEW]).key_id, SECRET)
    value, remaining = await sealed.ttl("plain", collection="c")
    assert value == VALUE and remaining is not None and 50 < remaining <= 60  # its TTL kept
    plain = await backend.open(namespace)
    try:
        assert plain.encryption_key_ids == ()
        with pytest.raises(ValueError, match="encryption_keys"):
            await plain.reseal("plain", collection="c")
    finally:
        await plain.aclose()


def test_keys_are_checked_and_never_echoed() -> None:
    key = generate_key()
    for wrong in (["too-short"], [key[:-4]], [], key):
        with pytest.raises(ValueError, match="encryption") as raised:
            Sealer(wrong)  # type: ignore[arg-type]
        assert key[:20] not in str(raised.value)
    assert Sealer([key, OLD]).key_id == Sealer([key]).key_id != Sealer([OLD]).key_id


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_values_sealed_by_earlier_releases_still_open(collection: str, key: str) -> None:
    """A value is bound to ``json.dumps([collection, key])``, the associated data every release has
    sealed with; the cheaper way it is made now gives the same bytes for any names."""
    cipher = AESGCM(base64.urlsafe_b64decode(OLD))
    nonce = os.urandom(12)
    earlier = cipher.encrypt(nonce, b'{"v":1}', json.dumps([collection, key]).encode("ascii"))
    stored = f"{SEALED_PREFIX}{Sealer([OLD]).key_id}:{base64.urlsafe_b64encode(nonce + earlier).decode('ascii')}"
    assert Sealer([generate_key(), OLD]).open(stored, collection, key) == '{"v":1}'
