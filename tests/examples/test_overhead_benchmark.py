"""The overhead benchmark's own parts: wrk parsing, ratios, and the contrib-asyncio bootstrap it runs the app in."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "collector_overhead.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("collector_overhead", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


WRK_SAMPLE = """Running 10s test @ http://127.0.0.1:8080/
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   210.51ms   80.12ms   1.20s    70.00%
  Latency Distribution
     50%  198.40ms
     75%  250.00ms
     90%  300.00ms
     99%    1.01s
  1503 requests in 10.02s, 9.10MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 4
Requests/sec:    150.00
"""


def test_parse_wrk_counts_failures_and_units(bench: ModuleType) -> None:
    ok, failed, seconds, p50 = bench.parse_wrk(WRK_SAMPLE)
    assert (ok, failed, seconds, p50) == (1499, 9, 10.02, 198.40)
    _, _, _, p50_us = bench.parse_wrk(WRK_SAMPLE.replace("198.40ms", "812.00us"))
    assert p50_us == pytest.approx(0.812)
    with pytest.raises(ValueError, match="not wrk output"):
        bench.parse_wrk("unable to connect")


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (the benchmark falls back to aiohttp)")
async def test_parse_wrk_reads_a_real_run(bench: ModuleType) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    server = TestServer(app)
    await server.start_server()
    try:
        proc = await asyncio.create_subprocess_exec(
            "wrk", "-t1", "-c2", "-d1s", "--latency", str(server.make_url("/")), stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
    finally:
        await server.close()
    ok, failed, seconds, p50 = bench.parse_wrk(out.decode())
    assert ok > 0 and failed == 0 and seconds > 0 and p50 > 0


def test_ratios_are_medians_of_rounds(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    M = bench.Measurement
    results = []
    for rnd, plain in enumerate([100.0, 80.0, 120.0], start=1):
        results.append(M("plain", rnd, plain, 1000, 0, 10.0, 5.0, 0.5, 0, 1.0))
        results.append(M("perfcast", rnd, plain * 0.9, 900, 0, 11.0, 5.5, 0.5, 10, 1.0))
    summary = bench.report(results, ["plain", "perfcast"])
    assert summary["perfcast"]["paired_ratio_to_plain"] == pytest.approx(0.9)
    assert summary["perfcast"]["ratio_to_plain"] == pytest.approx(90.0 / 100.0)
    assert summary["perfcast"]["cpu_ratio_to_plain"] == pytest.approx(1.1)
    assert "perfcast/plain throughput ratio: 0.900 (10.0% loss" in capsys.readouterr().out


def test_app_runs_under_the_contrib_asyncio_bootstrap(bench: ModuleType, tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    argv = bench._app_command("otel-asyncio", ["--port", "0", "--seed-posts", "20"], spans)
    env = {**os.environ, "OTEL_PYTHON_ASYNCIO_COROUTINE_NAMES_TO_TRACE": bench.OTEL_ASYNCIO_COROUTINES}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        match = re.search(r"listening on (http://\S+)", proc.stdout.readline())
        assert match, proc.stderr.read() if proc.stderr else ""

        async def get() -> int:
            async with aiohttp.ClientSession() as session, session.get(match.group(1) + "/") as resp:
                return resp.status

        assert asyncio.run(get()) == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    names = {json.loads(line)["name"] for line in spans.read_text().splitlines()}
    assert {"asyncio coro-_fetch_blob", "asyncio coro-_recommend"} <= names, names
    assert bench._app_command("plain", ["--port", "0"], spans)[1:3] == ["-m", "examples.forum"]
    assert bench._app_command("perfcast", [], spans)[1:5] == ["-m", "collector", "-o", str(spans)]
    assert sys.executable in bench._app_command("perfcast", [], spans)
