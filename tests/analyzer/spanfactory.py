"""Hand-written perfcast spans for tests: describe a request's tasks in milliseconds, get valid OTLP spans.

Times are ms from an arbitrary origin; ``Trace.spans()`` converts them to the span clock (ns) exactly as the
collector's ``docs/spans.md`` lays the attributes out.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analyzer.spans import Span, write_spans
from collector import attributes as A

T0 = 1_763_700_000_000_000_000
_ids = itertools.count(1)


def ns(ms: float) -> int:
    return T0 + round(ms * 1e6)


@dataclass
class Trace:
    route: str = "GET /"
    trace_id: str = field(default_factory=lambda: f"{next(_ids):032x}")
    spans_: list[Span] = field(default_factory=list)

    def _span(self, name: str, kind: str, start: float, end: float, attrs: dict[str, Any]) -> Span:
        span = Span(self.trace_id, f"{next(_ids):016x}", "", name, kind, ns(start), ns(end), attrs)
        self.spans_.append(span)
        return span

    def request(self, start: float, end: float, task: int,
                idle: list[tuple[float, float]] | None = None) -> Trace:
        """``idle``: when the loop slept (start ms, end ms)."""
        attrs: dict[str, Any] = {A.KIND: "request", A.ROUTE: self.route, A.TASK_ID: task, A.TASK_STEP: 0}
        if idle is not None:
            attrs[A.LOOP_IDLE_NS] = tuple(ns(t) for pair in idle for t in pair)
        self._span(self.route, "server", start, end, attrs)
        return self

    def task(self, tid: int, steps: list[tuple[float, float, str]], *, parent: int = -1, spawn_step: int = -1,
             created: float | None = None, first: int = 0, coro: str = "coro", cpu: float = 1.0) -> Trace:
        """``steps``: (start ms, wall ms, awaits) of each step."""
        self._span(f"task {coro}", "internal", steps[0][0], steps[-1][0] + steps[-1][1], {
            A.KIND: "task", A.TASK_ID: tid, A.TASK_PARENT_ID: parent, A.TASK_SPAWN_STEP: spawn_step,
            A.TASK_NAME: f"Task-{tid}", A.TASK_CORO: coro,
            A.TASK_CREATED_NS: ns(steps[0][0] if created is None else created),
            A.TASK_OUTCOME: "ok" if steps[-1][2] == "done" else "running", A.STEPS_FIRST: first,
            A.STEPS_START_NS: tuple(ns(s) for s, _, _ in steps),
            A.STEPS_WALL_NS: tuple(round(w * 1e6) for _, w, _ in steps),
            A.STEPS_CPU_NS: tuple(round(w * cpu * 1e6) for _, w, _ in steps),
            A.STEPS_AWAITS: tuple(a for _, _, a in steps),
        })
        return self

    def sync(self, sid: int, op: str, wait: str, children: list[int], *, task: int, step: int, start: float,
             end: float, k: int | None = None, timeout: float | None = None, timed_out: bool = False,
             resume_step: int | None = None, body_first_step: int | None = None,
             done: list[int] | None = None) -> Trace:
        attrs: dict[str, Any] = {
            A.KIND: "sync", A.SYNC_ID: sid, A.SYNC_OP: op, A.SYNC_WAIT: wait,
            A.SYNC_K: k if k is not None else (1 if wait == "any" else max(1, len(children))),
            A.SYNC_CHILDREN: tuple(children), A.SYNC_DONE: tuple(children if done is None else done), A.SYNC_TIMED_OUT: timed_out,
            A.TASK_ID: task, A.TASK_STEP: step,
        }
        if timeout is not None:
            attrs[A.SYNC_TIMEOUT_NS] = round(timeout * 1e6)
        if resume_step is not None:
            attrs[A.SYNC_RESUME_STEP] = resume_step
        if body_first_step is not None:
            attrs[A.SYNC_BODY_FIRST_STEP] = body_first_step
        self._span(f"sync {op}", "internal", start, end, attrs)
        return self

    def io(self, task: int, step: int, start: float, end: float, system: str = "redis", op: str = "GET",
           resource: str = "redis://127.0.0.1:6379/0", answer: float | None = None, read: float = 0.0) -> Trace:
        """``answer``: when the answer's read callback ended (ms); ``read``: time in read callbacks (ms)."""
        attrs: dict[str, Any] = {
            A.KIND: "io", A.IO_SYSTEM: system, A.IO_OPERATION: op, A.IO_RESOURCE: resource,
            A.IO_ROUND_TRIPS: 1, A.IO_REQUEST_BYTES: 30, A.IO_RESPONSE_BYTES: 12, A.TASK_ID: task, A.TASK_STEP: step,
        }
        if answer is not None:
            attrs[A.IO_ANSWER_NS] = ns(answer)
            attrs[A.IO_READ_NS] = round(read * 1e6)
        self._span(op, "client", start, end, attrs)
        return self

    def process(self, start: float, end: float, user_ms: float, loop_ms: float, host_ms: float | None = None,
                cpus: int = 2) -> Trace:
        """A ``process`` span over [start, end] ms: the process's CPU and, given ``host_ms``, the host's."""
        attrs: dict[str, Any] = {A.KIND: "process", A.PROCESS_USER_NS: round(user_ms * 1e6), A.PROCESS_SYSTEM_NS: 0,
                                 A.PROCESS_LOOP_THREAD_NS: round(loop_ms * 1e6), A.PROCESS_EXPORT_NS: 0,
                                 A.PROCESS_THREADS: 2}
        if host_ms is not None:
            attrs[A.PROCESS_HOST_BUSY_NS], attrs[A.PROCESS_HOST_CPUS] = round(host_ms * 1e6), cpus
        self._span("process", "internal", start, end, attrs)
        return self

    def spans(self) -> list[Span]:
        return list(self.spans_)


def write(path: Path, *traces: Trace, per_line: int = 5) -> Path:
    write_spans(path, [s for t in traces for s in t.spans()], per_line=per_line)
    return path


def gather_request(route: str = "GET /", shift: float = 0.0, sql_ms: float = 3.5, base: int = 0) -> Trace:
    """A cache lookup, then an SQL query and a blob fetch in parallel (gather), then rendering.

    root task 1: step0 [0, 0.5] starts redis GET [0.3, 2.1]; step1 [2.0, 2.4] spawns 2 and 3, waits in gather 10;
    task 2: SQL [2.5, 2.5 + sql_ms]; task 3: HTTP [2.65, 4.0]; root resumes at max + 0.1 and renders 0.5 ms.
    Task and sync ids are offset by ``base`` (ids differ between requests; node ids must not).
    """
    s = shift
    r, a, b, g = base + 1, base + 2, base + 3, base + 10
    sql_end = 2.5 + sql_ms
    done = max(sql_end + 0.2, 4.1)
    t = Trace(route)
    t.request(s - 0.1, s + done + 0.7, r)
    t.task(r, [(s + 0, 0.5, "io"), (s + 2.0, 0.4, f"sync:{g}"), (s + done + 0.1, 0.5, "done")], first=0,
           coro="index")
    t.io(r, 0, s + 0.3, s + 2.1)
    t.task(a, [(s + 2.4, 0.2, "io"), (s + sql_end, 0.2, "done")], parent=r, spawn_step=1, created=s + 2.2,
           coro="posts")
    t.io(a, 0, s + 2.5, s + sql_end, "postgresql", "SELECT posts", "postgresql://127.0.0.1:5432/test")
    t.task(b, [(s + 2.6, 0.1, "io"), (s + 4.0, 0.1, "done")], parent=r, spawn_step=1, created=s + 2.3,
           coro="blob")
    t.io(b, 0, s + 2.65, s + 4.0, "http", "GET /blob/{id}", "http://127.0.0.1:8081")
    t.sync(g, "gather", "all", [a, b], task=r, step=1, start=s + 2.35, end=s + done + 0.02, resume_step=2)
    return t


def cache_hit_request(route: str = "GET /", shift: float = 0.0) -> Trace:
    """The cache answers: a redis GET and rendering, no gather."""
    s = shift
    t = Trace(route)
    t.request(s - 0.1, s + 2.8, 1)
    t.task(1, [(s + 0, 0.5, "io"), (s + 2.0, 0.7, "done")], coro="index")
    t.io(1, 0, s + 0.3, s + 2.1)
    return t


def race_request(shift: float = 0.0, win: float = 3.0, lose: float = 5.0, wait: str = "any") -> Trace:
    """asyncio.wait(FIRST_COMPLETED) over two replicas: task 2 answers at ``win``, task 3 at ``lose``."""
    s = shift
    first = min(win, lose) + 0.1
    t = Trace("GET /race")
    t.request(s, s + first + 0.6, 1)
    t.task(1, [(s, 0.5, "sync:20"), (s + first + 0.1, 0.4, "done")], coro="race")
    t.task(2, [(s + 0.5, 0.1, "io"), (s + win, 0.1, "done")], parent=1, spawn_step=0, created=s + 0.2)
    t.io(2, 0, s + 0.55, s + win, "postgresql", "SELECT posts", "postgresql://replica-a:5432/test")
    t.task(3, [(s + 0.6, 0.1, "io"), (s + lose, 0.1, "done")], parent=1, spawn_step=0, created=s + 0.3)
    t.io(3, 0, s + 0.65, s + lose, "postgresql", "SELECT posts", "postgresql://replica-b:5432/test")
    t.sync(20, "wait", wait, [3, 2], task=1, step=0, start=s + 0.4, end=s + first + 0.02, resume_step=1,
           done=[2 if win < lose else 3])
    return t
