"""Load and failure scenarios by discrete-event simulation of closed-loop users walking causal graphs.

WebPerf enforces concurrency limits by reshaping each request's graph (with r concurrent requests and a limit
n on some call, it allows n/r concurrent calls per request) and takes an io call's latency from its profile at
``N x n_c`` concurrent calls (Jiang et al., SIGCOMM 2016, sections 4.3 and 6.2). That treats requests as
independent and leaves out the resource that dominates an asyncio service under load: its single event loop,
on which the compute segments of *all* concurrent requests run one at a time. So perfcast simulates instead:

- N closed-loop users (think time between requests, default 0) each draw a request: a route by its recorded
  share, then one Monte Carlo column of that route's node durations (a bootstrapped recorded request with the
  scenario's changes applied, :mod:`analyzer.predict`), and walk its DAG: a node starts when all (or the
  first k) of its predecessors have finished;
- compute nodes are served by one FIFO server, the loop (also those of one request's parallel branches);
- io nodes overlap, limited per resource by a pool (``load:N?pool.postgresql=10``: at most 10 calls in
  flight, the others queue FIFO for a connection); a call's connection goes back when the calling task's
  next step has run (where asyncpg's ``pool.fetch`` releases it), so under load it is held through that
  step's wait for the loop too, and when that step awaits a child of its own (asyncpg's release runs
  shielded and resets the connection with a query), until the child is done, whose calls to the same pool
  use the held connection; a returned connection wakes the first waiter, which takes it only when its
  step runs, after the loop's queued work, and a caller whose step runs before that takes it first, the
  waiter queueing again at the back (``asyncio.Queue.get``, which asyncpg's pool waits on); a recorded wait
  for a pooled connection (a task's wait on a future right before the step that makes the call) is left
  out, since the simulated pool makes its own; every other node is a pure delay;
- an io call's latency is its sampled duration, shifted when the profile store has a concurrency-
  parameterised profile of its api: by ``Q_L(u) - Q_L0(u)``, where ``Q_L`` is the profile's quantile function
  at the concurrency ``L`` the call meets on arrival (calls in flight to its resource), ``L0`` the level it met
  when recorded (its own request's calls to that resource waiting for answers, the io node's ``inflight``: a
  fan-out's recorded durations hold that much concurrency already) and ``u`` the call's rank among its node's
  samples, so the app-specific part of the call is kept and only the profiled effect of more concurrency is
  added (from two users per loop, or a failed replica, on: at one, the recorded load, the durations hold its
  concurrency);
- front-end replicas share the users evenly (``load:N?replicas=R``; ``failure:app`` leaves R - 1); a failed
  backend replica leaves its calls to R - 1 replicas, which only matters through concurrency profiles (the
  level a call meets is scaled by R / (R - 1): WebPerf's "its load effectively doubles" for R = 2);
- a compute node's recorded wait before its task first ran (``ready_ms``) was queueing for the loop: it is
  left out of the node's service time, since the simulation queues the node again under the new load; so is
  the part of a synchronisation point's wake-up (gather, wait, TaskGroup) during which the loop ran other
  tasks' steps (the sync node's ``queued_ms``), which would be queued twice (0.04 ms of the example's index
  page on average: its TaskGroup's shielded releases wait behind the other queries' steps); and the expected
  part of an io call's recorded wait for the loop: the part known to follow the answer's read
  (``answered_ms``) and half the rest of its bound (``queued_ms``; :data:`analyzer.graph.ANSWER_WAIT_SHARE`);
- HTTP calls to a route the graphs also hold become sub-requests (:class:`_Nesting`);
- an io call's CPU on the loop (the io node's ``cpu_ms``: the client library's serialising and parsing, of which
  ``cpu_before_ms`` came before the first wait) is queued on the loop before and after the call's wait; only
  the rest of the call overlaps;
- CPU the process spends outside every request's recorded CPU (other threads under the GIL, the kernel's
  share), the graphs' ``meta.background_cpu_ms`` per user request, is queued on the same server as background
  work spread over the io calls, off the requests' own paths (:func:`background_demand`), from two users per
  loop on (at one, the load the baseline is recorded at, the recorded durations hold its effect), and with a CPU
  neighbour stretched by the fair share (at one user only what the neighbour adds to it);
- a CPU neighbour (``interference:cpu=P`` with CPU profiles in the store): every piece of loop work holds the
  loop for the fair share (:func:`analyzer.predict.node_durations`; an io call's CPU too), and a piece the
  simulated loop wakes up for, idle before it, takes the profiles' extra at the neighbour's phase instead
  (:func:`_neighbour`): one wake-up serves every callback that is ready, so a fan-out whose answers arrive
  together pays one, where the steps after io calls, decided from the graph, would each pay their own; the
  loop's work inside an io call's wait that no step holds (its ``hidden_ms``: read callbacks, the loop's own
  turn) joins the spell that takes in the answer;
- a task step runs to its next ``await`` in one turn of the loop: an io call's CPU before its wait is served
  with the step that makes the call, and its CPU after the wait with the step that takes in the answer
  (:func:`_with_steps`), not queued behind the other tasks' steps ready between them (not under a CPU
  neighbour, whose model was fitted on the pieces queued apart);
- an io call's ``hidden_ms`` (the read callbacks that take in its answer, its share of the loop's own turn)
  holds the loop when its answer comes in, out of the call's wait: a fan-out's answers wait for each other's
  callbacks, and under load the answer's callbacks queue for the loop once and the step that takes the answer
  in again, as asyncio runs them (the process's background CPU is what is left beside them,
  :func:`~analyzer.graph.loop_cpu_ms`; under a CPU neighbour they stay in the waits, stretched);
- the work a request leaves behind once it has answered (a fire-and-forget task's steps and calls' CPU) runs
  beside the next request; at one user per loop, the load the durations were recorded at, the next request's
  recorded durations hold what it cost them, so it is not queued on the loop again (queued, the example's
  post page came out 0.1 ms, 5%, slower than recorded after an index page, whose view counter's Redis call
  ends during the next request; exact alone);
- recorded durations can be calibrated to the app without the collector (``meta.cpu_scale`` for CPU,
  ``meta.wait_scale`` for the rest: :func:`with_background`);
- every idle gap of the simulated loop adds to the loop work after it what a wake-up costs by itself
  (``meta.wake_cost_ms``, fitted to the loop's demand measured at a few users: :func:`fit_wake_cost`) and what
  the idle adds beyond it (the store's wake-up profile), less what the same work's gaps cost as recorded: a
  busier loop sleeps less and pays less per request. A gap before a step that follows only a sync point or
  another step is none: asyncio runs that step from its ready queue without sleeping (:attr:`Workload.sleeps`).

The first ``2 N`` completions are discarded (the start-up transient of users that all start at t = 0).
Checks with answers by hand are in the tests: N users of pure compute ``d`` see ``N d``; pure io is unchanged;
a call of ``d`` ms with ``c`` ms of loop CPU saturates at ``N c`` (``tests/analyzer/test_loadsim.py``).

References
----------
.. [1] J. Jiang, R. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If Scenarios for
   Cloud-hosted Web Applications", SIGCOMM 2016. doi:10.1145/2934872.2934882
.. [2] D. Beazley, "Understanding the Python GIL", PyCon 2010: one thread runs Python code at a time; threads
   release the GIL in blocking system calls (so the process's system time runs beside it).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np
import numpy.typing as npt

from analyzer.distribution import DagPlan, evaluate_plan
from analyzer.errors import GraphError, ProfileError
from analyzer.graph import CausalGraph, Node, NodeKind, hidden_loop_ms, loop_cpu_ms
from analyzer.interference import PERIOD_MS, cpu_slowdown, stretch_profile
from analyzer.scenario import Failure, Interference, Load, Scenario, Tier, applies, matches, route_matches
from analyzer.wakeup import (
    WakeProfile,
    service_profile_for,
    service_wake_profiles,
    wake_profile,
)

if TYPE_CHECKING:
    from analyzer.predict import NodeDurations, SupportsSelect

__all__ = ["BACKGROUND_KEY", "CLIENT_KEY", "CPU_SCALE_KEY", "HOST_CPUS_KEY", "HOST_CPU_KEY", "LEVELS_KEY",
           "OTHERS_KEY", "OTHERS_LEVELS_KEY", "WAIT_SCALE_KEY", "WAKE_COST_KEY", "BackgroundDemand", "Calibration",
           "MeasuredLevels", "Queueing", "Workload", "as_recorded", "at_recorded_load", "background_demand",
           "background_from_spans", "calibrate", "check_meta", "fit_wait_scale", "fit_wake_cost", "simulate",
           "simulate_scenario", "with_background", "with_wake_cost"]

FloatArray = npt.NDArray[np.float64]
Adjust = Callable[[int, int, int, int], float]
"""(workload, node position, column, concurrency level) -> duration shift in ms."""
Wake = Callable[[int, int, int, int, float, float, int], float]
"""(workload, node position, column, site, the loop's idle gap before the work, the work, its CPU server) -> what
the loop's coldness adds to the work (ms); site 0: a compute node, 1: an io call's CPU before its wait, 2: after
it. Times in ms; called for every piece of loop work in time order, the gap 0 when the loop was busy."""
Neighbour = Callable[[float, float, float], float]
"""(ms of the loop's work since it woke up, the quantile of the neighbour's phase when it woke, how long it slept
before, ms) -> what a CPU neighbour adds to that much work after a wake-up (ms;
:meth:`analyzer.interference.StretchProfile.at`)."""
ServiceWake = Callable[[int, int, int, int, float], float]
"""(workload, node position, column, resource group, how long the resource had been idle) -> what its coldness
adds to the io call (ms): the idle runs from the start of the group's call before (0 while another is in
flight); called when the call's wait starts."""


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """One request kind as the simulation sees it."""

    plan: DagPlan
    durations: FloatArray
    """``(nodes, columns)``: each node's duration in each Monte Carlo column."""
    on_loop: tuple[bool, ...]
    """Nodes that hold the event loop (compute)."""
    pool: tuple[int, ...] = ()
    """Per node: index of the pool limiting it, or -1 (empty: no pools)."""
    group: tuple[int, ...] = ()
    """Per node: index of the resource group whose calls in flight set its concurrency, or -1."""
    weight: float = 1.0
    """Share of the users' requests that are of this kind (0: only ever called by other requests)."""
    nested: tuple[int, ...] = ()
    """Per node: -1, or the index of the route (in ``simulate``'s ``routes``) an HTTP call of this node is
    served by, within the simulation: the call's duration is then that sub-request's latency plus the node's
    ``durations`` entry (the client side of the call)."""
    server: tuple[int, ...] = ()
    """Per node with ``nested``: the CPU server that runs the sub-request's compute (0: the caller's)."""
    cpu_before: FloatArray | None = None
    """``(nodes, columns)`` or None: io nodes' CPU on the loop before the call's wait (the client library
    serialising the request), served FIFO on the loop; part of the node's ``durations``."""
    cpu_after: FloatArray | None = None
    """``(nodes, columns)`` or None: io nodes' CPU on the loop after the wait (parsing the answer)."""
    background: tuple[float, ...] = ()
    """Per node: CPU (ms) no request records that the process spends for this call (other threads under the
    GIL, the kernel's share): queued on the CPU server when the call's wait starts, and the call cannot end
    before it is served; not part of the request's path otherwise. On the start node: per request."""
    holds: tuple[int, ...] = ()
    """Per node: -1, or the pooled io node whose connection this node still holds, returned when it ends (the
    calling task's next step: a pool takes the connection back in the code that runs after the answer)."""
    threaded: tuple[bool, ...] = ()
    """Per node: an io call served by a thread of the app's own process (aiosqlite runs each connection on
    one), which needs the GIL to take the job and again to hand the answer back (:data:`THREAD_SYSTEMS`)."""
    hidden: FloatArray | None = None
    """``(nodes, columns)`` or None: io nodes' loop work inside the wait that no step holds (read callbacks, the
    loop's own turn: the node's ``hidden_ms``), part of the wait's duration. A CPU neighbour stretches it as
    loop work when the answer comes in; with ``simulate(hidden_on_loop=True)`` it holds the loop then."""
    others: tuple[float, ...] = ()
    """Per node: CPU (ms) the host's other processes (the database, a cache, the load client) spend for this
    io call, on ``simulate(cores=...)``'s cores; the recorded wait holds it served at once, so a call that finds
    every core taken waits that much longer. Empty: none."""
    sleeps: tuple[bool, ...] = ()
    """Per node: whether the loop may have slept in ``select()`` right before this compute node's work, so that
    an idle gap before it is a wake-up: it follows an io call's answer, the request's arrival, a timer or a wait
    on another task. Not after a synchronisation point or another step only, which asyncio runs from its ready
    queue without sleeping (the sync point's recorded time is the loop dispatching it). An io call's CPU after
    its wait always follows its answer, its CPU before it the step that makes the call. Empty: every node."""


@dataclass(slots=True)
class Queueing:
    """Where the users' requests of a :func:`simulate` run waited, measured after its warm-up: per workload, the
    requests reported and their summed waits for the loop (a piece of loop work ready, the loop busy with
    others') and for a pooled connection (a call ready, every connection taken); and the loops' busy time
    over the measured span, every loop counted."""

    requests: list[int] = field(default_factory=list)
    loop_wait_ms: list[float] = field(default_factory=list)
    pool_wait_ms: list[float] = field(default_factory=list)
    pool_calls: list[int] = field(default_factory=list)
    """Per workload: its calls through a pool in a request (those made on a connection the request already holds
    not counted)."""
    core_wait_ms: list[float] = field(default_factory=list)
    """Per workload: the summed time its calls' shares of the other processes' CPU waited for a host core
    (``simulate(cores=...)``; a loop's work waiting for a core counts as waiting for the loop)."""
    busy_ms: float = 0.0
    span_ms: float = 0.0
    servers: int = 1
    core_busy_ms: float = 0.0
    """With ``simulate(cores=...)``: the host's cores' busy time over the measured span, every core counted."""
    cores: int = 0

    @property
    def loop_busy(self) -> float:
        """The loops' utilisation over the measured span (0..1)."""
        return self.busy_ms / (self.span_ms * self.servers) if self.span_ms > 0 else 0.0

    @property
    def loop_ms_per_request(self) -> float:
        """The loops' busy time per user request reported (0 without one)."""
        n = sum(self.requests)
        return self.busy_ms / n if n else 0.0

    @property
    def core_busy(self) -> float:
        """The host's cores' utilisation over the measured span (0..1; 0 without cores)."""
        return self.core_busy_ms / (self.span_ms * self.cores) if self.span_ms > 0 and self.cores else 0.0


THREAD_SYSTEMS = frozenset({"sqlite"})
"""io systems whose asyncio clients serve each call on a thread of the app's process: aiosqlite runs every
connection's queries on a thread of its own."""

GIL_SWITCH_MS = 5.0
"""CPython's switch interval (``sys.getswitchinterval()``): a thread waiting for the GIL asks its holder to
drop it after this long."""

_MAX_DEPTH = 4
"""Nested requests deeper than this are plain calls (a route that calls itself would not end otherwise)."""


def simulate(
    workloads: Sequence[Workload],
    users: int,
    completions: int,
    rng: np.random.Generator,
    *,
    think_ms: float = 0.0,
    pool_sizes: Sequence[int] = (),
    scale: Sequence[float] = (),
    adjust: Adjust | None = None,
    warmup: int | None = None,
    routes: Sequence[tuple[Sequence[int], Sequence[float]]] = (),
    servers: int = 1,
    wake: Wake | None = None,
    gil_switch_ms: float = GIL_SWITCH_MS,
    service_wake: ServiceWake | None = None,
    neighbour: Neighbour | None = None,
    columns: list[list[int]] | None = None,
    hidden_on_loop: bool = False,
    queueing: Queueing | None = None,
    cores: int = 0,
) -> list[FloatArray]:
    """Latencies of ``completions`` user requests of ``users`` closed-loop users, per workload.

    ``pool_sizes[p]`` limits the calls in flight through pool ``p``; the calls in flight of resource group ``g``
    times ``scale[g]`` (rounded up) is the concurrency level passed to ``adjust``. ``routes[i]`` lists the
    workloads (variants) of nested route ``i`` and their shares; ``servers`` is the number of FIFO CPU servers
    (event loops). ``wake`` is told the loop's idle gap before each piece of work that ends one and returns what
    the gap adds to it (:mod:`analyzer.wakeup`); ``service_wake`` what a resource group's idle adds to the io
    call that ends it. Latencies of nested requests are reported with their workload too; ``columns``, when
    given, gets the column of each latency reported (per workload, in the same order). ``hidden_on_loop``: an io
    call's hidden loop work (:attr:`Workload.hidden`) comes out of its wait and holds the loop when the answer
    arrives, before the call's CPU after the wait. ``queueing``, when given, is filled with where the users'
    requests waited (:class:`Queueing`).

    ``cores`` > 0: the host's cores, which every loop's work and the other processes' CPU for each io call
    (:attr:`Workload.others`) need. A piece of the others' work is placed, when its call starts, at the earliest
    time a core has room for it, in a gap before work placed earlier too (the kernel runs whatever is ready on
    an idle core: placed only after the last work of the core free first, the example of two cores, 1 ms of
    loop and 3 ms of the others' CPU per request at ten users came out at 23 ms where the cores bound it at
    20), and the call's wait grows by the time it waited. A loop's work is placed the same way from when it
    starts, which it does not wait for: what a loop waits for a core is in its demand (the preempted time).
    0: the loops own their cores.

    A ``threaded`` call's thread waits for the GIL when it takes the job and when it hands the answer back:
    while the loop's thread works, until the loop has no more queued work (it then blocks in ``epoll_wait`` and
    drops the GIL), at most ``gil_switch_ms`` (the holder is then asked to drop it). Measured on the example app
    at 16 users without the collector, aiosqlite's take-up went from 0.15 to 1.0 ms and its run from 0.18 to
    0.92 ms, against one user.
    """
    if users < 1:
        raise ValueError("users must be >= 1")
    warmup = 2 * users if warmup is None and users > 1 else (warmup or 0)
    weights = np.array([w.weight for w in workloads], dtype=np.float64)
    if weights.sum() <= 0:
        raise ValueError("no workload has a positive weight")
    kinds = rng.choice(len(workloads), size=completions + warmup + users, p=weights / weights.sum())
    variant_draws = [
        rng.choice(np.asarray(ks), size=4096, p=np.asarray(ps) / np.sum(ps)) for ks, ps in routes
    ]
    variant_cursor = [0] * len(routes)
    succ: list[list[list[int]]] = []
    need0: list[list[int]] = []
    for w in workloads:
        s: list[list[int]] = [[] for _ in range(w.plan.size)]
        for j, ps in enumerate(w.plan.preds):
            for p in ps:
                s[p].append(j)
        succ.append(s)
        need0.append(w.plan.waits_for())
    deferred = [{h for h in w.holds if h >= 0} for w in workloads]  # pooled calls a later step releases
    cursor = [0] * len(workloads)
    out: list[list[float]] = [[] for _ in workloads]
    heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, request, node, phase)
    seq = 0
    loop_free = [0.0] * max(servers, 1)
    # per core: its placed work as sorted (start, end) intervals, those over before ``now`` dropped
    core_work: list[list[tuple[float, float]]] = [[] for _ in range(max(cores, 0))]
    now = 0.0
    free = list(pool_sizes)
    waiting: list[deque[tuple[int, int]]] = [deque() for _ in pool_sizes]
    inflight = [0] * len(scale)
    last_call = [-1.0] * len(scale)  # start of each resource group's latest call's wait (-1: none yet)
    # per request: workload, column, start time, remaining needs, CPU server, parent (request, node), depth
    req_kind: list[int] = []
    req_col: list[int] = []
    req_t0: list[float] = []
    req_need: list[list[int]] = []
    req_server: list[int] = []
    req_parent: list[tuple[int, int] | None] = []
    req_depth: list[int] = []
    req_ended: list[bool] = []
    req_phase: list[float] = []
    req_loop_wait: list[float] = []  # per request: its summed waits for the loop, for a pooled connection
    req_pool_wait: list[float] = []
    req_core_wait: list[float] = []
    pool_since: dict[tuple[int, int], float] = {}  # (request, node) -> when the call first found the pool empty
    measured_from = 0.0 if warmup == 0 else -1.0  # when the warm-up ended (busy time counts from then)
    if queueing is not None:
        n = len(workloads)
        queueing.requests, queueing.loop_wait_ms, queueing.pool_wait_ms = [0] * n, [0.0] * n, [0.0] * n
        queueing.core_wait_ms = [0.0] * n
        queueing.pool_calls = [sum(1 for p in w.pool if p >= 0) if w.pool else 0 for w in workloads]
        queueing.busy_ms, queueing.span_ms, queueing.servers = 0.0, 0.0, max(servers, 1)
        queueing.core_busy_ms, queueing.cores = 0.0, max(cores, 0)
    spell_u = [0.0] * max(servers, 1)  # per CPU server: the neighbour's quantile when its loop last woke up
    spell_w = [0.0] * max(servers, 1)  # and the work it has done since (ms)
    spell_g = [0.0] * max(servers, 1)  # and how long it slept before (ms)
    # and what that work was charged, neighbour(spell_w, spell_u, spell_g): each piece asks the profile once
    spell_c = [neighbour(0.0, 0.0, 0.0) if neighbour is not None else 0.0] * max(servers, 1)
    done_count = 0
    issued = 0

    def push(t: float, r: int, j: int, phase: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, r, j, phase))
        seq += 1

    def open_request(k: int, t: float, server: int, parent: tuple[int, int] | None, depth: int) -> None:
        w = workloads[k]
        col = cursor[k] % w.durations.shape[1]
        cursor[k] += 1
        req_kind.append(k)
        req_col.append(col)
        req_t0.append(t)
        req_need.append(list(need0[k]))
        req_server.append(server)
        req_parent.append(parent)
        req_depth.append(depth)
        req_ended.append(False)
        req_phase.append(float(rng.random()) if neighbour is not None else 0.0)
        req_loop_wait.append(0.0)
        req_pool_wait.append(0.0)
        req_core_wait.append(0.0)
        begin(len(req_kind) - 1, w.plan.start, t)

    def new_request(t: float) -> None:
        nonlocal issued
        k = int(kinds[issued])
        issued += 1
        open_request(k, t, 0, None, 0)

    def core(t: float, d: float) -> float:
        """When ``d`` ms of CPU arriving at ``t`` starts: at the earliest time a core has room for it."""
        best, at, where = math.inf, 0, 0
        for i, placed in enumerate(core_work):
            while placed and placed[0][1] <= now:
                placed.pop(0)
            start, pos = t, len(placed)
            for k, (a, b) in enumerate(placed):
                if b <= start:
                    continue
                if start + d <= a:
                    pos = k
                    break
                start = b
            if start < best:
                best, at, where = start, i, pos
        core_work[at].insert(where, (best, best + d))
        if queueing is not None and measured_from >= 0:
            queueing.core_busy_ms += d
        return best

    def hold(server: int, t: float, d: float, r: int = -1) -> float:
        """FIFO single server: a job of ``d`` ms arriving at ``t`` ends then (request ``r``'s, or nobody's)."""
        s = max(t, loop_free[server])
        if core_work and d > 0:
            # the loop's work takes a core from the others, but does not wait for one here: its waits for a
            # core are in its demand (the preempted time measured at the level), and counted again they put
            # the example's index page 25 ms (24%) above its measured 102 ms at 16 users (docs/accuracy.md, run 94)
            core(s, d)
        loop_free[server] = s + d
        if queueing is not None:
            if r >= 0:
                req_loop_wait[r] += s - t
            if measured_from >= 0:
                queueing.busy_ms += d
        return s + d

    def on_loop(r: int, t: float, site: int, j: int, d: float, hidden: float = 0.0) -> float:
        """When ``d`` ms of request ``r``'s loop work arriving at ``t`` is done. The work a request leaves behind
        once it has answered (a fire-and-forget task) runs beside the next request, whose recorded durations
        hold what it cost them when the requests were recorded: one user per loop, the recorded load, does not
        queue it again."""
        if req_ended[r] and users == 1:
            return t + d
        return hold(req_server[r], t, woken(r, j, site, t, d, hidden), r)

    def woken(r: int, j: int, site: int, t: float, d: float, hidden: float = 0.0) -> float:
        """``d`` plus what the loop's idle gap before this work (arriving at ``t``) adds to it; ``hidden``: loop
        work the recorded wait before it already holds, which only a neighbour's stretch of it adds to."""
        if wake is None and neighbour is None:
            return d
        server = req_server[r]
        gap = max(t - loop_free[server], 0.0)
        w = workloads[req_kind[r]]
        if w.sleeps and (site == 1 or (site == 0 and not w.sleeps[j])):
            gap = 0.0  # made ready from the loop's ready queue: it did not sleep for this work
        extra = wake(req_kind[r], j, req_col[r], site, gap, d, server) if wake is not None else 0.0
        if neighbour is not None and d + hidden > 0:
            extra += spell(r, server, gap, t, d + hidden)
        return max(d + extra, 0.0)

    def spell(r: int, server: int, gap: float, t: float, d: float) -> float:
        """What a CPU neighbour adds to ``d`` ms of loop work starting at ``t``: the profiles' extra for the work
        of the loop's spell so far plus this, less what the spell's earlier work was charged. A spell starts
        where the loop wakes from idle (``gap`` > 0, how long it slept), at the quantile of the neighbour's phase
        then and at what that sleep does to it; its first piece pays the wake-up, unless the loop woke before
        the request arrived (that wake-up precedes its server span)."""
        assert neighbour is not None
        if gap > 0:
            u = req_phase[r] - (t - req_t0[r]) / PERIOD_MS
            spell_u[server], spell_w[server], spell_g[server] = u - math.floor(u), 0.0, gap
            before = 0.0 if loop_free[server] >= req_t0[r] else neighbour(0.0, spell_u[server], gap)
        else:
            before = spell_c[server]
        spell_w[server] += d
        spell_c[server] = neighbour(spell_w[server], spell_u[server], spell_g[server])
        return spell_c[server] - before

    def cpu_of(w: Workload, j: int, col: int) -> tuple[float, float]:
        if w.cpu_before is None or w.cpu_after is None:
            return 0.0, 0.0
        return float(w.cpu_before[j, col]), float(w.cpu_after[j, col])

    def start_io(r: int, j: int, t: float, d: float) -> None:
        k = req_kind[r]
        w = workloads[k]
        g = w.group[j] if w.group else -1
        if g >= 0:
            inflight[g] += 1
        before, after = cpu_of(w, j, req_col[r])
        if before > 0 or after > 0 or (w.background and w.background[j] > 0 and req_depth[r] == 0
                                       and j != w.plan.end):
            # the client library's CPU before the wait holds the loop first (phase 3 when served)
            push(on_loop(r, t, 1, j, before), r, j, 3)
            return
        wait_io(r, j, t, d)

    def wait_io(r: int, j: int, t: float, d: float) -> None:
        """The call's wait (and its background CPU) from ``t``; ``d``: the call's whole duration."""
        k = req_kind[r]
        w = workloads[k]
        g = w.group[j] if w.group else -1
        before, after = cpu_of(w, j, req_col[r])
        chunk = w.background[j] if w.background and req_depth[r] == 0 and j != w.plan.end else 0.0
        floor = hold(req_server[r], t, chunk) if chunk > 0 else t
        route = w.nested[j] if w.nested else -1
        if route >= 0 and req_depth[r] < _MAX_DEPTH:
            i = variant_cursor[route]
            variant_cursor[route] += 1
            target = int(variant_draws[route][i % variant_draws[route].size])
            server = w.server[j] or req_server[r]
            open_request(target, t, server, (r, j), req_depth[r] + 1)
            return
        if g >= 0 and adjust is not None:
            level = math.ceil(inflight[g] * scale[g] - 1e-9)
            d = max(d + adjust(k, j, req_col[r], level), 0.0)
        if g >= 0 and service_wake is not None:
            # the resource's first call: how long it had idled is unknown (it was recorded after a request)
            if last_call[g] >= 0:
                idle = t - last_call[g] if inflight[g] <= 1 else 0.0
                d = max(d + service_wake(k, j, req_col[r], g, idle), 0.0)
            last_call[g] = t
        if core_work and w.others and w.others[j] > 0 and req_depth[r] == 0:
            t0 = t
            t = core(t, w.others[j])  # the backend's share waits for a core, and the answer with it
            floor = max(floor, t)
            if queueing is not None:
                req_core_wait[r] += t - t0
        if w.threaded and w.threaded[j]:
            # the thread takes the job once it holds the GIL; phase 6 when its work is done
            push(max(t + gil_wait(r, t) + max(d - before - after, 0.0), floor), r, j, 6)
            return
        hidden = hidden_of(w, j, req_col[r]) if hidden_on_loop else 0.0
        end_wait(r, j, max(t + max(d - before - after - hidden, 0.0), floor))

    def gil_wait(r: int, t: float) -> float:
        """How long a thread of the process waits at ``t`` for the GIL the loop's thread holds."""
        return min(max(loop_free[req_server[r]] - t, 0.0), gil_switch_ms)

    def hidden_of(w: Workload, j: int, col: int) -> float:
        if w.hidden is None or (neighbour is None and not hidden_on_loop):
            return 0.0
        return float(w.hidden[j, col])

    def end_wait(r: int, j: int, t: float) -> None:
        """The call's answer arrived at ``t``: its CPU after the wait holds the loop, then the call ends."""
        w = workloads[req_kind[r]]
        _, after = cpu_of(w, j, req_col[r])
        if after > 0 or hidden_of(w, j, req_col[r]) > 0:
            push(t, r, j, 4)  # reserve the loop at t (in time order), then end
        else:
            push(t, r, j, 1)

    def begin(r: int, j: int, t: float) -> None:
        w = workloads[req_kind[r]]
        d = float(w.durations[j, req_col[r]])
        if w.on_loop[j]:
            push(on_loop(r, t, 0, j, d), r, j, 0)  # FIFO: starts when the loop is free
            return
        p = w.pool[j] if w.pool else -1
        if p >= 0:
            if free[p] == 0:
                pool_since.setdefault((r, j), t)
                waiting[p].append((r, j))
                return
            free[p] -= 1
        start_io(r, j, t, d)

    while issued < users:
        new_request(0.0)
    while heap:
        t, _, r, j, phase = heapq.heappop(heap)
        now = t
        if phase == 2:
            new_request(t)
            continue
        k = req_kind[r]
        w = workloads[k]
        if phase == 6:  # a threaded call's work is done: its thread hands the answer back under the GIL
            end_wait(r, j, t + gil_wait(r, t))
            continue
        if phase == 3:  # the call's CPU before its wait was served
            wait_io(r, j, t, float(w.durations[j, req_col[r]]))
            continue
        if phase == 5:  # a woken waiter's step runs: the connection, unless another caller took it meanwhile
            p = w.pool[j]
            if free[p] > 0:
                free[p] -= 1
                req_pool_wait[r] += t - pool_since.pop((r, j), t)
                start_io(r, j, t, float(w.durations[j, req_col[r]]))
            else:
                waiting[p].append((r, j))
            continue
        if phase == 4:  # the answer arrived: the CPU after the wait, then the call ends
            after, hidden = cpu_of(w, j, req_col[r])[1], hidden_of(w, j, req_col[r])
            if hidden_on_loop:  # the read callbacks run first, then the step's parsing: one piece of loop work
                after, hidden = after + hidden, 0.0
            push(on_loop(r, t, 2, j, after, hidden), r, j, 1)
            continue
        if phase == 1:  # an io call (or delay) finished: release what it held
            g = w.group[j] if w.group else -1
            if g >= 0:
                inflight[g] -= 1
        p = -1
        if w.holds and w.holds[j] >= 0:
            p = w.pool[w.holds[j]]  # the step after a pooled call ended: its connection goes back now
        elif phase == 1 and w.pool and j not in deferred[k]:
            p = w.pool[j]
        if p >= 0:
            free[p] += 1  # back in the pool's queue
            if waiting[p]:
                # asyncio.Queue wakes the first waiter, which takes the connection when its step runs: after the
                # loop's queued work. A caller whose step runs before that finds it free and takes it first; the
                # waiter then queues again, at the back.
                r2, j2 = waiting[p].popleft()
                push(hold(req_server[r2], t, 0.0), r2, j2, 5)
        need = req_need[r]
        for nxt in succ[k][j]:
            need[nxt] -= 1
            if need[nxt] == 0:
                begin(r, nxt, t)
        if j != w.plan.end:
            continue
        req_ended[r] = True
        parent = req_parent[r]
        if parent is not None:  # a nested request ended: its caller's call ends after the client side
            pr, pj = parent
            if done_count >= warmup:
                out[k].append(t - req_t0[r])
                if columns is not None:
                    columns[k].append(req_col[r])
            pw = workloads[req_kind[pr]]
            before, after = cpu_of(pw, pj, req_col[pr])
            end_wait(pr, pj, t + max(float(pw.durations[pj, req_col[pr]]) - before - after, 0.0))
            continue
        if w.background and w.background[j] > 0:
            # a request without io calls: its background CPU follows it (as the server's work between requests)
            hold(req_server[r], t, w.background[j])
        done_count += 1
        if done_count == warmup and warmup:
            measured_from = t
        if done_count > warmup:
            out[k].append(t - req_t0[r])
            if columns is not None:
                columns[k].append(req_col[r])
            if queueing is not None:
                queueing.requests[k] += 1
                queueing.loop_wait_ms[k] += req_loop_wait[r]
                queueing.pool_wait_ms[k] += req_pool_wait[r]
                queueing.core_wait_ms[k] += req_core_wait[r]
                queueing.span_ms = t - measured_from
        if done_count >= warmup + completions:
            break
        if issued < len(kinds):
            if think_ms > 0:
                push(t + think_ms, -1, -1, 2)  # the user thinks, then issues its next request
            else:
                new_request(t)
    return [np.asarray(x, dtype=np.float64) for x in out]


def simulate_scenario(
    graphs: Sequence[CausalGraph],
    models: Sequence[NodeDurations],
    scenario: Scenario,
    store: SupportsSelect | None,
    samples: int,
    rng: np.random.Generator,
    recorded: Sequence[NodeDurations] | None = None,
    queueing: Queueing | None = None,
) -> tuple[list[FloatArray], list[str]]:
    """Simulate a scenario with load and/or failure changes: per graph latencies, and notes saying how.

    ``queueing``, when given, is filled by the scenario's simulation (:class:`Queueing`).

    ``models`` are the graphs' node durations under the scenario's other changes (:func:`node_durations`);
    ``recorded`` the same requests' durations with none of them, as the simulation takes the recording: given,
    a scenario at the recorded load is predicted as a change to the recording (below); not given, the simulated
    latencies are returned as they are.

    When the scenario changes the idle gaps of the loop or of the services (location, tier and size lengthen
    io calls; load and failure fill the gaps with other requests' work) and the store has a wake-up profile
    (:mod:`analyzer.wakeup`), the simulation runs twice: once as recorded (the recorded durations, one user),
    to learn the idle gap before each piece of work in each request, then under the scenario, where each piece
    of work is charged what its gap adds beyond what its recorded gap did. Under load that is a credit: a busy
    loop does not pay the wake-ups its pieces paid at one user (the example's loop did 4-15% less CPU per
    request at 16 users than at one, ``benchmarks/whatif_accuracy.py``, runs 40-44).

    At one user per loop with every replica up (the load the spans were recorded at), durations as recorded
    (not calibrated to another deployment) and ``recorded`` given, the simulation predicts a *change*: each
    simulated request's latency is its recorded latency plus what the scenario's pass took beyond the
    recording's pass for the same request, drawn with the same random numbers (common random numbers). What
    the simulated loop gets wrong about a request as recorded (its queueing, its leftovers) then cancels, and
    with nothing changed the prediction is the recording (:func:`_as_change`). On the example's index page
    the simulated recording came out 1.7 ms (9%) below the recorded latencies at the median, so that every
    prediction from it started 21% off in median CDF deviation with nothing changed (``docs/accuracy.md``, run
    54).
    """
    load = scenario.load
    gaps_change = (scenario.changes_calls or (load is not None and load.users > 1)
                   or any(isinstance(c, Failure) for c in scenario.changes))
    profile = wake_profile(store) if store is not None and gaps_change else None
    # A loop demand measured at more users already holds the wake-ups the busier loop no longer pays
    measured = _loop_users(scenario) > 1 and any(len(_levels(g)) > 1 for g in graphs)
    measured_note = [("wake-up: the loop's idle gaps are not charged: its demand was measured at more users, "
                      "where it pays fewer wake-ups")] if measured and profile is not None else []
    profile = None if measured else profile
    services = service_wake_profiles(store) if store is not None and gaps_change else {}
    # what a wake-up itself costs the loop, fitted to its demand measured at more users (with_wake_cost)
    fixed = 0.0 if measured or not gaps_change else max(
        (_positive_meta(g, WAKE_COST_KEY) or 0.0 for g in graphs), default=0.0)
    neighbour, how = _neighbour(scenario, store)
    as_change = recorded is not None and at_recorded_load(scenario, graphs)
    if profile is None and fixed == 0.0 and not services and not as_change:
        latencies, notes = _simulate_once(graphs, models, scenario, store, samples, rng, neighbour=neighbour,
                                          queueing=queueing)
        return latencies, notes + measured_note + how
    spread = "the first loop work after them" if profile is None else (
        f"the loop work after them, what is still owed falling by e every {profile.tau_ms:.2g} ms of it ("
        + ("fitted to the profiled requests' steps" if profile.decay_ms > 0 else
           "half the work the profile's extra was measured on: its requests' median back to back") + ")")
    cost = _WakeCost(profile, spread, int(rng.integers(2**62)), services, fixed_ms=fixed)
    # Both passes draw the same sequence of requests (at one user, the same one after the other), so that a
    # piece of work is charged beyond what the same piece was charged after the same predecessor: with
    # sequences of their own, the idle before a post page (after an index page's leftovers, or not) differed
    # between the passes and spread its prediction with nothing changed (p10 0.17 ms low, p90 0.26 high).
    seed = int(rng.integers(2**62))
    if recorded is not None and as_change:
        # the recording as the scenario's pass models it (its pools, its loop), so that only the change differs
        first, reference = list(recorded), as_recorded(scenario)
    else:
        first, reference = [m.baseline() for m in models], Scenario(scenario.name, ())
    cols_0: list[list[int]] = [[] for _ in graphs]
    cols_s: list[list[int]] = [[] for _ in graphs]
    fitted = neighbour is not None
    base, _ = _simulate_once(graphs, first, reference, store, samples, np.random.default_rng(seed),
                             cost.cost(recording=True), cost.service_cost(recording=True), columns=cols_0,
                             fitted_cut=fitted)
    latencies, notes = _simulate_once(graphs, models, scenario, store, samples, np.random.default_rng(seed),
                                      cost.cost(recording=False), cost.service_cost(recording=False), neighbour,
                                      columns=cols_s, fitted_cut=fitted, queueing=queueing)
    notes += cost.describe() + measured_note + how
    if as_change:
        latencies, note = _as_change(models, base, latencies, cols_0, cols_s)
        notes.append(note)
    return latencies, notes


def _front_ends(scenario: Scenario) -> tuple[int, list[str]]:
    """The front ends left up under ``scenario``, and a note per front end it fails."""
    load = scenario.load or Load(1)
    alive, notes = load.replicas, []
    for f in scenario.changes:
        if isinstance(f, Failure) and f.is_app:
            fronts = f.replicas or (load.replicas if load.replicas > 1 else 2)
            alive = fronts - 1
            notes.append(f"failure: 1 of {fronts} front ends fails"
                         f"{'' if f.replicas or load.replicas > 1 else ' (2 assumed: give failure:app?replicas=R)'}")
    return alive, notes


def _loop_users(scenario: Scenario, alive_fronts: int | None = None) -> int:
    """Users per event loop under ``scenario``: its load's users over the front ends left up (``alive_fronts``,
    when already known from :func:`_front_ends`)."""
    alive = _front_ends(scenario)[0] if alive_fronts is None else alive_fronts
    return max(1, round((scenario.load or Load(1)).users / alive))


_LEVEL_FIELDS = ("users", "cpu_scale", "background_ms")


def _levels(graph: CausalGraph) -> list[dict[str, float]]:
    """``graph.meta[LEVELS_KEY]``'s rows (:data:`LEVELS_KEY`), checked; empty where absent."""
    return _rows(graph, LEVELS_KEY, _LEVEL_FIELDS, "cpu_scale")


def _others_levels(graph: CausalGraph) -> list[dict[str, float]]:
    """``graph.meta[OTHERS_LEVELS_KEY]``'s rows (:data:`OTHERS_LEVELS_KEY`), checked; empty where absent."""
    return _rows(graph, OTHERS_LEVELS_KEY, ("users", OTHERS_KEY), None)


def _rows(graph: CausalGraph, key: str, fields: Sequence[str], positive: str | None) -> list[dict[str, float]]:
    """``graph.meta[key]`` as rows of ``fields``, checked: users ascending from 1 up, every value finite and
    non-negative, ``positive`` above 0. Empty where absent.

    Raises
    ------
    GraphError
        If the entry is not such a list, naming the graph's route.
    """
    raw = graph.meta.get(key)
    if raw is None:
        return []
    what = (f"graph {graph.route!r}: meta {key!r} must be a list of {{{', '.join(fields)}}} with users ascending "
            f"from 1 up{f', {positive} > 0' if positive else ''} and times >= 0")
    try:
        rows = [{k: float(row[k]) for k in fields} for row in raw]
    except (TypeError, ValueError, KeyError):
        raise GraphError(f"{what}, got {raw!r}") from None
    users = [r["users"] for r in rows]
    if (not rows or users[0] < 1 or any(b <= a for a, b in itertools.pairwise(users))
            or not all((positive is None or r[positive] > 0) and all(v >= 0 and math.isfinite(v) for v in r.values())
                       for r in rows)):
        raise GraphError(f"{what}, got {raw!r}")
    return rows


def _at_load(graph: CausalGraph, users: int) -> CausalGraph:
    """``graph`` with the loop's demand (its CPU scale and background, ``LEVELS_KEY``) and the host's other
    processes' CPU (``OTHERS_LEVELS_KEY``) at ``users`` per loop, from their measured levels: MVASD's load-varying
    demand (Kattepur and Nambiar, IPDPS Workshops 2015, Algorithm 2), interpolated linearly between the levels
    rather than by their cubic spline (with two or three levels of a few hundred requests each, a cubic would
    carry their noise between them) and held past the last, as their eq. 12 holds the spline's ends. Each is
    unchanged without levels of its own.
    """
    extra: dict[str, float] = {}
    for rows, fields in ((_levels(graph), ((CPU_SCALE_KEY, "cpu_scale"), (BACKGROUND_KEY, "background_ms"))),
                         (_others_levels(graph), ((OTHERS_KEY, OTHERS_KEY),))):
        if len(rows) >= 2 and users > rows[0]["users"]:
            n = [r["users"] for r in rows]
            extra.update({key: float(np.interp(users, n, [r[field] for r in rows])) for key, field in fields})
    return _with_meta(graph, extra) if extra else graph


def at_recorded_load(scenario: Scenario, graphs: Sequence[CausalGraph]) -> bool:
    """Whether ``scenario`` runs at the load the graphs were recorded at (one user per loop, every replica up,
    durations not calibrated to another deployment): where :func:`simulate_scenario` predicts the change to the
    recording, given the recording's durations (:func:`as_recorded`)."""
    load = scenario.load
    return ((load is None or load.users <= 1) and not any(isinstance(c, Failure) for c in scenario.changes)
            and not any(_recalibrated(g) for g in graphs))


def as_recorded(scenario: Scenario) -> Scenario:
    """``scenario`` with no change but its load (and pools): the recording as its simulation models it."""
    return replace(scenario, changes=tuple(c for c in scenario.changes if isinstance(c, Load)))


def _meta_number(graph: CausalGraph, key: str) -> float | None:
    """``graph.meta[key]`` as a float, None where absent; :class:`GraphError` naming the graph and the key
    unless it is a finite number >= 0."""
    raw = graph.meta.get(key)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not (math.isfinite(raw) and raw >= 0):
        raise GraphError(f"graph {graph.route!r} (variant {graph.variant}): meta {key!r} must be a finite number "
                         f">= 0, got {raw!r}")
    return float(raw)


def _positive_meta(graph: CausalGraph, key: str) -> float | None:
    """``graph.meta[key]`` where it is above 0, else None (absent or 0); checked by :func:`_meta_number`."""
    x = _meta_number(graph, key)
    return x if x is not None and x > 0 else None


def check_meta(graph: CausalGraph) -> None:
    """Check what a calibration writes in ``graph.meta`` (the numbers, the levels): a file edited by hand gets
    :class:`GraphError` naming the graph and the key before anything is simulated, not a silent default."""
    for key in _NUMBER_KEYS:
        _meta_number(graph, key)
    _levels(graph)
    _others_levels(graph)


def _recalibrated(graph: CausalGraph) -> bool:
    """Whether the graph's durations were calibrated to a deployment other than the recorded one (the app
    without the collector, :func:`with_background`), whose latencies the recording does not give."""
    scale = _meta_number(graph, CPU_SCALE_KEY)
    return WAIT_SCALE_KEY in graph.meta or (scale is not None and scale < 1.0)


def _as_change(models: Sequence[NodeDurations], recorded: Sequence[FloatArray], simulated: Sequence[FloatArray],
               cols_0: Sequence[Sequence[int]], cols_s: Sequence[Sequence[int]]) -> tuple[list[FloatArray], str]:
    """Each simulated request's recorded latency plus the scenario pass's latency less the recording pass's for
    the same request (same workload, column and place in the sequence): a prediction of the change, by common
    random numbers (A. M. Law, *Simulation Modeling and Analysis*, 5th ed., 2015, section 11.2).

    ``recorded``/``simulated``: the two passes' latencies per workload, ``cols_0``/``cols_s`` their columns.
    Returns the latencies per workload and a note with the simulated recording's mean error, which cancels.
    """
    out: list[FloatArray] = []
    error_sum = 0.0
    error_n = 0
    for m, lat_0, lat_s, c0, cs in zip(models, recorded, simulated, cols_0, cols_s, strict=True):
        n = min(lat_0.size, lat_s.size)
        if n == 0 or list(c0[:n]) != list(cs[:n]):
            out.append(lat_s)  # the passes did not draw the same requests: nothing to pair
            continue
        seen = evaluate_plan(m.plan, m.base, m.idx[np.asarray(cs[:n], dtype=np.intp)])
        error_sum += float(np.sum(lat_0[:n] - seen))
        error_n += n
        out.append(np.maximum(seen + lat_s[:n] - lat_0[:n], 0.0))
    note = ("one user, the recorded load: each request predicted as its recorded latency plus what the "
            "scenario's simulation takes beyond the recording's, on the same random numbers (the simulated "
            f"recording came out {error_sum / max(error_n, 1):+.3f} ms from the recorded latencies on average)")
    return out, note


def _neighbour(scenario: Scenario, store: SupportsSelect | None) -> tuple[Neighbour | None, list[str]]:
    """A CPU neighbour's cost to the loop's spells of work (:data:`Neighbour`), or None without CPU profiles.

    The probes behind the profiles sleep and then run W ms of work, timed from the wake-up: what the loop does
    from the moment an answer wakes it until it idles again, one wake-up serving every callback that is ready
    (a fan-out whose answers arrive together pays one). So the simulation charges each spell of the loop's
    work what the profiles say for that much work, at the quantile of the neighbour's phase when the spell
    starts (:func:`analyzer.interference.phase_quantiles`) and, where the probes slept in classes, at how long
    the loop slept before it, piece by piece as the spell grows.
    """
    cpu = [c for c in scenario.changes if isinstance(c, Interference)]
    profile = stretch_profile(store, cpu[-1].cpu_pct) if cpu and store is not None else None
    if profile is None:
        return None, []
    return profile.at, [f"interference: each spell of the simulated loop's work, from a wake-up until it idles, "
                        f"takes the CPU profiles' extra for that much work at the neighbour's phase when it "
                        f"starts{' and after the sleep before it' if profile.gap_ms.size else ''}, from {profile.how}"]


class _WakeCost:
    """What the loop's idle gaps add to the work after them: recorded in a baseline pass, charged beyond that in
    the scenario's pass (:func:`simulate_scenario`).

    A gap's extra (:meth:`WakeProfile.at`) is paid by the loop work after it, the first the most: what is still
    owed falls by a factor e with every :attr:`WakeProfile.tau_ms` of work (a short step after a gap runs slow,
    but does not pay for a whole request's warm-up). A gap that comes before it is paid is priced together with
    the idle still behind it (the earlier gap, in the share of its extra still owed): a host idle for 10 ms,
    awake for 0.2 ms and idle for 10 ms again is about as cold as after one 20 ms spell. The quantile of each
    gap is a hash of the work that ends it (workload, node, column, site), so that both passes draw the same one.

    The services' own (:func:`~analyzer.wakeup.service_wake_profiles`): each io call to a resource with a
    profile is charged what the resource's idle before it adds, beyond what the call's recorded idle added.
    """

    _MASK = (1 << 64) - 1

    def __init__(self, profile: WakeProfile | None, spread: str, salt: int,
                 services: Mapping[str, WakeProfile] | None = None, *, fixed_ms: float = 0.0) -> None:
        self.profile = profile
        self.fixed_ms = fixed_ms
        self.spread = spread
        self.salt = salt
        self.services = dict(services or {})
        self.resolved: dict[str, WakeProfile | None] = {}
        self.base: dict[tuple[int, int, int, int], list[float]] = {}
        self.charged = 0
        self.total_ms = 0.0
        self.calls = 0
        self.calls_ms = 0.0

    def _u(self, k: int, j: int, col: int, site: int) -> float:
        # splitmix64 finaliser: a uniform draw per place, the same in both passes, without a table per sample
        x = (self.salt + k * 0x9E3779B97F4A7C15 + j * 0xBF58476D1CE4E5B9 + col * 0x94D049BB133111EB
             + site * 0x2545F4914F6CDD1D) & self._MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & self._MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & self._MASK
        return ((x ^ (x >> 31)) >> 11) / float(1 << 53)

    def _beyond(self, key: tuple[int, int, int, int], extra: float, recording: bool) -> float:
        """``extra`` less what the same piece of work was charged as recorded (the recording pass: 0).

        A sample the recording pass did not draw (under load, the scenario's pass draws more requests of a
        route than the recording pass did) takes what its node and site were charged there on average.
        """
        node = (key[0], key[1], -1, key[3])
        if recording:
            for k in (key, node):
                acc = self.base.setdefault(k, [0.0, 0.0])
                acc[0] += extra
                acc[1] += 1.0
            return 0.0  # the recorded durations already hold it
        acc = self.base.get(key) or self.base.get(node)
        return extra - acc[0] / acc[1] if acc is not None else extra

    def service_cost(self, *, recording: bool) -> Callable[[int, int, int, str, float], float] | None:
        """One pass's callback for the io calls of resources with a service wake-up profile, or None."""
        if not self.services:
            return None

        def wake(k: int, j: int, col: int, resource: str, idle: float) -> float:
            if resource not in self.resolved:
                self.resolved[resource] = service_profile_for(resource, self.services)
            profile = self.resolved[resource]
            if profile is None:
                return 0.0
            extra = self._beyond((k, j, col, 4), profile.at(idle, self._u(k, j, col, 4)), recording)
            if not recording and extra != 0.0:
                self.calls += 1
                self.calls_ms += extra
            return extra

        return wake

    def cost(self, *, recording: bool) -> Wake | None:
        """One pass's callback for :func:`simulate` (its own warm-up state per loop), or None without a profile
        of the loop."""
        if self.profile is None and self.fixed_ms <= 0:
            return None
        profile, fixed = self.profile, self.fixed_ms
        tau = profile.tau_ms if profile is not None else 0.0
        # server -> [extra still owed (ms), owed when the loop woke (ms), idle behind the cold spell (ms)]
        cold: dict[int, list[float]] = {}

        def wake(k: int, j: int, col: int, site: int, gap: float, d: float, server: int) -> float:
            state = cold.setdefault(server, [0.0, 0.0, 0.0])
            if gap > 0:
                # Idle spells a little work apart add up: two 10 ms waits 0.2 ms of work apart leave the host as
                # cold as one 20 ms wait (measured on the post page under a location scenario: +0.8 ms, where
                # the profile gives +0.2 for 10 ms and +0.7 for 20). The idle of the spell before still counts
                # in the share of its extra not yet paid.
                idle = gap + (state[2] * state[0] / state[1] if state[1] > 0 else 0.0)
                # a wake-up's own cost (the sleep in select(), the switch back) beside what the idle adds
                cooled = profile.at(idle, self._u(k, j, col, site)) if profile is not None else 0.0
                owed = max(fixed + cooled, state[0])
                state[0], state[1], state[2] = owed, owed, idle
            # the first work after a wake-up is the slowest: each ms of it pays 1/tau of what is still owed
            part = (state[0] * -math.expm1(-d / tau) if tau > 0 else state[0]) if d > 0 else 0.0
            state[0] -= part
            extra = self._beyond((k, j, col, site), part, recording)
            if not recording and extra != 0.0:
                self.charged += 1
                self.total_ms += extra
            return extra

        return wake

    def describe(self) -> list[str]:
        out = []
        if self.profile is not None or self.fixed_ms > 0:
            what = [f"the {self.profile.how}"] if self.profile is not None else []
            if self.fixed_ms > 0:
                what.append(f"{self.fixed_ms:.3g} ms of loop work per wake-up itself (fitted to the loop's demand "
                            "measured at a few loads)")
            out.append(f"wake-up: what the loop's idle gaps add to {self.spread}, from {' and '.join(what)}, beyond "
                       f"what the same work's gaps as recorded cost ({self.charged} pieces of work, "
                       f"{self.total_ms / max(self.charged, 1):+.3f} ms each on average)")
        for resource, p in sorted(self.resolved.items()):
            if p is not None:
                out.append(f"service wake-up: what {resource}'s idle before a call adds to it, from the {p.how}, "
                           f"beyond what the call's recorded idle did")
        if self.services:
            out.append(f"service wake-ups charged on {self.calls} calls, {self.calls_ms / max(self.calls, 1):+.3f} "
                       f"ms each on average")
        return out


def _simulate_once(
    graphs: Sequence[CausalGraph],
    models: Sequence[NodeDurations],
    scenario: Scenario,
    store: SupportsSelect | None,
    samples: int,
    rng: np.random.Generator,
    wake: Wake | None = None,
    service_wake: Callable[[int, int, int, str, float], float] | None = None,
    neighbour: Neighbour | None = None,
    columns: list[list[int]] | None = None,
    fitted_cut: bool | None = None,
    queueing: Queueing | None = None,
) -> tuple[list[FloatArray], list[str]]:
    """:func:`simulate_scenario`'s one pass; ``wake`` as for :func:`simulate`, ``service_wake`` too but told the
    resource's name where :func:`simulate`'s is told its group; ``queueing`` filled where given."""
    load = scenario.load or Load(1)
    failures = [c for c in scenario.changes if isinstance(c, Failure)]
    alive_fronts, notes = _front_ends(scenario)
    users = _loop_users(scenario, alive_fronts)
    graphs = [_at_load(g, users) for g in graphs]
    levels = sorted({int(row["users"]) for g in graphs for row in _levels(g)})
    if users > 1 and len(levels) > 1:
        notes.append(f"the loop's demand at {users} users per loop from its measured levels "
                     f"({', '.join(map(str, levels))} users): interpolated between them, held past the last")
    notes.append(f"load: {load.users} closed-loop users over {alive_fronts} front end(s) -> {users} per event loop"
                 f"{f', think {load.think_ms:g} ms' if load.think_ms else ''}; compute nodes share one FIFO loop")

    if load.mix:
        total = sum(w for _, w in load.mix)
        notes.append("mix: users request " + ", ".join(f"{route} {w / total:.0%}" for route, w in load.mix)
                     + " (the scenario's shares, not the recorded ones)")
    pool_names = [name for name, _ in load.pools]
    notes += [f"pool {name}: at most {limit} calls in flight per front end" for name, limit in load.pools]
    backend = [f for f in failures if not f.is_app]
    group_ids: dict[str, int] = {}
    group_scale: list[float] = []
    group_names: list[str] = []  # the resource of each group's first call, for service wake-up profiles
    failed_groups: dict[int, Failure] = {}
    for f in backend:
        endpoints = {n.resource for g in graphs for n in g.nodes if matches(f.resource, n)}
        count = f.replicas or (len(endpoints) if len(endpoints) > 1 else 2)
        gid = group_ids.setdefault(f"failure:{f.resource}", len(group_scale))
        # One endpoint (a balancer in front of the replicas) was profiled as a whole: its calls now load
        # count - 1 replicas instead of count, so a level L there is the profile's L * count / (count - 1).
        # Distinct endpoints were profiled one by one: the calls to all of them now share count - 1.
        group_scale.append((1.0 if len(endpoints) > 1 else count) / (count - 1))
        group_names.append(next(iter(sorted(endpoints)), f.resource))
        failed_groups[gid] = f
        notes.append(f"failure: 1 of {count} replicas of {f.resource!r} fails; the {count - 1} left carry its calls"
                     f"{'' if f.replicas or len(endpoints) > 1 else ' (2 assumed: give ?replicas=R)'}")

    neighbours = [c for c in scenario.changes if isinstance(c, Interference)]
    # a neighbour without CPU profiles: the fair share, as analyzer.predict stretched the calls' durations
    stretch = cpu_slowdown(neighbours[-1].cpu_pct) if neighbours and neighbour is None else 1.0
    nesting = _Nesting(graphs, models, load.nested, load.mix)
    curves = _Curves(store, scenario)
    # One user per loop with every replica up is the load the durations were recorded at: they hold its
    # concurrency already. Shifted, a fan-out's calls read ten where they recorded two or three: the simulated
    # loop starts them before any answer comes, where the recorded answers came sooner and waited for the loop
    # (the example's index page came out 0.3-1.15 ms above its recording with nothing changed).
    shift_levels = users > 1 or bool(failed_groups)
    ready_nodes = io_cpu_nodes = calibrated_nodes = pool_waits = sync_nodes = loop_cpu_nodes = hidden_nodes = 0
    client_side: dict[str, float] = {}  # route -> its requests' time outside the server span, where given
    steps_merged = 0
    # The loop's work outside the steps where it ran, when an answer comes in (the background demand is what the
    # process spends beside it), and an io call's CPU with its task's steps. Under a CPU neighbour the pieces stay
    # as the probes' model was fitted on them (the read callbacks in the waits, stretched; the calls' CPU queued on
    # its own): cut the new way, the example's index page under a neighbour at 50% came out 5.4 ms high with the
    # background as recorded, 1.6-3.0 ms lower than the old cut with the callbacks taken out of it
    # (docs/accuracy.md, runs 85-86). ``fitted_cut``: the scenario has such a neighbour, told to the pass that
    # simulates the recording too, so that both passes cut the loop's work alike.
    hidden_on_loop = not fitted_cut if fitted_cut is not None else neighbour is None
    parts: list[tuple[Any, ...]] = []
    for gi, (graph, model) in enumerate(zip(graphs, models, strict=True)):
        durations = model.sample_matrix()
        scale = _positive_meta(graph, CPU_SCALE_KEY)
        wait_scale = _positive_meta(graph, WAIT_SCALE_KEY)
        client_ms = _positive_meta(graph, CLIENT_KEY) or 0.0
        if client_ms > 0:
            client_side[graph.route] = client_ms
        on_loop, pool, group, nested, server = [], [], [], [], []
        cpu_before, cpu_after = np.zeros_like(durations), np.zeros_like(durations)
        hidden = np.zeros_like(durations) if neighbour is not None or hidden_on_loop else None
        for j, node_id in enumerate(model.plan.ids):
            node = graph.node(node_id)
            on_loop.append(node.kind is NodeKind.COMPUTE)
            unheld = node.extra.get("hidden_ms")
            recorded_hidden = (np.asarray(unheld, dtype=np.float64)[model.idx]
                               if isinstance(unheld, list) and len(unheld) == model.base.shape[1] else None)
            if hidden is not None and recorded_hidden is not None:
                hidden[j] = recorded_hidden * (scale if scale is not None else 1.0)
                hidden_nodes += 1
            if node.kind is NodeKind.IO and len(node.cpu_ms) == model.base.shape[1]:
                io_cpu_nodes += 1
                cpu_before[j], cpu_after[j] = _io_cpu(node, model.idx)
                if stretch != 1.0:  # a CPU neighbour: as analyzer.predict stretched the call's duration
                    cpu_before[j] *= stretch
                    cpu_after[j] *= stretch
            if j in model.loop_cpu:
                # a bigger answer to take in: the loop is held for the caller's extra CPU, and the calls queue
                # for it here, where the profile's callers did among themselves
                added, queued = model.loop_cpu[j]
                cpu_after[j] = np.maximum(cpu_after[j] + added, 0.0)
                durations[j] = np.maximum(durations[j] - queued, cpu_before[j] + cpu_after[j])
                loop_cpu_nodes += 1
            ready = node.extra.get("ready_ms")
            if scale is not None and node.kind is NodeKind.IO:
                # calibrated: the call's CPU is the process's own share only (the collector's cost taken out), and
                # so is the loop's work in its wait (hidden_ms, which the CPU scale was measured against too)
                held = cpu_before[j] + cpu_after[j] + (recorded_hidden if recorded_hidden is not None else 0.0)
                durations[j] = np.maximum(durations[j] - (1.0 - scale) * held, 0.0)
                cpu_before[j] *= scale
                cpu_after[j] *= scale
            if (scale is not None and node.kind is NodeKind.COMPUTE
                    and len(node.cpu_ms) == model.base.shape[1]):
                # calibrated: a segment holds the loop for its CPU time without the collector's share; its
                # recorded wall time beyond that was contention (other threads, processes), which is simulated
                cpu = np.asarray(node.cpu_ms, dtype=np.float64)[model.idx]
                changed = durations[j] - model.base[j][model.idx]  # what the scenario's other changes added
                durations[j] = np.maximum(cpu * scale + changed, 0.0)
                calibrated_nodes += 1
            elif node.kind is NodeKind.COMPUTE and isinstance(ready, list) and len(ready) == model.base.shape[1]:
                # The recorded segment includes the wait for the loop before the task first ran: that wait is
                # what the simulation reproduces, so the loop is held for the rest only.
                waited = np.asarray(ready, dtype=np.float64)[model.idx]
                durations[j] = np.maximum(durations[j] - waited, 0.0)
                ready_nodes += 1
            queued = node.extra.get("queued_ms")
            if node.kind is NodeKind.SYNC and isinstance(queued, list) and len(queued) == model.base.shape[1]:
                # the wake-up after a gather, wait or TaskGroup ran behind other tasks' steps: queueing for the
                # loop, which the simulation reproduces when the next step queues on it
                durations[j] = np.maximum(durations[j] - np.asarray(queued, dtype=np.float64)[model.idx], 0.0)
                sync_nodes += 1
            target, srv = nesting.target(gi, j, node, durations)
            if node.kind is NodeKind.IO:
                # the CPU is part of the call's duration: never more than it (a client side shortened by nesting)
                total = cpu_before[j] + cpu_after[j]
                shrink = np.where(total > durations[j], durations[j] / np.maximum(total, 1e-12), 1.0)
                cpu_before[j] *= shrink
                cpu_after[j] *= shrink
            if wait_scale is not None and _scaled_wait(node, target):
                # calibrated: what is not the loop's CPU (a wake-up, a call the process serves itself) is scaled
                # to the latency the app has without the collector
                held = (cpu_before[j] + cpu_after[j] + (hidden[j] if hidden is not None else 0.0)
                        if node.kind is NodeKind.IO else 0.0)
                durations[j] = held + np.maximum(durations[j] - held, 0.0) * wait_scale
            if node.kind is NodeKind.START and client_ms > 0:
                durations[j] = durations[j] + client_ms  # the request's time outside the server span, first
            nested.append(target)
            server.append(srv)
            if node.kind is not NodeKind.IO:
                pool.append(-1)
                group.append(-1)
                continue
            pool.append(next((i for i, name in enumerate(pool_names) if matches(name, node)), -1))
            key = next((f"failure:{f.resource}" for f in backend if matches(f.resource, node)), node.resource)
            if key not in group_ids:
                group_ids[key] = len(group_scale)
                group_scale.append(1.0)
                group_names.append(node.resource)
            group.append(group_ids[key])
            if target < 0 and shift_levels:
                curves.register(gi, j, node, durations[j], model.idx)
        if hidden_on_loop:
            steps_merged += _with_steps(graph, model.plan, durations, cpu_before, cpu_after, on_loop, nested)
        has_cpu = bool(cpu_before.any() or cpu_after.any())
        holds, held_pool = _pool_holders(graph, model.plan.ids, pool)
        for w in _pool_waits(graph, model.plan.ids, held_pool):
            durations[w] = 0.0  # the recorded wait for a connection: the simulated pool makes its own
            pool_waits += 1
        parts.append((model.plan, durations, tuple(on_loop), held_pool, tuple(group), tuple(nested), tuple(server),
                      cpu_before if has_cpu else None, cpu_after if has_cpu else None, holds, hidden))
    # weights once every nested call is known
    weights = [nesting.weight(gi) for gi in range(len(graphs))]
    background, how = _background(graphs, [p[0] for p in parts], weights, users,
                                  cpu_slowdown(neighbours[-1].cpu_pct) if neighbours else 1.0,
                                  served_hidden=hidden_on_loop)
    if how:
        notes.append(how)
    others, cores, how = _others(graphs, [p[0] for p in parts], weights, users)
    if how:
        notes.append(how)
    # At one user per loop the recorded durations hold the threads' waits for the GIL already
    threaded = [tuple(users > 1 and graph.node(i).kind is NodeKind.IO and graph.node(i).system in THREAD_SYSTEMS
                      for i in part[0].ids) for graph, part in zip(graphs, parts, strict=True)]
    # a compute node after a sync point or another step only runs from the ready queue: no wake-up before it
    internal = (NodeKind.SYNC, NodeKind.COMPUTE)
    sleeps = [tuple(not (graph.node(i).kind is NodeKind.COMPUTE and part[0].preds[j]
                         and all(graph.node(part[0].ids[p]).kind in internal for p in part[0].preds[j]))
                    for j, i in enumerate(part[0].ids))
              for graph, part in zip(graphs, parts, strict=True)]
    workloads = [Workload(plan, durations, loop, pool, group, weights[gi], nested, server, before, after,
                          background[gi], holds, threaded[gi], hidden, others[gi], sleeps[gi])
                 for gi, (plan, durations, loop, pool, group, nested, server, before, after, holds, hidden)
                 in enumerate(parts)]
    if any(any(t) for t in threaded):
        systems = sorted({graph.node(i).system for graph, part, t in zip(graphs, parts, threaded, strict=True)
                          for i, x in zip(part[0].ids, t, strict=True) if x})
        notes.append(f"io served by a thread of the app ({', '.join(systems)}): the thread waits for the GIL to "
                     f"take each call and to hand its answer back, while the loop has queued work, at most "
                     f"{GIL_SWITCH_MS:g} ms each")
    if pool_waits:
        notes.append(f"{pool_waits} recorded waits for a pooled connection left out: the simulated pool makes them")
    if any(h >= 0 for w in workloads for h in w.holds):
        notes.append("a pooled connection is returned when the calling task's next step ends (where the pool "
                     "takes it back), not when the answer arrives: under load that step waits for the loop too")
    if client_side:
        outside = ", ".join(f"{route} {ms:.3g} ms" for route, ms in sorted(client_side.items()))
        notes.append(f"client side: each request starts with its time outside the server span ({outside}: the "
                     "network, the client's own work, the server reading the request and writing the answer), so the "
                     "latency predicted is the client's")
    waits = sorted({round(float(g.meta[WAIT_SCALE_KEY]), 3) for g in graphs if WAIT_SCALE_KEY in g.meta})
    if waits:
        notes.append(f"calibrated waits: wake-ups, start/end and the calls the process serves itself x "
                     f"{', '.join(map(str, waits))} (so that the light load takes as long as the app without the "
                     "collector did; a call another process serves keeps its wait)")
    if calibrated_nodes:
        factors = sorted({round(float(g.meta[CPU_SCALE_KEY]), 3) for g in graphs if CPU_SCALE_KEY in g.meta})
        notes.append(f"calibrated CPU: {calibrated_nodes} compute nodes hold the loop for their CPU time x "
                     f"{', '.join(map(str, factors))} (min(1, the process's measured CPU / the CPU the nodes record))")
    if io_cpu_nodes:
        notes.append(f"{io_cpu_nodes} io nodes hold the loop for their recorded CPU (the client library's work "
                     "before and after the wait); only the rest of the call overlaps")
    if steps_merged:
        notes.append(f"{steps_merged} io calls' CPU before or after their wait runs in one turn of the loop with the "
                     "step of their task that makes the call or takes in its answer")
    if hidden_nodes and hidden_on_loop:
        notes.append(f"{hidden_nodes} io nodes' loop work outside any step (read callbacks, the loop's own turn: "
                     "hidden_ms) holds the loop when their answer comes in, out of their wait")
    elif hidden_nodes:
        notes.append(f"interference: {hidden_nodes} io nodes' loop work outside any step (read callbacks, the loop's "
                     "own turn: hidden_ms) is stretched with the spell that takes in their answer")
    if loop_cpu_nodes:
        notes.append(f"{loop_cpu_nodes} io nodes hold the loop for the caller's CPU the scenario adds to them (a "
                     "bigger answer to take in), the calls queueing for it on the simulated loop")
    for gid, f in failed_groups.items():
        if not curves.has_group(gid, workloads):
            raise ProfileError(
                f"scenario {scenario.name!r}: failure:{f.resource} changes nothing without a concurrency-"
                f"parameterised profile of its calls (the survivors' latency at their higher concurrency); "
                "measure one with 'perfcast profile ... --concurrency'"
            )
    if ready_nodes:
        notes.append(f"{ready_nodes} compute nodes hold the loop without their recorded wait to first run "
                     "(ready_ms): the simulation queues them instead")
    if sync_nodes:
        notes.append(f"{sync_nodes} synchronisation points wake their task without the recorded wait behind other "
                     "tasks' steps (queued_ms): the simulation queues the next step instead")
    notes += nesting.describe()
    notes += curves.describe()
    user_routes = len({g.route for g, w in zip(graphs, weights, strict=True) if w > 0})
    loaded = load.users > 1 or bool(failures)
    if queueing is None and loaded:
        queueing = Queueing()
    latencies = simulate(
        workloads, users, samples * max(user_routes, 1), rng, think_ms=load.think_ms,
        pool_sizes=[limit for _, limit in load.pools], scale=group_scale,
        adjust=curves.adjust if curves.any else None, routes=nesting.routes, servers=nesting.servers, wake=wake,
        gil_switch_ms=GIL_SWITCH_MS, neighbour=neighbour,
        service_wake=None if service_wake is None else (
            lambda k, j, col, g, idle: service_wake(k, j, col, group_names[g], idle)),
        columns=columns, hidden_on_loop=hidden_on_loop, queueing=queueing, cores=cores,
    )
    if queueing is not None:
        notes += _queueing_note(graphs, latencies, queueing, bool(load.pools))
        notes += _host_note(graphs, latencies, [w > 0 for w in weights], load.users, load.think_ms,
                            simulated=queueing if cores > 0 else None)
    return latencies, notes


def _queueing_note(graphs: Sequence[CausalGraph], latencies: Sequence[FloatArray], queueing: Queueing,
                   pooled: bool) -> list[str]:
    """Where each route's simulated requests waited under load: for the loop, for a pooled connection.

    What bounds a route tells what would help it: a route that waits mostly for connections gains from a bigger
    pool, one that waits for the loop from less CPU per request or another front end. On the example app at 16
    users, the post page (one pooled query, its connection's reset, one blob) waited 25 of its 32 ms for a
    connection of the pool of four, which the index pages' 13 pooled calls each kept busy, and 4.5 ms for the
    loop (``docs/accuracy.md``, run 87).
    """
    by_route: dict[str, list[int]] = {}
    for k, g in enumerate(graphs):
        if queueing.requests[k] > 0:
            by_route.setdefault(g.route, []).append(k)
    parts = []
    for route, ks in by_route.items():
        n = sum(queueing.requests[k] for k in ks)
        mean = float(np.mean(np.concatenate([latencies[k] for k in ks])))
        loop = sum(queueing.loop_wait_ms[k] for k in ks) / n
        text = f"{route} (mean {_ms(mean)} ms) {_ms(loop)} ms for the loop"
        calls = sum(queueing.pool_calls[k] * queueing.requests[k] for k in ks) / n
        if pooled and calls > 0:
            text += (f", {_ms(sum(queueing.pool_wait_ms[k] for k in ks) / n)} ms for a pooled connection over "
                     f"{calls:.3g} call{'s' if calls != 1 else ''}")
        core = sum(queueing.core_wait_ms[k] for k in ks) / n if queueing.core_wait_ms else 0.0
        if core > 0:
            text += f", {_ms(core)} ms for a host core (its calls' backends)"
        parts.append(text)
    if not parts:
        return []
    return [f"queueing per request, summed over its steps and calls (parallel ones each counted): "
            f"{'; '.join(parts)}; the loop {queueing.loop_busy:.0%} busy"]


def _ms(value: float) -> str:
    """Milliseconds to three significant digits, whole from 1000 on (``1154``, not ``1.15e+03``).

    >>> _ms(0.04567), _ms(61.94), _ms(1154.4)
    ('0.0457', '61.9', '1154')
    """
    return f"{value:.0f}" if abs(value) >= 999.5 else f"{value:.3g}"


def _host_note(graphs: Sequence[CausalGraph], latencies: Sequence[FloatArray], user_routes: Sequence[bool],
               users: int, think_ms: float, *, simulated: Queueing | None = None) -> list[str]:
    """How busy the host's cores would be at the simulated throughput, where the graphs carry the host's CPU per
    request (``HOST_CPU_KEY``), and a caution past :data:`HOST_BUSY_WARN`.

    The simulation serves the app's loop and takes every call's duration from the recording or a profile; it
    does not know that a database, a cache or a load client on the same host, and the app's loop itself, wait
    for a core once the host's cores are full. On the accuracy benchmark's two-core machine the processes beside
    the app took more CPU per request than its loop, the cores were all but full at 16 users, and the loop idled
    8-14% of the time waiting for them (``docs/accuracy.md``, runs 77-80). The utilisation is the closed-loop
    throughput ``users / (mean latency + think)`` times the CPU per request measured at the recorded load, over
    the cores (the utilisation law); processes that wake less often per request under load need less than that
    (on the benchmark 23-26% less at 16 users), so read it as an upper estimate: in run 81 it gave 113% and 110%
    where the cores were measured 88% and 95% busy. The two effects pull the latency opposite ways, and the
    benchmark's loaded index page came out from 23 ms low to 14 ms high on about 200 ms across runs 77-81: the
    note says where the prediction is weak, not which way it errs. ``simulated``: the simulation's queueing where
    it queued the loop and the other processes for the cores, from CPU per request measured near the simulated
    load (:func:`_others`): the note then gives the cores' utilisation in the simulation.
    """
    if simulated is not None:
        return [f"host: its {simulated.cores} cores {simulated.core_busy:.0%} busy in the simulation"]
    host = [_meta_number(g, HOST_CPU_KEY) or 0.0 for g in graphs if HOST_CPU_KEY in g.meta]
    cpus = [int(_meta_number(g, HOST_CPUS_KEY) or 0) for g in graphs if HOST_CPU_KEY in g.meta]
    served = [lat for lat, user in zip(latencies, user_routes, strict=True) if user and lat.size]
    if not host or not served or max(cpus) <= 0:
        return []
    cycle_ms = float(np.mean(np.concatenate(served))) + think_ms
    throughput = users / cycle_ms * 1000.0 if cycle_ms > 0 else 0.0
    busy = throughput * max(host) / 1000.0 / max(cpus)
    note = (f"host: {max(host):.3g} ms of CPU per request at the recorded load (the app and every other process on "
            f"it), {max(cpus)} CPUs: at the predicted {throughput:.4g} requests/s its cores would be {busy:.0%} busy")
    if busy > HOST_BUSY_WARN:
        note += ("; near or past their capacity the app's loop and the processes beside it (a database, cache or "
                 "client on the same host) wait for a core, and those processes need less CPU per request than at "
                 "one user; the simulation holds neither, so this prediction is less certain than its spread shows")
    return [note]


def _same_task(graph: CausalGraph, neighbours: Iterable[str], where: Mapping[str, int], task: str,
               kind: NodeKind) -> list[str]:
    """The nodes among ``neighbours`` (in the plan) of ``kind`` that belong to ``task``."""
    return [n for n in neighbours if n in where and graph.node(n).kind is kind and graph.node(n).task == task]


def _with_steps(graph: CausalGraph, plan: DagPlan, durations: FloatArray, cpu_before: FloatArray,
                cpu_after: FloatArray, on_loop: Sequence[bool], nested: Sequence[int]) -> int:
    """Serve an io call's CPU before its wait with the compute node of its task that makes the call, and its CPU
    after the wait with the one that takes in the answer (in place); returns how many calls moved either.

    A task step runs to its next ``await`` in one turn of the loop: the code before the call, the client
    library's serialising and the write are one piece of loop work, and so are the answer's parsing and the code
    after it. Queued apart, the steps of other tasks ready meanwhile would run between them: a ``gather`` of ten
    blob fetches and two queries would send the queries after every fetch's first step, where the app sends
    each in its own (the example's index page under +10 ms to PostgreSQL came out 1.6 ms long in its gather,
    ``docs/accuracy.md``, run 85). Calls made through a nested route keep their CPU (their client side).
    """
    ids = plan.ids
    where = {node_id: j for j, node_id in enumerate(ids)}
    moved = 0
    for j, node_id in enumerate(ids):
        node = graph.node(node_id)
        if node.kind is not NodeKind.IO or nested[j] >= 0:
            continue
        merged = False
        preds = plan.preds[j]
        if (len(preds) == 1 and on_loop[preds[0]] and graph.node(ids[preds[0]]).task == node.task
                and cpu_before[j].any()):
            durations[preds[0]] += cpu_before[j]
            durations[j] = np.maximum(durations[j] - cpu_before[j], 0.0)
            cpu_before[j] = 0.0
            merged = True
        steps = [where[n] for n in _same_task(graph, graph.dag.successors(node_id), where, node.task,
                                              NodeKind.COMPUTE) if len(plan.preds[where[n]]) == 1]
        if len(steps) == 1 and cpu_after[j].any():
            durations[steps[0]] += cpu_after[j]
            durations[j] = np.maximum(durations[j] - cpu_after[j], 0.0)
            cpu_after[j] = 0.0
            merged = True
        moved += merged
    return moved


def _pool_holders(graph: CausalGraph, ids: Sequence[str],
                  pool: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per node: the pooled io node whose connection it returns when it ends, or -1; the pools again, without
    the calls made on a connection already held).

    A pool's connection goes back in the code after the answer (asyncpg's ``pool.fetch`` releases it when its
    ``async with`` block exits), so it is held until the calling task's next step, the compute node of the
    same task that follows the call, has run; when no such step follows, at the answer. When that step ends by
    awaiting one child of its own (a sync node of the same task with that one child: asyncpg's release runs
    shielded and resets the connection with a query of its own), the connection is returned when the child
    ends (asyncpg puts it back in the pool's queue in the child's last step, before the caller wakes up), and
    the child's calls to the same pool use the held connection instead of taking another. Several children
    are the app's own ``gather``, started by a step that had given the connection back.
    """
    where = {node_id: j for j, node_id in enumerate(ids)}
    holds = [-1] * len(ids)
    pools = list(pool)
    for j, node_id in enumerate(ids):
        if pools[j] < 0:  # not pooled, or made on a connection an earlier call holds
            continue
        task = graph.node(node_id).task
        steps = _same_task(graph, graph.dag.successors(node_id), where, task, NodeKind.COMPUTE)
        if not steps:
            continue
        waits = _same_task(graph, graph.dag.successors(steps[0]), where, task, NodeKind.SYNC)
        holder = steps[0]
        if waits:
            children = [n for n in graph.dag.predecessors(waits[0]) if n in where and n != steps[0]]
            # one child: the release (asyncpg's, shielded). Several: the app's own gather, started after the
            # connection went back (aiosqlite's pool of the example returns it in the step that starts it)
            waits = waits if len(children) == 1 else []
            holder = children[0] if waits else steps[0]
        if holds[where[holder]] >= 0:
            continue
        holds[where[holder]] = j
        if waits:
            inside = nx.descendants(graph.dag, steps[0]) & nx.ancestors(graph.dag, holder)
            for n in inside:
                if n in where and pools[where[n]] == pool[j]:
                    pools[where[n]] = -1
    return tuple(holds), tuple(pools)


def _pool_waits(graph: CausalGraph, ids: Sequence[str], pool: Sequence[int]) -> list[int]:
    """Positions of the recorded waits for a pooled connection: a task's wait on a future right before the
    step that makes a pooled call (as :func:`analyzer.build.observed_pools` finds the pools)."""
    where = {node_id: j for j, node_id in enumerate(ids)}
    out = []
    for j, node_id in enumerate(ids):
        if pool[j] < 0:
            continue
        task = graph.node(node_id).task
        for step in _same_task(graph, graph.dag.predecessors(node_id), where, task, NodeKind.COMPUTE):
            out += [where[w] for w in _same_task(graph, graph.dag.predecessors(step), where, task, NodeKind.WAIT)]
    return out


def _io_cpu(node: Node, idx: npt.NDArray[np.intp]) -> tuple[FloatArray, FloatArray]:
    """An io node's CPU on the loop per column: (before the wait, after it).

    ``cpu_before_ms`` (the step that made the call) when the graph has it, else half of ``cpu_ms``.
    """
    cpu = np.asarray(node.cpu_ms, dtype=np.float64)[idx]
    first = node.extra.get("cpu_before_ms")
    if isinstance(first, list) and len(first) == len(node.cpu_ms):
        before = np.minimum(np.asarray(first, dtype=np.float64)[idx], cpu)
    else:
        before = cpu / 2
    return before, cpu - before


BACKGROUND_KEY = "background_cpu_ms"
"""Graph ``meta`` key: CPU (ms) per user request that the process spends outside what the requests record of the
loop's work (their nodes' CPU and their io calls' read callbacks, ``hidden_ms``)."""

WAIT_SCALE_KEY = "wait_scale"
"""Graph ``meta`` key: the factor that turns recorded waits (wake-ups, start/end, the calls the process serves
itself beyond their CPU: :func:`_scaled_wait`) into those of the app without the collector
(:func:`fit_wait_scale`)."""


def _scaled_wait(node: Node, nested: int) -> bool:
    """Whether the wait scale applies to ``node`` (``nested``: the route an HTTP call of it is served by within
    the simulation, or -1): a wake-up (sync, wait, a timer that is not a timeout, which keeps its length), the
    start and end, and an io call served within the process (by one of its threads, :data:`THREAD_SYSTEMS`, or
    a route of its own), where the collector's work can slow the wait. Not a call another process serves: its
    wait is the network's and the other process's. Scaled too, PostgreSQL's waits held the example's pooled
    connections shorter than they were under load, and the post page, which waits mostly for one, came out
    7.6 ms low at the median at 16 users against 4.2 without (docs/accuracy.md, run 103)."""
    if node.kind is NodeKind.COMPUTE or (node.kind is NodeKind.TIMER and node.timeout_ms is not None):
        return False
    return node.kind is not NodeKind.IO or node.system in THREAD_SYSTEMS or nested >= 0


CPU_SCALE_KEY = "cpu_scale"
"""Graph ``meta`` key: the factor that turns recorded on-loop CPU into the CPU of the app without the collector
(``min(1, process / traced)``); when present, compute nodes hold the loop for ``cpu_ms`` x it."""

WAKE_COST_KEY = "wake_cost_ms"
"""Graph ``meta`` key: the loop work (ms) a wake-up of the loop costs by itself, beside what the idle before it
adds (the wake-up profile's extra): fitted by :func:`fit_wake_cost`, written by :func:`with_wake_cost`."""

CLIENT_KEY = "client_ms"
"""Graph ``meta`` key: time (ms) per request outside the server span that the latency the prediction is compared
with holds: the network, the client's own work, the server reading the request before its span and writing the
answer after it (a client-side latency less the server span's, :func:`calibrate`). A delay before the start
node: the prediction is then of the client-side latency."""

HOST_CPU_KEY = "host_cpu_ms"
"""Graph ``meta`` key: CPU (ms) the whole host was busy per user request at the recorded load, the app's and every
other process's on it (from the collector's ``process`` spans)."""

HOST_CPUS_KEY = "host_cpus"
"""Graph ``meta`` key: the host's logical CPUs, with ``HOST_CPU_KEY``."""

LEVELS_KEY = "loop_levels"
"""Graph ``meta`` key: the loop's demand measured at more users than one, as :func:`calibrate` writes it: a list
of ``{"users": users per loop, "cpu_scale": ..., "background_ms": ...}``, users ascending, the first at the light
run's load (its ``CPU_SCALE_KEY`` and ``BACKGROUND_KEY``). A load prediction takes them at its users per loop
(:func:`_at_load`) and then charges no wake-ups: the levels hold what the busier loop saves."""

OTHERS_LEVELS_KEY = "others_levels"
"""Graph ``meta`` key: the host's other processes' CPU per user request (``OTHERS_KEY``) at the light run's load
and at more users, as :func:`calibrate` writes it: a list of ``{"users": ..., "others_cpu_ms": ...}``, users
ascending. A load prediction takes it at its users per loop (:func:`_at_load`), whether or not the loop's demand
comes from levels too."""

OTHERS_KEY = "others_cpu_ms"
"""Graph ``meta`` key: CPU (ms) per user request that the host's other processes (a database, a cache, a service,
the load client) spend on the host's cores beside the app, at a measured load level (:func:`_at_load`): with
``HOST_CPUS_KEY``, the simulation queues it and the loop's work for those cores."""

_NUMBER_KEYS = (BACKGROUND_KEY, WAIT_SCALE_KEY, CPU_SCALE_KEY, WAKE_COST_KEY, CLIENT_KEY, HOST_CPU_KEY, HOST_CPUS_KEY,
                OTHERS_KEY)
"""The ``meta`` keys of one number each that a calibration writes (:func:`check_meta`)."""

HOST_BUSY_WARN = 0.85
"""Host utilisation at the predicted throughput above which a load prediction says it is less certain."""


@dataclass(frozen=True, slots=True)
class BackgroundDemand:
    """A process's CPU per user request, and the part of it the requests' spans record."""

    process_ms: float
    """The process's CPU time (user + system, every thread) per user request: measured without the collector
    (psutil) to predict the app without it, or by the collector's ``process`` spans to predict it as collected."""
    traced_ms: float
    """The loop's work the requests record per user request: compute segments' and io calls' on-loop CPU and
    the read callbacks in the calls' waits (``hidden_ms``), over every traced route (the services a user
    request calls in the same process included)."""

    @property
    def background_ms(self) -> float:
        """What no request records (other threads, the kernel's share): ``max(process - traced, 0)``."""
        return max(self.process_ms - self.traced_ms, 0.0)

    @property
    def cpu_scale(self) -> float:
        """``min(1, process / traced)``: below 1 when the recorded CPU exceeds the whole process's CPU without the
        collector, i.e. the collector's own cost inside the steps; the recorded CPU is scaled down by it."""
        return min(1.0, self.process_ms / self.traced_ms) if self.traced_ms > 0 else 1.0

    host_ms: float | None = None
    """The whole host's busy CPU per user request (every process on it), where the collector read it."""
    host_cpus: int = 0
    """The host's logical CPUs, with ``host_ms``."""

    def to_json(self) -> dict[str, float]:
        out = {"process_ms": self.process_ms, "traced_ms": self.traced_ms, "background_ms": self.background_ms,
               "cpu_scale": self.cpu_scale}
        if self.host_ms is not None:
            out.update(host_ms=self.host_ms, host_cpus=float(self.host_cpus))
        return out


def background_demand(
    graphs: Sequence[CausalGraph], user_graphs: Sequence[CausalGraph], process_cpu_ms: float,
    mix: Mapping[str, float] | None = None,
) -> BackgroundDemand:
    """Split a measured process CPU per user request into what the graphs record and the background rest.

    Parameters
    ----------
    graphs
        Every graph of the process's spans over the measured window (in-process services included): their
        nodes' CPU (:func:`~analyzer.graph.loop_cpu_ms`) and the loop's work in their io calls' waits
        (:func:`~analyzer.graph.hidden_loop_ms`), both served on the simulated loop, are what the process's CPU
        is split against.
    user_graphs
        The graphs of the routes users request (their request counts are the denominator).
    process_cpu_ms
        The process's CPU per user request that holds its loop (as :func:`calibrate` takes it), measured
        *without* the collector, so that the collector's own CPU is not counted.
    mix
        route -> requests (or shares) of the user routes in the run ``process_cpu_ms`` was measured on, when its
        mix of routes differs from the graphs': the traced work per request is then taken at that mix (each
        route's per request, weighted by its share; what the other graphs record per user request as it is).
        The example's light runs asked for 44-60% index pages by round where the recording had 60%, and an index
        page records eight to ten times a post page's loop work: compared over different mixes, the CPU scale
        came out 23% low in the round of 44% and the loaded pages 18-21 ms low (``docs/accuracy.md``, runs
        108-110).
    """
    requests = sum(g.count for g in user_graphs)
    if requests < 1:
        raise ValueError("user_graphs hold no request")
    # the read callbacks (hidden_ms) hold the simulated loop too; measured without the collector at one user
    # and no neighbour, their wall time is the loop's CPU
    traced = _recorded_loop_ms(graphs) / requests
    counts: dict[str, int] = {}
    for g in user_graphs:
        counts[g.route] = counts.get(g.route, 0) + g.count
    shares = {r: float(w) for r, w in (mix or {}).items() if w > 0 and counts.get(r)}
    if shares and set(shares) != set(counts):
        shares = {}  # a route the run did not ask for, or one the graphs lack: the mixes cannot be compared
    if shares:
        user_ids = {id(g) for g in user_graphs}
        others = _recorded_loop_ms([g for g in graphs if id(g) not in user_ids]) / requests
        total = sum(shares.values())
        traced = others + sum(w / total * _recorded_loop_ms([g for g in user_graphs if g.route == r]) / counts[r]
                              for r, w in shares.items())
    return BackgroundDemand(process_cpu_ms, traced)


def _recorded_loop_ms(graphs: Sequence[CausalGraph]) -> float:
    """The loop's work the graphs record, summed over their requests: their nodes' CPU and the read callbacks in
    their io calls' waits (served on the simulated loop when each answer comes in)."""
    return loop_cpu_ms(graphs) + hidden_loop_ms(graphs)


def with_background(
    graphs: Sequence[CausalGraph], background_ms: float | BackgroundDemand, *, wait_scale: float | None = None
) -> list[CausalGraph]:
    """Copies of ``graphs`` whose ``meta`` carries the background CPU per user request (``BACKGROUND_KEY``).

    Given a :class:`BackgroundDemand`, also its ``cpu_scale`` (``CPU_SCALE_KEY``): compute nodes then hold the
    loop for their CPU time scaled by it. ``wait_scale`` (``WAIT_SCALE_KEY``, from :func:`wait_scale`) scales
    what is not the loop's CPU. The load simulation reads them (:func:`simulate_scenario`); ``dump_graphs``
    keeps them.
    """
    extra: dict[str, float] = {}
    if wait_scale is not None:
        if not wait_scale > 0:
            raise ValueError(f"wait_scale must be positive, got {wait_scale}")
        extra[WAIT_SCALE_KEY] = wait_scale
    if isinstance(background_ms, BackgroundDemand):
        extra[CPU_SCALE_KEY] = background_ms.cpu_scale
        if background_ms.host_ms is not None and background_ms.host_cpus > 0:
            extra[HOST_CPU_KEY], extra[HOST_CPUS_KEY] = background_ms.host_ms, float(background_ms.host_cpus)
        background_ms = background_ms.background_ms
    if background_ms < 0:
        raise ValueError(f"background_ms must be non-negative, got {background_ms}")
    extra[BACKGROUND_KEY] = background_ms
    return [_with_meta(g, extra) for g in graphs]


def _with_meta(graph: CausalGraph, extra: Mapping[str, Any]) -> CausalGraph:
    """A copy of ``graph`` whose ``meta`` also holds ``extra``."""
    return CausalGraph(graph.route, graph.nodes, list(graph.dag.edges), variant=graph.variant,
                       latency_ms=graph.latency_ms, trace_ids=graph.trace_ids, meta={**graph.meta, **extra})


def background_from_spans(
    graphs: Sequence[CausalGraph], requests: Sequence[Any], process: Sequence[Any]
) -> tuple[list[CausalGraph], BackgroundDemand | None]:
    """Attach to ``graphs`` the process CPU their spans do not record, measured by the collector itself.

    ``requests`` are the requests the graphs were built from (``analyzer.spans.Request``), ``process`` the
    collection's ``process`` spans (``analyzer.spans.process_cpu``). The process's CPU over the requests'
    window (start-up and shut-down left out), without the collector's export threads, divided by the user
    requests in that window (distinct traces: a call to a service traced in the same process shares its
    caller's trace), is the demand per user request; what the graphs record of it is subtracted
    (:func:`background_demand`). The prediction is then for the app as collected: the collector's cost inside
    the loop's steps stays in; use :func:`with_background` with a measurement without the collector to take
    it out. Returns the graphs unchanged and ``None`` when the spans have no ``process`` span.
    """
    from analyzer.spans import process_cpu_within

    if not requests or not graphs:
        return list(graphs), None
    window = (min(r.start_ns for r in requests), max(r.end_ns for r in requests))
    cpu = process_cpu_within(process, *window)
    if cpu is None:
        return list(graphs), None
    users = len({r.trace_id for r in requests})
    demand = BackgroundDemand(cpu.app_ms / users, _recorded_loop_ms(graphs) / users,
                              None if cpu.host_busy_ms is None else cpu.host_busy_ms / users, cpu.host_cpus)
    return with_background(graphs, demand), demand


def fit_wait_scale(
    graphs: Sequence[CausalGraph],
    demand: BackgroundDemand,
    target_ms: float,
    *,
    users: int = 1,
    samples: int = 2000,
    seed: int = 0,
    floor: float = 0.05,
    steps: int = 14,
) -> float:
    """The wait scale at which the simulation of ``graphs`` (one route) at the light run's load (``users``,
    one by default: the baseline's) has mean latency ``target_ms``.

    A light run without the collector is the one measurement of the app without it, so the calibrated model is
    made to reproduce it: compute nodes hold the loop for their CPU x ``demand.cpu_scale``, and the waits the
    collector can lengthen (wake-ups, start and end, calls the process serves itself: :func:`_scaled_wait`) are
    scaled by the number found here, by bisection on
    ``[floor, 1]`` with the same random numbers at every step, so that the mean grows with the scale. 1 when
    even the recorded waits fall short (a client-side latency also holds the client's own work and the network
    stack, which the server's spans do not), ``floor`` when even that is too long.

    The collector's cost is in the loop's steps, which ``cpu_scale`` takes out, and in some waits (the
    wake-ups of a loop that runs it, an in-process service it traces), not in a remote service's time: the
    ratio of the mean latencies without / with the collector, used for every wait before, scaled the remote
    time too and predicted the accuracy benchmark's load case 1-3 points lower (docs/whatif.md).
    """
    from analyzer.predict import predict  # the engine runs the simulation; it imports this module

    def mean_at(scale: float) -> float:
        calibrated = with_background(graphs, demand, wait_scale=scale)
        preds = predict(calibrated, f"load:{users}", None, samples, np.random.default_rng(seed))
        return float(np.mean(np.concatenate([p.predicted.samples_ms for p in preds])))

    if not target_ms > 0:
        raise ValueError(f"target_ms must be positive, got {target_ms}")
    if mean_at(1.0) <= target_ms:
        return 1.0
    lo, hi = floor, 1.0
    if mean_at(lo) >= target_ms:
        return lo
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if mean_at(mid) > target_ms else (mid, hi)
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What :func:`calibrate` found: the CPU split and the wait scale per route."""

    demand: BackgroundDemand
    wait_scale: float
    """Over every request: the scale of the graphs of routes not in ``by_route``."""
    by_route: Mapping[str, float]
    levels: tuple[tuple[int, BackgroundDemand], ...] = ()
    """(users, the demand measured there), for the levels beyond one user (:func:`calibrate`'s ``levels``)."""

    def describe(self) -> str:
        d = self.demand
        return (f"without the collector: {d.process_ms:.2f} ms of loop per request (the graphs record "
                f"{d.traced_ms:.2f}: "
                f"CPU scale {d.cpu_scale:.3f}, background {d.background_ms:.2f} ms)"
                + "".join(f", {x.process_ms:.2f} at {n} users" for n, x in self.levels) + "; wait scale "
                + ", ".join(f"{r} {x:.3f}" for r, x in self.by_route.items()))


def calibrate(
    graphs: Sequence[CausalGraph],
    routes: Sequence[str],
    process_cpu_ms: float,
    without_ms: Mapping[str, Sequence[float]],
    *,
    preempted_ms: float = 0.0,
    users: int = 1,
    samples: int = 2000,
    host: tuple[float, int] | None = None,
    client_ms: Mapping[str, float] | None = None,
    levels: Sequence[tuple[int, float, float, float | None]] = (),
    loop_levels: bool = True,
) -> tuple[list[CausalGraph], Calibration]:
    """Graphs calibrated to the app without the collector, from one light run with it and one without.

    Parameters
    ----------
    graphs
        Every graph of the collected light run (in-process services' routes included).
    routes
        The routes the users request: the waits of each route's graphs are scaled so that its simulation at
        the light run's load has the mean latency it had without the collector (:func:`fit_wait_scale`); other
        routes' graphs take the mean of those scales, weighted by requests.
    process_cpu_ms
        The CPU per user request the process's event loop is held for without the collector
        (:func:`background_demand`): every thread's user time (the GIL's demand) and the loop thread's system
        time (its own syscalls: the GIL is released in them, the loop is not); other threads' system time runs
        beside the loop. ``replayer.groundtruth.loop_cpu_s`` measures it. Counting user time only, the load
        simulation of the example app ran its loop 20-25% too fast (``benchmarks/whatif_accuracy.py``, load and
        failure cases).
    without_ms
        route -> latencies of the same light load without the collector.
    preempted_ms
        Time per user request the loop's thread was preempted in that run, ready to run while another thread
        held its core (``replayer.groundtruth.preempted_s``). The loop cannot serve anything meanwhile, so it
        counts as demand beside the CPU. On the example, where the app shares two cores with its backends, the
        blob service and the load client, it was a fifth to a quarter of the loop's CPU at 1 and at 16 users
        with PostgreSQL (an eighth with SQLite), and leaving it out predicted 16 users 10-18% low
        (docs/whatif.md).
    users
        The light load's users (1: as the baseline is recorded).
    samples
        Monte Carlo samples of each simulation of the fit.
    host
        (the whole host's busy CPU per user request in that run, the app's and every other process's on it; its
        CPUs), where they were read (``replayer.groundtruth.pooled_host``): a load prediction then says how busy
        the host's cores would be (:func:`_host_note`).
    client_ms
        route -> the time a request spends outside its server span, where ``without_ms`` are client-side
        latencies: the collected run's mean client-side latency less its mean server-side one
        (``replayer.groundtruth.client_side_ms``). Each request of the route then starts with that delay
        (``CLIENT_KEY``), the waits are fitted with it, and the prediction is of the client's latency. Without
        it, the fit scaled the waits to cover it: the example's post page, 2.4 ms at the client of which 0.6-0.9
        ms outside the server span, could not be made long enough (its scale stopped at 1), and under load the
        index page came out 3.4-3.8 ms high at the median, 1.3-1.5 with it (``docs/accuracy.md``, runs 87-88).
    levels
        (users, ``process_cpu_ms``, ``preempted_ms``, the host's busy CPU per request or None) measured the same
        way at a few more users per loop (``replayer.groundtruth.pooled_levels``). A load prediction then takes
        the loop's demand at its users from these levels (MVASD, :func:`_at_load`) instead of pricing it from one
        user with the wake-up profile: the time the host's other processes take from the loop grew under load
        by 65-178% on one machine and not at all on another at the same host busy share, which nothing measured
        at one user says (``docs/accuracy.md``, runs 90-92). With the host's CPU at every level and ``host``, the
        simulation also queues the loop's work and the other processes' CPU (the host's busy CPU less the
        loop's) for the host's cores (``OTHERS_LEVELS_KEY``), taken at the level too: on the example those
        processes needed 10-19% less CPU per request at 8 and 16 users than at one (runs 97-99).
    loop_levels
        False: the levels give the host's other processes' CPU only, and a load prediction prices the loop's
        demand from the light run, wake-ups included (:func:`fit_wake_cost` fits what one costs to the levels'
        loop demand). On a machine whose loop waited longer for a core the busier the host (the fitted cost 0),
        the example's failure case, whose balancer shares the host's two cores with the app and its backends,
        came out 16.0 and 11.0 ms low on its two pages without the cores, 3.5 and 3.6 ms low with them
        (``docs/accuracy.md``, run 116).
    """
    if client_ms is not None:
        bad = {r: x for r, x in client_ms.items() if not (np.isfinite(x) and x >= 0)}
        if bad:
            raise ValueError(f"client_ms must be finite and non-negative, got {bad}")
        graphs = [_with_meta(g, {CLIENT_KEY: float(client_ms[g.route])}) if g.route in client_ms else g
                  for g in graphs]
    if preempted_ms < 0:
        raise ValueError(f"preempted_ms must be non-negative, got {preempted_ms}")
    if host is not None and not (host[0] >= 0 and host[1] > 0):
        raise ValueError(f"host must be (CPU ms per request >= 0, CPUs > 0), got {host}")
    if (any(not (n > users and x > 0 and y >= 0 and (h is None or h >= 0)) for n, x, y, h in levels)
            or len({n for n, *_ in levels}) < len(levels)):
        raise ValueError(f"levels must be (users above {users}, each once; CPU ms > 0; preempted ms >= 0; host "
                         f"CPU ms >= 0 or None), got {list(levels)}")
    user_graphs = [g for g in graphs if g.route in routes]
    # the light run's own mix of routes, which its CPU per request was measured over; its levels ran the same
    # client sequence, so the same mix stands for theirs
    mix = _light_mix(routes, without_ms)
    demand = background_demand(graphs, user_graphs, process_cpu_ms + preempted_ms, mix)
    at_levels = tuple((int(n), background_demand(graphs, user_graphs, x + y, mix)) for n, x, y, _ in sorted(levels))
    if at_levels and loop_levels:
        rows = [{"users": float(users), "cpu_scale": demand.cpu_scale, "background_ms": demand.background_ms}]
        rows += [{"users": float(n), "cpu_scale": d.cpu_scale, "background_ms": d.background_ms} for n, d in at_levels]
        graphs = [_with_meta(g, {LEVELS_KEY: rows}) for g in graphs]
    if levels and host is not None and all(h is not None for *_, h in levels):
        # the other processes' CPU per request: the host's busy CPU less the app's loop CPU
        others = [(users, host[0] - process_cpu_ms)] + [(n, h - x) for n, x, _, h in sorted(levels)]
        graphs = [_with_meta(g, {OTHERS_LEVELS_KEY: [{"users": float(n), OTHERS_KEY: max(ms, 0.0)}
                                                     for n, ms in others]}) for g in graphs]
    if host is not None:
        demand = replace(demand, host_ms=host[0], host_cpus=host[1])
    by_route: dict[str, float] = {}
    counts: dict[str, int] = {}
    for route in routes:
        members = [g for g in graphs if g.route == route]
        measured = without_ms.get(route, ())
        if members and len(measured):
            by_route[route] = fit_wait_scale(members, demand, float(np.mean(measured)), users=users,
                                             samples=samples)
            counts[route] = sum(g.count for g in members)
    if not by_route:
        raise ValueError("calibrate needs, for one of the routes, graphs and latencies without the collector")
    overall = sum(by_route[r] * counts[r] for r in by_route) / max(sum(counts.values()), 1)
    out = [with_background([g], demand, wait_scale=by_route.get(g.route, overall))[0] for g in graphs]
    return out, Calibration(demand, overall, by_route, at_levels)


@dataclass(frozen=True, slots=True)
class MeasuredLevels:
    """One light run's graphs, calibrated (:func:`calibrate`), and the loop's demand measured beside it at a few
    more users per loop: what :func:`fit_wake_cost` fits to."""

    graphs: Sequence[CausalGraph]
    levels: Sequence[tuple[int, float]]
    """(users per loop, the loop's demand per request there: CPU and preempted time, as
    ``replayer.groundtruth.pooled_levels`` gives them)."""
    mix: Mapping[str, float]
    """route -> the share of the user routes in those runs."""

    @classmethod
    def of(cls, graphs: Sequence[CausalGraph], routes: Sequence[str], without_ms: Mapping[str, Sequence[float]],
           levels: Sequence[tuple[int, float, float, float | None]]) -> MeasuredLevels:
        """From what :func:`calibrate` was given: the user ``routes``, the light run's latencies by route (its
        mix: its levels ran the same client sequence) and its ``levels`` (users, loop CPU ms, preempted ms,
        host CPU ms or None per request: ``replayer.groundtruth.pooled_levels``)."""
        return cls(graphs, [(n, cpu + preempted) for n, cpu, preempted, _ in levels], _light_mix(routes, without_ms))


def _light_mix(routes: Sequence[str], without_ms: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """route -> the light run's requests of it (its latencies by route)."""
    return {r: float(len(without_ms.get(r, ()))) for r in routes}


def fit_wake_cost(
    runs: Sequence[MeasuredLevels],
    store: SupportsSelect | None = None,
    *,
    samples: int = 1000,
    seed: int = 0,
    probe_ms: float = 0.2,
) -> float:
    """The loop work a wake-up of the loop costs by itself (:data:`WAKE_COST_KEY`), fitted so that the
    simulation's loop demand per request at each measured level matches the level's.

    An asyncio loop with nothing to do sleeps in ``select()``; waking costs it the system call, the switch back
    and a cold cache, paid by the work after it, and a busier loop sleeps less often. The wake-up profile
    (:mod:`analyzer.wakeup`) prices how much longer idles add, measured against requests back to back, which
    still sleep between their calls: what a wake-up costs at all, which a loop that no longer sleeps saves, it
    cannot see. On the example at one user the loop slept 8-10 times a request, at 16 users 2.3-2.5 times, and
    its CPU per request, at the same mix of pages, fell 11% from one user to four; from one user's demand the
    simulation held the loop 10-18% longer per request at 16 users than measured (``docs/accuracy.md``, run
    112). The measured levels are MVASD's load-dependent demand [1]_; here they calibrate one constant of the
    simulation, which then says how often the loop sleeps at any load itself.

    ``runs`` are fitted together (least squares over every level of every run): the cost belongs to the app on
    its host, and a level's demand, over a short run, is noisy. ``store`` holds the profiles (the wake-up
    profile's decay spreads the cost too). Simulated at no cost and at ``probe_ms``, each level's demand is taken
    as linear in the cost between them and in a third simulation at the least-squares solution; the result is
    at least 0.

    .. [1] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying Service
       Demands", IPDPS Workshops, 2015: section VI (service demands varying with the load).
    """
    from analyzer.predict import predict  # the engine runs the simulation; it imports this module

    points = [(run, int(n), float(ms)) for run in runs for n, ms in run.levels if n > 1]
    if not points:
        raise ValueError("fit_wake_cost needs a measured level above one user per loop")
    if not probe_ms > 0:
        raise ValueError(f"probe_ms must be positive, got {probe_ms}")

    def demand_at(cost: float, run: MeasuredLevels, users: int) -> float:
        mix = tuple((route, share) for route, share in run.mix.items() if share > 0)
        queueing = Queueing()
        predict(with_wake_cost(run.graphs, cost), Scenario(f"load:{users}", (Load(users, mix=mix),)), store,
                samples, np.random.default_rng(seed), queueing=queueing)
        return queueing.loop_ms_per_request

    def simulated(cost: float) -> tuple[float, list[float]]:
        return cost, [demand_at(cost, run, n) for run, n, _ in points]

    def solve(a: tuple[float, list[float]], b: tuple[float, list[float]]) -> float:
        (x0, y0), (x1, y1) = a, b
        slopes = [(v1 - v0) / (x1 - x0) for v0, v1 in zip(y0, y1, strict=True)]
        norm = sum(k * k for k in slopes)
        if norm <= 0:
            return x0
        # least squares over the levels of y0 + slope (x - x0) = measured
        return max(x0 + sum(k * (ms - v) for k, v, (_, _, ms) in zip(slopes, y0, points, strict=True)) / norm, 0.0)

    zero, probe = simulated(0.0), simulated(probe_ms)
    first = solve(zero, probe)
    near = zero if first < probe_ms / 2 else probe
    if math.isclose(first, near[0]):
        return first
    return solve(near, simulated(first))


def with_wake_cost(graphs: Sequence[CausalGraph], cost_ms: float) -> list[CausalGraph]:
    """Copies of ``graphs`` whose ``meta`` carries what a wake-up of the loop costs (``WAKE_COST_KEY``, from
    :func:`fit_wake_cost`), which a load prediction then charges for every idle gap of its loop beyond the
    recording's."""
    if not (cost_ms >= 0 and math.isfinite(cost_ms)):
        raise ValueError(f"cost_ms must be finite and non-negative, got {cost_ms}")
    return [_with_meta(g, {WAKE_COST_KEY: float(cost_ms)}) for g in graphs]


def _background(
    graphs: Sequence[CausalGraph], plans: Sequence[DagPlan], weights: Sequence[float], users: int,
    slowdown: float = 1.0, *, served_hidden: bool = False,
) -> tuple[list[tuple[float, ...]], str]:
    """Per graph, per node: the background CPU each io call (or, without io, the start node) queues.

    The process's unrecorded CPU is mostly per call (a worker thread running a query, a client library in
    another thread, the kernel moving the bytes), so the demand per user request ``B`` is spread over the io
    calls: ``B / E[calls]`` per call, ``E[calls]`` the mean number of io calls per user request. Requests
    without io calls queue it when they end (held on the end node), like a server's work between requests.

    With one user per loop, the load the baseline is recorded at, nothing is queued: the recorded durations
    already hold what the background work cost them (queued again, it held the loop during the example's index
    page fan-out and made its one-user simulation 0.75 ms slower at the median than recorded).

    A CPU neighbour (``slowdown``: :func:`~analyzer.interference.cpu_slowdown` of its share) stretches that work
    too: the background's threads stay runnable through their work and share the core half and half while the
    neighbour runs, and while one runs Python it holds the GIL the loop waits for. So the demand is queued
    ``slowdown`` times over, and at one user per loop what the neighbour adds, ``B (slowdown - 1)``: the
    recordings hold the rest. (The CPU probes price work after a wake-up, which is the loop's, not a thread's
    that keeps running.) On three benchmark recordings of the example under a neighbour at 50%, the index page,
    whose 40-odd io calls carry most of it, came out 1.9-3.4 ms short without it and 0.2-2.1 ms high with it,
    of 17-19 ms measured; the post page moved by 0.0-0.1 ms.

    The background leaves out the io calls' loop work outside any step (``hidden_ms``, read callbacks:
    :func:`background_demand`), which the simulation serves on the loop when each answer comes in. Not
    ``served_hidden`` (under a CPU neighbour, where that work stays in the calls' waits and is stretched there),
    it is queued with the background as well, as the CPU probes' model was fitted with it.
    """
    amounts = [_meta_number(g, BACKGROUND_KEY) or 0.0 for g in graphs]
    demand = max(amounts, default=0.0)
    total = sum(weights)
    if not served_hidden and total > 0 and any(BACKGROUND_KEY in g.meta for g in graphs):
        demand += sum(w * hidden_loop_ms([g]) / max(g.count, 1) for g, w in zip(graphs, weights, strict=True)) / total
    out = [tuple(0.0 for _ in range(p.size)) for p in plans]
    if demand <= 0:
        return out, ""
    if users <= 1 and slowdown == 1.0:
        return out, (f"background CPU {demand:.3g} ms per request not queued at one user per loop: the recorded "
                     "durations hold its effect")
    recorded = demand
    demand *= slowdown - 1.0 if users <= 1 else slowdown
    ios, calls = _io_calls(graphs, plans, weights)
    for gi, plan in enumerate(plans):
        row = [0.0] * plan.size
        if calls > 0:
            for j in ios[gi]:
                row[j] = demand / calls
        else:
            row[plan.end] = demand
        out[gi] = tuple(row)
    per = f"{demand / calls:.3g} ms per io call ({calls:.3g} calls per request)" if calls > 0 else "per request"
    what = f"background CPU {recorded:.3g} ms per request (measured outside the requests' recorded CPU)"
    if slowdown != 1.0:
        what += f", x {slowdown:.3g} with the neighbour (the fair share)"
        if users <= 1:
            what += ": what the neighbour adds to it, the recorded durations hold the rest"
    return out, (f"{what}: {demand:.3g} ms queued on the loop's server, {per}; a call ends no sooner than its "
                 f"share is served")


def _io_calls(graphs: Sequence[CausalGraph], plans: Sequence[DagPlan], weights: Sequence[float]
              ) -> tuple[list[list[int]], float]:
    """Per graph, its io nodes' plan indices; and the io calls per user request (the graphs' mean by weight, 0
    without weight): the calls a per-request demand is spread over (:func:`_background`, :func:`_others`)."""
    ios = [[j for j, i in enumerate(p.ids) if g.node(i).kind is NodeKind.IO] for g, p in zip(graphs, plans, strict=True)]
    total = sum(weights)
    calls = sum(w * len(c) for w, c in zip(weights, ios, strict=True)) / total if total > 0 else 0.0
    return ios, calls


def _others(graphs: Sequence[CausalGraph], plans: Sequence[DagPlan], weights: Sequence[float], users: int
            ) -> tuple[list[tuple[float, ...]], int, str]:
    """Per graph, per node: the host's other processes' CPU each io call queues for a core; the cores; a note.

    Where the graphs carry that CPU per user request at the simulated load (``OTHERS_KEY``, from measured levels:
    :func:`_at_load`) and the host's CPUs (``HOST_CPUS_KEY``), it is spread over the io calls as the background
    is (:func:`_background`): the database's, cache's and services' work is for the calls, and the load
    client's, the rest, is spread with it. At one user per loop nothing is queued: the recorded waits hold it.
    """
    none: list[tuple[float, ...]] = [() for _ in plans]
    amounts = [_positive_meta(g, OTHERS_KEY) for g, w in zip(graphs, weights, strict=True) if w > 0]
    cpus = [_positive_meta(g, HOST_CPUS_KEY) for g in graphs]
    if users <= 1 or sum(weights) <= 0 or not amounts or None in amounts or not all(cpus):
        return none, 0, ""
    demand = max(a for a in amounts if a is not None)
    cores = int(max(c for c in cpus if c is not None))
    ios, calls = _io_calls(graphs, plans, weights)
    if calls <= 0:
        return none, 0, ""
    out = []
    for plan, members in zip(plans, ios, strict=True):
        row = [0.0] * plan.size
        for j in members:
            row[j] = demand / calls
        out.append(tuple(row))
    return out, cores, (f"host: its {cores} cores serve the loop's work and the other processes' {demand:.3g} ms of "
                        f"CPU per request at this load (the database, cache, services and load client beside the "
                        f"app, from the measured levels), {demand / calls:.3g} ms per io call, placed at the earliest "
                        "time a core has room: a call waits for a core before its backend's share")


class _Nesting:
    """HTTP calls served by a route the graphs also hold: simulated as sub-requests (see :class:`Load`).

    A node ``http GET /ad`` calls route ``GET /ad`` when the graphs have that route: the app called itself, or
    a service traced in the same process. The call then lasts the sub-request's simulated latency plus its
    client side: the call's sampled duration (with the scenario's changes, ``+20 ms`` per round trip) minus
    the route's median latency, at least 0; so at load 1 the call keeps its recorded distribution, tails
    included. Calls drawn from a profile (tier, size) stay plain calls: the profile measured the whole call. Users issue each route in proportion to its recorded
    requests that were *not* such calls (a route only ever called by others gets no users).
    """

    def __init__(self, graphs: Sequence[CausalGraph], models: Sequence[NodeDurations], mode: str,
                 mix: Sequence[tuple[str, float]] = ()) -> None:
        self.graphs, self.models, self.mode = graphs, models, mode
        self.mix = tuple(mix)
        by_route: dict[str, list[int]] = {}
        for gi, g in enumerate(graphs):
            by_route.setdefault(g.route, []).append(gi)
        self.route_index = {route: i for i, route in enumerate(by_route)} if mode != "off" else {}
        self.routes: list[tuple[Sequence[int], Sequence[float]]] = [
            (members, [float(max(graphs[gi].count, 1)) for gi in members]) for members in by_route.values()
        ] if mode != "off" else []
        self.median: dict[str, float] = {}
        for route, members in by_route.items():
            lat = np.concatenate([_latencies(graphs[gi], models[gi]) for gi in members])
            self.median[route] = float(np.median(lat))
        self.calls: dict[str, float] = {}
        self.endpoints: dict[str, int] = {}
        self.servers = 1

    def target(self, gi: int, j: int, node: Node, durations: FloatArray) -> tuple[int, int]:
        """(nested route index or -1, CPU server) for node ``j`` of graph ``gi``; adjusts its durations row."""
        if node.kind is not NodeKind.IO or node.system != "http" or not self.route_index:
            return -1, 0
        route = node.api[len("http "):]
        model = self.models[gi]
        if route not in self.route_index or j in model.per_sample:
            return -1, 0
        # the client side of each call: the call (with the scenario's changes) minus the route's median latency
        durations[j] = np.maximum(durations[j] - self.median[route], 0.0)
        self.calls[route] = self.calls.get(route, 0.0) + max(self.graphs[gi].count, 1)
        server = 0
        if self.mode == "separate":
            server = self.endpoints.setdefault(node.resource, len(self.endpoints) + 1)
            self.servers = len(self.endpoints) + 1
        return self.route_index[route], server

    def weight(self, gi: int) -> float:
        """Share of users' requests for graph ``gi``: its route's requests not made by other requests."""
        total: dict[str, float] = {}
        for x in self.graphs:
            total[x.route] = total.get(x.route, 0.0) + max(x.count, 1)
        own = {route: max(n - self.calls.get(route, 0.0), 0.0) for route, n in total.items()}
        if sum(own.values()) <= 0:
            own = total  # every route is called by another: let users issue them all
        g = self.graphs[gi]
        if self.mix:
            # the scenario's mix: each route's share of the users' requests, spread over its variants as recorded
            share = sum(w for name, w in self.mix if route_matches(name, g.route))
            return share * max(g.count, 1) / total[g.route]
        return own[g.route] * max(g.count, 1) / total[g.route]

    def describe(self) -> list[str]:
        if not self.calls:
            return []
        where = {"shared": "on the caller's CPU (one process)", "separate": "on a loop per endpoint"}[self.mode]
        called = ", ".join(f"{route} ({calls:g} calls)" for route, calls in sorted(self.calls.items()))
        users = sorted({g.route for gi, g in enumerate(self.graphs) if self.weight(gi) > 0})
        note = (f"nested: HTTP calls to {called} are simulated as sub-requests {where}; users issue "
                f"{', '.join(users)} (load:N?nested=off to disable)")
        return [note]


def _latencies(graph: CausalGraph, model: NodeDurations) -> FloatArray:
    if graph.latency_ms:
        return np.asarray(graph.latency_ms, dtype=np.float64)
    return evaluate_plan(model.plan, model.base, np.arange(model.base.shape[1]))


class _Curves:
    """Concurrency-parameterised profiles of io calls, as quantile functions cached per level."""

    def __init__(self, store: SupportsSelect | None, scenario: Scenario) -> None:
        self.store = store
        self.scenario = scenario
        self.found: dict[tuple[str, str, tuple[tuple[str, str], ...]], dict[int, FloatArray]] = {}
        self.missing: set[str] = set()
        self.absent: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
        self.nodes: dict[tuple[int, int], tuple[tuple[str, str, tuple[tuple[str, str], ...]], FloatArray,
                                                npt.NDArray[np.intp]]] = {}
        self.how: dict[str, str] = {}

    @property
    def any(self) -> bool:
        return bool(self.nodes)

    def register(self, k: int, j: int, node: Node, row: FloatArray, idx: npt.NDArray[np.intp]) -> None:
        """Node ``j`` of workload ``k`` (``row``: its durations per column, ``idx``: the recorded request of each)
        takes its profile's concurrency shift, from the level it met when recorded (``inflight``, else 1)."""
        if self.store is None:
            return
        tiers = [c for c in self.scenario.changes if isinstance(c, Tier) and applies(c, node)]
        labels = {"tier": tiers[-1].label} if tiers else {}
        key = (node.api, node.resource, tuple(sorted(labels.items())))
        if key in self.absent:
            self.missing.add(node.api)
            return
        if key not in self.found:
            try:
                sel = self.store.select(node.api, node.resource, labels, "concurrency", 1.0)
            except ProfileError:
                sel = None
            if (sel is None or not sel.keys or getattr(sel.keys[0], "param", "") != "concurrency"
                    or getattr(sel.keys[0], "labels", ()) != key[2]):  # not another configuration's profile
                self.missing.add(node.api)
                self.absent.add(key)
                return
            self.found[key] = {1: np.sort(np.asarray(sel.samples_ms, dtype=np.float64))}
            self.how[node.api] = sel.how
        if key in self.found:
            ranks = (np.argsort(np.argsort(row, kind="stable"), kind="stable") + 0.5) / row.size
            recorded = node.extra.get("inflight")
            if isinstance(recorded, list) and len(recorded) == len(node.samples_ms):
                levels = np.maximum(np.asarray(recorded, dtype=np.intp)[idx], 1)
            else:
                levels = np.ones(row.size, dtype=np.intp)
            self.nodes[(k, j)] = (key, ranks, levels)

    def has_group(self, gid: int, workloads: Sequence[Workload]) -> bool:
        return any(workloads[k].group[j] == gid for k, j in self.nodes)

    def quantiles(self, key: tuple[str, str, tuple[tuple[str, str], ...]], level: int) -> FloatArray:
        levels = self.found[key]
        if level not in levels:
            assert self.store is not None
            api, resource, labels = key
            sel = self.store.select(api, resource, dict(labels), "concurrency", float(level))
            levels[level] = np.sort(np.asarray(sel.samples_ms, dtype=np.float64))
        return levels[level]

    def adjust(self, k: int, j: int, col: int, level: int) -> float:
        """``Q_L(u) - Q_L0(u)``: ``L`` the level the call meets, ``L0`` the one it met when recorded (the calls of
        its own request to the same resource: a fan-out's recorded durations hold their concurrency already)."""
        entry = self.nodes.get((k, j))
        if entry is None:
            return 0.0
        key, ranks, levels = entry
        level, base = max(level, 1), int(levels[col])
        if level == base:
            return 0.0
        u = ranks[col]
        hi, lo = self.quantiles(key, level), self.quantiles(key, base)
        return float(hi[int(u * (hi.size - 1))] - lo[int(u * (lo.size - 1))])

    def describe(self) -> list[str]:
        out = [f"io {api}: + concurrency profile shift Q_L(u) - Q_L0(u), L0 the level met when recorded ({how})"
               for api, how in sorted(self.how.items())]
        if self.missing:
            out.append("io without a concurrency profile (latency as recorded, queueing only in pools): "
                       + ", ".join(sorted(self.missing)))
        return out
