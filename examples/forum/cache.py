"""The forum's cache: Redis when given, else the blob service's key-value API over HTTP."""

from __future__ import annotations

from typing import Protocol

import aiohttp
import redis.asyncio as aioredis

__all__ = ["Cache", "HttpCache", "RedisCache"]


class Cache(Protocol):
    """A string cache with expiry and counters (each call one round trip)."""

    async def get(self, key: str) -> str | None: ...
    async def set(self, key: str, value: str, ttl_ms: int) -> None: ...
    async def incr(self, key: str) -> int: ...
    async def close(self) -> None: ...


class RedisCache:
    """The cache on a Redis server (``GET``, ``SET PX``, ``INCR``)."""

    def __init__(self, url: str) -> None:
        self._redis = aioredis.Redis.from_url(url, decode_responses=True)

    async def get(self, key: str) -> str | None:
        value = await self._redis.get(key)
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_ms: int) -> None:
        await self._redis.set(key, value, px=max(ttl_ms, 1))

    async def incr(self, key: str) -> int:
        return int(await self._redis.incr(key))

    async def close(self) -> None:
        await self._redis.aclose()


class HttpCache:
    """The cache on the blob service's ``/kv`` API."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base = base_url.rstrip("/")

    async def get(self, key: str) -> str | None:
        async with self._session.get(f"{self._base}/kv", params={"key": key}) as resp:
            if resp.status == 404:
                return None
            resp.raise_for_status()
            return await resp.text()

    async def set(self, key: str, value: str, ttl_ms: int) -> None:
        params = {"key": key, "ttl_ms": str(ttl_ms)}
        async with self._session.put(f"{self._base}/kv", data=value, params=params) as resp:
            resp.raise_for_status()

    async def incr(self, key: str) -> int:
        async with self._session.post(f"{self._base}/kv/incr", params={"key": key}) as resp:
            resp.raise_for_status()
            return int(await resp.text())

    async def close(self) -> None:
        """Nothing to close: the session belongs to the app."""
