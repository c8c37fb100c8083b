"""The OTLP JSON-lines file, the bounded queue and the exit summary."""

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import collector

SCRIPT = """
import asyncio, sys
from opentelemetry import trace

async def work():
    await asyncio.sleep(0.001)

async def main():
    with trace.get_tracer("app").start_as_current_span("request"):
        await asyncio.gather(work(), work())
    print("app output")

asyncio.run(main())
sys.exit(int(sys.argv[1]))
"""


def _run_collect(tmp_path: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    out = tmp_path / "spans.jsonl"
    return subprocess.run(
        [*prefix, "-o", str(out), "--", sys.executable, str(script), "7"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )


def test_perfcast_collect_writes_otlp_json_lines_and_passes_the_exit_code(tmp_path):
    proc = _run_collect(tmp_path, sys.executable, "-m", "perfcast.cli", "collect")
    assert proc.returncode == 7, proc.stderr
    assert "app output" in proc.stdout
    assert (
        "perfcast: spans written=" in proc.stderr and "internal_errors=0" in proc.stderr
    )
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    spans = []
    for line in lines:
        obj = json.loads(line)
        for rs in obj["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans.extend(ss["spans"])
    kinds = {}
    for span in spans:
        assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16
        int(span["startTimeUnixNano"])
        attrs = {a["key"]: a["value"] for a in span.get("attributes", [])}
        kinds.setdefault(attrs.get("perfcast.kind", {}).get("stringValue"), []).append(
            attrs
        )
    assert len(kinds["task"]) == 3 and len(kinds["sync"]) == 1
    sync = kinds["sync"][0]
    assert [
        v["intValue"] for v in sync["perfcast.sync.children"]["arrayValue"]["values"]
    ] != []


def test_python_m_collector_is_the_same_command(tmp_path):
    proc = _run_collect(tmp_path, sys.executable, "-m", "collector")
    assert proc.returncode == 7, proc.stderr
    assert (tmp_path / "spans.jsonl").stat().st_size > 0


class SlowExporter(SpanExporter):
    """Takes its time, so that the bounded queue fills up."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        time.sleep(0.05)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def test_a_full_queue_drops_and_counts():
    slow = SlowExporter()
    provider = collector.instrument(output=None, exporter=slow, max_queue=4, quiet=True)
    tracer = provider.get_tracer("t")
    for i in range(200):
        tracer.start_span(f"s{i}").end()
    summary = collector.uninstrument()
    assert summary.dropped > 0
    assert summary.written == slow.exported
    # the drop check races the export thread by at most a few spans
    assert 200 <= summary.written + summary.dropped <= 205


async def test_fast_encoder_matches_the_protobuf_reference(collected):
    import asyncio

    from opentelemetry.trace import Status, StatusCode

    from collector._export import encode_otlp_json, to_otlp_json

    async def work() -> None:
        await asyncio.sleep(0)

    tracer = collected.provider.get_tracer("tests", "1.0")
    with tracer.start_as_current_span(
        "request", attributes={"f": 1.5, "b": False, "z": 0, "s": "", "e": []}
    ) as span:
        span.add_event("event", {"a": 1})
        span.set_status(Status(StatusCode.ERROR, "bad"))
        await asyncio.gather(work(), work())
    spans = collected.stop()
    assert {s.attributes.get("perfcast.kind") for s in spans} >= {"task", "sync"}
    assert encode_otlp_json(spans) == to_otlp_json(spans)


def test_otlp_http_export_when_the_standard_variable_is_set(monkeypatch):
    import http.server
    import threading

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[ExportTraceServiceRequest] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.append(request)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}"
    )
    try:
        provider = collector.instrument(output=None, quiet=True)
        provider.get_tracer("t").start_span("hello").end()
        summary = collector.uninstrument()
    finally:
        server.shutdown()
        server.server_close()
    names = [
        s.name
        for r in received
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert names == ["hello"] and summary.written == 1


def _plain_spans(n: int) -> Sequence[ReadableSpan]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(n):
        tracer.start_span(f"s{i}", attributes={"i": i}).end()
    return memory.get_finished_spans()


def test_exporters_hand_the_gil_over_between_short_chunks(tmp_path: Path, monkeypatch) -> None:
    import os

    import collector._export as export
    from collector._export import JsonLinesSpanExporter
    from collector._pipe import PipeSpanExporter, convert, spool

    handed = []
    monkeypatch.setattr(export, "_sleep", handed.append)
    spans = _plain_spans(70)

    out = tmp_path / "spans.jsonl"
    exporter = JsonLinesSpanExporter(out)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    lines = out.read_text().splitlines()
    # 70 spans in chunks of 8: 9 lines, the GIL handed over between each two
    assert len(lines) == 9 and len(handed) == 8 and set(handed) == {0}
    names = [s["name"] for line in lines for r in json.loads(line)["resourceSpans"]
             for sc in r["scopeSpans"] for s in sc["spans"]]
    assert names == [f"s{i}" for i in range(70)]  # nothing lost, order kept

    handed.clear()
    read_fd, write_fd = os.pipe()
    piped = PipeSpanExporter(write_fd)
    assert piped.export(spans) is SpanExportResult.SUCCESS
    piped.shutdown()
    assert len(handed) == 2  # chunks of 32: 3 frames
    spool(read_fd, str(tmp_path / "spool"))
    assert convert(str(tmp_path / "spool"), str(tmp_path / "piped.jsonl")) == 70
    piped_lines = (tmp_path / "piped.jsonl").read_text().splitlines()
    assert len(piped_lines) == 1  # the launcher joins the app's short frames (it shares no GIL with the app)
    piped_names = [s["name"] for line in piped_lines
                   for r in json.loads(line)["resourceSpans"] for sc in r["scopeSpans"] for s in sc["spans"]]
    assert sorted(piped_names) == sorted(names)
