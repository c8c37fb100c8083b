"""perfcast's collector: zero-code-change causal tracing of asyncio apps with OpenTelemetry.

``instrument()`` installs the hooks and the exporters; ``uninstrument()`` removes them, flushes and returns the
summary (also printed at exit). ``perfcast collect -- python app.py`` and ``python -m collector -- ...`` call
``instrument()`` in the child before its code runs, from a ``sitecustomize`` module.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from collector import _process, _runtime, _sampling
from collector._export import CountingExporter, JsonLinesSpanExporter
from collector._instrumentor import AsyncioCausalityInstrumentor
from collector._processor import CausalSpanProcessor
from collector.environment import Settings

__all__ = ["CollectorError", "Summary", "instrument", "is_instrumented", "uninstrument"]


class CollectorError(RuntimeError):
    """Raised by ``instrument()`` for bad settings or when the collector is already active.

    Never raised from inside the app's code: there, internal errors are counted and reported at exit.
    """


@dataclass(frozen=True, slots=True)
class Summary:
    """What a collection produced, printed as one line at exit."""

    written: int
    """Spans the exporters wrote."""
    dropped: int
    """Spans lost because the bounded export queue was full."""
    internal_errors: int
    """Failures inside the collector's hooks (counted, never raised into the app)."""
    untraced_steps: int
    """Task steps that ran outside any trace (not recorded)."""
    sampled: tuple[int, int, int] | None = None
    """With request sampling: (requests recorded, requests not recorded, windows opened)."""

    def line(self) -> str:
        text = (
            f"perfcast: spans written={self.written} dropped={self.dropped} "
            f"internal_errors={self.internal_errors} untraced_steps={self.untraced_steps}"
        )
        if self.sampled is not None:
            recorded, skipped, windows = self.sampled
            text += f" requests recorded={recorded} not_recorded={skipped} windows={windows}"
        return text


@dataclass(slots=True)
class _Active:
    provider: TracerProvider
    processor: CausalSpanProcessor
    counters: list[CountingExporter]
    settings: Settings


_active: _Active | None = None
_atexit_registered = False


def is_instrumented() -> bool:
    """Whether the collector is active in this process."""
    return _active is not None


def instrument(
    output: str | os.PathLike[str] | None = "spans.jsonl",
    *,
    exporter: SpanExporter | None = None,
    max_queue: int = 65536,
    chunk_steps: int = 512,
    resource_names: Mapping[str, str] | None = None,
    service_name: str | None = None,
    quiet: bool = False,
    otlp_http: bool | None = None,
    cpu_time: bool = True,
    sample: float = 1.0,
    sample_window_s: float = 0.5,
    settings: Settings | None = None,
) -> TracerProvider:
    """Install causal tracing in this process and start exporting spans.

    Parameters
    ----------
    output
        OTLP JSON-lines file (appended to), or None for no file.
    exporter
        An extra span exporter (an ``InMemorySpanExporter`` in tests).
    max_queue
        Capacity of each export queue, in spans; spans arriving when it is full are dropped and counted.
    chunk_steps
        Task steps per ``task`` chunk span.
    resource_names
        Resource URL -> name, written as ``perfcast.io.resource_name``.
    service_name
        ``service.name`` of the spans' resource.
    quiet
        Do not print the summary line at exit.
    otlp_http
        Also export over OTLP/HTTP; None: when ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set.
    sample
        Request sampling: the long-run share of time during which new aiohttp server requests are recorded,
        in windows of ``sample_window_s`` seconds opening at random (``collector._sampling``); outside them
        the step hooks are out and the app runs at nearly its plain cost. 1 (the default): every request.
    sample_window_s
        Length of a sampling window, seconds.
    cpu_time
        Measure each task step's CPU time (up to two ``thread_time`` syscalls a step); off, ``perfcast.steps.cpu_ns``
        is left out and readers use the wall time.
    settings
        All of the above at once (overrides them); ``collector.environment.settings_from_env()`` reads them
        from ``PERFCAST_*`` variables.

    Returns
    -------
    The ``TracerProvider`` the spans go through (also made the global one if none was set).
    """
    global _active, _atexit_registered
    if _active is not None:
        raise CollectorError(
            "the collector is already instrumenting this process; call uninstrument() first"
        )
    if settings is None:
        if otlp_http is None:
            otlp_http = bool(
                os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            )
        try:
            settings = Settings(
                output=os.fspath(output) if output is not None else None,
                max_queue=max_queue,
                chunk_steps=chunk_steps,
                resource_names=dict(resource_names or {}),
                service_name=service_name,
                quiet=quiet,
                otlp_http=otlp_http,
                cpu_time=cpu_time,
                sample=sample,
                sample_window_s=sample_window_s,
            )
        except ValueError as exc:
            raise CollectorError(str(exc)) from None
    name = (
        settings.service_name or os.path.basename(sys.argv[0] or "python") or "python"
    )
    sampling = settings.sample < 1.0
    provider = TracerProvider(resource=Resource.create({"service.name": name}),
                              sampler=_sampling.otel_sampler() if sampling else None)
    counters: list[CountingExporter] = []
    downstream: list[Any] = []

    def add(inner: SpanExporter) -> None:
        counting = CountingExporter(inner)
        counters.append(counting)
        downstream.append(
            BatchSpanProcessor(
                counting,
                max_queue_size=settings.max_queue,
                max_export_batch_size=min(512, settings.max_queue),
            )
        )

    if settings.span_fd is not None:
        from collector._pipe import PipeSpanExporter

        add(PipeSpanExporter(settings.span_fd))
    elif settings.output:
        try:
            add(JsonLinesSpanExporter(settings.output))
        except OSError as exc:
            raise CollectorError(
                f"cannot write spans to {settings.output}: {exc.strerror}"
            ) from None
    if settings.otlp_http:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )

        add(OTLPSpanExporter())
    if exporter is not None:
        add(exporter)
    processor = CausalSpanProcessor(downstream)
    provider.add_span_processor(processor)
    _runtime.reset(
        settings,
        provider.get_tracer("perfcast.collector"),
        processor.on_end,
        provider.resource,
        InstrumentationScope("perfcast.collector"),
    )
    AsyncioCausalityInstrumentor().instrument(tracer_provider=provider, hooked=not sampling)
    if sampling:
        _sampling.install(settings.sample, settings.sample_window_s)
    _process.start()
    if getattr(trace, "_TRACER_PROVIDER", None) is None:
        trace.set_tracer_provider(provider)
    _active = _Active(provider, processor, counters, settings)
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    return provider


def uninstrument() -> Summary | None:
    """Remove the hooks, write the remaining spans and return the summary (None when not instrumented)."""
    global _active
    active = _active
    if active is None:
        return None
    _active = None
    sampler = _sampling.uninstall()
    AsyncioCausalityInstrumentor().uninstrument()
    _process.finish()
    active.provider.shutdown()
    _runtime.tracer = _runtime.emit = None
    return Summary(
        written=sum(c.written for c in active.counters),
        dropped=active.processor.dropped,
        internal_errors=_runtime.internal_errors,
        untraced_steps=_runtime.untraced_steps,
        sampled=(sampler.recorded, sampler.skipped, sampler.windows) if sampler is not None else None,
    )


def _at_exit() -> None:
    active = _active
    if active is None:
        return
    summary = uninstrument()
    if summary is not None and not active.settings.quiet:
        print(summary.line(), file=sys.stderr, flush=True)
