"""Spans from an instrumented child process to ``perfcast collect``, which encodes and writes them.

Encoding OTLP/JSON costs far more CPU than making the spans; done in the app's process it holds the GIL
against the event loop (every socket call of the loop then waits for the export thread). Under ``perfcast
collect`` the child only marshals compact tuples onto a pipe; the launcher, another process, copies the frames
to a spool file next to the output while the program runs (no decoding, so it takes no CPU from the app on a
busy machine) and, once the program has exited, rebuilds the spans and writes the JSON lines with the same
encoder (``collector._export``).
"""

from __future__ import annotations

import functools
import marshal
import os
import pickle
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from collector._export import JsonLinesSpanExporter, handing_over

_HEADER = struct.Struct("!I")
_LINE_SPANS = 512
"""Spans per line of the converted file (the batch processor's batch size)."""


def _context(ctx: SpanContext | None) -> tuple[int, int, int, bool] | None:
    if ctx is None:
        return None
    return (ctx.trace_id, ctx.span_id, int(ctx.trace_flags), ctx.is_remote)


def _plain(attributes: Any) -> dict[str, Any]:
    # A BoundedAttributes' Mapping methods are Python-level: copy its (private) dict when it has one.
    raw = getattr(attributes, "_dict", attributes)
    return dict(raw) if raw else {}


def _compact(span: ReadableSpan) -> tuple[Any, ...]:
    # Private fields rather than the properties: those wrap each value in a new read-only view or tuple,
    # and this runs for every span, on a thread that shares the GIL with the event loop.
    scope = span._instrumentation_scope
    status = span._status
    return (
        span._name,
        _context(span._context),
        _context(span._parent),
        span._kind.value,
        span._start_time,
        span._end_time,
        _plain(span._attributes),
        status.status_code.value,
        status.description,
        (scope.name, scope.version) if scope is not None else ("", None),
        [(e.name, e.timestamp, _plain(e.attributes)) for e in span._events],
        [(_context(link.context), _plain(link.attributes)) for link in span._links],
        id(span._resource),
    )


class PipeSpanExporter(SpanExporter):
    """Writes each batch of spans as marshalled frames of at most :attr:`CHUNK` spans to a pipe (the launcher
    reads them), handing the GIL over to the event loop between frames (``collector._export``)."""

    CHUNK = 32
    """Spans made compact and marshalled while holding the GIL (a few µs each)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._resources: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for chunk in handing_over(spans, self.CHUNK):
            resources = {}
            for span in chunk:
                key = id(span.resource)
                if key not in self._resources:
                    self._resources[key] = resources[key] = dict(span.resource.attributes)
            compact = (resources, [_compact(s) for s in chunk])
            try:  # marshal: about twice as fast as pickle for these plain tuples
                payload = b"M" + marshal.dumps(compact)
            except ValueError:  # an attribute value of another type: pickle knows more types
                payload = b"P" + pickle.dumps(compact, protocol=pickle.HIGHEST_PROTOCOL)
            frame = _HEADER.pack(len(payload)) + payload
            with self._lock:
                try:
                    view = memoryview(frame)
                    while view:
                        view = view[os.write(self._fd, view) :]
                except OSError:
                    return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            try:
                os.close(self._fd)
            except OSError:
                pass


def _rebuild_context(raw: tuple[int, int, int, bool] | None) -> SpanContext | None:
    if raw is None:
        return None
    trace_id, span_id, flags, remote = raw
    return SpanContext(
        trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(flags)
    )


@functools.lru_cache(maxsize=256)
def _scope(name: str, version: str | None) -> InstrumentationScope:
    return InstrumentationScope(name, version)


def _rebuild(raw: tuple[Any, ...], resources: dict[int, Resource]) -> ReadableSpan:
    (
        name,
        ctx,
        parent,
        kind,
        start,
        end,
        attrs,
        code,
        description,
        scope,
        events,
        links,
        resource,
    ) = raw
    return ReadableSpan(
        name=name,
        context=_rebuild_context(ctx),
        parent=_rebuild_context(parent),
        resource=resources.get(resource) or Resource({}),
        attributes=attrs,
        events=[Event(n, a, timestamp=t) for n, t, a in events],
        links=[Link(_rebuild_context(c), a) for c, a in links],  # type: ignore[arg-type]
        kind=SpanKind(kind),
        status=Status(StatusCode(code), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=_scope(scope[0], scope[1]),
    )


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def spool(read_fd: int, spool_path: str) -> None:
    """Copy the frames arriving on ``read_fd`` to ``spool_path`` until EOF (cheap: no decoding)."""
    with os.fdopen(read_fd, "rb") as stream, open(spool_path, "wb") as out:
        while chunk := stream.read1(1 << 20):
            out.write(chunk)


class SpanPipe:
    """The parent's end of the span pipe to one instrumented child: frames spooled next to ``output`` while the
    child runs, written to ``output`` by :meth:`finish` once it has exited (``perfcast collect``, and the
    ground-truth harness's apps)."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.spool_path = output + ".spool"
        read_fd, self.write_fd = os.pipe()
        self._thread = threading.Thread(target=spool, args=(read_fd, self.spool_path), name="perfcast-spool",
                                        daemon=True)
        self._thread.start()

    def child_env(self, env: dict[str, str]) -> tuple[int, ...]:
        """Point ``env`` at the pipe; return the fds to pass to the child (``subprocess.Popen(pass_fds=...)``)."""
        from collector import environment

        env[environment.SPAN_FD] = str(self.write_fd)
        return (self.write_fd,)

    def started(self) -> None:
        """Close this process's copy of the write end, once the child holds it (or failed to start): the
        spool then ends when the child exits."""
        os.close(self.write_fd)

    def finish(self, timeout_s: float | None = None) -> None:
        """Wait for the spool's end, write the spans file, remove the spool."""
        self._thread.join(timeout_s)
        try:
            convert(self.spool_path, self.output)
        finally:
            try:
                os.remove(self.spool_path)
            except OSError:
                pass


def convert(spool_path: str, output: str) -> int:
    """Append the spooled frames to ``output`` as OTLP JSON lines; return the number of spans written.

    A truncated last frame (the program was killed while writing it) is dropped; a frame that cannot be
    decoded is reported once on stderr and skipped.
    """
    writer = JsonLinesSpanExporter(output, chunk=None)  # no app to share the GIL with here
    resources: dict[int, Resource] = {}
    written = failed = 0
    pending: list[ReadableSpan] = []
    with open(spool_path, "rb") as stream:
        while True:
            header = _read_exactly(stream, _HEADER.size)
            if header is None:
                break
            payload = _read_exactly(stream, _HEADER.unpack(header)[0])
            if payload is None:
                break
            try:
                loads = marshal.loads if payload[:1] == b"M" else pickle.loads
                new_resources, raw_spans = loads(payload[1:])
                for key, attrs in new_resources.items():
                    resources[key] = Resource(attrs)
                pending += [_rebuild(raw, resources) for raw in raw_spans]
                written += len(raw_spans)
                if len(pending) >= _LINE_SPANS:  # the app's short frames joined into lines of a batch's size
                    writer.export(pending)
                    pending = []
            except Exception as exc:  # noqa: BLE001 - one bad batch must not lose the others
                failed += 1
                if failed == 1:
                    print(
                        f"perfcast: a batch of spans could not be written: {exc!r}",
                        file=sys.stderr,
                    )
    writer.export(pending)
    writer.shutdown()
    return written
