"""The profiler against real endpoints: Redis, PostgreSQL, an in-process aiohttp server, TCP connect RTT."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from analyzer.profiles import ProfileStore
from analyzer.profiling import (
    HttpTarget,
    PostgresTarget,
    ProfilingError,
    RedisTarget,
    RttTarget,
    StopRule,
    is_stable,
    measure,
    parse_duration,
    parse_sizes,
    path_template,
    profile_target,
    relative_standard_error,
    sql_operation,
)

FAST = StopRule(rse=0.05, min_count=20, budget_s=1.0)


def test_parsers() -> None:
    assert parse_sizes("1k, 64k,1m,10") == [1024, 65536, 1048576, 10]
    assert parse_duration("500ms") == 0.5 and parse_duration("10m") == 600 and parse_duration("2") == 2
    with pytest.raises(ProfilingError, match="size '3x'"):
        parse_sizes("1k,3x")
    with pytest.raises(ProfilingError, match="duration"):
        parse_duration("soon")
    assert sql_operation("select * from posts p join users u on p.uid = u.id") == "SELECT posts"
    assert sql_operation("INSERT INTO comments VALUES ($1)") == "INSERT comments"
    assert sql_operation("SELECT 1") == "SELECT"
    assert sql_operation("/* app */ UPDATE posts SET x = 1") == "UPDATE posts"
    assert path_template("/blob/42") == "/blob/{id}"


def test_stopping_rule() -> None:
    assert not is_stable([5.0] * 9, 0.02, 10)
    assert is_stable([5.0] * 10, 0.02, 10)
    noisy = np.random.default_rng(0).exponential(5.0, 50)
    assert relative_standard_error(noisy) == pytest.approx(noisy.std(ddof=1) / np.sqrt(50) / noisy.mean())
    assert not is_stable(noisy, 0.02, 10)


async def test_measure_stops_when_stable_with_constant_calls() -> None:
    ticks = itertools.count(step=1_000_000)  # each clock read advances 1 ms: every call "takes" 1 ms
    samples, why = await measure(lambda: asyncio.sleep(0), StopRule(rse=0.01, min_count=25, budget_s=30),
                                 clock=lambda: next(ticks), concurrency=1)
    assert why == "stable" and samples.size == 25 and np.all(samples == 1.0)


async def test_measure_stops_at_max_count_and_reports_progress() -> None:
    seen: list[int] = []
    rng = np.random.default_rng(1)

    async def call() -> None:
        await asyncio.sleep(0)

    values = iter(np.cumsum(rng.exponential(1e6, 10_000)).astype(np.int64).tolist())
    samples, why = await measure(call, StopRule(rse=1e-9, min_count=5, budget_s=30, max_count=200),
                                 concurrency=4, progress=lambda n, rse, t: seen.append(n),
                                 clock=lambda: next(values))
    assert why == "max count" and 200 <= samples.size < 204
    assert seen and seen[-1] == samples.size


async def test_measure_takes_the_time_a_call_reports() -> None:
    async def call() -> float:
        await asyncio.sleep(0)
        return 2.5

    samples, why = await measure(call, StopRule(rse=0.01, min_count=10, budget_s=30))
    assert why == "stable" and samples.size == 10 and np.all(samples == 2.5)


async def test_measure_turns_driver_errors_into_profiling_errors() -> None:
    async def call() -> None:
        raise ConnectionResetError("peer went away")

    with pytest.raises(ProfilingError, match="ConnectionResetError: peer went away"):
        await measure(call, FAST, concurrency=2)


async def test_redis_workload_independent_and_size_profiles(redis_url: str, tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "p.db")
    target = RedisTarget(redis_url, "GET")
    results = await profile_target(target, labels={"tier": "local"}, rule=FAST, store=store)
    assert [r.key.api for r in results] == ["redis GET"]
    assert results[0].key.resource == "redis://127.0.0.1:6379/0"
    assert results[0].samples_ms.size >= FAST.min_count
    assert store.samples(results[0].key).size == results[0].samples_ms.size
    assert store.round_trips(results[0].key) == 1.0
    sized = await profile_target(RedisTarget(redis_url, "SET"), sizes=[1024, 4 * 1024 * 1024], rule=FAST, store=store)
    assert [(r.key.api, r.key.param, r.key.value) for r in sized] == [
        ("redis SET", "size_bytes", 1024.0), ("redis SET", "size_bytes", 4194304.0)]
    # A 4 MiB SET takes longer than a 1 KiB one.
    assert np.median(sized[1].samples_ms) > np.median(sized[0].samples_ms)
    sel = store.select("redis SET", "redis://127.0.0.1:6379/0", {}, "size_bytes", 1_000_000)
    assert "interpolated" in sel.how
    store.close()


async def test_redis_concurrency_profile(redis_url: str) -> None:
    results = await profile_target(RedisTarget(redis_url, "PING"), concurrencies=[1, 8], rule=FAST)
    assert [r.key.param for r in results] == ["concurrency", "concurrency"]
    assert [r.key.value for r in results] == [1.0, 8.0]


async def test_redis_unreachable() -> None:
    with pytest.raises(ProfilingError, match="cannot reach Redis"):
        await profile_target(RedisTarget("redis://127.0.0.1:1/0"), rule=FAST)


async def test_postgres_select_profile(postgres_url: str, tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "p.db")
    results = await profile_target(PostgresTarget(postgres_url), sizes=[64, 65536], rule=FAST, store=store)
    assert results[0].key.api == "postgresql SELECT perfcast_profile"
    assert results[0].key.resource == "postgresql://127.0.0.1:5432/test"
    assert all(r.samples_ms.size >= FAST.min_count for r in results)
    custom = await profile_target(PostgresTarget(postgres_url, "SELECT count(*) FROM pg_class"), rule=FAST)
    assert custom[0].key.api == "postgresql SELECT pg_class"
    with pytest.raises(ProfilingError, match="statement failed"):
        await profile_target(PostgresTarget(postgres_url, "SELECT * FROM no_such_table_here"), rule=FAST)
    store.close()


async def test_postgres_calls_make_one_round_trip_each(postgres_url: str) -> None:
    from urllib.parse import urlsplit

    from replayer.proxy import LatencyProxy, Upstream

    parts = urlsplit(postgres_url)
    async with LatencyProxy([Upstream(parts.hostname or "127.0.0.1", parts.port or 5432)], delay_ms=20) as proxy:
        url = postgres_url.replace(parts.netloc.rpartition("@")[2], proxy.address)
        (result,) = await profile_target(PostgresTarget(url, "SELECT 1"), rule=StopRule(rse=0.05, min_count=15,
                                                                                         budget_s=2.0))
    # one 20 ms round trip per call; releasing a pooled connection after each call (its reset) would add another
    assert 20.0 <= float(np.median(result.samples_ms)) < 30.0


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(request.query.get("bytes", "10")))

    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/blob", blob)
    app.router.add_get("/missing", missing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_http_profiles(http_server: str, tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "p.db")
    target = HttpTarget(f"{http_server}/blob?bytes={{size}}", api="http GET /blob/{id}")
    results = await profile_target(target, sizes=[100, 4_000_000], rule=FAST, store=store, labels={"loc": "here"})
    assert [r.key.api for r in results] == ["http GET /blob/{id}"] * 2
    assert results[0].key.resource == http_server
    assert np.median(results[1].samples_ms) > np.median(results[0].samples_ms)
    # the caller's CPU per call, kept with the samples: taking in 4 MB costs the client's loop more than 100 B
    cpu = [store.cpu_ms(r.key) for r in results]
    assert cpu == [r.cpu_ms for r in results] and 0 < cpu[0] < cpu[1]
    plain = await profile_target(HttpTarget(f"{http_server}/blob"), concurrencies=[4], rule=FAST)
    assert plain[0].key.api == "http GET /blob" and plain[0].key.value == 4.0
    with pytest.raises(ProfilingError, match="HTTP 404"):
        await profile_target(HttpTarget(f"{http_server}/missing"), rule=FAST)
    with pytest.raises(ProfilingError, match="placeholder"):
        await profile_target(HttpTarget(f"{http_server}/blob"), sizes=[10], rule=FAST)
    store.close()


async def test_sizes_with_concurrencies_measure_the_grid(http_server: str, tmp_path: Path) -> None:
    """Sizes and concurrencies together: every size with one caller and with each number of callers, the first
    size's points stored as the concurrency profile too; the engine reads the payload profile at a level."""
    store = ProfileStore(tmp_path / "p.db")
    target = HttpTarget(f"{http_server}/blob?bytes={{size}}", api="http GET /blob/{id}")
    results = await profile_target(target, sizes=[100, 2_000_000], concurrencies=[4], rule=FAST, store=store)
    assert [(r.key.param, r.key.value, r.key.concurrency) for r in results] == [
        ("size_bytes", 100.0, 1), ("size_bytes", 100.0, 4), ("size_bytes", 2e6, 1), ("size_bytes", 2e6, 4)]
    conc = store.select("http GET /blob/{id}", http_server, {}, "concurrency", 4)
    assert conc.samples_ms.tolist() == results[1].samples_ms.tolist()
    # four callers share one server: a big body takes longer each than alone
    assert np.median(results[3].samples_ms) > np.median(results[2].samples_ms)
    sel = store.select("http GET /blob/{id}", http_server, {}, "size_bytes", 2e6, 4)
    assert sel.samples_ms.tolist() == results[3].samples_ms.tolist()
    store.close()


async def test_rtt_profile(http_server: str) -> None:
    address = http_server.removeprefix("http://")
    results = await profile_target(RttTarget(address), labels={"location": "local"}, rule=FAST)
    assert results[0].key.api == "rtt" and results[0].key.resource == f"tcp://{address}"
    assert results[0].samples_ms.size >= FAST.min_count
    with pytest.raises(ProfilingError, match="HOST:PORT"):
        RttTarget("nohost")
    with pytest.raises(ProfilingError, match="cannot connect"):
        await profile_target(RttTarget("127.0.0.1:1"), rule=FAST)


async def test_wake_up_profile_pauses_before_each_call(http_server: str, tmp_path: Path) -> None:
    from analyzer.wakeup import WAKE_API, wake_profile

    store = ProfileStore(tmp_path / "p.db")
    target = HttpTarget(f"{http_server}/blob")
    rule = StopRule(rse=0.05, min_count=10, max_count=10, budget_s=5.0)
    began = asyncio.get_running_loop().time()
    results = await profile_target(target, idle_ms=[30.0], rule=rule, store=store)
    elapsed = asyncio.get_running_loop().time() - began
    # the reference at 0 ms is added; the pauses are not part of the samples but do take their time
    assert [(r.key.api, r.key.param, r.key.value) for r in results] == [(WAKE_API, "idle_ms", 0.0),
                                                                          (WAKE_API, "idle_ms", 30.0)]
    assert all(r.samples_ms.size == 10 and float(np.median(r.samples_ms)) < 30.0 for r in results)
    assert elapsed >= 10 * 0.030
    profile = wake_profile(store)
    assert profile is not None and profile.idle_ms.tolist() == [0.0, 30.0]
    with pytest.raises(ProfilingError, match="without sizes"):
        await profile_target(target, idle_ms=[5.0], sizes=[10], rule=rule)
    with pytest.raises(ProfilingError, match=">= 0"):
        await profile_target(target, idle_ms=[-1.0], rule=rule)
    store.close()


class _DriftingTarget:
    """A fake endpoint on a host slowing down as it works: each call takes its payload's time plus 0.01 ms for
    every call made before it. It records the order its points were prepared in."""

    api, resource, round_trips = "http GET /blob/{id}", "http://drifting", 1.0

    def __init__(self) -> None:
        self.calls = 0
        self.prepared: list[tuple[int | None, int]] = []
        self._size: int | None = None
        self._concurrency = 1

    async def open(self, concurrency: int) -> None:
        self._concurrency = concurrency

    async def prepare(self, size_bytes: int | None) -> None:
        self._size = size_bytes
        self.prepared.append((size_bytes, self._concurrency))

    async def call(self) -> float:
        await asyncio.sleep(0)
        self.calls += 1
        return (self._size or 0) / 1000 + 0.01 * self.calls

    async def close(self) -> None:
        pass


async def test_points_take_turns_so_drift_does_not_enter_their_difference(tmp_path: Path) -> None:
    rule = StopRule(rse=1e-9, min_count=2, budget_s=30, max_count=300)
    gaps = {}
    for rounds in (1, 6):
        target = _DriftingTarget()
        store = ProfileStore(tmp_path / f"p{rounds}.db")
        small, big = await profile_target(target, sizes=[1000, 2000], rule=rule, rounds=rounds, store=store)
        # every point gets its whole count over its spells, and is stored whole after the last one
        assert small.samples_ms.size == big.samples_ms.size == 300
        stored = store.select(target.api, target.resource, {}, "size_bytes", 2000.0)
        assert stored.samples_ms.tolist() == big.samples_ms.tolist()
        gaps[rounds] = float(big.samples_ms.mean() - small.samples_ms.mean())
        store.close()
    # spells in order, then in reverse: a b | b a | a b ...
    assert target.prepared[:4] == [(1000, 1), (2000, 1), (2000, 1), (1000, 1)] and len(target.prepared) == 12
    # the true difference is 1 ms; one after the other adds the drift of 300 calls (3 ms), turns almost none
    assert gaps[1] == pytest.approx(4.0, abs=0.05)
    assert abs(gaps[6] - 1.0) < 0.1


async def test_rounds_must_be_positive() -> None:
    with pytest.raises(ProfilingError, match="rounds"):
        await profile_target(_DriftingTarget(), sizes=[1, 2], rounds=0)
