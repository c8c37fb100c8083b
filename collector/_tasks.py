"""Task life: ids, parents and steps (the compute segments between awaits), written as ``task`` chunk spans.

Every task step and wake-up goes through ``asyncio.events.Handle._run`` (pure Python on 3.11-3.13), so one
patch there sees every step; ``BaseEventLoop.create_task`` (through which ``create_task``, ``ensure_future``
and ``TaskGroup.create_task`` go) gives each task its id and parent. The per-step cost is two clock pairs,
two context lookups and four list appends; spans are only made per chunk of steps.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.events
import asyncio.futures
import asyncio.tasks
import itertools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext
from opentelemetry.trace.propagation import _SPAN_KEY

from collector import _runtime
from collector import attributes as A

_TASK_TYPES: tuple[type, ...] = tuple(
    {asyncio.Task, getattr(asyncio.tasks, "_PyTask", asyncio.Task)}
)
# The ContextVar holding OTel's current Context: read straight from each handle's contextvars.Context.
_OTEL_VAR = getattr(otel_context._RUNTIME_CONTEXT, "_current_context", None)
UNSAMPLED = otel_context.create_key("perfcast-unsampled")
"""Set in the OTel context of the requests the sampler leaves out (``collector._sampling``): their steps are
not measured and the tasks they create are not registered."""
_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns
_thread_ns = time.thread_time_ns


def _no_cpu_clock() -> int:
    return 0


@dataclass(slots=True, eq=False)
class TaskRecord:
    """What the collector knows about one live task; the step arrays hold the current chunk."""

    id: int
    parent_id: int
    spawn_step: int
    name: str
    coro: str
    created_ns: int
    ref: Any = None
    n: int = 0
    """Steps run so far: the index of the running (or next) step."""
    first: int = 0
    """Index of the chunk's first step."""
    starts: list[int] = field(default_factory=list)
    walls: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    awaits: list[str] = field(default_factory=list)
    span: Any = None
    """The span object current at the last recorded step (an identity cache for the trace check)."""
    trace_id: int = 0
    parent_ctx: SpanContext | None = None
    await_tag: str | None = None
    """Set by sync/sleep wrappers while the task waits inside them: ``sync:<id>``, ``sleep:<ns>``."""
    io_stack: list[Any] = field(default_factory=list)
    """Open I/O span states started in this task, innermost last."""
    wait_sync: Any = None
    """A future-based sync point (gather, shield) the task waits on; finished at the task's next step."""
    capture: list[Any] | None = None
    """When a list: tasks created by this task are appended (sync wrappers find their children)."""
    sleep_ns: int | None = None
    """Set by ``asyncio.sleep``'s timer during the step (``loop.call_later``); reset at each step end."""
    step_start_ns: int = 0
    """Unix ns at which the running (or last) step started."""
    started: Any = None
    """The first span started during the running step: the step's trace when no span is current before or
    after it (a request handled in a single step opens and closes its server span inside it)."""


class _ThreadState(threading.local):
    """Per thread: an app may run event loops on several threads (each thread runs its own task steps)."""

    current: TaskRecord | None = None
    """The record of the task whose step is running on this thread, None outside task steps."""
    last_t: int = 0
    """perf_counter_ns at the end of this thread's last recorded step."""
    ref_t: int = 0
    """perf_counter_ns of this thread's last CPU clock reading."""
    ref_c: int = 0
    """thread_time_ns of this thread's last CPU clock reading (taken at ``ref_t``)."""


_state = _ThreadState()


def current() -> TaskRecord | None:
    """The record of the task whose step is running on this thread (None outside task steps)."""
    return _state.current


SYNC_FUTURES: dict[int, Any] = {}
"""id(future returned by gather/shield) -> its sync state."""
_records: dict[int, TaskRecord] = {}
_ids = itertools.count(1)
_orig_run: Any = None
_SHARED_CPU_GAP_NS = 10_000
_SHORT_STEP_NS = 20_000


def record_of(task: object) -> TaskRecord | None:
    """The record of a task (None for other objects or tasks created before instrumentation)."""
    return _records.get(id(task))


def task_id(obj: object) -> int:
    """The perfcast id of a task, or -1 for anything else."""
    rec = _records.get(id(obj))
    return rec.id if rec is not None else -1


def _register(task: Any, parent: TaskRecord | None) -> TaskRecord:
    coro = task.get_coro()
    rec = TaskRecord(
        id=next(_ids),
        parent_id=parent.id if parent is not None else -1,
        spawn_step=parent.n if parent is not None else -1,
        name=task.get_name(),
        coro=getattr(coro, "__qualname__", type(coro).__qualname__),
        created_ns=time.time_ns(),
    )
    key = id(task)
    # A weak reference, so that the collector never keeps a task alive (that would change when the app
    # sees "Task was destroyed but it is pending"); the callback forgets the record with the task.
    rec.ref = weakref.ref(task, lambda _ref, key=key: _records.pop(key, None))
    _records[key] = rec
    return rec


def _create_task(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    task = wrapped(*args, **kwargs)
    try:
        parent = _state.current
        if parent is None and _sampling_roots_lazily:
            return task  # registered at its first step if it runs in a recorded request
        if id(task) not in _records:
            rec = _register(task, parent)
            if parent is not None and parent.io_stack:
                # a task made inside an I/O call (a client library's own wait_for/timeout task) works for it
                rec.io_stack.append(parent.io_stack[-1])
        if parent is not None and parent.capture is not None:
            parent.capture.append(task)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("create_task")
    return task


def _run(self: asyncio.events.Handle) -> None:
    task = getattr(self._callback, "__self__", None)
    if task is None or not isinstance(task, _TASK_TYPES):
        return _orig_run(self)
    ctx = self._context
    octx0 = ctx.get(_OTEL_VAR)
    if octx0 and UNSAMPLED in octx0:
        # a request the sampler left out, running while a window is open or draining: not measured at all
        return _orig_run(self)
    try:
        rec = _records.get(id(task)) or _register(task, None)
        if rec.wait_sync is not None:
            rec.wait_sync.resume(rec)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("step start")
        return _orig_run(self)
    state = _state
    prev = state.current
    state.current = rec
    # Unix time of the start from the span clock itself (time.time_ns, as the SDK's spans use), so that steps
    # and spans stay aligned however the wall clock is slewed; durations from the monotonic counter.
    u0 = rec.step_start_ns = _time_ns()
    t0 = _perf_ns()
    # The CPU clock is a system call (about 1 us, as much as the rest of this hook), so it is read only
    # where it can differ from the wall clock: at the start of a step that does not follow another one back
    # to back (the loop may have waited in select() since the last reading) and at the end of a step that
    # lasted at least _SHORT_STEP_NS. A shorter step ran on the CPU: the thread can hardly have been
    # descheduled within it (a time slice lasts far longer), so its CPU time is its wall time. In between,
    # the thread ran back to back, so the CPU time at a step's start is the last reading plus the wall time
    # since it.
    if t0 - state.last_t >= _SHARED_CPU_GAP_NS:
        state.ref_c = _thread_ns()
        state.ref_t = t0
    try:
        _orig_run(self)
    finally:
        t1 = _perf_ns()
        state.last_t = t1
        state.current = prev
        wall = t1 - t0
        if wall < _SHORT_STEP_NS:
            cpu = wall
        else:
            c1 = _thread_ns()
            cpu = c1 - state.ref_c - (t0 - state.ref_t)
            # min()/max() absorb the two clocks' granularity
            cpu = wall if cpu > wall else max(0, cpu)
            state.ref_c = c1
            state.ref_t = t1
        try:
            _end_step(rec, task, ctx, octx0, u0, wall, cpu)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("step end")


def _end_step(
    rec: TaskRecord, task: Any, ctx: Any, octx0: Any, start_ns: int, wall: int, cpu: int
) -> None:
    octx = ctx.get(_OTEL_VAR)
    span = octx.get(_SPAN_KEY) if octx else None
    if span is None and octx0:
        span = octx0.get(_SPAN_KEY)
    if span is None:
        span = rec.started
    rec.started = None
    if span is not rec.span:
        if span is not None:
            sc = span.get_span_context()
            if not (sc.is_valid and sc.trace_flags.sampled):  # a trace the sampler dropped is not recorded
                span = None
            elif sc.trace_id != rec.trace_id:
                flush(rec, None)
                rec.trace_id = sc.trace_id
                rec.parent_ctx = sc
                rec.first = rec.n
        if span is None and rec.starts:
            flush(rec, None)
        rec.span = span
    done = task.done()
    if span is None:
        rec.sleep_ns = None
        _runtime.untraced_steps += 1
        rec.trace_id = 0
        rec.n += 1
        return
    rec.starts.append(start_ns)
    rec.walls.append(wall)
    rec.cpus.append(cpu)
    if done:
        rec.awaits.append("done")
    else:
        rec.awaits.append(_awaited(rec, task._fut_waiter))
    rec.sleep_ns = None
    rec.n += 1
    if done:
        flush(rec, task)
        rec.span = None
        rec.trace_id = 0
    elif len(rec.starts) >= _runtime.settings.chunk_steps:
        flush(rec, None)


def _awaited(rec: TaskRecord, waiter: Any) -> str:
    if waiter is None:
        return "sleep:0"  # a bare yield (asyncio.sleep(0)): rescheduled at once
    if isinstance(waiter, _TASK_TYPES):
        other = _records.get(id(waiter))
        return f"task:{other.id}" if other is not None else "future"
    sync = SYNC_FUTURES.get(id(waiter))
    if sync is not None:
        rec.wait_sync = sync
        sync.waiter = rec
        return sync.tag
    if rec.sleep_ns is not None:
        return f"sleep:{rec.sleep_ns}"
    if rec.await_tag is not None:
        return rec.await_tag
    stack = rec.io_stack
    while stack and not stack[-1].open:
        stack.pop()  # an I/O call inherited from the parent task has ended
    if stack:
        return "io"
    return "future"


def _call_later(
    self: Any, delay: float, callback: Any, *args: Any, context: Any = None
) -> Any:
    # asyncio.sleep(delay) is call_later(delay, _set_result_unless_cancelled, future): note the delay for
    # the running task, whose step then ends suspended on that future.
    if callback is _SET_RESULT:
        rec = _state.current
        if rec is not None:
            rec.sleep_ns = max(0, int(delay * 1e9))
    return _orig_call_later(self, delay, callback, *args, context=context)


_SET_RESULT = asyncio.futures._set_result_unless_cancelled
_orig_call_later: Any = None


def flush(rec: TaskRecord, task: Any) -> None:
    """Emit the record's current chunk as a ``task`` span (``task`` given: the task finished)."""
    if not rec.starts:
        return
    starts, walls, cpus, awaits = rec.starts, rec.walls, rec.cpus, rec.awaits
    rec.starts, rec.walls, rec.cpus, rec.awaits = [], [], [], []
    first, rec.first = rec.first, rec.n
    if _runtime.emit is None or rec.parent_ctx is None:
        return
    if task is None:
        outcome = "running"
    elif task.cancelled():
        outcome = "cancelled"
    else:
        outcome = "error" if task._exception is not None else "ok"
    attributes = {
        A.KIND: "task",
        A.TASK_ID: rec.id,
        A.TASK_PARENT_ID: rec.parent_id,
        A.TASK_SPAWN_STEP: rec.spawn_step,
        A.TASK_NAME: rec.name,
        A.TASK_CORO: rec.coro,
        A.TASK_CREATED_NS: rec.created_ns,
        A.TASK_OUTCOME: outcome,
        A.STEPS_FIRST: first,
        A.STEPS_START_NS: starts,
        A.STEPS_WALL_NS: walls,
        A.STEPS_AWAITS: awaits,
    }
    if _runtime.settings.cpu_time:
        attributes[A.STEPS_CPU_NS] = cpus
    _runtime.emit_span(
        f"task {rec.coro}",
        rec.parent_ctx,
        starts[0],
        starts[-1] + walls[-1],
        attributes,
    )


def flush_all() -> None:
    """Emit the open chunks of all tasks (at exit, for tasks still running)."""
    for rec in list(_records.values()):
        try:
            task = rec.ref() if rec.ref is not None else None
            flush(rec, task if task is not None and task.done() else None)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("flush")


_create_task_wrapper: Any = None
_hooked = False
_sampling_roots_lazily = False
"""With request sampling: tasks created outside recorded steps are registered at their first recorded step
(most are created by requests the sampler left out)."""


def install(hooked: bool = True) -> None:
    """Prepare the step hooks; with ``hooked``, put them in place at once (else ``hook()`` does, later, for
    the request sampler's windows)."""
    global _orig_run, _orig_call_later, _thread_ns, _create_task_wrapper, _sampling_roots_lazily
    if _orig_run is not None:
        return
    _sampling_roots_lazily = not hooked
    _thread_ns = time.thread_time_ns if _runtime.settings.cpu_time else _no_cpu_clock
    if _OTEL_VAR is None:
        raise RuntimeError("opentelemetry's runtime context is not contextvars-based")
    _orig_run = asyncio.events.Handle._run
    _orig_call_later = asyncio.base_events.BaseEventLoop.call_later
    _create_task_wrapper = wrapt.FunctionWrapper(
        asyncio.base_events.BaseEventLoop.__dict__["create_task"], _create_task
    )
    if hooked:
        hook()


def hook() -> None:
    """Put the per-step hooks in place: ``Handle._run``, ``create_task``, ``call_later``.

    They are class attributes that applications do not bind by name, so they can be swapped while the loop
    runs (the request sampler does, at the edges of its windows); a step already running finishes under the
    ``_run`` it started with.
    """
    global _hooked
    if _orig_run is None or _hooked:
        return
    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop.create_task = _create_task_wrapper  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop.call_later = _call_later  # type: ignore[method-assign]
    _hooked = True


def unhook() -> None:
    """Take the per-step hooks out (steps then run at their plain cost); records are kept."""
    global _hooked
    if _orig_run is None or not _hooked:
        return
    asyncio.base_events.BaseEventLoop.call_later = _orig_call_later  # type: ignore[method-assign]
    asyncio.base_events.BaseEventLoop.create_task = _create_task_wrapper.__wrapped__  # type: ignore[method-assign]
    asyncio.events.Handle._run = _orig_run  # type: ignore[method-assign]
    _hooked = False


def is_hooked() -> bool:
    """Whether the per-step hooks are in place."""
    return _hooked


def traced_tasks_alive() -> bool:
    """Whether a task whose last recorded step belonged to a trace has not finished yet."""
    return any(rec.trace_id for rec in list(_records.values()))


def forget() -> None:
    """Emit the open chunks and forget every record (the tasks run on unrecorded until the next window,
    where they are met as new tasks: their step counts and pending waits would be stale)."""
    flush_all()
    _records.clear()
    SYNC_FUTURES.clear()


def uninstall() -> None:
    """Undo ``install()``; emit open chunks first."""
    global _orig_run, _orig_call_later, _create_task_wrapper, _sampling_roots_lazily
    if _orig_run is None:
        return
    forget()
    unhook()
    _sampling_roots_lazily = False
    _orig_run = _orig_call_later = _create_task_wrapper = None
    _state.current = None
