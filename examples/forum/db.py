"""The forum's database: the same queries on PostgreSQL (asyncpg) or on a seeded SQLite file (aiosqlite).

Tables, all prefixed ``forum_`` so they can live in a shared database: ``forum_users``, ``forum_posts``,
``forum_post_tags`` and ``forum_comments``. :func:`open_database` creates and seeds them idempotently: the
data are generated from a fixed seed, so every process (and every run) sees the same forum.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiosqlite
import asyncpg

__all__ = ["Database", "Post", "PostgresDatabase", "SeedData", "SqliteDatabase", "open_database"]

_USERS = 50
_TAGS = ("python", "asyncio", "latency", "redis", "postgres", "http", "cache", "queues", "tracing", "numpy",
         "capacity", "replicas", "timeouts", "profiling", "graphs", "sqlite", "aiohttp", "cpu", "gc", "tls")
_WORDS = ("event", "loop", "await", "task", "future", "socket", "query", "index", "page", "blob", "replica",
          "timeout", "render", "latency", "throughput", "median", "tail", "cache", "miss", "hit", "server")
_EPOCH = 1_700_000_000.0


@dataclass(frozen=True, slots=True)
class Post:
    """One forum post as shown on a page."""

    id: int
    author: str
    title: str
    body: str
    created_at: float
    """Unix seconds."""


@dataclass(frozen=True, slots=True)
class SeedData:
    """The deterministic content of the forum for a given number of posts."""

    users: list[tuple[int, str]]
    posts: list[tuple[int, int, str, str, float]]
    """(id, author_id, title, body, created_at)"""
    tags: list[tuple[int, str]]
    """(post_id, tag)"""
    comments: list[tuple[int, int, int, str]]
    """(id, post_id, author_id, body)"""

    @classmethod
    def generate(cls, n_posts: int, seed: int = 20240601) -> SeedData:
        """The forum's content: ``n_posts`` posts by 50 users, 1-3 tags and 0-8 comments each."""
        rng = random.Random(seed)

        def sentence(n: int) -> str:
            return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize()

        users = [(i, f"user{i:03d}") for i in range(1, _USERS + 1)]
        # A skewed author distribution, so "top users" has a clear order.
        weights = [1 / i for i in range(1, _USERS + 1)]
        posts: list[tuple[int, int, str, str, float]] = []
        tags: list[tuple[int, str]] = []
        comments: list[tuple[int, int, int, str]] = []
        for pid in range(1, n_posts + 1):
            author = rng.choices(range(1, _USERS + 1), weights)[0]
            posts.append((pid, author, sentence(6), sentence(60), _EPOCH + 600.0 * pid))
            tags.extend((pid, tag) for tag in rng.sample(_TAGS, rng.randint(1, 3)))
            for _ in range(rng.randint(0, 8)):
                comments.append((len(comments) + 1, pid, rng.randint(1, _USERS), sentence(12)))
        return cls(users, posts, tags, comments)


class Database(Protocol):
    """The queries the forum makes (each one round trip to the database)."""

    async def recent_posts(self, limit: int, offset: int) -> list[Post]: ...
    async def top_users(self, limit: int) -> list[tuple[str, int]]: ...
    async def tag_counts(self, limit: int) -> list[tuple[str, int]]: ...
    async def comment_count(self, post_id: int) -> int: ...
    async def get_post(self, post_id: int) -> Post | None: ...
    async def close(self) -> None: ...


# --- PostgreSQL ---------------------------------------------------------------------------------------------

_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS forum_users (id integer PRIMARY KEY, name text NOT NULL);
CREATE TABLE IF NOT EXISTS forum_posts (
    id integer PRIMARY KEY, author_id integer NOT NULL REFERENCES forum_users(id),
    title text NOT NULL, body text NOT NULL, created_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS forum_posts_created_at ON forum_posts (created_at);
CREATE TABLE IF NOT EXISTS forum_post_tags (post_id integer NOT NULL, tag text NOT NULL, PRIMARY KEY (post_id, tag));
CREATE TABLE IF NOT EXISTS forum_comments (
    id integer PRIMARY KEY, post_id integer NOT NULL, author_id integer NOT NULL, body text NOT NULL);
CREATE INDEX IF NOT EXISTS forum_comments_post_id ON forum_comments (post_id);
"""


class PostgresDatabase:
    """The forum's queries on PostgreSQL through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, url: str, seed_posts: int, pool_size: int) -> PostgresDatabase:
        """Connect, create the ``forum_*`` tables if needed and seed them up to ``seed_posts`` posts."""
        pool = await asyncpg.create_pool(url, min_size=1, max_size=pool_size)
        try:
            async with pool.acquire() as conn, conn.transaction():
                # Several processes may start at once against one database: seed under a lock.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext('forum_seed'))")
                await conn.execute(_PG_SCHEMA)
                have = await conn.fetchval("SELECT count(*) FROM forum_posts WHERE id <= $1", seed_posts)
                if have < seed_posts:
                    await _pg_seed(conn, SeedData.generate(seed_posts))
        except BaseException:
            await pool.close()
            raise
        return cls(pool)

    async def recent_posts(self, limit: int, offset: int) -> list[Post]:
        rows = await self._pool.fetch(
            "SELECT p.id, u.name, p.title, p.body, p.created_at FROM forum_posts p"
            " JOIN forum_users u ON u.id = p.author_id ORDER BY p.created_at DESC LIMIT $1 OFFSET $2",
            limit, offset,
        )
        return [Post(*row) for row in rows]

    async def top_users(self, limit: int) -> list[tuple[str, int]]:
        rows = await self._pool.fetch(
            "SELECT u.name, count(p.id) AS n FROM forum_users u JOIN forum_posts p ON p.author_id = u.id"
            " GROUP BY u.name ORDER BY n DESC, u.name LIMIT $1",
            limit,
        )
        return [(row[0], row[1]) for row in rows]

    async def tag_counts(self, limit: int) -> list[tuple[str, int]]:
        rows = await self._pool.fetch(
            "SELECT tag, count(*) AS n FROM forum_post_tags GROUP BY tag ORDER BY n DESC, tag LIMIT $1", limit
        )
        return [(row[0], row[1]) for row in rows]

    async def comment_count(self, post_id: int) -> int:
        count = await self._pool.fetchval("SELECT count(*) FROM forum_comments WHERE post_id = $1", post_id)
        return int(count)

    async def get_post(self, post_id: int) -> Post | None:
        row = await self._pool.fetchrow(
            "SELECT p.id, u.name, p.title, p.body, p.created_at FROM forum_posts p"
            " JOIN forum_users u ON u.id = p.author_id WHERE p.id = $1",
            post_id,
        )
        return None if row is None else Post(*row)

    async def close(self) -> None:
        await self._pool.close()


async def _pg_seed(conn: asyncpg.Connection, data: SeedData) -> None:
    await conn.executemany("INSERT INTO forum_users VALUES ($1, $2) ON CONFLICT DO NOTHING", data.users)
    await conn.executemany("INSERT INTO forum_posts VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", data.posts)
    await conn.executemany("INSERT INTO forum_post_tags VALUES ($1, $2) ON CONFLICT DO NOTHING", data.tags)
    await conn.executemany(
        "INSERT INTO forum_comments VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING", data.comments
    )


# --- SQLite -------------------------------------------------------------------------------------------------

_SQLITE_SCHEMA = _PG_SCHEMA.replace("double precision", "real")


class SqliteDatabase:
    """The forum's queries on a SQLite file, through a small pool of aiosqlite connections.

    Each aiosqlite connection runs its queries on its own thread, so a pool of ``n`` connections lets
    ``n`` queries run in parallel, as a pool of database connections does. (aiosqlite has no pool: this
    is the few lines of one.)
    """

    def __init__(self, path: Path, conns: list[aiosqlite.Connection], owns_dir: bool) -> None:
        self.path = path
        """The database file."""
        self._conns = conns
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        for conn in conns:
            self._idle.put_nowait(conn)
        self._owns_dir = owns_dir

    @classmethod
    async def open(cls, seed_posts: int, pool_size: int, path: Path | None = None) -> SqliteDatabase:
        """Create (in a new temporary directory unless ``path`` is given) and seed the database."""
        owns_dir = path is None
        if path is None:
            path = Path(tempfile.mkdtemp(prefix="forum-")) / "forum.db"
        conns: list[aiosqlite.Connection] = []
        try:
            first = await aiosqlite.connect(path)
            conns.append(first)
            await first.executescript(_SQLITE_SCHEMA)
            async with first.execute("SELECT count(*) FROM forum_posts WHERE id <= ?", (seed_posts,)) as cur:
                (have,) = await cur.fetchone() or (0,)
            if have < seed_posts:
                data = SeedData.generate(seed_posts)
                await first.executemany("INSERT OR IGNORE INTO forum_users VALUES (?, ?)", data.users)
                await first.executemany("INSERT OR IGNORE INTO forum_posts VALUES (?, ?, ?, ?, ?)", data.posts)
                await first.executemany("INSERT OR IGNORE INTO forum_post_tags VALUES (?, ?)", data.tags)
                await first.executemany("INSERT OR IGNORE INTO forum_comments VALUES (?, ?, ?, ?)", data.comments)
                await first.commit()
            for _ in range(pool_size - 1):
                conns.append(await aiosqlite.connect(path))
        except BaseException:
            for conn in conns:
                await conn.close()
            raise
        return cls(path, conns, owns_dir)

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        conn = await self._idle.get()
        try:
            yield conn
        finally:
            self._idle.put_nowait(conn)

    async def _fetch(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        # execute_fetchall: one trip to the connection's thread per query, as one round trip to a server.
        async with self._conn() as conn:
            return [tuple(row) for row in await conn.execute_fetchall(sql, params)]

    async def recent_posts(self, limit: int, offset: int) -> list[Post]:
        rows = await self._fetch(
            "SELECT p.id, u.name, p.title, p.body, p.created_at FROM forum_posts p"
            " JOIN forum_users u ON u.id = p.author_id ORDER BY p.created_at DESC LIMIT ? OFFSET ?",
            limit, offset,
        )
        return [Post(*row) for row in rows]

    async def top_users(self, limit: int) -> list[tuple[str, int]]:
        rows = await self._fetch(
            "SELECT u.name, count(p.id) AS n FROM forum_users u JOIN forum_posts p ON p.author_id = u.id"
            " GROUP BY u.name ORDER BY n DESC, u.name LIMIT ?",
            limit,
        )
        return [(str(row[0]), int(row[1])) for row in rows]

    async def tag_counts(self, limit: int) -> list[tuple[str, int]]:
        rows = await self._fetch(
            "SELECT tag, count(*) AS n FROM forum_post_tags GROUP BY tag ORDER BY n DESC, tag LIMIT ?", limit
        )
        return [(str(row[0]), int(row[1])) for row in rows]

    async def comment_count(self, post_id: int) -> int:
        rows = await self._fetch("SELECT count(*) FROM forum_comments WHERE post_id = ?", post_id)
        return int(rows[0][0])

    async def get_post(self, post_id: int) -> Post | None:
        rows = await self._fetch(
            "SELECT p.id, u.name, p.title, p.body, p.created_at FROM forum_posts p"
            " JOIN forum_users u ON u.id = p.author_id WHERE p.id = ?",
            post_id,
        )
        return Post(*rows[0]) if rows else None

    async def close(self) -> None:
        for conn in self._conns:
            await conn.close()
        self._conns = []
        if self._owns_dir:
            shutil.rmtree(self.path.parent, ignore_errors=True)


async def open_database(postgres_url: str | None, seed_posts: int, pool_size: int) -> Database:
    """PostgreSQL when a URL is given, else a fresh seeded SQLite file."""
    if postgres_url:
        return await PostgresDatabase.open(postgres_url, seed_posts, pool_size)
    return await SqliteDatabase.open(seed_posts, pool_size)
