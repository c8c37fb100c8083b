"""Shared fixtures: real Redis and PostgreSQL on 127.0.0.1.

Tests that need them skip with the reason when they are not reachable, except under ``CI=true``, where a
missing service is a failure: CI must never pass by skipping the I/O tests.
"""

from __future__ import annotations

import os

import pytest

from replayer.groundtruth import reachable

REDIS_URL = os.environ.get("PERFCAST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("PERFCAST_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _require(name: str, host: str, port: int) -> None:
    if reachable(host, port):
        return
    reason = f"{name} is not reachable on {host}:{port}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI=true: the I/O tests must run on CI, start {name} first")
    pytest.skip(reason)


@pytest.fixture
def redis_url() -> str:
    """URL of a real Redis server (skips, or fails under CI=true, when there is none)."""
    _require("Redis", "127.0.0.1", 6379)
    return REDIS_URL


@pytest.fixture
def postgres_url() -> str:
    """URL of a real PostgreSQL server, database ``test`` (skips, or fails under CI=true, when there is none)."""
    _require("PostgreSQL", "127.0.0.1", 5432)
    return POSTGRES_URL
