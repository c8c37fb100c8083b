"""The span processor that ties spans to tasks and completes I/O spans, in front of the export queue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from collector import _idle, _io, _runtime, _tasks
from collector import attributes as A

_SCOPES: dict[str, str] = {
    "opentelemetry.instrumentation.aiohttp_server": "request",
    "opentelemetry.instrumentation.redis": "redis",
    "opentelemetry.instrumentation.asyncpg": "postgresql",
    "opentelemetry.instrumentation.aiohttp_client": "http",
    "opentelemetry.instrumentation.sqlite3": "sqlite",
}


class CausalSpanProcessor(SpanProcessor):
    """Adds ``perfcast.*`` attributes to spans and forwards finished spans to bounded export processors.

    ``on_start`` tags every span started in a task step with the task id and step, classifies the spans of
    the contrib instrumentations (``request``, ``io``, ``blocking``) and opens the I/O measurement state;
    ``_on_ending`` (the SDK hook run while a span ends) writes the measured I/O attributes.
    """

    def __init__(self, downstream: list[Any]) -> None:
        self.downstream = downstream
        self.dropped = 0
        self._io: dict[int, _io.IoState] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attrs = _raw_attributes(span)
            rec = _tasks._state.current
            extra: dict[str, Any] = {}
            if rec is not None and A.TASK_ID not in attrs:
                extra[A.TASK_ID] = rec.id
                extra[A.TASK_STEP] = rec.n
                if rec.started is None:
                    rec.started = span
            scope = span._instrumentation_scope
            role = _SCOPES.get(scope.name) if scope is not None else None
            kind = attrs.get(A.KIND)
            if role == "request":
                if span.kind is SpanKind.SERVER:
                    extra[A.KIND] = "request"
                    extra[A.ROUTE] = span.name
                    woke = _idle.last_woke()
                    if woke is not None:
                        extra[A.LOOP_WOKE_NS] = woke
            elif role is not None:
                if role == "sqlite" and _io._get_running_loop() is not None:
                    kind = extra[A.KIND] = "blocking"
                    extra[A.BLOCKING_CALL] = "sqlite3.execute"
                else:
                    kind = extra[A.KIND] = "io"
            if extra:
                _set_on_ended(
                    span, extra
                )  # same direct write: the span is not visible to anyone else yet
            if role not in (None, "request"):
                self._open_io(span, role, rec, kind == "io")
            elif role is None and kind == "io":
                self._open_io(span, str(attrs.get(A.IO_SYSTEM, "")), rec, True)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("on_start")

    def _open_io(self, span: Span, system: str, rec: Any, awaited: bool) -> None:
        state = _io.IoState(system=system, rec=rec)
        self._io[span.context.span_id] = state
        if rec is not None and awaited:
            rec.io_stack.append(state)

    def _on_ending(self, span: Span) -> None:
        state = self._io.pop(span.context.span_id, None)
        if state is None:
            if span.kind is SpanKind.SERVER:
                self._request_ending(span)
            return
        try:
            state.open = False
            rec = state.rec
            if rec is not None and state in rec.io_stack:
                rec.io_stack.remove(state)
            attrs = _raw_attributes(span)
            extra: dict[str, Any] = {}
            if A.IO_RESOURCE not in attrs:
                extra = _io.io_attributes(state.system, span.name, attrs)
            if A.IO_ROUND_TRIPS not in attrs:
                extra[A.IO_ROUND_TRIPS] = state.round_trips
                extra[A.IO_REQUEST_BYTES] = state.request_bytes
                if state.measured_response:
                    extra[A.IO_RESPONSE_BYTES] = state.response_bytes
            if state.answer_ns and A.IO_ANSWER_NS not in attrs:
                extra[A.IO_ANSWER_NS] = state.answer_ns
                extra[A.IO_READ_NS] = state.read_ns
            _set_on_ended(span, extra)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("on_ending")

    @staticmethod
    def _request_ending(span: Span) -> None:
        try:
            if _raw_attributes(span).get(A.KIND) != "request" or span.start_time is None or span.end_time is None:
                return
            sleeps = _idle.sleeps_between(span.start_time, span.end_time)
            if sleeps is not None:
                _set_on_ended(span, {A.LOOP_IDLE_NS: tuple(sleeps)})
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("on_ending")

    def on_end(self, span: ReadableSpan) -> None:
        for processor in self.downstream:
            try:
                queue = processor._batch_processor._queue
                if len(queue) >= queue.maxlen:
                    self.dropped += 1
            except AttributeError:
                pass
            processor.on_end(span)

    def shutdown(self) -> None:
        for processor in self.downstream:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(
            processor.force_flush(timeout_millis) for processor in self.downstream
        )


def _raw_attributes(span: Span) -> Mapping[str, Any]:
    # Read through the bounded attribute map's (private) dict: its Mapping methods are Python-level and
    # cost more than the rest of these hooks; the public read-only view when it is not there.
    bounded = span._attributes
    raw = getattr(bounded, "_dict", None)
    if isinstance(raw, dict):
        return raw
    return span.attributes or {}


def _set_on_ended(span: Span, values: dict[str, Any]) -> None:
    # The SDK freezes attributes before calling _on_ending; perfcast's measurements are only complete then,
    # so they are written into the (private) dict of the bounded attribute map: the values are ints and
    # strings perfcast made, which need none of its validation.
    if not values:
        return
    bounded = span._attributes
    target = getattr(bounded, "_dict", None)
    if isinstance(target, dict) and (
        bounded.maxlen is None or len(target) + len(values) <= bounded.maxlen
    ):
        target.update(values)
        return
    frozen = getattr(bounded, "_immutable", False)
    bounded._immutable = False
    try:
        for key, value in values.items():
            bounded[key] = value
    finally:
        bounded._immutable = frozen
