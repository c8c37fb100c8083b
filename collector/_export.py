"""OTLP JSON-lines export: the OpenTelemetry Collector ``file`` exporter's format, one export batch per line.

``to_otlp_json`` is the reference: the protobuf message from ``opentelemetry-exporter-otlp-proto-common``
(the encoder the OTLP exporters use), turned into JSON by ``google.protobuf.json_format``, with the one
OTLP/JSON rule the generic mapping lacks applied by hand (trace and span ids in hex, not base64; OTLP
specification, "JSON Protobuf Encoding"). It costs about 350 µs of CPU per span, more than the app spends
making it, so the exporter writes with ``encode_otlp_json``, a direct encoder of the same mapping about ten
times faster; ``tests/collector/test_export.py`` checks that both give the same JSON.

Export runs on the batch processor's thread, which shares the GIL with the app's event loop. Encoding a batch
of 512 spans at once held the GIL for 15-20 ms: every socket call the loop made meanwhile (it gives the GIL
up for the syscall) waited for CPython's switch interval (5 ms) to get it back, so recorded steps carried
stalls of 5-50 ms off the CPU that the app without the collector never has. The exporters therefore encode a
batch in short chunks and hand the GIL over between them (:func:`handing_over`).
"""

from __future__ import annotations

import base64
import json
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_KEYS = ("traceId", "spanId", "parentSpanId")

_sleep = time.sleep
"""Taken before the collector wraps ``time.sleep`` (``collector._io``): handing the GIL over is not a sleep of
the app's."""


def handing_over(spans: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """``spans`` in chunks of ``size``, the GIL handed over between two chunks.

    ``time.sleep(0)`` releases the GIL in a syscall, so that a thread waiting for it (the event loop back from
    a socket call) takes it at once instead of after the switch interval. Costs about 2 µs per chunk.

    >>> [list(c) for c in handing_over([1, 2, 3, 4, 5], 2)]
    [[1, 2], [3, 4], [5]]
    """
    for start in range(0, len(spans), size):
        if start:
            _sleep(0)
        yield spans[start:start + size]


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        value = obj.get(key)
        if value:
            obj[key] = base64.b64decode(value).hex()


def to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The ``{"resourceSpans": [...]}`` object of a batch of spans, in the OTLP/JSON mapping."""
    message = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in message.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return message


def _value(value: Any) -> dict[str, Any]:
    # the AnyValue oneof, as json_format writes it (int64 as a decimal string); exact types first (fast path)
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is int:
        return {"intValue": str(value)}
    if kind is tuple or kind is list:
        if not value:
            return {"arrayValue": {}}
        first = type(value[0])
        if first is int and all(type(v) is int for v in value):
            return {"arrayValue": {"values": [{"intValue": str(v)} for v in value]}}
        if first is str and all(type(v) is str for v in value):
            return {"arrayValue": {"values": [{"stringValue": v} for v in value]}}
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return _other_value(value)


def _other_value(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isnan(value):
            return {"doubleValue": "NaN"}
        if math.isinf(value):
            return {"doubleValue": "Infinity" if value > 0 else "-Infinity"}
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        values = [{"key": str(k), "value": _value(v)} for k, v in value.items()]
        return {"kvlistValue": {"values": values} if values else {}}
    values = [_value(v) for v in value]
    return {"arrayValue": {"values": values} if values else {}}


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return (
        [{"key": k, "value": _value(v)} for k, v in attributes.items()]
        if attributes
        else []
    )


def _flags(parent: Any) -> int:
    return 0x100 | (0x200 if parent is not None and parent.is_remote else 0)


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value:
        out[key] = value


def _span_json(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    out: dict[str, Any] = {
        "traceId": f"{ctx.trace_id:032x}",
        "spanId": f"{ctx.span_id:016x}",
    }
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    _put(out, "name", span.name)
    _put(
        out, "kind", span.kind.value + 1
    )  # SDK INTERNAL=0.. -> OTLP SPAN_KIND_INTERNAL=1..
    _put(out, "startTimeUnixNano", str(span.start_time) if span.start_time else "")
    _put(out, "endTimeUnixNano", str(span.end_time) if span.end_time else "")
    _put(out, "attributes", _attributes(span.attributes))
    _put(out, "droppedAttributesCount", span.dropped_attributes)
    events = []
    for event in span.events:
        encoded: dict[str, Any] = {}
        _put(encoded, "timeUnixNano", str(event.timestamp) if event.timestamp else "")
        _put(encoded, "name", event.name)
        _put(encoded, "attributes", _attributes(event.attributes))
        _put(encoded, "droppedAttributesCount", event.dropped_attributes)
        events.append(encoded)
    _put(out, "events", events)
    _put(out, "droppedEventsCount", span.dropped_events)
    links = []
    for link in span.links:
        encoded = {
            "traceId": f"{link.context.trace_id:032x}",
            "spanId": f"{link.context.span_id:016x}",
        }
        _put(encoded, "attributes", _attributes(link.attributes))
        _put(encoded, "droppedAttributesCount", link.dropped_attributes)
        encoded["flags"] = _flags(link.context)
        links.append(encoded)
    _put(out, "links", links)
    _put(out, "droppedLinksCount", span.dropped_links)
    status: dict[str, Any] = {}
    if span.status is not None:
        _put(status, "message", span.status.description or "")
        _put(status, "code", span.status.status_code.value)
    out["status"] = status
    out["flags"] = _flags(span.parent)
    return out


def encode_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """``to_otlp_json(spans)``, computed directly (same grouping by resource and scope, same JSON)."""
    # Grouped by identity first (hashing a Resource hashes all its attributes, on every span), then by
    # equality, which is how the protobuf encoder groups.
    by_id: dict[tuple[int, int], list[dict[str, Any]]] = {}
    objects: dict[tuple[int, int], tuple[Any, Any]] = {}
    for span in spans:
        key = (id(span.resource), id(span.instrumentation_scope))
        encoded_spans = by_id.get(key)
        if encoded_spans is None:
            encoded_spans = by_id[key] = []
            objects[key] = (span.resource, span.instrumentation_scope)
        encoded_spans.append(_span_json(span))
    groups: dict[Any, dict[Any, list[dict[str, Any]]]] = {}
    for key, encoded_spans in by_id.items():
        resource, scope = objects[key]
        groups.setdefault(resource, {}).setdefault(scope, []).extend(encoded_spans)
    resource_spans = []
    for resource, scopes in groups.items():
        scope_spans = []
        for scope, encoded in scopes.items():
            scope_json: dict[str, Any] = {}
            if scope is not None:
                _put(scope_json, "name", scope.name)
                _put(scope_json, "version", scope.version or "")
                _put(scope_json, "attributes", _attributes(scope.attributes))
            entry: dict[str, Any] = {"scope": scope_json, "spans": encoded}
            _put(entry, "schemaUrl", scope.schema_url if scope is not None else "")
            scope_spans.append(entry)
        item: dict[str, Any] = {"resource": {}}
        _put(item["resource"], "attributes", _attributes(resource.attributes))
        item["scopeSpans"] = scope_spans
        _put(item, "schemaUrl", resource.schema_url)
        resource_spans.append(item)
    return {"resourceSpans": resource_spans}


class JsonLinesSpanExporter(SpanExporter):
    """Appends each exported batch to a file as OTLP/JSON lines of at most ``chunk`` spans each (``None``: the
    whole batch on one line, the GIL kept throughout: for a process that runs no app, ``collector._pipe``)."""

    CHUNK = 8
    """Spans encoded while holding the GIL (about 40 µs each): the loop waits at most about 0.3 ms for it."""

    def __init__(self, path: str | os.PathLike[str], chunk: int | None = CHUNK) -> None:
        self.path = os.fspath(path)
        self.chunk = chunk
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        chunks = handing_over(spans, self.chunk) if self.chunk else (spans,)
        lines = [json.dumps(encode_otlp_json(chunk), separators=(",", ":")) + "\n" for chunk in chunks]
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write("".join(lines))
            self._file.flush()
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


class CountingExporter(SpanExporter):
    """Counts the spans another exporter wrote successfully (for the exit summary)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.written = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.written += len(spans)
        else:
            self.failed += len(spans)
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()
