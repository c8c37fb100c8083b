"""Reading spans: OTLP JSON lines -> :class:`Span` records -> complete :class:`Request` bundles.

The collector writes spans in the OpenTelemetry Collector ``file`` exporter format: one
``{"resourceSpans": [...]}`` object per line, in the protobuf-JSON mapping (hex ids, int64 as decimal strings,
attribute values as ``stringValue | intValue | boolValue | doubleValue | arrayValue | kvlistValue | bytesValue``).
:func:`read_spans` parses such a file and groups the spans of each handled request (a ``request`` span and the
``task``, ``sync`` and ``io`` spans of the tasks it ran) into a :class:`Request`, the input of
:func:`analyzer.build.build_graphs`. The ``perfcast.*`` attributes are those of ``collector/attributes.py``
(described in ``docs/spans.md``).

Nothing readable is lost: a malformed line or span is reported in :attr:`SpanFile.problems` (``file:line: what``)
and skipped while every other line is kept, and a request whose spans are incomplete (the app was stopped while
it ran, a chunk was dropped) is left out with a problem naming its trace and what is missing. With
``strict=True`` the first problem raises :class:`~analyzer.errors.SpanFileError` instead.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from analyzer.errors import SpanFileError
from collector import attributes as A

__all__ = [
    "IoCall",
    "ProcessCpu",
    "Request",
    "Span",
    "SpanFile",
    "Step",
    "SyncPoint",
    "TaskLife",
    "assemble_requests",
    "parse_line",
    "process_cpu",
    "process_cpu_within",
    "sampling_windows",
    "read_spans",
    "span_to_otlp",
    "write_spans",
]

_SPAN_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True, slots=True)
class Span:
    """One span as written by an OTLP exporter, attributes decoded to Python values."""

    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits."""
    parent_id: str
    """16 hex digits, or ``""`` for a root span."""
    name: str
    kind: str
    """OpenTelemetry span kind in lowercase: ``internal``, ``server``, ``client``, ``producer``, ``consumer``."""
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    """Attribute values as ``str``, ``int``, ``float``, ``bool`` or tuples of them."""
    resource: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0
    """Line of the spans file the span was read from (1-based; 0 when not read from a file)."""

    @property
    def perfcast_kind(self) -> str:
        """``perfcast.kind`` (``request``, ``task``, ``sync``, ``io``, ``blocking``) or ``""``."""
        value = self.attributes.get(A.KIND, "")
        return value if isinstance(value, str) else ""

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a task: a synchronous run of its coroutine between two suspensions."""

    index: int
    start_ns: int
    wall_ns: int
    cpu_ns: int
    awaits: str
    """What the task was suspended on after this step (``task:<id>``, ``sync:<id>``, ``sleep:<ns>``, ``io``,
    ``future``, ``done``)."""

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.wall_ns


@dataclass(frozen=True, slots=True)
class TaskLife:
    """The steps of one asyncio task inside one trace, its chunks concatenated."""

    task_id: int
    parent_id: int
    """The task that created it, -1 when none."""
    spawn_step: int
    """The parent's step during which it was created, -1 when none."""
    name: str
    coro: str
    created_ns: int
    outcome: str
    steps: tuple[Step, ...]
    """Contiguous steps, ``steps[i].index == steps[0].index + i``."""

    def step(self, index: int) -> Step | None:
        """The step with absolute index ``index``, or ``None`` when it is not in this trace."""
        if not self.steps:
            return None
        i = index - self.steps[0].index
        return self.steps[i] if 0 <= i < len(self.steps) else None

    @property
    def end_ns(self) -> int:
        """End of the last step seen (the task's finish when its outcome is not ``running``)."""
        return self.steps[-1].end_ns if self.steps else self.created_ns


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """A synchronisation point (``sync`` span): which tasks it joined, how, and when it completed."""

    sync_id: int
    op: str
    wait: str
    """``all`` or ``any``."""
    k: int
    children: tuple[int, ...]
    done: tuple[int, ...]
    timeout_ns: int | None
    timed_out: bool
    resume_step: int | None
    body_first_step: int | None
    task_id: int
    """The awaiting task."""
    task_step: int
    """The awaiting task's step that made the call."""
    start_ns: int
    end_ns: int
    """When the point completed (the awaiting task could resume)."""


@dataclass(frozen=True, slots=True)
class IoCall:
    """An I/O call (``io`` span) made by a task."""

    task_id: int
    task_step: int
    start_ns: int
    end_ns: int
    system: str
    operation: str
    resource: str
    round_trips: int
    request_bytes: int
    response_bytes: int
    name: str = ""
    span_id: str = ""
    line: int = 0
    answer_ns: int = 0
    """When the loop had taken in the call's last answer (its last read callback's end, Unix ns); 0 when not
    recorded."""
    read_ns: int = 0
    """Time the loop spent in the read callbacks of the call's socket, ns."""

    @property
    def api(self) -> str:
        """``<system> <operation>``, e.g. ``redis GET``."""
        return f"{self.system} {self.operation}".strip()


@dataclass(frozen=True, slots=True)
class Request:
    """Everything recorded about one handled request: the input of the graph builder."""

    trace_id: str
    route: str
    start_ns: int
    end_ns: int
    root_task: int
    tasks: Mapping[int, TaskLife]
    """The root task and the tasks it created, directly or not, in this trace."""
    syncs: Mapping[int, SyncPoint]
    """Synchronisation points awaited by those tasks."""
    ios: tuple[IoCall, ...]
    """I/O calls made by those tasks, by start time."""
    line: int = 0
    """Line of the request span in the spans file."""
    loop_idle: tuple[tuple[int, int], ...] | None = None
    """When the event loop slept during the request, ``(start_ns, end_ns)`` in time order; None when not
    recorded (``perfcast.loop.idle_ns``)."""
    loop_woke_ns: int | None = None
    """When the event loop's last ``select()`` that could block returned before the request started (its reading
    and parsing of the request lie between); None when not recorded (``perfcast.loop.woke_ns``)."""

    @property
    def latency_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True, slots=True)
class SpanFile:
    """A spans file: every readable span, the complete requests, and what was wrong with the rest."""

    path: str
    spans: tuple[Span, ...]
    requests: tuple[Request, ...]
    problems: tuple[str, ...] = ()
    """Readable descriptions of the lines, spans and requests left out, ``file:line: problem``."""


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """Where the process's CPU went during a collection (a ``process`` span), in ms."""

    start_ns: int
    end_ns: int
    user_ms: float
    """User-mode CPU of every thread."""
    system_ms: float
    """Kernel-mode CPU of every thread."""
    loop_thread_ms: float
    """CPU of the main (event loop) thread, user and kernel."""
    export_ms: float
    """CPU of the collector's export threads: the collector's, not the app's."""
    threads: int
    host_busy_ms: float | None = None
    """CPU the whole host was busy, over its cores (every process on it); None where it was not read."""
    host_cpus: int = 0
    """The host's logical CPUs (0: not read)."""

    @property
    def app_ms(self) -> float:
        """The process's CPU without the collector's export threads."""
        return max(self.user_ms + self.system_ms - self.export_ms, 0.0)

    @property
    def other_threads_ms(self) -> float:
        """CPU of the app's threads other than the loop's (embedded services, database workers...)."""
        return max(self.app_ms - self.loop_thread_ms, 0.0)


def sampling_windows(spans: Iterable[Span]) -> tuple[Span, ...]:
    """The ``window`` spans among ``spans``: the collection recorded only the requests of these windows
    (``perfcast collect --sample``); empty when it recorded every request."""
    return tuple(s for s in spans if s.perfcast_kind == "window")


def process_cpu(spans: Iterable[Span]) -> tuple[ProcessCpu, ...]:
    """The ``process`` spans among ``spans`` (one per second of the collection), by start time.

    Empty for a sampled collection (``window`` spans present): most of its process CPU went to requests that
    were not recorded, so it cannot be divided among the recorded ones.
    """
    spans = list(spans)
    if sampling_windows(spans):
        return ()
    out = []
    for span in spans:
        if span.perfcast_kind != "process":
            continue
        a = span.attributes

        def ms(key: str, attrs: Mapping[str, Any] = a) -> float:
            value = attrs.get(key, 0)
            return value / 1e6 if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

        threads = a.get(A.PROCESS_THREADS, 0)
        cpus = a.get(A.PROCESS_HOST_CPUS, 0)
        read = A.PROCESS_HOST_BUSY_NS in a and isinstance(cpus, int) and cpus > 0
        host = ms(A.PROCESS_HOST_BUSY_NS) if read else None
        out.append(ProcessCpu(span.start_ns, span.end_ns, ms(A.PROCESS_USER_NS), ms(A.PROCESS_SYSTEM_NS),
                              ms(A.PROCESS_LOOP_THREAD_NS), ms(A.PROCESS_EXPORT_NS),
                              threads if isinstance(threads, int) else 0, host, cpus if host is not None else 0))
    return tuple(sorted(out, key=lambda p: p.start_ns))


def process_cpu_within(samples: Iterable[ProcessCpu], start_ns: int | None = None,
                       end_ns: int | None = None) -> ProcessCpu | None:
    """The process's CPU over ``[start_ns, end_ns]``: the ``process`` spans summed, each weighted by the share of
    its interval inside the window (the collector writes one per second). ``None`` when no span overlaps.

    >>> a = ProcessCpu(0, 10, 10.0, 0.0, 5.0, 1.0, 3)
    >>> b = ProcessCpu(10, 20, 20.0, 2.0, 10.0, 1.0, 3)
    >>> process_cpu_within([a, b], 5, 20).user_ms
    25.0
    """
    parts = list(samples)
    if not parts:
        return None
    lo = min(p.start_ns for p in parts) if start_ns is None else start_ns
    hi = max(p.end_ns for p in parts) if end_ns is None else end_ns
    total = [0.0] * 4
    threads = cpus = 0
    host: float | None = 0.0
    covered: list[int] = []
    for p in parts:
        span = p.end_ns - p.start_ns
        inside = min(p.end_ns, hi) - max(p.start_ns, lo)
        if inside <= 0 and span > 0:
            continue
        share = 1.0 if span <= 0 else inside / span
        for i, value in enumerate((p.user_ms, p.system_ms, p.loop_thread_ms, p.export_ms)):
            total[i] += value * share
        # the host's share only where every interval of the window read it
        host = None if host is None or p.host_busy_ms is None else host + p.host_busy_ms * share
        threads, cpus = max(threads, p.threads), max(cpus, p.host_cpus)
        covered += [max(p.start_ns, lo), min(p.end_ns, hi)]
    if not covered:
        return None
    return ProcessCpu(min(covered), max(covered), *total, threads, host, cpus if host is not None else 0)


# --------------------------------------------------------------------------------------------------------
# OTLP JSON


class _Bad(Exception):
    """A problem at a known field of the current line (turned into SpanFileError with the path and line)."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _int(value: Any, where: str) -> int:
    # protobuf-JSON writes int64 as decimal strings; accept plain numbers too.
    if isinstance(value, bool):
        raise _Bad(where, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _Bad(where, f"expected an integer, got {value!r}")


def _hex_id(value: Any, digits: int, where: str, *, optional: bool = False) -> str:
    if value in (None, "") and optional:
        return ""
    if isinstance(value, str) and len(value) == digits:
        try:
            int(value, 16)
            return value.lower()
        except ValueError:
            pass
    raise _Bad(where, f"expected {digits} hex digits, got {value!r}")


def _any_value(value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _Bad(where, f"expected an AnyValue object, got {value!r}")
    if not value:
        return None
    if "stringValue" in value:
        return str(value["stringValue"])
    if "intValue" in value:
        return _int(value["intValue"], where + ".intValue")
    if "boolValue" in value:
        if not isinstance(value["boolValue"], bool):
            raise _Bad(where + ".boolValue", f"expected true or false, got {value['boolValue']!r}")
        return value["boolValue"]
    if "doubleValue" in value:
        raw = value["doubleValue"]
        try:
            return float(raw)  # "NaN"/"Infinity" are strings in protobuf-JSON
        except (TypeError, ValueError):
            raise _Bad(where + ".doubleValue", f"expected a number, got {raw!r}") from None
    if "arrayValue" in value:
        values = (value["arrayValue"] or {}).get("values", [])
        if not isinstance(values, list):
            raise _Bad(where + ".arrayValue.values", "expected a list")
        try:  # fast path for the long integer arrays of task chunks
            raw = [v["intValue"] for v in values]
            if all(type(x) is str or type(x) is int for x in raw):
                return tuple(map(int, raw))
        except (KeyError, TypeError, ValueError):
            pass
        return tuple(_any_value(v, f"{where}.arrayValue.values[{i}]") for i, v in enumerate(values))
    if "kvlistValue" in value:
        return _attributes((value["kvlistValue"] or {}).get("values", []), where + ".kvlistValue.values")
    if "bytesValue" in value:
        try:
            return base64.b64decode(value["bytesValue"], validate=True)
        except (ValueError, TypeError):
            raise _Bad(where + ".bytesValue", "expected base64") from None
    raise _Bad(where, f"unknown value type {sorted(value)}")


def _attributes(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise _Bad(where, f"expected a list of key/value objects, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    for i, kv in enumerate(raw):
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise _Bad(f"{where}[{i}]", "expected {\"key\": ..., \"value\": ...}")
        out[kv["key"]] = _any_value(kv.get("value", {}), f"{where}[{i}] ({kv['key']})")
    return out


def _span(raw: Any, resource: Mapping[str, Any], where: str, line: int) -> Span:
    if not isinstance(raw, dict):
        raise _Bad(where, "expected a span object")
    kind = raw.get("kind", 0)
    if isinstance(kind, str):
        kind_name = kind.removeprefix("SPAN_KIND_").lower()
    else:
        kind_name = _SPAN_KINDS.get(_int(kind, where + ".kind"), "unspecified")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise _Bad(where + ".name", f"expected a string, got {name!r}")
    start = _int(raw.get("startTimeUnixNano"), where + ".startTimeUnixNano")
    end = _int(raw.get("endTimeUnixNano"), where + ".endTimeUnixNano")
    if end < start:
        raise _Bad(where + ".endTimeUnixNano", f"ends ({end}) before it starts ({start})")
    return Span(
        trace_id=_hex_id(raw.get("traceId"), 32, where + ".traceId"),
        span_id=_hex_id(raw.get("spanId"), 16, where + ".spanId"),
        parent_id=_hex_id(raw.get("parentSpanId"), 16, where + ".parentSpanId", optional=True),
        name=name,
        kind=kind_name,
        start_ns=start,
        end_ns=end,
        attributes=_attributes(raw.get("attributes"), where + ".attributes"),
        resource=resource,
        line=line,
    )


def parse_line(text: str, line: int = 0) -> tuple[list[Span], list[tuple[str | None, str]]]:
    """Parse one OTLP JSON line into spans, and the ``(field, problem)`` of each span that could not be read.

    Raises ``ValueError`` (a :class:`_Bad` with ``field``) when the line as a whole is unreadable.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        what = "truncated line" if exc.msg.startswith(("Unterminated", "Expecting")) and exc.pos >= len(text) - 1 \
            else "not valid JSON"
        raise _Bad(None, f"{what}: {exc.msg} (column {exc.colno})") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("resourceSpans"), list):
        raise _Bad("resourceSpans", "expected an object {\"resourceSpans\": [...]} (OTLP JSON)")
    spans: list[Span] = []
    bad: list[tuple[str | None, str]] = []
    for ri, rs in enumerate(doc["resourceSpans"]):
        rwhere = f"resourceSpans[{ri}]"
        if not isinstance(rs, Mapping):
            bad.append((rwhere, "expected an object"))
            continue
        try:
            resource = _attributes((rs.get("resource") or {}).get("attributes"), rwhere + ".resource.attributes")
        except _Bad as exc:
            bad.append((exc.field, exc.problem))
            resource = {}
        scopes = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans", []))
        if not isinstance(scopes, list):
            bad.append((rwhere + ".scopeSpans", "expected a list"))
            continue
        for si, ss in enumerate(scopes):
            raw_spans = ss.get("spans", []) if isinstance(ss, Mapping) else None
            if not isinstance(raw_spans, list):
                bad.append((f"{rwhere}.scopeSpans[{si}].spans", "expected a list"))
                continue
            for pi, raw in enumerate(raw_spans):
                try:
                    spans.append(_span(raw, resource, f"{rwhere}.scopeSpans[{si}].spans[{pi}]", line))
                except _Bad as exc:
                    bad.append((exc.field, exc.problem))
    return spans, bad


def read_spans(path: str | Path, *, strict: bool = False) -> SpanFile:
    """Read an OTLP JSON lines spans file and assemble its complete requests.

    Parameters
    ----------
    path
        The file ``perfcast collect`` (or an OpenTelemetry Collector ``file`` exporter) wrote.
    strict
        Raise :class:`~analyzer.errors.SpanFileError` on the first problem instead of reporting it in
        :attr:`SpanFile.problems` and going on.

    Returns
    -------
    SpanFile
        All readable spans, the complete requests (by start time) and the problems met.

    Raises
    ------
    SpanFileError
        The file cannot be read, or (``strict``) a line, span or request is malformed or incomplete.
    """
    path = Path(path)
    problems: list[str] = []

    def report(line: int | None, fld: str | None, problem: str) -> None:
        error = SpanFileError(path, line, fld, problem)
        if strict:
            raise error
        problems.append(str(error))

    spans: list[Span] = []
    try:
        handle = path.open("r", encoding="utf-8", errors="strict")
    except OSError as exc:
        raise SpanFileError(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    with handle:
        lineno = 0
        while True:
            try:
                text = handle.readline()
            except UnicodeDecodeError as exc:
                lineno += 1
                report(lineno, None, f"not UTF-8 text ({exc.reason}); the rest of the file cannot be read")
                break
            if not text:
                break
            lineno += 1
            if not text.strip():
                continue
            try:
                got, bad = parse_line(text, lineno)
            except _Bad as exc:
                report(lineno, exc.field, exc.problem)
                continue
            for fld, problem in bad:
                report(lineno, fld, problem + " (span skipped)")
            spans.extend(got)
    requests = assemble_requests(spans, lambda line, fld, problem: report(line, fld, problem))
    return SpanFile(path=str(path), spans=tuple(spans), requests=tuple(requests), problems=tuple(problems))


def _to_any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, (tuple, list)):
        return {"arrayValue": {"values": [_to_any_value(v) for v in value]}}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": [{"key": k, "value": _to_any_value(v)} for k, v in value.items()]}}
    return {"stringValue": str(value)}


def span_to_otlp(span: Span) -> dict[str, Any]:
    """The protobuf-JSON form of one span (the inverse of what :func:`read_spans` parses)."""
    kinds = {name: number for number, name in _SPAN_KINDS.items()}
    out: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": kinds.get(span.kind, 0),
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": [{"key": k, "value": _to_any_value(v)} for k, v in span.attributes.items()],
    }
    if span.parent_id:
        out["parentSpanId"] = span.parent_id
    return out


def write_spans(path: str | Path, spans: Iterable[Span], *, per_line: int = 64) -> None:
    """Write spans as OTLP JSON lines (``per_line`` spans per line, grouped by resource)."""
    batch: list[Span] = []
    with Path(path).open("w", encoding="utf-8") as out:
        def flush() -> None:
            groups: dict[str, tuple[Mapping[str, Any], list[Span]]] = {}
            for span in batch:
                key = json.dumps(dict(span.resource), sort_keys=True, default=str)
                groups.setdefault(key, (span.resource, []))[1].append(span)
            doc = {"resourceSpans": [
                {"resource": {"attributes": [{"key": k, "value": _to_any_value(v)} for k, v in res.items()]},
                 "scopeSpans": [{"scope": {"name": "perfcast"}, "spans": [span_to_otlp(s) for s in group]}]}
                for res, group in groups.values()
            ]}
            out.write(json.dumps(doc, separators=(",", ":")) + "\n")
            batch.clear()

        for span in spans:
            batch.append(span)
            if len(batch) >= per_line:
                flush()
        if batch:
            flush()


# --------------------------------------------------------------------------------------------------------
# assembling requests


class _Incomplete(Exception):
    """A request cannot be built: the message says what is missing."""


def _get(span: Span, key: str, typ: type | tuple[type, ...], default: Any = ..., *, array: bool = False) -> Any:
    value = span.attributes.get(key, ...)
    if value is ...:
        if default is ...:
            raise _Bad(key, f"missing on {span.perfcast_kind or 'a'} span {span.span_id} ({span.name!r})")
        return default
    if array:
        if not isinstance(value, tuple) or not all(isinstance(v, typ) and not (
                typ is int and isinstance(v, bool)) for v in value):
            raise _Bad(key, f"expected an array of {typ.__name__ if isinstance(typ, type) else typ}, "
                            f"got {value!r} on span {span.span_id}")
        return value
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise _Bad(key, f"expected {typ.__name__ if isinstance(typ, type) else typ}, got {value!r} "
                        f"on span {span.span_id}")
    return value


def _chunk(span: Span) -> tuple[dict[str, Any], list[Step]]:
    first = _get(span, A.STEPS_FIRST, int)
    starts = _get(span, A.STEPS_START_NS, int, array=True)
    walls = _get(span, A.STEPS_WALL_NS, int, array=True)
    cpus = _get(span, A.STEPS_CPU_NS, int, (), array=True)
    awaits = _get(span, A.STEPS_AWAITS, str, array=True)
    if not (len(starts) == len(walls) == len(awaits)) or (cpus and len(cpus) != len(starts)):
        raise _Bad(A.STEPS_AWAITS, f"step arrays differ in length (start_ns {len(starts)}, wall_ns {len(walls)}, "
                                   f"cpu_ns {len(cpus)}, awaits {len(awaits)}) on span {span.span_id}")
    if any(w < 0 for w in walls):
        raise _Bad(A.STEPS_WALL_NS, f"negative wall time on span {span.span_id}")
    meta = {
        "parent_id": _get(span, A.TASK_PARENT_ID, int, -1),
        "spawn_step": _get(span, A.TASK_SPAWN_STEP, int, -1),
        "name": _get(span, A.TASK_NAME, str, ""),
        "coro": _get(span, A.TASK_CORO, str, ""),
        "created_ns": _get(span, A.TASK_CREATED_NS, int, starts[0] if starts else span.start_ns),
        "outcome": _get(span, A.TASK_OUTCOME, str, "running"),
    }
    steps = [
        Step(first + i, starts[i], walls[i], cpus[i] if cpus else walls[i], awaits[i]) for i in range(len(starts))
    ]
    return meta, steps


def _sync(span: Span) -> SyncPoint:
    timeout = _get(span, A.SYNC_TIMEOUT_NS, int, None)
    resume = _get(span, A.SYNC_RESUME_STEP, int, None)
    body = _get(span, A.SYNC_BODY_FIRST_STEP, int, None)
    wait = _get(span, A.SYNC_WAIT, str, "all")
    if wait not in ("all", "any"):
        raise _Bad(A.SYNC_WAIT, f"expected 'all' or 'any', got {wait!r} on span {span.span_id}")
    children = tuple(_get(span, A.SYNC_CHILDREN, int, (), array=True))
    return SyncPoint(
        sync_id=_get(span, A.SYNC_ID, int),
        op=_get(span, A.SYNC_OP, str, "sync"),
        wait=wait,
        k=max(1, _get(span, A.SYNC_K, int, 1 if wait == "any" else max(1, len(children)))),
        children=children,
        done=tuple(_get(span, A.SYNC_DONE, int, (), array=True)),
        timeout_ns=timeout,
        timed_out=bool(_get(span, A.SYNC_TIMED_OUT, bool, False)),
        resume_step=resume,
        body_first_step=body,
        task_id=_get(span, A.TASK_ID, int),
        task_step=_get(span, A.TASK_STEP, int, -1),
        start_ns=span.start_ns,
        end_ns=span.end_ns,
    )


# Fallbacks to the OpenTelemetry semantic conventions for I/O spans perfcast did not annotate fully.
_SYSTEM_KEYS = ("db.system.name", "db.system")
_OPERATION_KEYS = ("db.operation.name", "db.operation", "http.request.method", "http.method")


def _io(span: Span) -> IoCall:
    attrs = span.attributes
    system = attrs.get(A.IO_SYSTEM) or next((attrs[k] for k in _SYSTEM_KEYS if k in attrs), "")
    if not system and any(k in attrs for k in ("http.request.method", "http.method", "url.full", "http.url")):
        system = "http"
    operation = attrs.get(A.IO_OPERATION) or next((attrs[k] for k in _OPERATION_KEYS if k in attrs), span.name)
    resource = attrs.get(A.IO_RESOURCE_NAME) or attrs.get(A.IO_RESOURCE)
    if not resource:
        host = attrs.get("server.address", attrs.get("net.peer.name", ""))
        port = attrs.get("server.port", attrs.get("net.peer.port", ""))
        resource = f"{system}://{host}:{port}" if host else str(system)
    return IoCall(
        task_id=_get(span, A.TASK_ID, int),
        task_step=_get(span, A.TASK_STEP, int, -1),
        start_ns=span.start_ns,
        end_ns=span.end_ns,
        system=str(system),
        operation=str(operation),
        resource=str(resource),
        round_trips=_get(span, A.IO_ROUND_TRIPS, int, 0),
        request_bytes=_get(span, A.IO_REQUEST_BYTES, int, 0),
        response_bytes=_get(span, A.IO_RESPONSE_BYTES, int, 0),
        name=span.name,
        span_id=span.span_id,
        line=span.line,
        answer_ns=_get(span, A.IO_ANSWER_NS, int, 0),
        read_ns=_get(span, A.IO_READ_NS, int, 0),
    )


def _loop_idle(span: Span) -> tuple[tuple[int, int], ...] | None:
    flat = _get(span, A.LOOP_IDLE_NS, int, None, array=True)
    if flat is None:
        return None
    if len(flat) % 2:
        raise _Bad(A.LOOP_IDLE_NS, f"expected [start, end, ...] pairs, got {len(flat)} values on span {span.span_id}")
    pairs = tuple(zip(flat[::2], flat[1::2], strict=True))
    if any(b < a for a, b in pairs) or any(a2 < b for (_, b), (a2, _) in zip(pairs, pairs[1:])):
        raise _Bad(A.LOOP_IDLE_NS, f"sleeps out of order on span {span.span_id}")
    return pairs


def _loop_woke(span: Span) -> int | None:
    woke = _get(span, A.LOOP_WOKE_NS, int, None)
    if woke is not None and woke > span.start_ns:
        raise _Bad(A.LOOP_WOKE_NS, f"the loop woke at {woke}, after the request started ({span.start_ns}), on span "
                                   f"{span.span_id}")
    return woke


def _is_io(span: Span) -> bool:
    kind = span.perfcast_kind
    if kind:
        return kind == "io"
    # An I/O span of a contrib instrumentation the collector did not classify, made inside a task.
    return span.kind == "client" and A.TASK_ID in span.attributes


def assemble_requests(
    spans: Iterable[Span], report: Any = None
) -> list[Request]:
    """Group spans into complete :class:`Request` bundles, one per ``request`` span.

    ``report(line, field, problem)`` is called for every span whose perfcast attributes are malformed and for
    every request left out because its spans are incomplete (default: ignore them).
    """
    report = report or (lambda line, fld, problem: None)
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    requests: list[Request] = []
    for trace_id, trace_spans in by_trace.items():
        requests.extend(_trace_requests(trace_id, trace_spans, report))
    requests.sort(key=lambda r: (r.start_ns, r.trace_id))
    return requests


def _trace_requests(trace_id: str, spans: Sequence[Span], report: Any) -> list[Request]:
    chunks: dict[int, list[tuple[dict[str, Any], list[Step], Span]]] = defaultdict(list)
    syncs: dict[int, SyncPoint] = {}
    ios: list[IoCall] = []
    request_spans: list[Span] = []
    for span in spans:
        kind = span.perfcast_kind
        try:
            if kind == "request":
                request_spans.append(span)
            elif kind == "task":
                meta, steps = _chunk(span)
                chunks[_get(span, A.TASK_ID, int)].append((meta, steps, span))
            elif kind == "sync":
                sync = _sync(span)
                syncs[sync.sync_id] = sync
            elif _is_io(span):
                ios.append(_io(span))
        except _Bad as exc:
            report(span.line, exc.field, exc.problem + " (span skipped)")
    if not request_spans:
        if chunks or syncs or ios:
            line = min(s.line for s in spans)
            report(line, None, f"trace {trace_id}: no request span ({len(chunks)} tasks, {len(syncs)} sync "
                               f"points, {len(ios)} I/O calls): an unfinished request, or work outside any "
                               "request; left out")
        return []
    tasks: dict[int, TaskLife] = {}
    for task_id, parts in chunks.items():
        tasks[task_id] = _concatenate(task_id, parts)
    ios = [_check_owner(io, tasks, report) for io in ios]
    out = []
    for span in sorted(request_spans, key=lambda s: s.start_ns):
        route = span.attributes.get(A.ROUTE) or span.attributes.get("http.route") or span.name
        where = f"trace {trace_id} ({route}, span {span.span_id})"
        try:
            root = span.attributes.get(A.TASK_ID)
            if not isinstance(root, int) or isinstance(root, bool):
                raise _Incomplete(f"the request span has no integer '{A.TASK_ID}'")
            request = _request(trace_id, str(route), span, root, tasks, syncs, ios)
            try:
                request = dataclasses.replace(request, loop_idle=_loop_idle(span))
            except _Bad as exc:
                report(span.line, exc.field, f"{exc.problem}; the request is kept without the loop's sleeps")
            try:
                request = dataclasses.replace(request, loop_woke_ns=_loop_woke(span))
            except _Bad as exc:
                report(span.line, exc.field, f"{exc.problem}; the request is kept without its wake-up")
            out.append(request)
        except _Incomplete as exc:
            report(span.line, None, f"{where}: {exc}; request left out")
    return out


# Span times come from time.time_ns, step times from perf_counter_ns mapped once to it: allow for drift.
_SLACK_NS = 1_000_000  # a span this close to the step it names is taken as started in it
_FIND_SLACK_NS = 50_000  # when looking for the step that really ran at a span's start


def _check_owner(io: IoCall, tasks: Mapping[int, TaskLife], report: Any) -> IoCall:
    """``io`` itself, or, when the task and step it names did not run at its start, the task step that did.

    An I/O span can only start during a step of the task that makes the call; one naming a step that does
    not exist or ran at another time was misattributed, and the task running at its start is its maker.
    """

    def running(task: TaskLife) -> Step | None:
        return next((st for st in task.steps
                     if st.start_ns - _FIND_SLACK_NS <= io.start_ns <= st.end_ns + _FIND_SLACK_NS), None)

    named = tasks.get(io.task_id)
    step = named.step(io.task_step) if named is not None else None
    if step is None or not step.start_ns - _SLACK_NS <= io.start_ns <= step.end_ns + _SLACK_NS:
        found = [(t, st) for t in tasks.values() if (st := running(t)) is not None]
        where = f"io span {io.span_id} ({io.api}) names task {io.task_id} step {io.task_step}, which was not running"
        if len(found) == 1:
            task, st = found[0]
            report(io.line, A.TASK_ID, f"{where} when it started; attributed to task {task.task_id} step {st.index}")
            return dataclasses.replace(io, task_id=task.task_id, task_step=st.index)
        if named is not None:
            report(io.line, A.TASK_ID, f"{where} when it started, nor any single other task; left as it is")
    return io


def _concatenate(task_id: int, parts: list[tuple[dict[str, Any], list[Step], Span]]) -> TaskLife:
    parts = sorted(parts, key=lambda p: p[1][0].index if p[1] else -1)
    steps: list[Step] = []
    for _, chunk_steps, _ in parts:
        for step in chunk_steps:
            if steps and step.index <= steps[-1].index:
                continue  # a chunk exported twice
            steps.append(step)
    meta = parts[0][0]
    outcome = next((p[0]["outcome"] for p in parts if p[0]["outcome"] != "running"), "running")
    return TaskLife(task_id=task_id, steps=tuple(steps), **{**meta, "outcome": outcome})


def _gaps(task: TaskLife, lo: int, hi: int) -> str | None:
    """The first missing step range of ``task`` that overlaps [lo, hi] ns, as text."""
    for a, b in pairwise(task.steps):
        if b.index != a.index + 1 and a.end_ns < hi and b.start_ns > lo:
            return f"steps {a.index + 1}..{b.index - 1} of task {task.task_id} are missing (a chunk was lost)"
    return None


def _inside(intervals: Sequence[tuple[int, int]], t: int) -> bool:
    return any(a <= t <= b for a, b in intervals)


def _request(
    trace_id: str,
    route: str,
    span: Span,
    root: int,
    tasks: Mapping[int, TaskLife],
    syncs: Mapping[int, SyncPoint],
    ios: Sequence[IoCall],
) -> Request:
    if root not in tasks:
        raise _Incomplete(f"its task {root} was never seen (no task chunk)")
    # The request's tasks: the root and every task of this trace descending from it.
    children: dict[int, list[int]] = defaultdict(list)
    for tid, task in tasks.items():
        if tid != root:
            children[task.parent_id].append(tid)
    members: dict[int, TaskLife] = {}
    todo = [root]
    while todo:
        tid = todo.pop()
        if tid in members:
            continue
        members[tid] = tasks[tid]
        todo.extend(children.get(tid, ()))
    io_by_task: dict[int, list[tuple[int, int]]] = defaultdict(list)
    my_ios = tuple(sorted((io for io in ios if io.task_id in members), key=lambda io: io.start_ns))
    for io in my_ios:
        io_by_task[io.task_id].append((io.start_ns, io.end_ns))
    my_syncs = {sid: s for sid, s in syncs.items() if s.task_id in members}
    lo, hi = span.start_ns, span.end_ns
    for tid, task in members.items():
        gap = _gaps(task, lo, hi) if tid == root else _gaps(task, task.created_ns, 2**63)
        if gap:
            raise _Incomplete(gap)
        # What the task waited on, outside its own I/O calls (inside them it is the client library's work).
        for a, b in pairwise(task.steps):
            if tid == root and (b.start_ns < lo or a.end_ns > hi):
                continue
            if _inside(io_by_task[tid], (a.end_ns + b.start_ns) // 2):
                continue
            what = a.awaits
            if what.startswith("task:"):
                target = _ref(what, tid, a.index)
                if target not in tasks:
                    raise _Incomplete(f"task {tid} awaits task {target} (step {a.index}), which was never seen")
            elif what.startswith("sync:"):
                target = _ref(what, tid, a.index)
                if target not in syncs:
                    raise _Incomplete(f"task {tid} waits in sync point {target} (step {a.index}), which was "
                                      "never seen (an unfinished request?)")
    for sync in my_syncs.values():
        if _inside(io_by_task[sync.task_id], sync.start_ns):
            continue
        for child in sync.children:
            if child >= 0 and child not in tasks:
                raise _Incomplete(f"sync point {sync.sync_id} ({sync.op}) joins task {child}, which was never seen")
    joined = {c for s in my_syncs.values() for c in s.children if c in tasks}
    joined |= {int(st.awaits[5:]) for t in members.values() for st in t.steps
               if st.awaits.startswith("task:") and st.awaits[5:].isdigit() and int(st.awaits[5:]) in tasks}
    return Request(
        trace_id=trace_id,
        route=route,
        start_ns=lo,
        end_ns=hi,
        root_task=root,
        tasks={**members, **{c: tasks[c] for c in sorted(joined - members.keys())}},
        syncs=my_syncs,
        ios=my_ios,
        line=span.line,
    )


def _ref(what: str, tid: int, step: int) -> int:
    try:
        return int(what.split(":", 1)[1])
    except ValueError:
        raise _Incomplete(f"task {tid} step {step}: '{A.STEPS_AWAITS}' entry {what!r} is not '<kind>:<id>'") \
            from None
