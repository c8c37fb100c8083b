"""Building causal graphs from requests: one DAG per route and per distinct causal shape.

Each :class:`~analyzer.spans.Request` becomes one DAG (:func:`request_graph`) whose node durations are that
request's observed durations; requests of a route with the same shape (node ids, kinds, wait modes, apis and
edges, without durations) are merged into one :class:`~analyzer.graph.CausalGraph` variant whose
``samples_ms[i]`` all come from request ``i`` (:func:`build_graphs`).

How a request becomes a DAG (the happens-before rules of WebPerf's dependency graphs, Jiang et al.,
SIGCOMM 2016, section 3, for asyncio's spawn / await / gather / wait / TaskGroup / timeouts):

- Each task's timeline (its steps and the suspensions between them) is cut into nodes, in time order. An I/O
  call of the task covers [a, b]: it is one ``io`` node of duration b - a (the steps and suspensions inside
  are the client library's work and the network). Step time outside I/O calls is ``compute``. A suspension
  outside I/O calls becomes a node by what the task awaited: a ``sync`` node for a synchronisation point
  (``sync:<id>``) or a task (``task:<id>``, a join), a ``timer`` node for ``asyncio.sleep`` and a ``wait``
  node for anything else. Between two such nodes there is always a compute node, possibly of zero duration,
  so that a variant's shape does not depend on timing.
- A sync node waits for the joined tasks' last nodes (all, or the k first), for a timer node when a timeout
  races them, and (``all``) for the awaiting task's previous node; an ``any`` node's successor also waits for
  that previous node. Its duration is the wake-up delay: resume - the time the point completed as the
  collector recorded it (the timer if it fired, else the finish of the joined tasks it reported done).
- A task's first node follows the node of its parent that created it; the delay before the task first ran
  (the event loop was busy) is part of that compute node and reported as ``ready_ms``.
- ``start`` precedes the root task's first node in the request window and the root task's last node in the
  window precedes ``end``; ``start`` lasts from the request span's start to that first node and ``end`` from
  the last node to the request span's end. Tasks nobody awaited (fire and forget) do not lead to ``end``.

Every duration is the node's own observed interval, never derived from the graph's edges, so evaluating a
graph with them (:func:`analyzer.selfcheck.self_check`) tests the edges.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
from typing import Any

import networkx as nx

from analyzer.errors import GraphError
from analyzer.graph import PER_REQUEST_EXTRAS, CausalGraph, Node, NodeKind, WaitMode, expected_answer_wait
from analyzer.spans import (
    IoCall,
    Request,
    Span,
    SpanFile,
    Step,
    SyncPoint,
    TaskLife,
    assemble_requests,
)

__all__ = ["POOLS_KEY", "RequestGraph", "build_graphs", "observed_pools", "request_graph"]

_BACK_TO_BACK_NS = 300_000
"""Steps closer than this ran back to back on the loop, for :meth:`_Builder._queued`: between the last step
of a busy spell and the step an answer resumes, the loop selects and runs the read callbacks of every socket
that became ready meanwhile (the client libraries parse answers there), about 15 us a socket when measured
on the example app (190 us for twelve)."""

# Children of these ops are named by creation rank rather than argument index: their argument is a set.
_SET_OPS = frozenset({"wait", "as_completed"})


@dataclass(slots=True)
class _Obs:
    """A node of one request's DAG with what was observed of it."""

    id: str
    kind: NodeKind
    start_ns: int
    end_ns: int
    duration_ns: int
    task: str = ""
    label: str = ""
    wait: WaitMode = WaitMode.ALL
    k: int = 1
    cpu_ns: int = 0
    io: IoCall | None = None
    timeout_ns: int | None = None
    ready_ns: int | None = None
    wait_ns: int | None = None
    """compute nodes, with fold_waits: unattributed waits folded into the node."""
    sync: SyncPoint | None = None
    """sync nodes of synchronisation points: the point."""
    inline: bool = False
    """sync nodes: the point completed without suspending the task (an inline body: timeout, TaskGroup)."""
    won_by: str = ""
    """any-wait sync nodes: the predecessor(s) that finished first (comma-separated ids)."""
    cpu_before_ns: int = 0
    """io nodes: the part of ``cpu_ns`` in the step that made the call (before its first wait)."""
    inflight: int = 0
    """io nodes: the request's calls to the same resource waiting for answers when this one started, itself
    included."""
    open_calls: int = 0
    """io nodes: the request's calls to the same resource whose spans were open when this one started, itself
    included: its place in a fan-out whose answers come in no sooner than they did."""
    queued_ns: int = 0
    """io nodes: the end of the call's wait during which the loop ran other tasks' steps (:meth:`_queued`);
    sync nodes: the part of the wake-up during which it did (:meth:`_sync`)."""
    answered_ns: int = 0
    """io nodes: the part of ``queued_ns`` after the answer was read, known rather than bounded (:meth:`_queued`)."""
    hidden_ns: int = 0
    """io nodes: the loop's work inside the call's wait that no step holds (:func:`_hidden_work`)."""


@dataclass(frozen=True, slots=True)
class RequestGraph:
    """The DAG of one request, durations in ms: the unit :func:`build_graphs` merges into variants."""

    request: Request
    nodes: Mapping[str, Node]
    """Nodes with one sample each (this request's durations)."""
    edges: tuple[tuple[str, str], ...]

    def shape(self) -> tuple[Any, ...]:
        """The variant key: nodes' ids, kinds, wait modes, apis and race winners, and the edges; no durations."""
        return (
            self.request.route,
            tuple(sorted((n.id, n.kind.value, n.wait.value, n.k, n.api, n.extra.get("won_by", ""))
                         for n in self.nodes.values())),
            tuple(sorted(self.edges)),
        )


def build_graphs(
    requests: SpanFile | Iterable[Request] | Iterable[Span], *, fold_waits: bool = False, problems: list[str] | None = None
) -> list[CausalGraph]:
    """Causal graphs of the requests: one per route and per distinct causal shape (variant).

    Parameters
    ----------
    requests
        A :class:`~analyzer.spans.SpanFile` (its complete requests), requests, or spans (grouped into requests
        by :func:`~analyzer.spans.assemble_requests`; incomplete ones are left out).
    fold_waits
        Fold unattributed waits (``future``: a lock, a connection pool, a queue) into the compute node around
        them instead of making ``wait`` nodes, and report them as the compute nodes' ``wait_ms``. Such waits come
        and go with contention, so by default requests that differ only by them are separate variants; folded,
        they share one.
    problems
        When given, a request whose spans make no DAG (a cycle: contradictory spans) is described here and left
        out; otherwise :class:`~analyzer.errors.GraphError` is raised.

    Returns
    -------
    list of CausalGraph
        Sorted by route, then by variant; variant 0 of a route is its most frequent shape. The nodes'
        ``samples_ms``, ``cpu_ms``, ``round_trips``, bytes and the graph's ``latency_ms`` and ``trace_ids``
        are aligned by request.
    """
    if isinstance(requests, SpanFile):
        reqs: tuple[Request, ...] = requests.requests
    else:
        items = tuple(requests)
        spans = [x for x in items if isinstance(x, Span)]
        reqs = tuple(assemble_requests(spans)) + tuple(x for x in items if isinstance(x, Request))
    groups: dict[tuple[Any, ...], list[RequestGraph]] = defaultdict(list)
    for req in reqs:
        rg = request_graph(req, fold_waits=fold_waits)
        if not _is_acyclic(rg.edges):
            cycle = " -> ".join(u for u, _ in nx.find_cycle(nx.DiGraph(list(rg.edges))))
            message = (f"trace {req.trace_id} ({req.route}, spans file line {req.line}): its spans give a cycle "
                       f"({cycle}); request left out")
            if problems is None:
                raise GraphError(message)
            problems.append(message)
            continue
        groups[rg.shape()].append(rg)
    by_route: dict[str, list[list[RequestGraph]]] = defaultdict(list)
    for members in groups.values():
        by_route[members[0].request.route].append(members)
    graphs = []
    for route in sorted(by_route):
        variants = sorted(by_route[route], key=lambda m: (-len(m), m[0].request.start_ns))
        for number, members in enumerate(variants):
            graphs.append(_merge(route, number, members))
    pools = observed_pools(rg.request for members in groups.values() for rg in members)
    if pools:
        for graph in graphs:
            graph.meta[POOLS_KEY] = dict(pools)
    return graphs


POOLS_KEY = "pools"
"""Graph ``meta`` key: resource -> the most calls seen in flight to it at once, for resources whose callers
waited for a slot (a connection pool): :func:`observed_pools`."""


def observed_pools(requests: Iterable[Request]) -> dict[str, int]:
    """Connection pools the spans reveal: resource -> the most calls in flight to it at once.

    A resource counts when some task waited on an unattributed future (``future``) in the step right before
    it called that resource: waiting for a free connection. Its limit is then the largest number of calls to it
    that overlapped in one request; the what-if engine enforces it (the way WebPerf reshapes its graphs for
    concurrency limits), so that slower calls also make the pool's queue longer. Resources no one waited for
    are left out: nothing shows their limit was reached.
    """
    waited: set[str] = set()
    most: dict[str, int] = {}
    for req in requests:
        for io in req.ios:
            task = req.tasks.get(io.task_id)
            before = task.step(io.task_step - 1) if task is not None and io.task_step > 0 else None
            if before is not None and before.awaits == "future":
                waited.add(io.resource)
        by_resource: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for io in req.ios:
            by_resource[io.resource] += [(io.start_ns, 1), (io.end_ns, -1)]
        for resource, points in by_resource.items():
            level = peak = 0
            for _, d in sorted(points):  # an end sorts before a start at the same instant
                level += d
                peak = max(peak, level)
            most[resource] = max(most.get(resource, 0), peak)
    return {r: most[r] for r in sorted(waited) if most.get(r, 0) > 0}


def _is_acyclic(edges: Iterable[tuple[str, str]]) -> bool:
    preds: dict[str, list[str]] = defaultdict(list)
    for u, v in edges:
        preds[v].append(u)
    try:
        tuple(TopologicalSorter(preds).static_order())  # graphlib: much cheaper than a networkx graph here
    except CycleError:
        return False
    return True


def _merge(route: str, variant: int, members: Sequence[RequestGraph]) -> CausalGraph:
    first = members[0]
    nodes = []
    for node_id, proto in first.nodes.items():
        samples = [rg.nodes[node_id] for rg in members]
        extra = dict(proto.extra)
        for key in PER_REQUEST_EXTRAS:
            if key in extra:
                extra[key] = [int(s.extra[key][0]) if key in _COUNTS else round(float(s.extra[key][0]), 6)
                              for s in samples]
        if "wait_ms" in extra and not any(extra["wait_ms"]):
            del extra["wait_ms"]
        nodes.append(
            Node(
                id=node_id,
                kind=proto.kind,
                samples_ms=tuple(s.samples_ms[0] for s in samples),
                wait=proto.wait,
                k=proto.k,
                task=proto.task,
                label=proto.label,
                api=proto.api,
                resource=proto.resource,
                system=proto.system,
                cpu_ms=tuple(s.cpu_ms[0] for s in samples) if proto.cpu_ms else (),
                round_trips=tuple(s.round_trips[0] for s in samples) if proto.round_trips else (),
                request_bytes=tuple(s.request_bytes[0] for s in samples) if proto.request_bytes else (),
                response_bytes=tuple(s.response_bytes[0] for s in samples) if proto.response_bytes else (),
                timeout_ms=proto.timeout_ms,
                extra=extra,
            )
        )
    graph = CausalGraph(
        route,
        nodes,
        first.edges,
        variant=variant,
        latency_ms=[rg.request.latency_ms for rg in members],
        trace_ids=[rg.request.trace_id for rg in members],
    )
    graph.validate()
    return graph


# --------------------------------------------------------------------------------------------------------
# one request


def request_graph(req: Request, *, fold_waits: bool = False) -> RequestGraph:
    """The causal DAG of one request, with its observed durations (one sample per node).

    ``fold_waits``: see :func:`build_graphs`.
    """
    return _Builder(req, fold_waits).build()


def _merge_intervals(ios: Iterable[IoCall]) -> list[IoCall]:
    """The outermost I/O calls: a call nested in (or overlapping) an earlier one is part of it."""
    out: list[IoCall] = []
    for io in sorted(ios, key=lambda io: (io.start_ns, -io.end_ns)):
        if out and io.start_ns < out[-1].end_ns:
            continue
        out.append(io)
    return out


def _inside(ios: Sequence[IoCall], t: int) -> bool:
    return any(io.start_ns < t < io.end_ns for io in ios)


def _ref(what: str) -> int | None:
    try:
        return int(what.split(":", 1)[1])
    except (IndexError, ValueError):
        return None


class _Builder:
    def __init__(self, req: Request, fold_waits: bool = False) -> None:
        self.req = req
        self.fold_waits = fold_waits
        self.ios: dict[int, list[IoCall]] = defaultdict(list)
        for io in req.ios:
            self.ios[io.task_id].append(io)
        self.ios = defaultdict(list, {t: _merge_intervals(v) for t, v in self.ios.items()})
        # Synchronisation points each task awaited, outside its I/O calls (inside, they are the library's).
        self.syncs: dict[int, list[SyncPoint]] = defaultdict(list)
        for sync in sorted(req.syncs.values(), key=lambda s: (s.start_ns, s.sync_id)):
            if sync.task_id in req.tasks and not _inside(self.ios[sync.task_id], sync.start_ns):
                self.syncs[sync.task_id].append(sync)
        self.ordinal = {s.sync_id: n for syncs in self.syncs.values() for n, s in enumerate(syncs)}
        self.nodes: dict[str, _Obs] = {}
        self.seq: dict[int, list[_Obs]] = {}
        self.paths: dict[int, str] = {}
        self.marks: dict[int, str] = {}  # sync with a timer -> the node that ends at its call (starts the timer)
        self.after_any: list[tuple[str, str, str]] = []  # (awaiting task's previous node, any-sync, successor)

    # -- task paths ------------------------------------------------------------------------------------
    def _name_tasks(self) -> None:
        req = self.req
        self.paths[req.root_task] = "root"
        kids: dict[int, list[TaskLife]] = defaultdict(list)
        for task in req.tasks.values():
            if task.task_id != req.root_task:
                kids[task.parent_id].append(task)
        todo = [req.root_task]
        while todo:
            parent = todo.pop(0)
            base = self.paths[parent]
            named_by_sync: dict[int, str] = {}
            for sync in self.syncs[parent]:
                n = self.ordinal[sync.sync_id]
                tasks = [c for c in sync.children if c in req.tasks]
                order = (sorted(tasks, key=lambda c: (req.tasks[c].created_ns, c))
                         if sync.op in _SET_OPS else list(sync.children))
                for child in tasks:
                    if child not in named_by_sync and child not in self.paths:
                        named_by_sync[child] = f"{base}/{sync.op}#{n}[{order.index(child)}]"
            spawned = sorted(kids.get(parent, ()), key=lambda t: (t.created_ns, t.task_id))
            m = 0
            for task in spawned:
                if _inside(self.ios[parent], task.created_ns):
                    continue  # created by a client library inside an I/O call: part of that call
                if task.task_id in named_by_sync:
                    self.paths[task.task_id] = named_by_sync.pop(task.task_id)
                else:
                    self.paths[task.task_id] = f"{base}/spawn#{m}"
                    m += 1
                todo.append(task.task_id)
            # joined here but created elsewhere (outside this request's task tree)
            for child, path in named_by_sync.items():
                if child not in self.paths and req.tasks[child].parent_id not in req.tasks:
                    self.paths[child] = path
                    todo.append(child)

    # -- one task's timeline ---------------------------------------------------------------------------
    def _timeline(self, task: TaskLife) -> list[_Obs]:
        tid = task.task_id
        path = self.paths[tid]
        ios = self.ios[tid]
        lo, hi = (self.req.start_ns, self.req.end_ns) if tid == self.req.root_task else (-(2**63), 2**63)
        awaiting: dict[str, Step] = {}  # what each step awaited -> the first step awaiting it
        for st in task.steps:
            awaiting.setdefault(st.awaits, st)  # the first: a timed-out wait_for awaits again after the timer
        inline = [s for s in self.syncs[tid] if f"sync:{s.sync_id}" not in awaiting]
        cuts: list[tuple[int, str, SyncPoint]] = []
        for sync in self.syncs[tid]:
            if sync.timeout_ns is not None:
                # The timer starts at the call, which the step that then awaits the point made: kept inside
                # that step (before its last nanosecond, so that the shape is that of any other request), since
                # a step of the wall clock between the two readings (time_ns is not monotonic) would put the
                # mark after the wait and make a cycle.
                at = sync.start_ns
                if (st := awaiting.get(f"sync:{sync.sync_id}")) is not None:
                    at = min(max(at, st.start_ns), max(st.end_ns - 1, st.start_ns))
                cuts.append((at, "mark", sync))
        for sync in inline:
            cuts.append((sync.end_ns, "inline", sync))
        cut_times = sorted({t for t, _, _ in cuts})

        # (time, order, what, payload): order breaks ties so a cut precedes what starts at its time.
        events: list[tuple[int, int, str, Any]] = []
        for st in task.steps:
            a, b = max(st.start_ns, lo), min(st.end_ns, hi)
            if b < a:
                continue
            for pa, pb in self._outside_io(a, b, ios):
                bounds = [pa] + [t for t in cut_times if pa < t < pb] + [pb]
                for x, y in pairwise(bounds):
                    events.append((x, 1, "cpu", (x, y, st)))
        for io in ios:
            if io.end_ns >= lo and io.start_ns <= hi:
                events.append((max(io.start_ns, lo), 1, "io", io))
        for prev, nxt in pairwise(task.steps):
            a, b = prev.end_ns, nxt.start_ns
            if b < lo or a > hi or _inside(ios, (a + b) // 2):
                continue
            events.append((max(a, lo), 1, "gap", (max(a, lo), min(b, hi), prev)))
        for t, what, sync in cuts:
            if lo <= t <= hi:
                events.append((t, 0, what, sync))
        events.sort(key=lambda e: (e[0], e[1]))

        seq: list[_Obs] = []
        counters: dict[str, int] = defaultdict(int)
        # pieces of the compute node being built; a piece without a step is a folded wait (fold_waits)
        pending: list[tuple[int, int, Step | None]] = []

        def new_id(prefix: str) -> str:
            n = counters[prefix]
            counters[prefix] += 1
            return f"{path}/{prefix}{n}"

        def add(node: _Obs) -> _Obs:
            seq.append(node)
            self.nodes[node.id] = node
            return node

        def close_compute(at: int) -> None:
            # Always a compute node between two other nodes (possibly empty): shapes must not depend on timing.
            if seq and seq[-1].kind is NodeKind.COMPUTE and not pending:
                return
            if pending:
                start, end = pending[0][0], pending[-1][1]
                wall = sum(y - x for x, y, _ in pending)
                cpu = sum(round(st.cpu_ns * (y - x) / st.wall_ns) if st and st.wall_ns else 0
                          for x, y, st in pending)
                waited = sum(y - x for x, y, st in pending if st is None)
            else:
                start = end = at
                wall = cpu = waited = 0
            add(_Obs(new_id("c"), NodeKind.COMPUTE, start, end, wall, path, task.coro, cpu_ns=cpu,
                     wait_ns=waited if self.fold_waits else None))
            pending.clear()

        for t, _, what, payload in events:
            if what == "cpu":
                pending.append(payload)
                continue
            if what == "gap":
                a, b, step = payload
                label = step.awaits
                last = seq[-1] if seq else None
                if (label.startswith("sync:") and last is not None and last.sync is not None
                        and f"sync:{last.sync.sync_id}" == label):
                    # The point woke the task and it waited again (TaskGroup.__aexit__ loops): one node.
                    last.end_ns = b
                    pending.clear()
                    continue
                if self.fold_waits and not label.startswith(("sync:", "task:", "sleep:")):
                    pending.append((a, b, None))  # contention (a lock, a pool): part of the compute around it
                    continue
                close_compute(a)
                add(self._gap_node(path, a, b, label, new_id))
                continue
            if what == "io":
                io = payload
                close_compute(io.start_ns)
                before, after = self._io_cpu(task, io)
                queued, answered = self._queued(task, io)
                add(_Obs(new_id("io"), NodeKind.IO, max(io.start_ns, lo), min(io.end_ns, hi),
                         min(io.end_ns, hi) - max(io.start_ns, lo), path, io.operation, io=io,
                         cpu_ns=before + after, cpu_before_ns=before, queued_ns=queued, answered_ns=answered))
                continue
            sync = payload
            close_compute(t)
            if what == "mark":
                self.marks[sync.sync_id] = seq[-1].id
                continue
            add(self._sync_node(sync, path, t, t, inline=True))
        close_compute(seq[-1].end_ns if seq else max(lo, task.created_ns))
        return seq

    def _call_tasks(self, task: TaskLife, io: IoCall) -> list[TaskLife]:
        """The task that made an I/O call and the tasks it created inside the call (a library's own helper
        tasks): the work that is the call's own."""
        return [task] + [t for t in self.req.tasks.values()
                         if t.parent_id == task.task_id and io.start_ns < t.created_ns < io.end_ns]

    def _io_cpu(self, task: TaskLife, io: IoCall) -> tuple[int, int]:
        """CPU of the loop thread inside an I/O call, (in the step that made it, in later steps), in ns.

        The client library's work on the loop (serialising the request, parsing the answer): the steps of the
        calling task inside the call, pro-rated by overlap like compute pieces, and the steps of the tasks it
        created inside the call (a library's own helper tasks).
        """
        before = after = 0
        for t in self._call_tasks(task, io):
            for st in t.steps:
                a, b = max(st.start_ns, io.start_ns), min(st.end_ns, io.end_ns)
                if b <= a or not st.wall_ns:
                    continue
                cpu = round(st.cpu_ns * (b - a) / st.wall_ns)
                if t is task and st.start_ns <= io.start_ns:
                    before += cpu
                else:
                    after += cpu
        return before, after

    def _queued(self, task: TaskLife, io: IoCall) -> tuple[int, int]:
        """How long the end of an I/O call waited for the event loop, in ns: ``(bound, known)``.

        The answer may have come while the loop was busy with other tasks' work; the calling task resumed only
        after it. When the answer comes later (a scenario's longer round trip) the loop has usually finished
        that work; the load simulation queues the call's resumption behind whatever is running then, so it
        takes this part out of the recorded duration as it takes ``ready_ms`` out of a compute node's.

        - ``known``: from the end of the answer's read callback (``IoCall.answer_ns``) to the call's return,
          the loop's time on anything but the calling task's steps: the answer was in, the task was waiting
          for its turn. 0 when the collector did not time the read.
        - ``bound``: ``known`` plus the loop's busy spell before that read (:meth:`_busy_before`), less the
          call's own read callbacks (``IoCall.read_ns``): the answer came somewhere in that spell, since a
          sleeping loop wakes at once for it. An upper bound.

        The calling task's own steps (the client library parsing the answer) are the call's CPU, not queueing.
        """
        own = {t.task_id for t in self._call_tasks(task, io)}
        answered = io.answer_ns if io.start_ns < io.answer_ns <= io.end_ns else io.end_ns
        known = max(0, io.end_ns - answered - self._own_time(answered, io.end_ns, own))
        before = self._busy_before(io.start_ns, answered, own)
        if self.req.loop_idle is not None:
            before = max(0, before - io.read_ns)  # the call's own read callbacks, outside any step
        return known + before, known

    def _own_time(self, start_ns: int, end_ns: int, own: set[int]) -> int:
        """Time the steps of the tasks in ``own`` ran within ``[start_ns, end_ns]`` (ns)."""
        return sum(max(0, min(st.end_ns, end_ns) - max(st.start_ns, start_ns))
                   for tid in own if (t := self.req.tasks.get(tid)) is not None for st in t.steps
                   if st.end_ns > start_ns and st.start_ns < end_ns)

    def _busy_before(self, start_ns: int, end_ns: int, own: set[int]) -> int:
        """How long the loop was busy with anything but the steps of the tasks in ``own`` right before
        ``end_ns``, within ``[start_ns, end_ns]`` (ns): what kept a task that could have resumed from resuming.

        With the loop's sleeps recorded (``Request.loop_idle``), the busy spell since the last sleep, less
        ``own``'s steps: callbacks outside any step count. Without them, :meth:`_steps_before`."""
        idle = self.req.loop_idle
        if idle is None:
            return self._steps_before(start_ns, end_ns, own)
        i = bisect.bisect_right(idle, (end_ns, end_ns)) - 1
        spell = max(start_ns, min(idle[i][1], end_ns)) if i >= 0 else start_ns
        return max(0, end_ns - spell - self._own_time(spell, end_ns, own))

    def _steps_before(self, start_ns: int, end_ns: int, own: set[int]) -> int:
        """The steps of tasks not in ``own`` that ran back to back (gaps under ``_BACK_TO_BACK_NS``) right before
        ``end_ns``, within ``[start_ns, end_ns]`` (ns): a lower bound on :meth:`_busy_before`, blind to the
        callbacks between steps but also to the loop's own turn from one task to the next."""
        pieces = sorted(((max(st.start_ns, start_ns), min(st.end_ns, end_ns), t.task_id in own)
                         for t in self.req.tasks.values() for st in t.steps
                         if st.end_ns > start_ns and st.start_ns < end_ns),
                        key=lambda x: x[1], reverse=True)
        frontier, queued = end_ns, 0
        for a, b, mine in pieces:
            if b < frontier - _BACK_TO_BACK_NS:
                break
            if a < frontier:
                if not mine:
                    queued += min(b, frontier) - a
                frontier = a
        return queued

    @staticmethod
    def _outside_io(a: int, b: int, ios: Sequence[IoCall]) -> list[tuple[int, int]]:
        pieces = [(a, b)]
        for io in ios:
            nxt = []
            for x, y in pieces:
                if io.end_ns <= x or io.start_ns >= y:
                    nxt.append((x, y))
                    continue
                if io.start_ns > x:
                    nxt.append((x, io.start_ns))
                if io.end_ns < y:
                    nxt.append((io.end_ns, y))
            pieces = nxt
        return pieces

    def _gap_node(self, path: str, a: int, b: int, label: str, new_id: Any) -> _Obs:
        if label.startswith("sync:"):
            sync = self.req.syncs.get(_ref(label) or -1)
            if sync is not None and sync.sync_id in self.ordinal and sync.task_id in self.paths:
                return self._sync_node(sync, path, a, b, inline=False)
        if label.startswith("task:"):
            return _Obs(new_id("join#"), NodeKind.SYNC, a, b, 0, path, label)
        if label.startswith("sleep:"):
            ns = _ref(label) or 0
            return _Obs(new_id("t"), NodeKind.TIMER, a, b, b - a, path, f"sleep {ns / 1e6:g} ms")
        return _Obs(new_id("w"), NodeKind.WAIT, a, b, b - a, path, label)

    def _sync_node(self, sync: SyncPoint, path: str, a: int, b: int, *, inline: bool) -> _Obs:
        # Edges and duration are set once every task's nodes exist (_sync).
        return _Obs(f"{path}/{sync.op}#{self.ordinal[sync.sync_id]}", NodeKind.SYNC, a, b, 0, path, sync.op,
                    wait=WaitMode(sync.wait), k=sync.k, sync=sync, inline=inline)

    # -- the request ------------------------------------------------------------------------------------
    def build(self) -> RequestGraph:
        req = self.req
        self._name_tasks()
        for tid in self.paths:
            self.seq[tid] = self._timeline(req.tasks[tid])
        root = self.seq[req.root_task]
        start = _Obs("start", NodeKind.START, req.start_ns, req.start_ns, 0)
        end = _Obs("end", NodeKind.END, req.end_ns, req.end_ns, 0)
        edges: set[tuple[str, str]] = set()
        first_root, last_root = root[0], root[-1]
        start.duration_ns = max(0, first_root.start_ns - req.start_ns)
        end.duration_ns = max(0, req.end_ns - last_root.end_ns)
        edges.add(("start", first_root.id))
        edges.add((last_root.id, "end"))
        extra_nodes: list[_Obs] = [end]

        for tid, seq in self.seq.items():
            for prev, node in pairwise(seq):
                if node.kind is not NodeKind.SYNC or node.wait is WaitMode.ALL:
                    edges.add((prev.id, node.id))
            if tid != req.root_task and seq:
                self._spawn_edge(req.tasks[tid], seq[0], edges)

        for tid, seq in self.seq.items():
            for i, node in enumerate(seq):
                if node.kind is NodeKind.SYNC and node.sync is None:
                    self._join(node, edges)
                elif node.sync is not None:
                    self._sync(tid, seq, i, node, edges, extra_nodes)

        nodes = {"start": start}
        nodes.update((n.id, n) for seq in self.seq.values() for n in seq)
        nodes.update((n.id, n) for n in extra_nodes)
        dag = nx.DiGraph(list(edges)) if self.after_any else nx.DiGraph()
        # An any-wait's successor also waits for the awaiting task's previous node when that node does not
        # already precede every racer (as_completed after other work, a race whose children ran earlier).
        for prev_id, sync_id, next_id in self.after_any:
            if not all(nx.has_path(dag, prev_id, p) for p in dag.predecessors(sync_id)):
                edges.add((prev_id, next_id))
        _count_inflight([n for n in nodes.values() if n.io is not None])
        _hidden_work(req, list(nodes.values()))
        return RequestGraph(req, {i: _to_node(n) for i, n in nodes.items()}, tuple(sorted(edges)))

    def _spawn_edge(self, task: TaskLife, first: _Obs, edges: set[tuple[str, str]]) -> None:
        parent_seq = self.seq.get(task.parent_id)
        parent = self.req.tasks.get(task.parent_id)
        spawn_step = parent.step(task.spawn_step) if parent is not None else None
        # The creation time, but never after the end of the step that created the task (the step index is
        # exact; the two clocks may disagree by a few microseconds).
        created = task.created_ns if spawn_step is None else min(task.created_ns, spawn_step.end_ns)
        pred: _Obs | None = None
        if parent_seq:
            for node in parent_seq:
                if node.start_ns <= created:
                    pred = node
                if node.start_ns <= created <= node.end_ns and node.kind is NodeKind.COMPUTE:
                    pred = node
                    break
            pred = pred or parent_seq[0]
            if pred.kind in (NodeKind.SYNC, NodeKind.TIMER):
                # Created inside the call that starts the sync point (shield, wait_for, gather wrap their
                # coroutines in tasks after the compute node is cut at the call): it comes from the compute
                # before the sync point, which waits for it; an edge from the sync point would make a cycle.
                before = parent_seq[: parent_seq.index(pred)]
                pred = next((n for n in reversed(before) if n.kind is NodeKind.COMPUTE), pred)
        pred_id = pred.id if pred else "start"
        edges.add((pred_id, first.id))
        # The task could run once the parent's step that created it ended: the wait for the loop until then
        # is part of its first node (measured from the parent's step, not from the predecessor chosen here).
        if spawn_step is not None:
            ready_from = spawn_step.end_ns
        else:
            ready_from = pred.end_ns if pred else self.req.start_ns
        ready = max(0, first.start_ns - ready_from)
        first.ready_ns = ready
        first.duration_ns += ready

    def _last_of(self, task_id: int) -> _Obs | None:
        seq = self.seq.get(task_id)
        return seq[-1] if seq else None

    def _join(self, node: _Obs, edges: set[tuple[str, str]]) -> None:
        target = _ref(node.label)
        last = self._last_of(target) if target is not None else None
        if last is not None:
            edges.add((last.id, node.id))
        awaited = self.req.tasks.get(target) if target is not None else None
        # Wake-up delay after the awaited task finished (its own finish, whatever the edges say).
        ready = awaited.end_ns if awaited is not None and awaited.steps else node.start_ns
        node.duration_ns = max(0, node.end_ns - ready)

    def _sync(self, tid: int, seq: list[_Obs], i: int, node: _Obs, edges: set[tuple[str, str]],
              extra_nodes: list[_Obs]) -> None:
        sync = node.sync
        assert sync is not None
        prev = seq[i - 1]
        racers: list[str] = [last.id for c in dict.fromkeys(sync.children)
                             if c >= 0 and (last := self._last_of(c)) is not None]
        body_races = self._body_races(sync, node.inline)
        if not racers and not body_races and not node.inline:
            # Nothing known to wait for (the joined awaitables are not tasks the collector saw): an opaque
            # wait for the whole suspension, as for an unattributed future.
            edges.add((prev.id, node.id))
            node.wait, node.k = WaitMode.ALL, 1
            node.duration_ns = max(0, node.end_ns - prev.end_ns)
            return
        if node.wait is WaitMode.ALL or body_races or not racers:
            racers.append(prev.id)  # the waiting task's previous node, or the inline body's last node
        if sync.timeout_ns is not None:
            if node.wait is WaitMode.ALL:
                # min(all of them, timer): an all-node raced against the timer.
                join = _Obs(f"{node.id}/all", NodeKind.SYNC, node.start_ns, node.start_ns, 0, node.task,
                            f"{sync.op} (all)")
                extra_nodes.append(join)
                self.nodes[join.id] = join
                edges.update((r, join.id) for r in racers)
                join.end_ns = max(self.nodes[r].end_ns for r in racers)
                racers = [join.id]
                node.wait, node.k = WaitMode.ANY, 1
                edges.discard((prev.id, node.id))  # now an any-wait: only the racers precede it
            # The timer starts at the call (the compute is cut there).
            pred = self.nodes[self.marks.get(sync.sync_id, prev.id)]
            timer = _Obs(f"{node.id}/timer", NodeKind.TIMER, pred.end_ns, sync.start_ns + sync.timeout_ns,
                         sync.timeout_ns, node.task, f"{sync.op} timeout {sync.timeout_ns / 1e6:g} ms",
                         timeout_ns=sync.timeout_ns)
            extra_nodes.append(timer)
            self.nodes[timer.id] = timer
            edges.add((pred.id, timer.id))
            racers.append(timer.id)
        edges.update((r, node.id) for r in racers)
        node.k = 1 if node.wait is WaitMode.ALL else min(node.k, len(racers))
        done = self._completed(sync, prev, body_races)
        node.duration_ns = max(0, node.end_ns - done)
        # the wake-up ran behind other tasks' steps (a loop busy with the request's other branches): queueing the
        # load simulation makes again. Steps only, not the busy spell an io call's answer is bounded by (_queued):
        # a wake-up's spell is mostly the loop's own turn from the joined task to this one (tens of us on a
        # wake-up of the same length), which the simulated loop does not queue again
        node.queued_ns = min(self._steps_before(done, node.end_ns, {tid}), node.duration_ns)
        if node.wait is WaitMode.ANY and len(racers) > 1:
            # Which racer(s) won is control flow (a replica, a timeout that fired): part of the variant. The
            # timer won when the collector says so (a loop busy elsewhere can fire it after the work is done).
            timer_id = f"{node.id}/timer"
            if sync.timed_out and timer_id in racers:
                node.won_by = timer_id
            else:
                order = sorted((r for r in racers if r != timer_id), key=lambda r: (self.nodes[r].end_ns, r))
                node.won_by = ",".join(sorted(order[: node.k]))
        if node.wait is WaitMode.ANY and prev.id not in racers and i + 1 < len(seq):
            self.after_any.append((prev.id, node.id, seq[i + 1].id))

    @staticmethod
    def _body_races(sync: SyncPoint, inline: bool) -> bool:
        """The work raced is the inline body itself (``timeout``, 3.12+ ``wait_for`` of a coroutine)."""
        return inline and sync.wait == "any" and not any(c >= 0 for c in sync.children)

    def _completed(self, sync: SyncPoint, prev: _Obs, body_races: bool) -> int:
        """When the point completed, as the collector recorded it: the timer if it fired, else the finish of the
        joined tasks it reported done (the k-th of them for an any-wait).

        Never from the graph's predecessors (which come from the point's ``children``, ``wait`` and ``k``), so
        that the self-check catches a wrong predecessor or wait mode: a race recorded as all-of, for instance,
        completes when its winner was done, not when the graph's all-wait would start. (The ``sync`` span's end
        is only a fallback: for ``wait``, ``wait_for`` and ``TaskGroup`` the collector ends it in the resumed
        step, after the wake-up.)
        """
        if sync.timed_out and sync.timeout_ns is not None:
            done = sync.start_ns + sync.timeout_ns
        elif body_races:
            done = prev.end_ns  # the inline body's end
        else:
            ends = sorted(t.end_ns for c in dict.fromkeys(sync.done)
                          if c >= 0 and (t := self.req.tasks.get(c)) is not None and t.steps)
            if not ends:
                done = sync.end_ns
            elif sync.wait == "all":
                done = ends[-1]
            else:
                done = ends[min(sync.k, len(ends)) - 1]
        # Unless the body itself raced, the waiting task may reach the point after it completed.
        return done if body_races else max(done, prev.end_ns)


_COUNTS = ("inflight", "open_calls")
"""The per-request extras that are counts of calls (kept as integers)."""


def _count_inflight(calls: Sequence[_Obs]) -> None:
    """Set each io node's ``inflight``: the request's calls to its resource still waiting for their answers when
    it started (itself too); and its ``open_calls``, the calls whose spans were open then, answered or not.

    A call whose answer has come but waits for the loop no longer loads the resource: a fan-out's calls start
    one loop step apart and their answers wait for the loop to get through the rest, so counting open spans
    would put every call of ten behind the nine before it, where the server had answered most of them (the ten
    blob fetches of the example's index page: the tenth started while about four answers were outstanding).
    Each call counts until its expected answer: before the part of its end known to follow the answer
    (``answered_ns``) and the expected share of the rest of its bound (``queued_ns``,
    :data:`~analyzer.graph.ANSWER_WAIT_SHARE`), as the load simulation takes it out. Counting to the bound's
    start instead counts no call at all when the loop never slept during the fan-out: the bound then spans every
    call from its start.

    ``open_calls`` is the call's place in its fan-out when the answers come in no sooner than they did: a
    bigger answer (``size:``) keeps an earlier call unanswered at least as long as its span lasted today.
    """
    by_resource: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for obs in calls:
        assert obs.io is not None
        answer = obs.io.end_ns - expected_answer_wait(obs.queued_ns, min(obs.answered_ns, obs.queued_ns))
        by_resource[obs.io.resource].append((obs.io.start_ns, answer, obs.io.end_ns))
    for obs in calls:
        assert obs.io is not None
        start = obs.io.start_ns
        obs.inflight = max(1, sum(1 for a, b, _ in by_resource[obs.io.resource] if a <= start < b))
        obs.open_calls = max(1, sum(1 for a, _, e in by_resource[obs.io.resource] if a <= start < e))


def _hidden_work(req: Request, nodes: Sequence[_Obs]) -> None:
    """Set each io node's ``hidden_ns``: the loop's work during the request that no node holds the loop for.

    The loop is busy whenever it is not asleep in ``select()`` (``Request.loop_idle``). Compute nodes (less
    their wait to first run) and io calls' own CPU account for most of that; the rest is work outside any task
    step: the sockets' read callbacks (``IoCall.read_ns``), the server's work before the first step and after
    the last, the loop's own turn between callbacks, what the collector's hooks add there. The simulation leaves
    it inside the waits, where it was recorded, but a CPU neighbour stretches it as it stretches the steps
    (:mod:`analyzer.loadsim`). Each call gets its own read callbacks, and what is left is shared equally among
    the request's calls. Without recorded sleeps, the read callbacks alone.
    """
    calls = [n for n in nodes if n.io is not None]
    if not calls:
        return
    for obs in calls:
        assert obs.io is not None
        obs.hidden_ns = max(obs.io.read_ns, 0)
    if req.loop_idle is None:
        return
    asleep = sum(max(0, min(b, req.end_ns) - max(a, req.start_ns)) for a, b in req.loop_idle)
    # a segment's wait for the loop before its task first ran is other work's time, not its own
    held = sum(n.duration_ns - (n.ready_ns or 0) for n in nodes if n.kind is NodeKind.COMPUTE)
    held += sum(n.cpu_ns for n in calls)
    rest = (req.end_ns - req.start_ns) - asleep - held - sum(n.hidden_ns for n in calls)
    if rest > 0:
        share = rest // len(calls)
        for obs in calls:
            obs.hidden_ns += share


def _to_node(obs: _Obs) -> Node:
    io = obs.io
    extra: dict[str, Any] = {}
    if obs.ready_ns is not None:
        extra["ready_ms"] = [obs.ready_ns / 1e6]
    if obs.wait_ns is not None:
        extra["wait_ms"] = [obs.wait_ns / 1e6]
    if obs.won_by:
        extra["won_by"] = obs.won_by
    if obs.kind is NodeKind.IO:
        extra["cpu_before_ms"] = [obs.cpu_before_ns / 1e6]
        extra["inflight"] = [max(obs.inflight, 1)]
        extra["open_calls"] = [max(obs.open_calls, 1)]
        extra["queued_ms"] = [obs.queued_ns / 1e6]
        extra["answered_ms"] = [obs.answered_ns / 1e6]
        extra["hidden_ms"] = [obs.hidden_ns / 1e6]
    if obs.kind is NodeKind.SYNC and obs.sync is not None:
        extra["queued_ms"] = [obs.queued_ns / 1e6]
    return Node(
        id=obs.id,
        kind=obs.kind,
        samples_ms=(obs.duration_ns / 1e6,),
        wait=obs.wait,
        k=obs.k,
        task=obs.task,
        label=obs.label,
        api=io.api if io else "",
        resource=io.resource if io else "",
        system=io.system if io else "",
        cpu_ms=(obs.cpu_ns / 1e6,) if obs.kind in (NodeKind.COMPUTE, NodeKind.IO) else (),
        round_trips=(io.round_trips,) if io else (),
        request_bytes=(io.request_bytes,) if io else (),
        response_bytes=(io.response_bytes,) if io else (),
        timeout_ms=obs.timeout_ns / 1e6 if obs.timeout_ns is not None else None,
        extra=extra,
    )
