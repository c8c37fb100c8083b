"""The forum web app: an index page with every asyncio shape a real service has, and a simpler post page.

``GET /`` (``?page=N&user=U``), in order:

1. a cache lookup of the rendered page (Redis ``GET``, or the blob service's ``/kv``);
2. on a miss: the page's posts (one SQL query), then in parallel (``asyncio.gather``) the top users and tag
   counts (SQL) and one blob per post (HTTP); then each post's comment count in an ``asyncio.TaskGroup``;
   then the render (synchronous CPU work); then the cache set, with a short TTL;
3. a race of two recommendation replicas (``asyncio.wait(FIRST_COMPLETED)``; the loser is cancelled);
4. the ad service under ``asyncio.wait_for`` (slow in a fraction of calls, so the timeout fires);
5. the per-user boxes spliced into the page (CPU), and a fire-and-forget task that counts the view.

``GET /post/{id}``: one SQL query, one blob, a render. ``GET /health``: trivial. ``GET /stats``: counters
of the branches taken (cache hits and misses, ad timeouts, race winners), as JSON.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import replace
from typing import Any, cast

import aiohttp
from aiohttp import web

from examples.forum.blobs import BlobServiceConfig, EmbeddedServices, start_embedded
from examples.forum.cache import Cache, HttpCache, RedisCache
from examples.forum.config import ForumConfig
from examples.forum.db import Database, open_database
from examples.forum.render import assemble_index, render_index, render_post

__all__ = ["FORUM", "Forum", "build_app"]

log = logging.getLogger("examples.forum")


class Forum:
    """One forum process's clients (database, cache, HTTP) and its branch counters."""

    def __init__(self, config: ForumConfig, db: Database, cache: Cache, session: aiohttp.ClientSession,
                 blob_url: str, replica_urls: tuple[str, str]) -> None:
        self.config = config
        self.db = db
        self.cache = cache
        self.session = session
        self.blob_url = blob_url.rstrip("/")
        self.replica_urls = tuple(url.rstrip("/") for url in replica_urls)
        self.counters: Counter[str] = Counter()
        """``index``, ``post``, ``cache_hit``, ``cache_miss``, ``ad_timeout``, ``ad_error``, ``race_win:<url>``,
        ``race_lost_all``, ``view_error``."""
        self._rng = random.Random(config.seed)
        self._background: set[asyncio.Task[None]] = set()

    # --- GET / ----------------------------------------------------------------------------------------

    async def index_page(self, page: int, user: int | None) -> str:
        """The index page for one user (see the module docstring for the steps)."""
        self.counters["index"] += 1
        if user is None:
            user = self._rng.randint(1, 1000)
        key = f"forum:index:{page}"
        page_html = await self.cache.get(key)
        if page_html is None:
            self.counters["cache_miss"] += 1
            page_html = await self._build_index(page)
            await self.cache.set(key, page_html, self.config.cache_ttl_ms)
        else:
            self.counters["cache_hit"] += 1
        recommended = await self._race_recommendations(user)
        ad = await self._ad_with_timeout(user)
        body = assemble_index(page_html, recommended, ad)
        self._spawn(self._record_view(page))
        return body

    async def _build_index(self, page: int) -> str:
        per_page = self.config.posts_per_page
        offset = (page * per_page) % max(self.config.seed_posts, 1)
        posts = await self.db.recent_posts(per_page, offset)
        # One flat gather: two SQL queries and one HTTP call per post, all in parallel.
        top_users, tags, *blobs = await asyncio.gather(
            self.db.top_users(10), self.db.tag_counts(15), *(self._fetch_blob(p.id) for p in posts)
        )
        top_users = cast(list[tuple[str, int]], top_users)
        tags = cast(list[tuple[str, int]], tags)
        async with asyncio.TaskGroup() as tg:
            counts = [tg.create_task(self.db.comment_count(p.id)) for p in posts]
        return render_index(page, posts, cast(list[bytes], blobs), top_users, tags, [c.result() for c in counts],
                            self.config.render_scale)

    async def _fetch_blob(self, blob_id: int) -> bytes:
        url = f"{self.blob_url}/blob/{blob_id}"
        async with self.session.get(url, params={"bytes": str(self.config.payload_bytes)}) as resp:
            resp.raise_for_status()
            return await resp.read()

    async def _recommend(self, replica_url: str, user: int) -> list[int]:
        async with self.session.get(f"{replica_url}/recommend", params={"user": str(user)}) as resp:
            resp.raise_for_status()
            reply = await resp.json()
            return [int(pid) for pid in reply["posts"]]

    async def _race_recommendations(self, user: int) -> list[int]:
        """Ask both replicas, keep the first good answer, cancel the other; [] when both fail."""
        racers = {asyncio.create_task(self._recommend(url, user)): url for url in self.replica_urls}
        pending = set(racers)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        self.counters[f"race_win:{racers[task]}"] += 1
                        return task.result()
        finally:
            for loser in pending:  # also when this request is itself cancelled
                loser.cancel()
        self.counters["race_lost_all"] += 1
        return []

    async def _fetch_ad(self, user: int) -> str:
        async with self.session.get(f"{self.blob_url}/ad", params={"user": str(user)}) as resp:
            resp.raise_for_status()
            return str((await resp.json())["ad"])

    async def _ad_with_timeout(self, user: int) -> str | None:
        try:
            return await asyncio.wait_for(self._fetch_ad(user), timeout=self.config.ad_timeout_ms / 1000)
        except TimeoutError:
            self.counters["ad_timeout"] += 1
        except aiohttp.ClientError:
            self.counters["ad_error"] += 1
        return None

    async def _record_view(self, page: int) -> None:
        try:
            await self.cache.incr(f"forum:views:{page}")
        except Exception as exc:  # noqa: BLE001 - nobody awaits this task: log its failure here
            self.counters["view_error"] += 1
            log.warning("could not count a view of page %d: %s", page, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # Keep a reference: the event loop holds tasks only weakly.
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- GET /post/{id} -------------------------------------------------------------------------------

    async def post_page(self, post_id: int) -> str | None:
        """A post's page, or ``None`` when there is no such post."""
        self.counters["post"] += 1
        post = await self.db.get_post(post_id)
        if post is None:
            return None
        blob = await self._fetch_blob(post_id)
        return render_post(post, blob, self.config.render_scale)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for the fire-and-forget tasks still running (at shutdown)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=timeout_s)


FORUM = web.AppKey("forum", Forum)
_CONFIG = web.AppKey("forum_config", ForumConfig)


def _int_query(request: web.Request, name: str) -> int | None:
    text = request.query.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"query parameter {name!r} must be an integer, got {text!r}") from None
    if value < 0:
        raise web.HTTPBadRequest(text=f"query parameter {name!r} must be non-negative, got {value}")
    return value


async def _index(request: web.Request) -> web.Response:
    page = _int_query(request, "page") or 0
    body = await request.app[FORUM].index_page(page, _int_query(request, "user"))
    return web.Response(text=body, content_type="text/html")


async def _post(request: web.Request) -> web.Response:
    try:
        post_id = int(request.match_info["id"])
    except ValueError:
        raise web.HTTPBadRequest(text="post id must be an integer") from None
    body = await request.app[FORUM].post_page(post_id)
    if body is None:
        raise web.HTTPNotFound(text=f"no post {post_id}")
    return web.Response(text=body, content_type="text/html")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _stats(request: web.Request) -> web.Response:
    forum = request.app[FORUM]
    return web.json_response({
        "counters": dict(forum.counters),
        "database": type(forum.db).__name__,
        "cache": type(forum.cache).__name__,
        "blob_url": forum.blob_url,
        "replica_urls": list(forum.replica_urls),
    })


async def _dependencies(app: web.Application) -> AsyncIterator[None]:
    config = app[_CONFIG]
    services: EmbeddedServices | None = None
    if config.blob_url is None:
        service = BlobServiceConfig(
            payload_bytes=config.payload_bytes, delay_ms=config.blob_delay_ms,
            replica_jitter_ms=config.replica_jitter_ms, ad_slow_fraction=config.ad_slow_fraction,
            ad_slow_ms=config.ad_slow_ms,
        )
        # One blob/cache/ad service and two recommendation replicas, each its own service on its own port.
        seeds = [None] * 3 if config.seed is None else [config.seed + i for i in (1, 2, 3)]
        services = await asyncio.to_thread(start_embedded, [replace(service, seed=seed) for seed in seeds])
    blob_url = services.urls[0] if services is not None else str(config.blob_url)
    if config.replica_urls:
        replicas = config.replica_urls
    elif services is not None:
        replicas = services.urls[1:3]
    else:  # two connections to the one blob service given
        replicas = (blob_url, blob_url)
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=30)
    )
    db: Database | None = None
    cache: Cache | None = None
    try:
        db = await open_database(config.postgres_url, config.seed_posts, config.db_pool)
        cache = RedisCache(config.redis_url) if config.redis_url else HttpCache(session, blob_url)
        forum = Forum(config, db, cache, session, blob_url, (replicas[0], replicas[1]))
        app[FORUM] = forum
        yield
        await forum.drain()
    finally:
        if cache is not None:
            await cache.close()
        if db is not None:
            await db.close()
        await session.close()
        if services is not None:
            await asyncio.to_thread(services.stop)


def build_app(config: ForumConfig) -> web.Application:
    """The forum as an aiohttp application; its dependencies open on startup and close on cleanup."""
    app = web.Application()
    app[_CONFIG] = config
    app.cleanup_ctx.append(_dependencies)
    app.router.add_get("/", _index)
    app.router.add_get("/post/{id}", _post)
    app.router.add_get("/health", _health)
    app.router.add_get("/stats", _stats)
    return app
