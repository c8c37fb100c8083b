"""``perfcast loadtest`` and ``perfcast agent``: parsing, the documented JSON, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from perfcast._loadtest import level_stations, to_document
from perfcast.cli import main
from replayer.agent import create_app
from replayer.loadtest import LevelResult, LoadTestConfig, LoadTestError, LoadTestResult
from replayer.monitor import HostUtilisation, ProcessUtilisation


def _serve_in_thread(app: web.Application) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1:0 in its own thread and event loop; yield its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _page(request: web.Request) -> web.Response:
    await asyncio.sleep(0.005)
    return web.Response(text="page")


@pytest.fixture
def app_url() -> Iterator[str]:
    app = web.Application()
    app.router.add_get("/", _page)
    yield from _serve_in_thread(app)


@pytest.fixture
def agent_url() -> Iterator[str]:
    yield from _serve_in_thread(create_app("remote1"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_writes_the_documented_json(app_url: str, agent_url: str, tmp_path: Path) -> None:
    out = tmp_path / "lt.json"
    args = ["loadtest", "--url", f"{app_url}/", "--users", "1,3", "--think", "20ms", "--duration", "0.6s",
            "--warmup", "100ms", "--monitor", agent_url, "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "perfcast-loadtest/1"
    assert doc["url"] == f"{app_url}/"
    assert doc["think_time_s"] == pytest.approx(0.02)
    assert [level["users"] for level in doc["levels"]] == [1, 3]
    for level in doc["levels"]:
        for key in ("duration_s", "throughput_per_s", "response_time_s", "response_time_p50_s",
                    "response_time_p90_s", "response_time_p99_s"):
            assert isinstance(level[key], float) and level[key] > 0, key
        assert isinstance(level["completed"], int) and level["completed"] > 0
        assert level["errors"] == 0
        assert level["throughput_per_s"] == pytest.approx(level["completed"] / level["duration_s"])
        stations = level["stations"]
        assert "remote1-cpu" in stations and stations["remote1-cpu"]["source"] == "agent"
        local = [name for name, s in stations.items() if s["source"] == "host" and name.endswith("-cpu")]
        assert len(local) == 1
        for name, s in stations.items():
            assert set(s) >= {"utilization", "busy_servers", "demand_s", "servers", "visits"}, name
            assert isinstance(s["servers"], int) and s["servers"] >= 1
            assert 0.0 <= s["utilization"] <= 1.0
            # service demand law: D = U / X, with U in busy servers
            assert s["demand_s"] == pytest.approx(s["busy_servers"] / level["throughput_per_s"])
            assert s["busy_servers"] == pytest.approx(s["utilization"] * s["servers"])
    assert "stations (operational laws)" in result.output


def test_process_stations_only(app_url: str, tmp_path: Path) -> None:
    out = tmp_path / "lt.json"
    args = ["loadtest", "--url", f"{app_url}/", "--users", "2", "--think", "10ms", "--duration", "0.4s",
            "--warmup", "0s", "--think-distribution", "constant", "--no-local-monitor",
            "--pid", f"self={os.getpid()}:2", "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (level,) = json.loads(out.read_text())["levels"]
    assert list(level["stations"]) == ["self-cpu"]
    station = level["stations"]["self-cpu"]
    assert station["servers"] == 2 and station["source"] == "process" and station["demand_s"] > 0
    assert level["hosts"] == {}


def test_bad_users_list_is_a_usage_error(app_url: str) -> None:
    result = CliRunner().invoke(main, ["loadtest", "--url", app_url, "--users", "1,two"])
    assert result.exit_code == 2
    assert "`users`: item 2 of '1,two' is 'two'" in result.output


def test_bad_pid_is_a_usage_error(app_url: str) -> None:
    result = CliRunner().invoke(main, ["loadtest", "--url", app_url, "--users", "1", "--pid", "app=abc"])
    assert result.exit_code == 2
    assert "expected [LABEL=]PID[,PID...][:SERVERS]" in result.output


def test_pid_groups_are_parsed() -> None:
    from perfcast._loadtest import _parse_pids
    from replayer.monitor import ProcessTarget

    assert _parse_pids(["db=10,11,12:2", "7"]) == [ProcessTarget("db", 10, 2, (11, 12)), ProcessTarget("pid7", 7)]


def test_unreachable_url_exits_1_naming_it(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/"
    result = CliRunner().invoke(main, ["loadtest", "--url", url, "--users", "1", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert f"LoadTestError: cannot reach {url}" in result.output
    assert not (tmp_path / "x.json").exists()


def test_silent_agent_exits_1_naming_it(app_url: str, tmp_path: Path) -> None:
    agent = f"http://127.0.0.1:{_free_port()}"
    args = ["loadtest", "--url", app_url, "--users", "1", "--monitor", f"db={agent}", "-o", str(tmp_path / "x.json")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    assert f"MonitorError: agent {agent}/metrics is not answering" in result.output


def test_agent_command_help() -> None:
    result = CliRunner().invoke(main, ["agent", "--help"])
    assert result.exit_code == 0
    assert "--port" in result.output and "9464" in result.output


def test_agent_command_serves_metrics() -> None:
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "perfcast.cli", "agent", "--port", "0", "--name", "cli-box"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            body = json.load(response)
        assert body["format"] == "perfcast-metrics/1" and body["host"] == "cli-box"
    finally:
        proc.terminate()
        proc.wait(10)


def _level(completed: int = 100, *hosts: HostUtilisation) -> LevelResult:
    return LevelResult(
        users=10, duration_s=10.0, completed=completed, errors=0 if completed else 5,
        throughput_per_s=completed / 10.0, response_time_s=0.05, response_time_p50_s=0.04,
        response_time_p90_s=0.08, response_time_p99_s=0.1, think_time_s=1.0, generator_busy_cpus=0.1,
        hosts=hosts, processes=(ProcessUtilisation("app", 1, 10.0, 1, 0.5, 0.1),),
        error_examples=() if completed else ("HTTP 503",),
    )


def _host(name: str, bandwidth: float) -> HostUtilisation:
    return HostUtilisation(name, 10.0, 4, 2.0, 1, 0.25, 0.0, 0.0, 1.25e6, 2.5e6, bandwidth)


def test_level_stations_by_hand() -> None:
    stations = level_stations(_level(100, _host("web", 125e6), _host("db", 0.0)), ["host", "agent"])
    # X = 10/s: 2 busy CPUs -> 200 ms per request; disk 25 ms; 1.25 MB/s of 125 MB/s -> 1% of the link
    assert stations["web-cpu"].demand_s == pytest.approx(0.2) and stations["web-cpu"].servers == 4
    assert stations["web-disk"].demand_s == pytest.approx(0.025)
    assert stations["web-net-tx"].utilization == pytest.approx(0.01)
    assert stations["web-net-rx"].utilization == pytest.approx(0.02)
    assert "db-net-tx" not in stations  # bandwidth unknown: no network station
    assert stations["db-cpu"].source == "agent"
    assert stations["app-cpu"].demand_s == pytest.approx(0.05) and stations["app-cpu"].source == "process"


def test_same_station_twice_is_an_error() -> None:
    with pytest.raises(LoadTestError, match="two monitors give station 'web-cpu'"):
        level_stations(_level(100, _host("web", 0.0), _host("web", 0.0)), ["host", "agent"])


def test_level_without_successes_is_an_error() -> None:
    config = LoadTestConfig(url="http://h/", users=(10,), think_time_s=1.0, duration_s=10.0)
    result = LoadTestResult(config, (_level(0),))
    with pytest.raises(LoadTestError, match=r"level users=10: no request succeeded .*\(5 errors: HTTP 503\)"):
        to_document(result, [])
