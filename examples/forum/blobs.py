"""The blob service: blobs, a small key-value cache, recommendations and ads over HTTP.

It plays the forum's remote dependencies when no real ones are given: an object store (``GET /blob/{id}``),
a cache (``/kv?key=K``), a recommendation service (``GET /recommend``, raced across two replicas) and an
ad service (``GET /ad``, sometimes slow). Latency is controllable, so what-if scenarios (a farther service,
a slow replica) can be reproduced for real; so is the size of the stored blobs while the service runs
(``PUT /admin/blob-bytes`` with the size as the body, ``DELETE`` to go back to what each request asks for),
the way an object store's objects grow without the app that reads them changing.

Run on its own, one process per replica::

    python -m examples.forum.blobs --port 8081 --delay-ms 5

or embedded in the forum process on its own thread and event loop (:func:`start_embedded`), so that the
service's work does not queue on the app's event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from aiohttp import web

from examples.forum._serve import bind, serve_until_signalled

__all__ = ["BlobServiceConfig", "EmbeddedServices", "build_blob_app", "main", "start_embedded"]


@dataclass(frozen=True, slots=True)
class BlobServiceConfig:
    """Behaviour of one blob service."""

    payload_bytes: int = 4096
    """Blob size when the request does not ask for one (``?bytes=N``)."""
    delay_ms: float = 0.0
    """Latency added to every request (distance to the service)."""
    replica_jitter_ms: float = 2.0
    """Mean of the exponential delay of a ``/recommend`` reply, so that either replica may win a race."""
    ad_ms: float = 3.0
    """Latency of a normal ``/ad`` reply."""
    ad_slow_fraction: float = 0.1
    """Fraction of ``/ad`` replies that take ``ad_slow_ms`` instead."""
    ad_slow_ms: float = 200.0
    seed: int | None = None
    """Seed of the service's random delays (``None``: not reproducible)."""


_CONFIG = web.AppKey("config", BlobServiceConfig)
_RNG = web.AppKey("rng", random.Random)
_AD_RNG = web.AppKey("ad_rng", random.Random)
"""The ads' own stream: the k-th ``/ad`` call is slow or not whatever the ``/recommend`` calls drew before it, so
that two seeded runs that make the same calls (a baseline and a what-if scenario) see the same slow ads."""
_KV: web.AppKey[dict[str, tuple[float | None, str]]] = web.AppKey("kv")
"""key -> (monotonic expiry or None, value)"""
_BLOB_BYTES: web.AppKey[list[int | None]] = web.AppKey("blob_bytes")
"""[the size every blob has now, whatever the request asks for; None: as asked] (``/admin/blob-bytes``)"""
_MAX_BLOB = 64 * 1024 * 1024


async def _delay(request: web.Request, extra_ms: float = 0.0) -> None:
    total_ms = request.app[_CONFIG].delay_ms + extra_ms
    if total_ms > 0:
        await asyncio.sleep(total_ms / 1000)


async def _blob(request: web.Request) -> web.Response:
    config = request.app[_CONFIG]
    try:
        blob_id = int(request.match_info["id"])
        size = int(request.query.get("bytes", config.payload_bytes))
    except ValueError:
        raise web.HTTPBadRequest(text="blob id and ?bytes= must be integers") from None
    if not 0 <= size <= _MAX_BLOB:
        raise web.HTTPBadRequest(text=f"?bytes= must be between 0 and {_MAX_BLOB}")
    stored = request.app[_BLOB_BYTES][0]
    size = stored if stored is not None else size
    await _delay(request)
    stamp = blob_id.to_bytes(8, "big")
    body = (stamp * (size // 8 + 1))[:size]
    return web.Response(body=body, content_type="application/octet-stream")


def _kv_get_live(request: web.Request, key: str) -> str | None:
    entry = request.app[_KV].get(key)
    if entry is None:
        return None
    expires, value = entry
    if expires is not None and expires < time.monotonic():
        del request.app[_KV][key]
        return None
    return value


def _key(request: web.Request) -> str:
    key = request.query.get("key")
    if not key:
        raise web.HTTPBadRequest(text="the key goes in the query: ?key=K")
    return key


async def _kv_get(request: web.Request) -> web.Response:
    key = _key(request)
    await _delay(request)
    value = _kv_get_live(request, key)
    if value is None:
        raise web.HTTPNotFound()
    return web.Response(text=value)


async def _kv_put(request: web.Request) -> web.Response:
    key = _key(request)
    try:
        ttl_ms = int(request.query["ttl_ms"]) if "ttl_ms" in request.query else None
    except ValueError:
        raise web.HTTPBadRequest(text="?ttl_ms= must be an integer") from None
    value = await request.text()
    await _delay(request)
    expires = None if ttl_ms is None else time.monotonic() + ttl_ms / 1000
    request.app[_KV][key] = (expires, value)
    return web.Response(status=204)


async def _kv_incr(request: web.Request) -> web.Response:
    key = _key(request)
    await _delay(request)
    current = _kv_get_live(request, key)
    try:
        value = int(current or "0") + 1
    except ValueError:
        raise web.HTTPConflict(text=f"value of {key!r} is not an integer") from None
    request.app[_KV][key] = (None, str(value))
    return web.Response(text=str(value))


async def _recommend(request: web.Request) -> web.Response:
    config = request.app[_CONFIG]
    rng = request.app[_RNG]
    user = request.query.get("user", "0")
    jitter = rng.expovariate(1 / config.replica_jitter_ms) if config.replica_jitter_ms > 0 else 0.0
    await _delay(request, jitter)
    picks = rng.sample(range(1, 1000), 5)
    return web.json_response({"user": user, "posts": picks, "replica": request.url.port})


async def _ad(request: web.Request) -> web.Response:
    config = request.app[_CONFIG]
    slow = request.app[_AD_RNG].random() < config.ad_slow_fraction
    await _delay(request, config.ad_slow_ms if slow else config.ad_ms)
    return web.json_response({"ad": "Try perfectly ordinary widgets", "slow": slow})


async def _set_blob_bytes(request: web.Request) -> web.Response:
    text = (await request.text()).strip()
    if not text.isdigit() or int(text) > _MAX_BLOB:
        raise web.HTTPBadRequest(text=f"the body must be the blob size in bytes, 0 to {_MAX_BLOB}; got {text!r}")
    request.app[_BLOB_BYTES][0] = int(text)
    return web.Response(status=204)


async def _clear_blob_bytes(request: web.Request) -> web.Response:
    request.app[_BLOB_BYTES][0] = None
    return web.Response(status=204)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "keys": len(request.app[_KV])})


def build_blob_app(config: BlobServiceConfig) -> web.Application:
    """The blob service as an aiohttp application."""
    app = web.Application(client_max_size=_MAX_BLOB)
    app[_CONFIG] = config
    app[_RNG] = random.Random(config.seed)
    app[_AD_RNG] = random.Random(None if config.seed is None else config.seed + 1)
    app[_KV] = {}
    app[_BLOB_BYTES] = [None]
    app.router.add_get("/blob/{id}", _blob)
    app.router.add_put("/admin/blob-bytes", _set_blob_bytes)
    app.router.add_delete("/admin/blob-bytes", _clear_blob_bytes)
    # Keys go in the query string, so that every call of one kind has one path (one operation).
    app.router.add_get("/kv", _kv_get)
    app.router.add_put("/kv", _kv_put)
    app.router.add_post("/kv/incr", _kv_incr)
    app.router.add_get("/recommend", _recommend)
    app.router.add_get("/ad", _ad)
    app.router.add_get("/health", _health)
    return app


class EmbeddedServices:
    """Blob services served by one event loop on a background thread, each on its own port.

    Use :func:`start_embedded` to create one, and :meth:`stop` (or ``with``) to end it.
    """

    def __init__(self, urls: tuple[str, ...], loop: asyncio.AbstractEventLoop,
                 runners: list[web.AppRunner]) -> None:
        self.urls = urls
        """Base URL of each service, in the order asked for."""
        self._loop = loop
        self._runners = runners

    def stop(self) -> None:
        """Shut the services down and stop their thread's loop (idempotent)."""
        if self._loop.is_closed() or not self._runners:
            return
        runners, self._runners = self._runners, []

        async def cleanup() -> None:
            for runner in runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_embedded(configs: Sequence[BlobServiceConfig], host: str = "127.0.0.1") -> EmbeddedServices:
    """Start one independent blob service per config, on free ports, on a new thread with its own loop.

    The thread is a daemon: a process that exits without calling :meth:`EmbeddedServices.stop` does not hang.
    """
    started = threading.Event()
    outcome: list[EmbeddedServices | Exception] = []

    async def setup(loop: asyncio.AbstractEventLoop) -> EmbeddedServices:
        urls, runners = [], []
        for config in configs:
            runner = web.AppRunner(build_blob_app(config), handle_signals=False, access_log=None)
            await runner.setup()
            runners.append(runner)
            sock = bind(host, 0)
            await web.SockSite(runner, sock).start()
            urls.append(f"http://{host}:{sock.getsockname()[1]}")
        return EmbeddedServices(tuple(urls), loop, runners)

    def serve() -> None:
        loop = asyncio.new_event_loop()
        try:
            outcome.append(loop.run_until_complete(setup(loop)))
        except Exception as exc:  # noqa: BLE001 - handed to the starting thread, which raises it
            outcome.append(exc)
        started.set()
        try:
            if not isinstance(outcome[0], Exception):
                loop.run_forever()
        finally:
            loop.close()

    threading.Thread(target=serve, name="forum-blob-services", daemon=True).start()
    started.wait()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m examples.forum.blobs``: serve one blob service until interrupted."""
    p = argparse.ArgumentParser(prog="python -m examples.forum.blobs", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    p.add_argument("--delay-ms", type=float, default=0.0, help="latency added to every request")
    p.add_argument("--payload-bytes", type=int, default=4096)
    p.add_argument("--replica-jitter-ms", type=float, default=2.0)
    p.add_argument("--ad-ms", type=float, default=3.0)
    p.add_argument("--ad-slow-fraction", type=float, default=0.1)
    p.add_argument("--ad-slow-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int)
    ns = p.parse_args(argv)
    if ns.delay_ms < 0 or ns.payload_bytes < 0 or not 0 <= ns.ad_slow_fraction <= 1:
        p.error("--delay-ms and --payload-bytes must be non-negative, --ad-slow-fraction in [0, 1]")
    config = BlobServiceConfig(
        payload_bytes=ns.payload_bytes, delay_ms=ns.delay_ms, replica_jitter_ms=ns.replica_jitter_ms,
        ad_ms=ns.ad_ms, ad_slow_fraction=ns.ad_slow_fraction, ad_slow_ms=ns.ad_slow_ms, seed=ns.seed,
    )
    asyncio.run(_serve_forever(config, ns.host, ns.port))


async def _serve_forever(config: BlobServiceConfig, host: str, port: int) -> None:
    await serve_until_signalled(build_blob_app(config), host, port)


if __name__ == "__main__":
    main()
