"""The load client: closed and open loops, request counts, errors, JSON and the subprocess runner."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from examples.forum.load import LoadResult, run_load, run_load_subprocess


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """A real aiohttp server: ``/ok/{n}`` answers 200, ``/missing`` 404."""

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text=request.match_info["n"])

    app = web.Application()
    app.router.add_get("/ok/{n}", ok)
    srv = TestServer(app)
    await srv.start_server()
    yield str(srv.make_url("")).rstrip("/")
    await srv.close()


async def test_closed_loop_returns_the_requested_number_of_latencies(server: str) -> None:
    result = await run_load(server, users=4, requests=25, paths=["/ok/{n}"], n_max=3, seed=1)
    assert len(result.latencies_ms) == 25 and len(result.paths) == 25
    assert result.errors == 0 and result.mode == "closed"
    assert all(lat > 0 for lat in result.latencies_ms)
    assert set(result.paths) <= {"/ok/1", "/ok/2", "/ok/3"} and len(set(result.paths)) > 1
    assert result.throughput_rps == pytest.approx(25 / result.elapsed_s)


async def test_open_loop_and_duration(server: str) -> None:
    result = await run_load(server, users=8, duration_s=0.4, rate_rps=100, paths=["/ok/1"], seed=2)
    assert result.mode == "open" and result.elapsed_s == pytest.approx(0.4)
    # Poisson arrivals at 100/s for 0.4 s: about 40; far outside [10, 100] means the loop is wrong.
    assert 10 <= len(result.latencies_ms) <= 100
    counted = await run_load(server, users=2, requests=12, rate_rps=200, paths=["/ok/1"])
    assert len(counted.latencies_ms) == 12


async def test_warmup_requests_are_not_measured(server: str) -> None:
    result = await run_load(server, users=2, requests=5, warmup_s=0.2, paths=["/ok/1"])
    assert len(result.latencies_ms) == 5 and result.errors == 0


async def test_errors_are_counted_with_examples(server: str) -> None:
    result = await run_load(server, users=2, requests=6, paths=["/missing"])
    assert result.latencies_ms == () and result.errors == 6
    assert "HTTP 404" in result.error_examples[0]
    assert math.isnan(result.percentile_ms(50)) and result.to_json()["p50_ms"] is None


async def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="users"):
        await run_load("http://127.0.0.1:1", users=0, requests=1)
    with pytest.raises(ValueError, match="duration_s or requests"):
        await run_load("http://127.0.0.1:1")


def test_percentiles_and_json_round_trip() -> None:
    result = LoadResult((4.0, 1.0, 3.0, 2.0), ("/",) * 4, 1, ("x",), 2.0, 3, "closed")
    assert (result.percentile_ms(50), result.percentile_ms(100), result.percentile_ms(0)) == (2.0, 4.0, 1.0)
    assert result.throughput_rps == 2.0
    assert LoadResult.from_json(result.to_json()) == result
    with pytest.raises(ValueError, match="q must be"):
        result.percentile_ms(101)


async def test_subprocess_runner(server: str) -> None:
    import asyncio

    from collector._process import host_cpu_ns

    before = host_cpu_ns()[0]
    result = await asyncio.to_thread(run_load_subprocess, server, users=3, requests=300, paths=["/ok/{n}"])
    around = (host_cpu_ns()[0] - before) / 1e9
    assert len(result.latencies_ms) == 300 and result.users == 3
    # the host's CPU over the client's run only: its interpreter's start-up (imports, about 0.35 s of CPU) is out
    assert 0 < result.host_cpu_s[0] < around - 0.05
    with pytest.raises(RuntimeError, match="load client failed"):
        await asyncio.to_thread(run_load_subprocess, server, users=0, requests=1)


async def test_a_controller_labels_each_request_before_it_is_sent(server: str) -> None:
    import asyncio

    events: list[str] = []  # what the controller and the server saw, in order

    async def controller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        k = 0
        while await reader.readline() == b"next\n":
            k += 1
            events.append(f"label{k}")
            writer.write(f"side{k % 2}\n".encode())
            await writer.drain()
        writer.close()

    ctl = await asyncio.start_server(controller, "127.0.0.1", 0)
    port = ctl.sockets[0].getsockname()[1]
    result = await run_load(server, users=1, requests=5, paths=["/ok/1"], control=f"127.0.0.1:{port}")
    ctl.close()
    assert result.labels == ("side1", "side0", "side1", "side0", "side1")
    assert events == [f"label{k}" for k in range(1, 6)]  # one question per request, none after the last
    assert LoadResult.from_json(result.to_json()) == result
    with pytest.raises(ValueError, match="one closed-loop user"):
        await run_load(server, users=2, requests=1, control=f"127.0.0.1:{port}")
    with pytest.raises(ValueError, match="'localhost': expected HOST:PORT"):
        await run_load(server, users=1, requests=1, control="localhost")
