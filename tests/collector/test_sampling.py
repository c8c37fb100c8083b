"""Request sampling in windows: whole requests recorded inside windows, hooks out and tracing suppressed outside."""

from __future__ import annotations

import asyncio
import asyncio.events
import random
import statistics

import pytest
from aiohttp import ClientSession, web

import collector
from analyzer.build import build_graphs
from analyzer.selfcheck import self_check
from analyzer.spans import process_cpu, read_spans, sampling_windows
from collector import _io, _sampling, _tasks
from collector import attributes as A
from collector.environment import settings_from_env


SESSION = web.AppKey("session", ClientSession)
BLOB_URL = web.AppKey("blob_url", str)


def _contrib_config_on(session: ClientSession) -> bool:
    return any(hasattr(tc, "_is_instrumented_by_opentelemetry") for tc in session._trace_configs)


async def _leaf(i: int) -> int:
    await asyncio.sleep(0.0005)
    return i


async def _page(request: web.Request) -> web.Response:
    values = await asyncio.gather(*(_leaf(i) for i in range(3)))
    async with asyncio.TaskGroup() as tg:
        more = [tg.create_task(_leaf(i)) for i in range(2)]
    async with request.app[SESSION].get(request.app[BLOB_URL]) as resp:
        blob = await resp.read()
    return web.json_response({"sum": sum(values) + sum(t.result() for t in more), "blob": len(blob)})


async def _blob(request: web.Request) -> web.Response:
    return web.Response(body=b"b" * 512)


async def _serve(handler_app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(handler_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _run_service(seconds: float, on_request=None) -> list[dict]:
    """A page service calling a blob service in the same process; sequential requests for ``seconds``."""
    blobs = web.Application()
    blobs.router.add_get("/blob/{id}", _blob)
    blob_runner, blob_base = await _serve(blobs)
    app = web.Application()
    app.router.add_get("/page/{id}", _page)
    session = ClientSession()
    app[SESSION], app[BLOB_URL] = session, f"{blob_base}/blob/7"
    runner, base = await _serve(app)
    bodies = []
    try:
        async with ClientSession() as client:
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            i = 0
            while loop.time() < end:
                async with client.get(f"{base}/page/{i}") as resp:
                    bodies.append(await resp.json())
                if on_request is not None:
                    on_request(session)
                i += 1
    finally:
        await session.close()
        await runner.cleanup()
        await blob_runner.cleanup()
    return bodies


def test_windows_record_whole_requests_and_nothing_else(tmp_path):
    out = tmp_path / "spans.jsonl"
    collector.instrument(output=out, quiet=True, sample=0.5, sample_window_s=0.05)
    try:
        bodies = asyncio.run(_run_service(1.5))
    finally:
        summary = collector.uninstrument()
    assert bodies and all(b == {"sum": 4, "blob": 512} for b in bodies)
    assert summary is not None and summary.sampled is not None
    recorded, skipped, windows = summary.sampled
    assert recorded > 0 and skipped > 0 and windows >= 2
    # every page and every blob request went through the sampler once (the blob service is a request too)
    assert recorded + skipped == 2 * len(bodies)
    assert "requests recorded=" in summary.line()

    spans = read_spans(out)
    assert not spans.problems
    # one server span per recorded request (a blob request of a recorded page is inside the page's trace; one
    # of a page left out is a request of its own); the requests left out made no span
    request_spans = [s for s in spans.spans if s.perfcast_kind == "request"]
    assert len(request_spans) == recorded
    assert {r.route for r in spans.requests} <= {"GET /page/{id}", "GET /blob/{id}"}
    assert sum(r.route == "GET /page/{id}" for r in spans.requests) > 0
    window_spans = sampling_windows(spans.spans)
    assert len(window_spans) == windows
    assert sum(w.attributes[A.WINDOW_RECORDED] for w in window_spans) == recorded
    assert process_cpu(spans.spans) == ()  # sampled: process CPU is not divided among recorded requests
    errors = [e for g in build_graphs(spans) for e in self_check(g)]
    assert statistics.median(errors) < 0.01


def test_hooks_and_client_tracing_are_out_between_windows():
    collector.instrument(output=None, quiet=True, sample=0.5, sample_window_s=0.05)
    seen: list[tuple[bool, bool, bool]] = []

    def observe(session: ClientSession) -> None:
        s = _sampling.sampler
        assert s is not None
        seen.append((s.recording, _tasks.is_hooked() and _io._hooked, _contrib_config_on(session)))

    try:
        asyncio.run(_run_service(1.0, observe))
    finally:
        collector.uninstrument()
    assert {state for state in seen} == {(True, True, True), (False, False, False)}
    assert asyncio.events.Handle._run is not _tasks._run  # uninstrument() put the original back


def test_requests_outside_windows_leave_no_spans(collected_sampled):
    collected, sampler = collected_sampled
    sampler.next_open = float("inf")  # no window ever opens
    bodies = asyncio.run(_run_service(0.3))
    spans = collected.stop()
    assert bodies and sampler.recorded == 0 and sampler.skipped == 2 * len(bodies)  # pages and blobs
    kinds = {(s.attributes or {}).get(A.KIND) for s in spans}
    assert kinds <= {"process", None}  # no request, task, sync or io span; the SDK made none either


@pytest.fixture
def collected_sampled():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.collector.conftest import Collected

    exporter = InMemorySpanExporter()
    provider = collector.instrument(output=None, exporter=exporter, quiet=True, sample=0.5, sample_window_s=0.05)
    assert _sampling.sampler is not None
    try:
        yield Collected(provider, exporter), _sampling.sampler
    finally:
        if collector.is_instrumented():
            collector.uninstrument()


def test_window_gaps_are_exponential_with_the_mean_that_gives_the_fraction():
    sampler = _sampling.WindowSampler(0.02, 0.5, rng=random.Random(7))
    gaps = [sampler._gap() for _ in range(20000)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.5 * (1 - 0.02) / 0.02, rel=0.03)
    # exponential: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(mean, rel=0.05)


def test_windows_scheduled_while_idle_are_not_opened_late(monkeypatch):
    monkeypatch.setattr(_tasks, "hook", lambda: None)
    monkeypatch.setattr(_io, "hook", lambda: None)
    sampler = _sampling.WindowSampler(0.1, 0.5, rng=random.Random(3))
    # a request inside a scheduled window opens it, to close at the scheduled end (not 0.5 s after it)
    sampler.next_open = 2000.0
    assert sampler.admit(2000.2) is False  # the step of the request that opens it was not hooked
    assert sampler.recording and sampler.closes_at == pytest.approx(2000.5)
    # the first request after a long quiet spell: the windows due meanwhile are skipped, none opens late
    sampler.recording = False
    sampler.next_open = 100.0
    sampler.admit(1000.0)
    if sampler.recording:  # only when a scheduled window happens to cover the instant
        assert sampler.closes_at - 0.5 <= 1000.0 < sampler.closes_at
    else:
        assert sampler.next_open > 1000.0
    opened = []
    for _ in range(2000):  # over many quiet spells, a window is open at the first request about 10% of times
        sampler.recording = False
        sampler.admit(sampler.next_open + 50.0)
        opened.append(sampler.recording)
    assert 0.05 < statistics.fmean(opened) < 0.2


@pytest.mark.parametrize("fraction, window", [(0.0, 0.5), (1.0, 0.5), (-0.1, 0.5), (0.5, 0.0)])
def test_bad_sampler_settings_are_refused(fraction, window):
    with pytest.raises(ValueError):
        _sampling.WindowSampler(fraction, window)


@pytest.mark.parametrize("sample, window, message", [
    (0.0, 0.5, "sample must be in (0, 1]"),
    (1.5, 0.5, "sample must be in (0, 1]"),
    (0.1, -1.0, "sample window must be > 0"),
])
def test_instrument_refuses_bad_sampling(sample, window, message):
    with pytest.raises(collector.CollectorError, match=message.replace("(", r"\(").replace("]", r"\]")):
        collector.instrument(output=None, quiet=True, sample=sample, sample_window_s=window)
    assert not collector.is_instrumented()


def test_sampling_settings_from_the_environment():
    s = settings_from_env({"PERFCAST_SAMPLE": "0.02", "PERFCAST_SAMPLE_WINDOW": "0.25"})
    assert (s.sample, s.sample_window_s) == (0.02, 0.25)
    assert settings_from_env({}).sample == 1.0
    with pytest.raises(ValueError, match=r"PERFCAST_SAMPLE: expected a share in \(0, 1\], got 'often'"):
        settings_from_env({"PERFCAST_SAMPLE": "often"})
    with pytest.raises(ValueError, match=r"PERFCAST_SAMPLE: expected a share in \(0, 1\], got '0'"):
        settings_from_env({"PERFCAST_SAMPLE": "0"})
    with pytest.raises(ValueError, match="PERFCAST_SAMPLE_WINDOW: expected seconds > 0, got '-1'"):
        settings_from_env({"PERFCAST_SAMPLE_WINDOW": "-1"})


SCRIPT = """
import asyncio
from opentelemetry import trace

async def main():
    with trace.get_tracer("app").start_as_current_span("job"):
        await asyncio.gather(asyncio.sleep(0.001), asyncio.sleep(0.001))
    print("app output")

asyncio.run(main())
"""


def test_perfcast_collect_passes_the_sampling_options_to_the_program(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    out = tmp_path / "spans.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "perfcast.cli", "collect", "-o", str(out), "--sample", "0.5", "--sample-window",
         "0.2", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "app output" in proc.stdout
    # no aiohttp server, so no request to record: the job's trace (not a request) is dropped whole
    assert "requests recorded=0 not_recorded=0 windows=0" in proc.stderr
    spans = read_spans(out)
    assert {s.perfcast_kind for s in spans.spans} == {"process"}

    bad = subprocess.run(
        [sys.executable, "-m", "perfcast.cli", "collect", "--sample", "0", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )
    assert bad.returncode == 2 and "--sample" in bad.stderr and "app output" not in bad.stdout
