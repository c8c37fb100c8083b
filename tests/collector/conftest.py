"""Fixtures: the collector installed around one test, spans captured by the real SDK in memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

import collector
from collector import attributes as A


@dataclass
class Collected:
    """The running collection: a tracer for test request spans, and the finished spans once stopped."""

    provider: TracerProvider
    exporter: InMemorySpanExporter
    summary: collector.Summary | None = None

    @property
    def tracer(self) -> Tracer:
        return self.provider.get_tracer("tests")

    def stop(self) -> list[ReadableSpan]:
        if self.summary is None:
            self.summary = collector.uninstrument()
        return list(self.exporter.get_finished_spans())

    def of_kind(self, kind: str) -> list[ReadableSpan]:
        return [s for s in self.stop() if (s.attributes or {}).get(A.KIND) == kind]

    def task(self, task_id: int) -> dict[str, Any]:
        """The merged attributes of a task's chunks, with the step arrays concatenated in order."""
        chunks = sorted(
            (s for s in self.of_kind("task") if s.attributes[A.TASK_ID] == task_id),
            key=lambda s: s.attributes[A.STEPS_FIRST],
        )
        assert chunks, f"no task chunk for task {task_id}"
        merged = dict(chunks[-1].attributes)
        for key in (A.STEPS_START_NS, A.STEPS_WALL_NS, A.STEPS_CPU_NS, A.STEPS_AWAITS):
            merged[key] = [v for c in chunks for v in c.attributes[key]]
        return merged

    def sync(self, op: str) -> list[ReadableSpan]:
        return [s for s in self.of_kind("sync") if s.attributes[A.SYNC_OP] == op]


@pytest.fixture
def collected() -> Iterator[Collected]:
    exporter = InMemorySpanExporter()
    provider = collector.instrument(output=None, exporter=exporter, quiet=True)
    result = Collected(provider, exporter)
    try:
        yield result
    finally:
        if collector.is_instrumented():
            collector.uninstrument()
