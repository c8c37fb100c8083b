"""The forum app: every route on the embedded defaults, every branch of the index, real Redis and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
import asyncpg
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from examples.forum import ForumConfig, build_app, parse_config
from examples.forum.app import FORUM
from examples.forum.blobs import BlobServiceConfig, build_blob_app
from examples.forum.db import PostgresDatabase, SeedData

ROOT = Path(__file__).resolve().parents[2]
BASE = ForumConfig(port=0, seed_posts=40, posts_per_page=5, render_scale=0.2)



@pytest.fixture
async def start() -> AsyncIterator[Callable[[ForumConfig], object]]:
    """Start forum apps on free ports (in this process); close them at the end of the test."""
    clients: list[TestClient] = []

    async def _start(config: ForumConfig) -> TestClient:
        client = TestClient(TestServer(build_app(config)))
        await client.start_server()
        clients.append(client)
        return client

    yield _start
    for client in clients:
        await client.close()


async def _stats(client: TestClient) -> dict[str, object]:
    resp = await client.get("/stats")
    assert resp.status == 200
    return dict(await resp.json())


async def test_index_and_post_pages_on_embedded_defaults(start) -> None:
    client = await start(BASE)
    resp = await client.get("/", params={"page": "1", "user": "7"})
    assert resp.status == 200
    assert resp.content_type == "text/html"
    body = await resp.text()
    assert len(re.findall(r'<article id="post-\d+">', body)) == BASE.posts_per_page
    assert '<ol class=recommended><li><a href="/post/' in body
    assert "<div class=ad" in body

    resp = await client.get("/post/3")
    assert resp.status == 200
    body = await resp.text()
    assert f"{BASE.payload_bytes} bytes, digest" in body and "<h1>" in body

    assert (await client.get("/post/999999")).status == 404
    assert (await client.get("/post/abc")).status == 400
    bad = await client.get("/", params={"page": "x"})
    assert bad.status == 400 and "'page'" in await bad.text()
    assert (await (await client.get("/health")).json()) == {"ok": True}

    stats = await _stats(client)
    assert stats["database"] == "SqliteDatabase" and stats["cache"] == "HttpCache"
    counters = stats["counters"]
    assert isinstance(counters, dict) and counters["index"] == 1 and counters["post"] == 2


async def test_cache_miss_then_hit_and_expiry(start) -> None:
    client = await start(replace(BASE, cache_ttl_ms=200))
    first = await (await client.get("/", params={"page": "2"})).text()
    second = await (await client.get("/", params={"page": "2"})).text()
    counters = (await _stats(client))["counters"]
    assert counters["cache_miss"] == 1 and counters["cache_hit"] == 1  # type: ignore[index]
    # The cached page carries the same posts; only the per-user boxes differ.
    assert re.findall(r'<article id="post-\d+">', first) == re.findall(r'<article id="post-\d+">', second)
    await asyncio.sleep(0.3)
    await client.get("/", params={"page": "2"})
    assert (await _stats(client))["counters"]["cache_miss"] == 2  # type: ignore[index]


@pytest.mark.parametrize(("fraction", "expect_all", "expect_none"), [(1.0, True, False), (0.0, False, True)])
async def test_ad_timeout_fires_in_the_configured_fraction(start, fraction: float, expect_all: bool,
                                                           expect_none: bool) -> None:
    client = await start(replace(BASE, ad_slow_fraction=fraction, ad_slow_ms=300, ad_timeout_ms=40))
    bodies = [await (await client.get("/", params={"page": "1"})).text() for _ in range(4)]
    timeouts = (await _stats(client))["counters"].get("ad_timeout", 0)  # type: ignore[union-attr]
    fallbacks = sum("<div class=ad-fallback>" in body for body in bodies)
    assert timeouts == fallbacks
    assert (timeouts == 4) is expect_all
    assert (timeouts == 0) is expect_none


async def test_timeout_branch_and_race_both_occur(start) -> None:
    client = await start(replace(BASE, ad_slow_fraction=0.5, ad_slow_ms=150, ad_timeout_ms=40,
                                 replica_jitter_ms=5.0))
    await asyncio.gather(*(client.get("/", params={"page": str(i % 4)}) for i in range(30)))
    stats = await _stats(client)
    counters = stats["counters"]
    assert isinstance(counters, dict)
    assert 0 < counters["ad_timeout"] < 30
    wins = {url: counters.get(f"race_win:{url}", 0) for url in stats["replica_urls"]}  # type: ignore[union-attr]
    assert len(wins) == 2 and all(n > 0 for n in wins.values()), wins
    assert sum(wins.values()) == 30


async def test_fire_and_forget_view_counter(start) -> None:
    client = await start(BASE)
    for _ in range(3):
        assert (await client.get("/", params={"page": "5"})).status == 200
    forum = client.app[FORUM]  # type: ignore[index]
    await forum.drain()
    async with aiohttp.ClientSession() as session, session.get(f"{forum.blob_url}/kv", params={"key": "forum:views:5"}) as resp:
        assert resp.status == 200
        assert await resp.text() == "3"


async def test_separate_blob_service_and_replicas(start) -> None:
    servers = [TestServer(build_blob_app(BlobServiceConfig(replica_jitter_ms=1.0, ad_slow_fraction=0.0)))
               for _ in range(3)]
    for server in servers:
        await server.start_server()
    try:
        urls = [str(server.make_url("")).rstrip("/") for server in servers]
        client = await start(replace(BASE, blob_url=urls[0], replica_urls=(urls[1], urls[2]), payload_bytes=100))
        assert (await client.get("/", params={"page": "1"})).status == 200
        assert "100 bytes" in await (await client.get("/post/2")).text()
        stats = await _stats(client)
        assert stats["blob_url"] == urls[0] and stats["replica_urls"] == urls[1:]
    finally:
        for server in servers:
            await server.close()


async def test_a_failed_replica_loses_every_race(start) -> None:
    live = TestServer(build_blob_app(BlobServiceConfig()))
    await live.start_server()
    dead = TestServer(web.Application())
    await dead.start_server()
    dead_url = str(dead.make_url("")).rstrip("/")
    await dead.close()  # nothing listens there any more: connection refused
    try:
        live_url = str(live.make_url("")).rstrip("/")
        client = await start(replace(BASE, blob_url=live_url, replica_urls=(dead_url, live_url)))
        for _ in range(3):
            body = await (await client.get("/", params={"page": "1"})).text()
            assert '<ol class=recommended><li><a href="/post/' in body
        counters = (await _stats(client))["counters"]
        assert counters[f"race_win:{live_url}"] == 3 and f"race_win:{dead_url}" not in counters  # type: ignore[operator]
    finally:
        await live.close()


async def test_real_redis_and_postgres_are_used(start, redis_url: str, postgres_url: str) -> None:
    page = 1000 + uuid.uuid4().int % 1000  # a key no other test or process touches
    client = await start(replace(BASE, redis_url=redis_url, postgres_url=postgres_url, cache_ttl_ms=5000))
    resp = await client.get("/", params={"page": str(page)})
    assert resp.status == 200
    assert len(re.findall(r'<article id="post-\d+">', await resp.text())) == BASE.posts_per_page
    stats = await _stats(client)
    assert stats["database"] == "PostgresDatabase" and stats["cache"] == "RedisCache"
    await client.app[FORUM].drain()  # type: ignore[index]

    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        cached = await r.get(f"forum:index:{page}")
        assert cached is not None and cached.startswith("<!doctype html>")
        assert 0 < await r.pttl(f"forum:index:{page}") <= 5000
        assert await r.get(f"forum:views:{page}") == "1"
    finally:
        await r.delete(f"forum:index:{page}", f"forum:views:{page}")
        await r.aclose()

    conn = await asyncpg.connect(postgres_url)
    try:
        tables = {row[0] for row in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'forum\\_%'")}
        assert {"forum_users", "forum_posts", "forum_post_tags", "forum_comments"} <= tables
        assert await conn.fetchval("SELECT count(*) FROM forum_posts WHERE id <= $1", BASE.seed_posts) == 40
    finally:
        await conn.close()


async def test_postgres_seeding_is_idempotent(postgres_url: str) -> None:
    counts = []
    for _ in range(2):
        db = await PostgresDatabase.open(postgres_url, seed_posts=30, pool_size=1)
        try:
            counts.append((len(await db.recent_posts(1000, 0)), await db.comment_count(1)))
        finally:
            await db.close()
    assert counts[0] == counts[1]
    assert counts[0][0] >= 30


def test_seed_data_is_deterministic_and_prefix_stable() -> None:
    small, large = SeedData.generate(20), SeedData.generate(40)
    assert small == SeedData.generate(20)
    assert large.posts[:20] == small.posts
    assert large.comments[: len(small.comments)] == small.comments
    assert len(large.users) == 50 and all(1 <= len([t for t in large.tags if t[0] == p[0]]) <= 3
                                          for p in large.posts)


def test_config_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_config(["--port", "0", "--replica-url", "http://a", "--replica-url", "http://b"]).replica_urls == (
        "http://a", "http://b")
    for argv, message in [
        (["--replica-url", "http://a"], "give two replicas"),
        (["--ad-slow-fraction", "1.5"], "between 0 and 1"),
        (["--payload-bytes", "-1"], "non-negative"),
    ]:
        with pytest.raises(SystemExit):
            parse_config(argv)
        assert message in capsys.readouterr().err


def _spawn(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    match = re.fullmatch(r"listening on (http://127\.0\.0\.1:(\d+))", line)
    if match is None or match.group(2) == "0":
        proc.kill()
        pytest.fail(f"{args[0]}: expected 'listening on http://HOST:PORT', got {line!r}: {proc.communicate()[1]}")
    return proc, match.group(1)


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_command_lines_announce_the_real_port_and_stop_on_sigint() -> None:
    blob, blob_url = _spawn("examples.forum.blobs", "--port", "0", "--payload-bytes", "64")
    app = None
    try:
        app, url = _spawn("examples.forum", "--port", "0", "--seed-posts", "30", "--blob-url", blob_url)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/") as resp:
                assert resp.status == 200 and "<article" in await resp.text()
            async with session.get(f"{blob_url}/blob/3") as resp:
                assert len(await resp.read()) == 64
    finally:
        if app is not None:
            assert _stop(app) == 0
        assert _stop(blob) == 0


async def test_replicas_started_with_reuse_port_share_the_port_and_the_connections() -> None:
    import psutil

    blob, blob_url = _spawn("examples.forum.blobs", "--port", "0", "--payload-bytes", "64")
    apps: list[subprocess.Popen[str]] = []
    try:
        common = ("--seed-posts", "30", "--blob-url", blob_url, "--cache-ttl-ms", "0", "--render-scale", "3")
        app, url = _spawn("examples.forum", "--port", "0", "--reuse-port", *common)
        apps.append(app)
        port = url.rsplit(":", 1)[1]
        app2, url2 = _spawn("examples.forum", "--port", port, "--reuse-port", *common)  # no EADDRINUSE
        apps.append(app2)
        assert url2 == url
        cpu = [psutil.Process(p.pid).cpu_times() for p in apps]
        for _ in range(40):  # a new connection each: the kernel picks a replica per connection
            async with aiohttp.ClientSession() as session, session.get(f"{url}/") as resp:
                assert resp.status == 200
        grew = [sum(psutil.Process(p.pid).cpu_times()[:2]) - sum(c[:2]) for p, c in zip(apps, cpu, strict=True)]
        assert all(g > 0 for g in grew), grew  # both served some (one alone: 2^-39)
        assert _stop(apps.pop()) == 0
        for _ in range(10):  # the stopped one's socket left the group: nothing is refused
            async with aiohttp.ClientSession() as session, session.get(f"{url}/") as resp:
                assert resp.status == 200
    finally:
        for app in apps:
            _stop(app)
        assert _stop(blob) == 0
