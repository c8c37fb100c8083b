"""OTLP JSON-lines export: the OpenTelemetry Collector ``file`` exporter's format, one export batch per line.

The protobuf message comes from ``opentelemetry-exporter-otlp-proto-common`` (the encoder the OTLP exporters
use) and the JSON from ``google.protobuf.json_format``. Only one thing is done by hand: OTLP/JSON writes trace
and span ids as hex where the generic protobuf mapping writes base64 (OTLP specification, "JSON Protobuf
Encoding"), and it wants enums as integers.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_ID_KEYS = ("traceId", "spanId", "parentSpanId")


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


class JsonLinesSpanExporter(SpanExporter):
    """Appends each exported batch to a file as one OTLP/JSON line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = json.dumps(to_otlp_json(spans), separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(line + "\n")
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
