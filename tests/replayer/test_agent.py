"""The agent's HTTP API, and a monitor reading from it, through real aiohttp servers on port 0."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import psutil
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from replayer.agent import create_app, serve
from replayer.monitor import AgentMonitor, HostCounters, MonitorError, read_host_counters, sample


@pytest.fixture
async def agent_url() -> AsyncIterator[str]:
    server = TestServer(create_app("box1"))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_health(agent_url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{agent_url}/health") as response:
        assert response.status == 200
        body = await response.json()
    assert body["status"] == "ok"
    assert body["host"] == "box1"


async def test_metrics_are_well_formed_numbers(agent_url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{agent_url}/metrics") as response:
        assert response.status == 200
        body = await response.json()
    counters = HostCounters.from_json(body, "agent")  # checks every field: present, finite, non-negative
    assert counters.host == "box1"
    assert counters.cpu_count == psutil.cpu_count()
    assert 0 < counters.cpu_busy_s <= counters.cpu_total_s


async def test_monitor_reads_the_agent_over_a_window(agent_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        monitor = AgentMonitor(agent_url, session)
        first = await monitor.read()
        u = await sample(monitor, 0.2)
        renamed = await AgentMonitor(agent_url, session, host="db").read()
    assert first.host == "box1" and u.host == "box1" and renamed.host == "db"
    assert u.elapsed_s >= 0.2
    assert 0.0 <= u.cpu_busy_servers <= u.cpu_servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_agent_not_answering_is_named() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(MonitorError, match=rf"agent {url}/metrics is not answering"):
            await AgentMonitor(url, session).read()


async def _bad_metrics(request: web.Request) -> web.Response:
    data = read_host_counters().to_json()
    data["cpu_total_s"] = "lots"
    return web.json_response(data)


async def _not_json(request: web.Request) -> web.Response:
    return web.Response(text="<html>")


async def test_agent_with_bad_answers() -> None:
    app = web.Application()
    app.router.add_get("/bad/metrics", _bad_metrics)
    app.router.add_get("/html/metrics", _not_json)
    server = TestServer(app)
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(MonitorError, match=r"/bad/metrics: field 'cpu_total_s'"):
                await AgentMonitor(f"{base}/bad", session).read()
            with pytest.raises(MonitorError, match=r"/html/metrics sent invalid JSON"):
                await AgentMonitor(f"{base}/html", session).read()
            with pytest.raises(MonitorError, match=r"/nothing/metrics answered HTTP 404"):
                await AgentMonitor(f"{base}/nothing", session).read()
    finally:
        await server.close()


async def test_serve_on_port_zero_reports_its_url() -> None:
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve("127.0.0.1", 0, host_name="svc", on_ready=ready.set_result))
    try:
        url = await asyncio.wait_for(ready, 10)
        assert not url.endswith(":0")
        async with aiohttp.ClientSession() as session, session.get(f"{url}/health") as response:
            assert (await response.json())["host"] == "svc"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
