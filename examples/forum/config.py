"""The forum app's settings: one frozen record, parsed from the command line.

Every knob a what-if scenario may want to turn is a flag here: where the database, cache and blob
services are, how big the blobs are, how much CPU the page render costs, how often the ad service is
slow enough for the request's timeout to fire, and how long cached pages live.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ForumConfig:
    """Settings of one forum app process."""

    host: str = "127.0.0.1"
    port: int = 8080
    """0 picks a free port; the ``listening on`` line shows the real one."""
    reuse_port: bool = False
    """Share the port with other processes that ask too (``SO_REUSEPORT``): replicas the kernel balances."""
    redis_url: str | None = None
    """Redis used as the page cache; ``None`` uses the blob service's key-value API."""
    postgres_url: str | None = None
    """PostgreSQL holding the ``forum_*`` tables; ``None`` uses a seeded SQLite temp file."""
    blob_url: str | None = None
    """Base URL of the blob service; ``None`` starts the embedded one on its own thread."""
    replica_urls: tuple[str, ...] = ()
    """The two recommendation replicas raced on each index request (embedded ones when empty)."""
    payload_bytes: int = 4096
    """Size of each blob fetched per post."""
    seed_posts: int = 200
    """Posts created (idempotently) at start."""
    posts_per_page: int = 10
    db_pool: int = 4
    """Connections to the database (SQLite: one thread each)."""
    cache_ttl_ms: int = 500
    """Lifetime of a cached index page: short, so that hits and misses both occur under load."""
    render_scale: float = 1.0
    """Multiplies the CPU work of rendering a page (1.0: a few ms per index page miss)."""
    ad_timeout_ms: float = 50.0
    """``asyncio.wait_for`` timeout on the ad service call."""
    ad_slow_fraction: float = 0.1
    """Embedded service only: fraction of ad calls that are slow (slower than the timeout)."""
    ad_slow_ms: float = 200.0
    """Embedded service only: latency of a slow ad call."""
    blob_delay_ms: float = 0.0
    """Embedded service only: latency added to every blob-service request (a farther service)."""
    replica_jitter_ms: float = 2.0
    """Embedded service only: mean of the exponential delay of each recommendation reply."""
    seed: int | None = None
    """Seeds the choice of users and the embedded services' random delays (``None``: not reproducible)."""


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m examples.forum`` argument parser."""
    p = argparse.ArgumentParser(prog="python -m examples.forum", description="A small asyncio forum app.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_non_negative_int, default=8080, help="0 picks a free port")
    p.add_argument("--reuse-port", action="store_true",
                   help="share the port with other replicas started so (SO_REUSEPORT: the kernel balances them)")
    p.add_argument("--redis", dest="redis_url", metavar="URL", help="Redis URL for the page cache")
    p.add_argument("--postgres", dest="postgres_url", metavar="URL", help="PostgreSQL URL (tables forum_*)")
    p.add_argument("--blob-url", metavar="URL", help="blob service base URL (default: embedded)")
    p.add_argument(
        "--replica-url", dest="replica_urls", metavar="URL", action="append", default=[],
        help="recommendation replica (give two; default: embedded)",
    )
    p.add_argument("--payload-bytes", type=_non_negative_int, default=4096, metavar="N",
                   help="size of the blob fetched per post (default 4096)")
    p.add_argument("--seed-posts", type=_non_negative_int, default=200, metavar="N",
                   help="posts created idempotently at start (default 200)")
    p.add_argument("--posts-per-page", type=_non_negative_int, default=10, metavar="N",
                   help="posts on an index page: blobs and comment counts fetched per miss (default 10)")
    p.add_argument("--db-pool", type=_non_negative_int, default=4, metavar="N",
                   help="database connections (default 4)")
    p.add_argument("--cache-ttl-ms", type=_non_negative_int, default=500, metavar="MS",
                   help="lifetime of a cached index page (default 500)")
    p.add_argument("--render-scale", type=_non_negative_float, default=1.0, metavar="X",
                   help="multiplies the CPU work of rendering (default 1.0: a few ms per index miss)")
    p.add_argument("--ad-timeout-ms", type=_non_negative_float, default=50.0, metavar="MS",
                   help="asyncio.wait_for timeout on the ad call (default 50)")
    p.add_argument("--ad-slow-fraction", type=_fraction, default=0.1, metavar="F",
                   help="embedded services: fraction of slow ad calls, where the timeout fires (default 0.1)")
    p.add_argument("--ad-slow-ms", type=_non_negative_float, default=200.0, metavar="MS",
                   help="embedded services: latency of a slow ad call (default 200)")
    p.add_argument("--blob-delay-ms", type=_non_negative_float, default=0.0, metavar="MS",
                   help="embedded services: latency added to every call (default 0)")
    p.add_argument("--replica-jitter-ms", type=_non_negative_float, default=2.0, metavar="MS",
                   help="embedded services: mean exponential delay of a recommendation (default 2)")
    p.add_argument("--seed", type=int, help="seed of the random users and of the embedded services' delays")
    return p


def parse_config(argv: Sequence[str] | None = None) -> ForumConfig:
    """Parse command-line arguments into a :class:`ForumConfig` (exits with usage on bad input)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if len(ns.replica_urls) == 1:
        parser.error("--replica-url: give two replicas to race, or none")
    if ns.posts_per_page < 1:
        parser.error("--posts-per-page: must be at least 1")
    if ns.db_pool < 1:
        parser.error("--db-pool: must be at least 1")
    values = vars(ns)
    values["replica_urls"] = tuple(ns.replica_urls)
    return ForumConfig(**values)
