"""The closed-loop load generator against a real in-process aiohttp server with a known service time."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from collections.abc import AsyncIterator

import psutil
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from analyzer.demands import littles_law_deviation
from replayer.loadtest import (
    LoadTestConfig,
    LoadTestError,
    Progress,
    ThinkTime,
    local_pid_for_url,
    parse_duration,
    parse_users,
    run_load_test,
)
from replayer.monitor import LocalMonitor, MonitorError, ProcessTarget

SERVICE_S = 0.02
THINK_S = 0.05


def _app() -> web.Application:
    counter = itertools.count()

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(SERVICE_S)
        return web.Response(text="ok")

    async def flaky(request: web.Request) -> web.Response:
        if next(counter) % 2:
            raise web.HTTPInternalServerError()
        return web.Response(text="ok")

    async def broken(request: web.Request) -> web.Response:
        raise web.HTTPServiceUnavailable()

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/flaky", flaky)
    app.router.add_get("/broken", broken)
    return app


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    server = TestServer(_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_throughput_obeys_littles_law(base_url: str) -> None:
    config = LoadTestConfig(
        url=f"{base_url}/slow",
        users=(2, 6),
        think_time_s=THINK_S,
        duration_s=1.2,
        warmup_s=0.3,
        think=ThinkTime.CONSTANT,
    )
    seen: list[Progress] = []
    result = await run_load_test(
        config, monitors=[LocalMonitor("here")], processes=[ProcessTarget("self", os.getpid(), servers=3)], progress=seen.append
    )
    assert [level.users for level in result.levels] == [2, 6]
    for level in result.levels:
        assert level.errors == 0 and level.completed > 0
        # the server sleeps SERVICE_S before answering: no response can be faster
        assert level.response_time_p50_s >= SERVICE_S
        assert level.response_time_s <= level.response_time_p99_s
        assert level.response_time_p50_s <= level.response_time_p90_s <= level.response_time_p99_s
        # Little's law over the closed loop, N = X (R + Z), within 10%
        deviation = littles_law_deviation(level.users, level.throughput_per_s, level.response_time_s, THINK_S)
        assert abs(deviation) < 0.10, level
        assert level.throughput_per_s == pytest.approx(level.completed / level.duration_s)
        (host,) = level.hosts
        assert host.host == "here" and host.cpu_servers == psutil.cpu_count()
        (proc,) = level.processes
        assert proc.label == "self" and proc.servers == 3 and proc.busy_servers > 0
        assert level.generator_busy_cpus > 0
    assert {p.phase for p in seen} == {"warmup", "measure"}
    assert {p.level_index for p in seen} == {0, 1}


async def test_exponential_think_times(base_url: str) -> None:
    config = LoadTestConfig(
        url=f"{base_url}/slow", users=(8,), think_time_s=THINK_S, duration_s=1.2, warmup_s=0.2, seed=7
    )
    (level,) = (await run_load_test(config)).levels
    # with random think times the law holds with the think times the users actually slept
    deviation = littles_law_deviation(level.users, level.throughput_per_s, level.response_time_s, level.think_time_s)
    assert abs(deviation) < 0.10, level
    # and those are exponential draws of the asked mean (some 100 of them: a loose bound)
    assert level.think_time_s == pytest.approx(THINK_S, rel=0.35)


async def test_errors_are_counted_apart(base_url: str) -> None:
    config = LoadTestConfig(
        url=f"{base_url}/flaky", users=(3,), think_time_s=0.01, duration_s=0.5, warmup_s=0.1, think=ThinkTime.CONSTANT
    )
    (level,) = (await run_load_test(config)).levels
    assert level.errors > 0 and level.completed > 0
    assert level.error_examples == ("HTTP 500",)
    assert abs(level.completed - level.errors) <= 3 * 2  # every other request fails
    assert level.to_json()["error_examples"] == ["HTTP 500"]


async def test_url_answering_an_error_stops_the_test_first(base_url: str) -> None:
    config = LoadTestConfig(url=f"{base_url}/broken", users=(1,), think_time_s=0, duration_s=1)
    with pytest.raises(LoadTestError, match=r"/broken answered HTTP 503"):
        await run_load_test(config)


async def test_unreachable_url_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    with pytest.raises(LoadTestError, match=rf"cannot reach {url}"):
        await run_load_test(LoadTestConfig(url=url, users=(1,), think_time_s=0, duration_s=1))


async def test_bad_pid_fails_before_the_first_level(base_url: str) -> None:
    proc = psutil.Popen(["true"])
    proc.wait()
    config = LoadTestConfig(url=f"{base_url}/slow", users=(1,), think_time_s=0, duration_s=60)
    with pytest.raises(MonitorError, match=rf"process {proc.pid}"):
        await run_load_test(config, processes=[ProcessTarget("gone", proc.pid)])


async def test_process_labels_must_differ(base_url: str) -> None:
    config = LoadTestConfig(url=f"{base_url}/slow", users=(1,), think_time_s=0, duration_s=60)
    same = [ProcessTarget("a", os.getpid()), ProcessTarget("a", os.getpid())]
    with pytest.raises(LoadTestError, match="labels must differ"):
        await run_load_test(config, processes=same)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": ()}, "at least one concurrency level"),
        ({"users": (1, 0)}, "each level must be a positive integer"),
        ({"think_time_s": -1.0}, "`think_time_s` must be non-negative"),
        ({"duration_s": 0.0}, "`duration_s` must be positive"),
        ({"url": "ftp://x/"}, "`url`: expected an http"),
        ({"url": "http:///path"}, "`url`: expected an http"),
    ],
)
def test_config_errors(kwargs: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"url": "http://h/", "users": (1,), "think_time_s": 1.0, "duration_s": 1.0}
    with pytest.raises(LoadTestError, match=message):
        LoadTestConfig(**(settings | kwargs))  # type: ignore[arg-type]


def test_parse_users_and_durations() -> None:
    assert parse_users("1,20,105,203") == (1, 20, 105, 203)
    assert parse_duration("60s") == 60.0
    assert parse_duration("1.5m") == 90.0
    assert parse_duration("200ms") == pytest.approx(0.2)
    with pytest.raises(LoadTestError, match=r"item 2 of '1,x,3' is 'x'"):
        parse_users("1,x,3")
    with pytest.raises(LoadTestError, match=r"item 1 of '0' is '0'"):
        parse_users("0")
    with pytest.raises(LoadTestError, match=r"`--think`: expected a duration"):
        parse_duration("soon", "--think")


def test_local_pid_for_url() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert local_pid_for_url(f"http://127.0.0.1:{port}/x") == os.getpid()
        assert local_pid_for_url(f"http://localhost:{port}/") == os.getpid()
    assert local_pid_for_url("http://example.com:80/") is None


def test_doctests() -> None:
    import doctest

    import replayer.loadtest

    result = doctest.testmod(replayer.loadtest)
    assert result.attempted > 0 and result.failed == 0
