"""A small asyncio forum: the example app perfcast is demonstrated and measured on.

It imports only public libraries (aiohttp, redis.asyncio, asyncpg, aiosqlite): it is the "unmodified app"
that ``perfcast collect`` instruments from outside. Run it with ``python -m examples.forum --port 0``,
its blob service with ``python -m examples.forum.blobs``, and load it with ``python -m examples.forum.load``.
"""

from examples.forum.app import Forum, build_app
from examples.forum.config import ForumConfig, parse_config

__all__ = ["Forum", "ForumConfig", "build_app", "parse_config"]
