"""Client-side MCP storage slots of the MCP SDK, filled by any kvstores store.

- :class:`StoreResponseCacheStore` is the SDK's ``mcp.client.caching.ResponseCacheStore``
  (the client response cache of SEP-2549): pass it as ``CacheConfig(store=..., partition=...)``
  and every client replica on the same store shares one cache, each principal's private
  entries kept apart by the partition the SDK folds into the key.
- :class:`StoreTokenStorage` is the SDK's OAuth ``mcp.client.auth.TokenStorage``: pass it to
  ``OAuthClientProvider(storage=...)`` and a restarted client keeps its registration and tokens.

Both keep what they store for as long as it is good and no longer: a cache entry for its
``ttlMs``, an access token for its ``expires_in`` (while no refresh token can renew it), a
registration until its client secret expires. Needs the ``mcp`` extra.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any, Literal, cast

from kvstores._optional import missing_extra
from kvstores.protocol import AsyncKeyValue, DestroyCollectionStore, EnumerateKeysStore, implements

try:
    from mcp.client.caching import CacheEntry, CacheKey
    from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
    from mcp_types import CacheableResult
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(getattr(exc, "name", None) or "mcp", "mcp") from exc

__all__ = [
    "DEFAULT_RESPONSE_CACHE_COLLECTION",
    "DEFAULT_TOKEN_COLLECTION",
    "StoreResponseCacheStore",
    "StoreTokenStorage",
]

DEFAULT_RESPONSE_CACHE_COLLECTION = "mcp-client-response-cache"
"""The collection a :class:`StoreResponseCacheStore` owns unless told otherwise."""

DEFAULT_TOKEN_COLLECTION = "mcp-client-oauth"
"""The collection a :class:`StoreTokenStorage` writes to unless told otherwise."""

_ENTRY_VERSION = 1


def _result_models() -> dict[str, type[CacheableResult]]:
    """Every cacheable result model loaded in this process, by its qualified name.

    Read back against this table, never imported by name: a stored tag that names no
    loaded model (another version's, or forged) is a miss.
    """
    models: dict[str, type[CacheableResult]] = {}
    pending: list[type[CacheableResult]] = [CacheableResult]
    while pending:
        model = pending.pop()
        models[_tag(model)] = model
        pending.extend(model.__subclasses__())
    return models


def _tag(model: type[Any]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


class StoreResponseCacheStore:
    """The SDK's client ``ResponseCacheStore`` on a kvstores store, shareable across client replicas.

    Each :class:`~mcp.client.caching.CacheKey` (method, params key and the partition the SDK
    derives from the principal) becomes one key of ``collection``: a digest of the three
    fields, so that no two keys share an entry and a long resource URI fits any backend.
    An entry lives until its ``expires_at`` (the result's ``ttlMs``) and not a moment longer;
    one that cannot be read back as the result it was (another version's layout, a model
    this process does not load) is a miss, never an error. ``clear()`` empties ``collection``
    and nothing else, so give each cache its own collection.
    """

    def __init__(self, store: AsyncKeyValue, *, collection: str = DEFAULT_RESPONSE_CACHE_COLLECTION) -> None:
        if not (implements(store, DestroyCollectionStore) or implements(store, EnumerateKeysStore)):
            raise TypeError(
                f"a response cache store needs destroy_collection() or keys() for clear(); "
                f"{type(store).__name__} has neither"
            )
        self.store = store
        self.collection = collection

    @staticmethod
    def store_key(key: CacheKey) -> str:
        """The store key of a cache key: a digest of its three fields, encoded injectively."""
        fields = json.dumps([key.method, key.params_key, key.partition], ensure_ascii=False)
        return hashlib.sha256(fields.encode("utf-8", "surrogatepass")).hexdigest()

    async def get(self, key: CacheKey) -> CacheEntry | None:
        """The entry stored under ``key``; None when absent, expired or unreadable."""
        stored = await self.store.get(self.store_key(key), collection=self.collection)
        return None if stored is None else _read_entry(stored)

    async def set(self, key: CacheKey, entry: CacheEntry) -> None:
        """Store ``entry`` until its ``expires_at``; an entry already stale replaces the old one by nothing."""
        if not isinstance(entry.value, CacheableResult):
            raise TypeError(f"a cache entry holds a cacheable result model, not {type(entry.value).__name__}")
        remaining = None if entry.expires_at is None else entry.expires_at - time.time()
        if remaining is None or not math.isfinite(remaining) or remaining <= 0:
            await self.delete(key)  # never fresh: the SDK would treat it as a miss anyway
            return
        stored = {
            "v": _ENTRY_VERSION,
            "model": _tag(type(entry.value)),
            "value": entry.value.model_dump(mode="json", by_alias=True),
            "scope": entry.scope,
            "expires_at": entry.expires_at,
        }
        await self.store.put(self.store_key(key), stored, collection=self.collection, ttl=remaining)

    async def delete(self, key: CacheKey) -> None:
        """Forget ``key``."""
        await self.store.delete(self.store_key(key), collection=self.collection)

    async def clear(self) -> None:
        """Forget every entry of this cache's collection, and nothing outside it."""
        if implements(self.store, DestroyCollectionStore):
            await cast(DestroyCollectionStore, self.store).destroy_collection(self.collection)
            return
        keys = await cast(EnumerateKeysStore, self.store).keys(self.collection)  # checked in __init__
        await self.store.delete_many(keys, collection=self.collection)


def _read_entry(stored: dict[str, Any]) -> CacheEntry | None:
    """The cache entry a stored value holds, or None when it is not one this version wrote."""
    if stored.get("v") != _ENTRY_VERSION:
        return None
    model = _result_models().get(str(stored.get("model")))
    scope = stored.get("scope")
    expires_at = stored.get("expires_at")
    if model is None or scope not in ("public", "private") or not isinstance(expires_at, (int, float)):
        return None
    try:
        value = model.model_validate(stored.get("value"))
    except ValidationError:
        return None
    checked_scope: Literal["public", "private"] = "public" if scope == "public" else "private"
    return CacheEntry(value=value, scope=checked_scope, expires_at=float(expires_at))


class StoreTokenStorage:
    """The SDK's OAuth client ``TokenStorage`` on a kvstores store, under one ``key``.

    ``key`` names the client: one per server (and per principal, when one store holds
    several users' tokens). Tokens and the client registration are two entries of
    ``collection``. Tokens without a refresh token expire with the access token
    (``expires_in``); with one they live ``refresh_token_ttl`` seconds (None: until
    replaced), since OAuth's token response does not say how long a refresh token lasts.
    Read back, ``expires_in`` is what remains of the access token's lifetime. The
    registration expires with its client secret (``client_secret_expires_at``; 0 or
    absent: never). The store holds the tokens as they are: wrap it in an encryption
    wrapper (e.g. py-key-value's ``FernetEncryptionWrapper``) to keep them unreadable at rest.
    """

    def __init__(
        self,
        store: AsyncKeyValue,
        *,
        key: str,
        collection: str = DEFAULT_TOKEN_COLLECTION,
        refresh_token_ttl: float | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.collection = collection
        self.refresh_token_ttl = refresh_token_ttl
        # One injective encoding for both entries of ``key`` (never a bare separator).
        self._tokens_key = json.dumps(["tokens", key], ensure_ascii=False)
        self._client_key = json.dumps(["client", key], ensure_ascii=False)

    async def get_tokens(self) -> OAuthToken | None:
        """The stored tokens, ``expires_in`` counting from now; None when absent or expired."""
        stored = await self.store.get(self._tokens_key, collection=self.collection)
        if stored is None:
            return None
        try:
            tokens = OAuthToken.model_validate(stored["token"])
        except (KeyError, TypeError, ValidationError):
            return None
        expires_at = stored.get("expires_at")
        if isinstance(expires_at, (int, float)):
            tokens.expires_in = max(0, math.floor(expires_at - time.time()))
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        """Store ``tokens`` for as long as they can be used."""
        expires_at = None if tokens.expires_in is None else time.time() + int(tokens.expires_in)
        if tokens.refresh_token is not None:
            ttl = self.refresh_token_ttl
        elif expires_at is not None:
            ttl = expires_at - time.time()
            if ttl <= 0:
                await self.store.delete(self._tokens_key, collection=self.collection)
                return
        else:
            ttl = None
        stored = {"token": tokens.model_dump(mode="json", exclude_none=True), "expires_at": expires_at}
        await self.store.put(self._tokens_key, stored, collection=self.collection, ttl=ttl)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        """The stored client registration; None when absent, expired or unreadable."""
        stored = await self.store.get(self._client_key, collection=self.collection)
        if stored is None:
            return None
        try:
            return OAuthClientInformationFull.model_validate(stored)
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        """Store the registration until its client secret expires."""
        ttl: float | None = None
        if client_info.client_secret_expires_at:
            ttl = client_info.client_secret_expires_at - time.time()
            if ttl <= 0:
                await self.store.delete(self._client_key, collection=self.collection)
                return
        stored = client_info.model_dump(mode="json", exclude_none=True)
        await self.store.put(self._client_key, stored, collection=self.collection, ttl=ttl)
