"""The ``perfcast.*`` span attributes: the contract between the collector and the analyzer.

Every key is a ``Final`` constant with its own docstring. ``docs/spans.md`` is the prose version of this
module; keep the two in step. The analyzer reads spans only through these keys (and, for I/O spans made by
other OpenTelemetry instrumentations, through the standard semantic-convention keys as a fallback).

Kinds of span (``perfcast.kind``):

- ``request``: a server span, one per handled request. Its duration is the request's observed latency.
- ``task``: one chunk of one asyncio task's life inside one trace: its steps (the compute segments between
  awaits) as parallel arrays. A task that serves several requests (a keep-alive connection handler) or that
  runs many steps is cut into several chunks; the analyzer concatenates them by ``perfcast.task.id``.
- ``sync``: one synchronisation point (gather, wait, as_completed, TaskGroup, wait_for, timeout, shield):
  which tasks it joined, with what semantics, and how it ended.
- ``io``: an I/O call (Redis, PostgreSQL, HTTP, SQLite), usually made by a contrib instrumentation, with
  the causal attributes added by the collector.
- ``process``: one per second of the collection (contiguous intervals): the process's CPU time (user,
  system), the loop thread's and the collector's export threads' during the interval.
- ``window``: with request sampling (``--sample`` below 1), one per sampling window: the interval in which
  requests were recorded, with its counts. Without ``window`` spans every request was recorded.
- ``blocking``: a blocking call made on the event loop thread (``time.sleep``, a synchronous socket or
  sqlite3 call): serial compute, it holds the loop.
"""

from __future__ import annotations

from typing import Final

KIND: Final = "perfcast.kind"
"""One of ``request``, ``task``, ``sync``, ``io``, ``blocking``, ``process``, ``window``."""

# --- on every span started inside an asyncio task ---------------------------------------------------------
TASK_ID: Final = "perfcast.task.id"
"""int: process-unique id of the asyncio task the span was started in (assigned by the collector)."""

TASK_STEP: Final = "perfcast.task.step"
"""int: index (from 0) of that task's step during which the span started."""

# --- request spans ----------------------------------------------------------------------------------------
ROUTE: Final = "perfcast.route"
"""str: the request kind, ``METHOD /route/{template}`` (e.g. ``GET /post/{id}``), never the raw path."""

LOOP_IDLE_NS: Final = "perfcast.loop.idle_ns"
"""int[]: when the event loop slept (blocked in ``select()`` for at least 20 us, nothing being ready) during the
request, as ``[start, end, start, end, ...]`` in Unix ns, in time order; absent when not recorded. Between two
sleeps the loop was busy: task steps, and callbacks outside any step (the client libraries' read callbacks)."""

LOOP_WOKE_NS: Final = "perfcast.loop.woke_ns"
"""int: when the event loop's last ``select()`` that could block returned before the request span started
(Unix ns), however short it blocked: from then to the span's start the loop read and parsed the request, work no
span of the request holds (``analyzer.wakeup`` prices a wake-up with it). Absent when not recorded."""

# --- task chunk spans ---------------------------------------------------------------------------------------
TASK_PARENT_ID: Final = "perfcast.task.parent_id"
"""int: id of the task that created this one; -1 when created outside any task."""

TASK_SPAWN_STEP: Final = "perfcast.task.spawn_step"
"""int: the parent's step index during which this task was created; -1 when there is no parent."""

TASK_NAME: Final = "perfcast.task.name"
"""str: ``Task.get_name()`` at creation."""

TASK_CORO: Final = "perfcast.task.coro"
"""str: ``__qualname__`` of the task's coroutine."""

TASK_CREATED_NS: Final = "perfcast.task.created_ns"
"""int: wall-clock time (Unix ns, the span clock) at which the task was created."""

TASK_OUTCOME: Final = "perfcast.task.outcome"
"""str: ``ok``, ``error`` or ``cancelled`` on the chunk that saw the task finish; ``running`` otherwise."""

STEPS_FIRST: Final = "perfcast.steps.first"
"""int: step index of the first step in this chunk (chunks of one task are contiguous)."""

STEPS_START_NS: Final = "perfcast.steps.start_ns"
"""int[]: start of each step, Unix ns."""

STEPS_WALL_NS: Final = "perfcast.steps.wall_ns"
"""int[]: wall time of each step, ns."""

STEPS_CPU_NS: Final = "perfcast.steps.cpu_ns"
"""int[]: CPU time of the loop thread during each step, ns."""

STEPS_AWAITS: Final = "perfcast.steps.awaits"
"""str[]: what the task was suspended on after each step: ``task:<id>``, ``sync:<id>``, ``sleep:<ns>``,
``io`` (inside an I/O span), ``future`` (anything else), or ``done`` after the task's last step."""

# --- sync spans -------------------------------------------------------------------------------------------
SYNC_ID: Final = "perfcast.sync.id"
"""int: process-unique id of the synchronisation point, referenced by ``sync:<id>`` in ``steps.awaits``."""

SYNC_OP: Final = "perfcast.sync.op"
"""str: ``gather``, ``wait``, ``as_completed``, ``taskgroup``, ``wait_for``, ``timeout`` or ``shield``."""

SYNC_WAIT: Final = "perfcast.sync.wait"
"""str: ``all`` or ``any``; ``as_completed`` awaits use ``any`` with ``perfcast.sync.k``."""

SYNC_K: Final = "perfcast.sync.k"
"""int: how many children must finish for the sync point to complete (1 = any, len(children) = all)."""

SYNC_CHILDREN: Final = "perfcast.sync.children"
"""int[]: task ids joined, in argument order (-1 for an awaitable that is not a task)."""

SYNC_DONE: Final = "perfcast.sync.done"
"""int[]: task ids that had finished when the sync point completed."""

SYNC_TIMEOUT_NS: Final = "perfcast.sync.timeout_ns"
"""int: the timer raced against the children (wait_for, timeout, wait(timeout=)); absent when none."""

SYNC_TIMED_OUT: Final = "perfcast.sync.timed_out"
"""bool: the timer won."""

SYNC_RESUME_STEP: Final = "perfcast.sync.resume_step"
"""int: step index of the awaiting task that ran once the sync point completed."""

SYNC_BODY_FIRST_STEP: Final = "perfcast.sync.body_first_step"
"""int: for ``timeout`` and ``taskgroup``: first step index of the inline body run in the awaiting task."""

# --- io spans ---------------------------------------------------------------------------------------------
IO_SYSTEM: Final = "perfcast.io.system"
"""str: ``redis``, ``postgresql``, ``http`` or ``sqlite``."""

IO_RESOURCE: Final = "perfcast.io.resource"
"""str: what the call hit, as a URL without credentials: ``redis://127.0.0.1:6379/0``,
``postgresql://127.0.0.1:5432/test``, ``http://127.0.0.1:8081``, ``sqlite:///abs/path.db``."""

IO_RESOURCE_NAME: Final = "perfcast.io.resource_name"
"""str: optional name given at collection (``PERFCAST_RESOURCE_NAMES``) for the resource."""

IO_OPERATION: Final = "perfcast.io.operation"
"""str: the operation's shape: ``GET`` (Redis command), ``SELECT posts`` (SQL verb + first table),
``GET /blob/{id}`` (HTTP method + route or path template)."""

IO_ROUND_TRIPS: Final = "perfcast.io.round_trips"
"""int: network round trips the call made (write-then-read turnarounds, plus connection set-up)."""

IO_REQUEST_BYTES: Final = "perfcast.io.request_bytes"
"""int: bytes written to the network by the call."""

IO_RESPONSE_BYTES: Final = "perfcast.io.response_bytes"
"""int: bytes read from the network by the call."""

IO_ANSWER_NS: Final = "perfcast.io.answer_ns"
"""int: when the loop had taken in the call's last answer (the end of its socket's last read callback, Unix ns)."""

IO_READ_NS: Final = "perfcast.io.read_ns"
"""int: the time the loop spent in the read callbacks of the call's socket (the client library taking in its
answers outside any task step), ns."""

# --- the process spans (one per second of the collection, contiguous intervals) ---------------------------
PROCESS_USER_NS: Final = "perfcast.process.user_ns"
"""int: user-mode CPU time of the whole process (every thread) over the span, ns."""

PROCESS_SYSTEM_NS: Final = "perfcast.process.system_ns"
"""int: kernel-mode CPU time of the whole process over the span, ns."""

PROCESS_LOOP_THREAD_NS: Final = "perfcast.process.loop_thread_ns"
"""int: CPU time of the main thread (the event loop's, usually) over the span, ns."""

PROCESS_EXPORT_NS: Final = "perfcast.process.export_ns"
"""int: CPU time of the collector's export threads (the SDK's batch processors), ns: not the app's."""

PROCESS_THREADS: Final = "perfcast.process.threads"
"""int: threads alive when the span was written."""

PROCESS_HOST_BUSY_NS: Final = "perfcast.process.host_busy_ns"
"""int: CPU time the whole host was busy over the span, summed over its cores, ns: the app's and every other
process's (a database, cache or load client on the same machine)."""

PROCESS_HOST_CPUS: Final = "perfcast.process.host_cpus"
"""int: the host's logical CPUs."""

# --- window spans (one per sampling window, with --sample below 1) ---------------------------------------
WINDOW_RECORDED: Final = "perfcast.window.recorded"
"""int: requests that started in the window and were recorded whole."""

WINDOW_SKIPPED: Final = "perfcast.window.skipped"
"""int: requests that started while the window was open or draining but were not recorded (they arrived
on a step that began before the window opened, or after it stopped admitting)."""

WINDOW_FRACTION: Final = "perfcast.window.fraction"
"""float: the sampling fraction the collection ran with (long-run share of time inside windows)."""

WINDOW_LENGTH_NS: Final = "perfcast.window.length_ns"
"""int: the configured window length, ns; the span itself also covers the drain (recorded requests and
their tasks finishing after the window stopped admitting)."""

# --- blocking spans ---------------------------------------------------------------------------------------
BLOCKING_CALL: Final = "perfcast.blocking.call"
"""str: the blocking function, e.g. ``time.sleep``, ``socket.recv``, ``sqlite3.execute``."""
