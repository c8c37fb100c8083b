"""Process-wide collector state: the tracer, the settings and the counters of the exit summary.

Hooks run inside the user's app; every hook body catches its own failures and calls ``count_error``,
so that an internal error is counted and reported at exit, never raised into the app.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, Tracer

from collector.environment import Settings

logger = logging.getLogger("collector")

tracer: Tracer | None = None
"""The tracer perfcast's own spans (task chunks, sync points, blocking calls) are made with."""

settings: Settings = Settings()

emit: Callable[[Any], None] | None = None
"""Hands a finished ``ReadableSpan`` to the export pipeline (``task`` chunks are built directly as
ReadableSpans: the SDK's per-element validation of their step arrays would cost more than the steps)."""
resource: Any = None
scope: Any = None


internal_errors: int = 0
untraced_steps: int = 0
_logged: int = 0


def emit_span(
    name: str, parent: Any, start_ns: int, end_ns: int, attributes: dict[str, Any]
) -> None:
    """Hand a finished INTERNAL span, child of ``parent`` (a SpanContext), straight to the export pipeline;
    ``parent=None`` makes it the root of a trace of its own (a ``process`` or ``window`` span).

    perfcast's own spans are built whole when their facts are known, as ReadableSpans: going through the SDK's
    Span (locks, attribute validation, processors' on_start) costs several times more.
    """
    sink = emit
    if sink is None:
        return
    if parent is None:
        context = SpanContext(random.getrandbits(128) or 1, _span_id(), is_remote=False,
                              trace_flags=TraceFlags(TraceFlags.SAMPLED))
    else:
        context = SpanContext(parent.trace_id, _span_id(), is_remote=False, trace_flags=parent.trace_flags)
    sink(
        ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=resource,
            attributes=attributes,
            kind=SpanKind.INTERNAL,
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=scope,
        )
    )


def _span_id() -> int:
    while True:
        value = random.getrandbits(64)
        if value:
            return value


def count_error(where: str) -> None:
    """Count an internal error (called from an ``except`` block); log the first few with their traceback."""
    global internal_errors, _logged
    internal_errors += 1
    if _logged < 5:
        _logged += 1
        logger.debug("perfcast internal error in %s", where, exc_info=True)  # noqa: LOG014 - called in except blocks


def reset(
    new_settings: Settings,
    new_tracer: Tracer | None,
    new_emit: Callable[[Any], None] | None = None,
    new_resource: Any = None,
    new_scope: Any = None,
) -> None:
    """Start a new collection: new settings, tracer, span sink and zeroed counters."""
    global \
        settings, \
        tracer, \
        emit, \
        resource, \
        scope, \
        internal_errors, \
        untraced_steps, \
        _logged
    settings = new_settings
    tracer = new_tracer
    emit, resource, scope = new_emit, new_resource, new_scope
    internal_errors = untraced_steps = _logged = 0
