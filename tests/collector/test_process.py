"""The ``process`` span: the process's CPU split, written to the spans file when the collection ends."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import collector
from analyzer.spans import process_cpu, process_cpu_within, read_spans
from collector import attributes as A


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_process_span_splits_the_cpu(tmp_path: Path) -> None:
    collector.instrument(output=tmp_path / "spans.jsonl", quiet=True)
    try:
        worker = threading.Thread(target=_burn, args=(0.15,))
        worker.start()

        async def main() -> None:
            _burn(0.05)  # on the loop thread
            await asyncio.sleep(0)

        asyncio.run(main())
        worker.join()
    finally:
        collector.uninstrument()
    got = read_spans(tmp_path / "spans.jsonl")
    assert got.problems == ()
    cpu = process_cpu_within(process_cpu(got.spans))
    assert cpu is not None
    assert cpu.loop_thread_ms >= 50 * 0.9
    assert cpu.other_threads_ms >= 150 * 0.9  # the worker thread's CPU is not the loop's
    assert cpu.user_ms + cpu.system_ms >= cpu.loop_thread_ms + 150 * 0.9
    assert cpu.export_ms >= 0 and cpu.threads >= 1 and cpu.end_ns > cpu.start_ns
    # the host's busy time holds this process's, and fits in its cores over the window
    assert cpu.host_busy_ms is not None and cpu.host_cpus >= 1
    assert cpu.host_busy_ms >= (cpu.user_ms + cpu.system_ms) * 0.9 - 20
    assert cpu.host_busy_ms <= (cpu.end_ns - cpu.start_ns) / 1e6 * cpu.host_cpus + 20


def test_only_for_spans_files() -> None:
    exporter = InMemorySpanExporter()
    collector.instrument(output=None, exporter=exporter, quiet=True)
    collector.uninstrument()
    assert not [s for s in exporter.get_finished_spans() if s.attributes.get(A.KIND) == "process"]


def test_one_span_per_interval_covering_the_collection(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from collector import _process

    monkeypatch.setattr(_process, "INTERVAL_S", 0.05)
    collector.instrument(output=tmp_path / "spans.jsonl", quiet=True)
    try:
        _burn(0.3)
        time.sleep(0.2)
    finally:
        collector.uninstrument()
    samples = process_cpu(read_spans(tmp_path / "spans.jsonl").spans)
    assert len(samples) >= 4
    # contiguous intervals: each starts where the previous ended
    assert all(a.end_ns == b.start_ns for a, b in zip(samples, samples[1:]))
    whole = process_cpu_within(samples)
    assert whole is not None and whole.loop_thread_ms >= 300 * 0.9
    # a window holding only the idle end sees little of the burn
    tail = process_cpu_within(samples, samples[-1].end_ns - 100_000_000, samples[-1].end_ns)
    assert tail is not None and tail.loop_thread_ms < whole.loop_thread_ms / 2


def test_the_host_is_summed_only_where_every_interval_read_it() -> None:
    from analyzer.spans import ProcessCpu

    read = [ProcessCpu(0, 10, 1.0, 0.0, 1.0, 0.0, 1, 8.0, 2), ProcessCpu(10, 20, 1.0, 0.0, 1.0, 0.0, 1, 4.0, 2)]
    both = process_cpu_within(read, 5, 20)
    assert both is not None and both.host_busy_ms == pytest.approx(8.0) and both.host_cpus == 2  # 4 + 4
    unread = [read[0], ProcessCpu(10, 20, 1.0, 0.0, 1.0, 0.0, 1)]
    partly = process_cpu_within(unread)
    assert partly is not None and partly.host_busy_ms is None and partly.host_cpus == 0
    only_read = process_cpu_within(unread, 0, 10)
    assert only_read is not None and only_read.host_busy_ms == pytest.approx(8.0)
