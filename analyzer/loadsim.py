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
  flight, the others queue FIFO for a connection); every other node is a pure delay;
- an io call's latency is its sampled duration, shifted when the profile store has a concurrency-
  parameterised profile of its api: by ``Q_L(u) - Q_1(u)``, where ``Q_L`` is the profile's quantile function
  at the concurrency ``L`` the call meets on arrival (calls in flight to its resource) and ``u`` the call's
  rank among its node's samples, so the app-specific part of the call is kept and only the profiled effect
  of concurrency is added;
- front-end replicas share the users evenly (``load:N?replicas=R``; ``failure:app`` leaves R - 1); a failed
  backend replica leaves its calls to R - 1 replicas, which only matters through concurrency profiles (the
  level a call meets is scaled by R / (R - 1): WebPerf's "its load effectively doubles" for R = 2);
- a compute node's recorded wait before its task first ran (``ready_ms``) was queueing for the loop: it is
  left out of the node's service time, since the simulation queues the node again under the new load;
- HTTP calls to a route the graphs also hold become sub-requests (:class:`_Nesting`).

The first ``2 N`` completions are discarded (the start-up transient of users that all start at t = 0).
Checks with answers by hand are in the tests: N users of pure compute ``d`` see ``N d``; pure io is unchanged.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from analyzer.distribution import DagPlan, evaluate_plan
from analyzer.errors import ProfileError
from analyzer.graph import CausalGraph, Node, NodeKind
from analyzer.scenario import Failure, Load, Scenario, Tier, matches

if TYPE_CHECKING:
    from analyzer.predict import NodeDurations, SupportsSelect

__all__ = ["Workload", "simulate", "simulate_scenario"]

FloatArray = npt.NDArray[np.float64]
Adjust = Callable[[int, int, int, int], float]
"""(workload, node position, column, concurrency level) -> duration shift in ms."""


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
) -> list[FloatArray]:
    """Latencies of ``completions`` user requests of ``users`` closed-loop users, per workload.

    ``pool_sizes[p]`` limits the calls in flight through pool ``p``; the calls in flight of resource group ``g``
    times ``scale[g]`` (rounded up) is the concurrency level passed to ``adjust``. ``routes[i]`` lists the
    workloads (variants) of nested route ``i`` and their shares; ``servers`` is the number of FIFO CPU servers
    (event loops). Latencies of nested requests are reported with their workload too.
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
    cursor = [0] * len(workloads)
    out: list[list[float]] = [[] for _ in workloads]
    heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, request, node, phase)
    seq = 0
    loop_free = [0.0] * max(servers, 1)
    free = list(pool_sizes)
    waiting: list[deque[tuple[int, int]]] = [deque() for _ in pool_sizes]
    inflight = [0] * len(scale)
    # per request: workload, column, start time, remaining needs, CPU server, parent (request, node), depth
    req_kind: list[int] = []
    req_col: list[int] = []
    req_t0: list[float] = []
    req_need: list[list[int]] = []
    req_server: list[int] = []
    req_parent: list[tuple[int, int] | None] = []
    req_depth: list[int] = []
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
        begin(len(req_kind) - 1, w.plan.start, t)

    def new_request(t: float) -> None:
        nonlocal issued
        k = int(kinds[issued])
        issued += 1
        open_request(k, t, 0, None, 0)

    def start_io(r: int, j: int, t: float, d: float) -> None:
        k = req_kind[r]
        w = workloads[k]
        g = w.group[j] if w.group else -1
        if g >= 0:
            inflight[g] += 1
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
        push(t + d, r, j, 1)

    def begin(r: int, j: int, t: float) -> None:
        w = workloads[req_kind[r]]
        d = float(w.durations[j, req_col[r]])
        if w.on_loop[j]:
            server = req_server[r]
            s = max(t, loop_free[server])  # FIFO single server: service starts when the loop is free
            loop_free[server] = s + d
            push(s + d, r, j, 0)
            return
        p = w.pool[j] if w.pool else -1
        if p >= 0:
            if free[p] == 0:
                waiting[p].append((r, j))
                return
            free[p] -= 1
        start_io(r, j, t, d)

    while issued < users:
        new_request(0.0)
    while heap:
        t, _, r, j, phase = heapq.heappop(heap)
        if phase == 2:
            new_request(t)
            continue
        k = req_kind[r]
        w = workloads[k]
        if phase == 1:  # an io call (or delay) finished: release what it held
            g = w.group[j] if w.group else -1
            if g >= 0:
                inflight[g] -= 1
            p = w.pool[j] if w.pool else -1
            if p >= 0:
                if waiting[p]:
                    r2, j2 = waiting[p].popleft()
                    start_io(r2, j2, t, float(workloads[req_kind[r2]].durations[j2, req_col[r2]]))
                else:
                    free[p] += 1
        need = req_need[r]
        for nxt in succ[k][j]:
            need[nxt] -= 1
            if need[nxt] == 0:
                begin(r, nxt, t)
        if j != w.plan.end:
            continue
        parent = req_parent[r]
        if parent is not None:  # a nested request ended: its caller's call ends after the client side
            pr, pj = parent
            if done_count >= warmup:
                out[k].append(t - req_t0[r])
            push(t + float(workloads[req_kind[pr]].durations[pj, req_col[pr]]), pr, pj, 1)
            continue
        done_count += 1
        if done_count > warmup:
            out[k].append(t - req_t0[r])
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
) -> tuple[list[FloatArray], list[str]]:
    """Simulate a scenario with load and/or failure changes: per graph latencies, and notes saying how.

    ``models`` are the graphs' node durations under the scenario's other changes (:func:`node_durations`).
    """
    load = scenario.load or Load(1)
    failures = [c for c in scenario.changes if isinstance(c, Failure)]
    notes: list[str] = []
    fronts = load.replicas
    alive_fronts = fronts
    for f in failures:
        if f.is_app:
            fronts = f.replicas or (load.replicas if load.replicas > 1 else 2)
            alive_fronts = fronts - 1
            notes.append(f"failure: 1 of {fronts} front ends fails"
                         f"{'' if f.replicas or load.replicas > 1 else ' (2 assumed: give failure:app?replicas=R)'}")
    users = max(1, round(load.users / alive_fronts))
    notes.append(f"load: {load.users} closed-loop users over {alive_fronts} front end(s) -> {users} per event loop"
                 f"{f', think {load.think_ms:g} ms' if load.think_ms else ''}; compute nodes share one FIFO loop")

    pool_names = [name for name, _ in load.pools]
    notes += [f"pool {name}: at most {limit} calls in flight per front end" for name, limit in load.pools]
    backend = [f for f in failures if not f.is_app]
    group_ids: dict[str, int] = {}
    group_scale: list[float] = []
    failed_groups: dict[int, Failure] = {}
    for f in backend:
        endpoints = {n.resource for g in graphs for n in g.nodes if matches(f.resource, n)}
        count = f.replicas or (len(endpoints) if len(endpoints) > 1 else 2)
        gid = group_ids.setdefault(f"failure:{f.resource}", len(group_scale))
        # One endpoint (a balancer in front of the replicas) was profiled as a whole: its calls now load
        # count - 1 replicas instead of count, so a level L there is the profile's L * count / (count - 1).
        # Distinct endpoints were profiled one by one: the calls to all of them now share count - 1.
        group_scale.append((1.0 if len(endpoints) > 1 else count) / (count - 1))
        failed_groups[gid] = f
        notes.append(f"failure: 1 of {count} replicas of {f.resource!r} fails; the {count - 1} left carry its calls"
                     f"{'' if f.replicas or len(endpoints) > 1 else ' (2 assumed: give ?replicas=R)'}")

    nesting = _Nesting(graphs, models, load.nested)
    curves = _Curves(store, scenario)
    ready_nodes = 0
    parts: list[tuple[Any, ...]] = []
    for gi, (graph, model) in enumerate(zip(graphs, models, strict=True)):
        durations = model.sample_matrix()
        on_loop, pool, group, nested, server = [], [], [], [], []
        for j, node_id in enumerate(model.plan.ids):
            node = graph.node(node_id)
            on_loop.append(node.kind is NodeKind.COMPUTE)
            ready = node.extra.get("ready_ms")
            if node.kind is NodeKind.COMPUTE and isinstance(ready, list) and len(ready) == model.base.shape[1]:
                # The recorded segment includes the wait for the loop before the task first ran: that wait is
                # what the simulation reproduces, so the loop is held for the rest only.
                waited = np.asarray(ready, dtype=np.float64)[model.idx]
                durations[j] = np.maximum(durations[j] - waited, 0.0)
                ready_nodes += 1
            target, srv = nesting.target(gi, j, node, durations)
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
            group.append(group_ids[key])
            if target < 0:
                curves.register(gi, j, node, durations[j])
        parts.append((model.plan, durations, tuple(on_loop), tuple(pool), tuple(group), tuple(nested), tuple(server)))
    # weights once every nested call is known
    workloads = [Workload(plan, durations, loop, pool, group, nesting.weight(gi), nested, server)
                 for gi, (plan, durations, loop, pool, group, nested, server) in enumerate(parts)]
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
    notes += nesting.describe()
    notes += curves.describe()
    user_routes = len({g.route for gi, g in enumerate(graphs) if nesting.weight(gi) > 0})
    latencies = simulate(
        workloads, users, samples * max(user_routes, 1), rng, think_ms=load.think_ms,
        pool_sizes=[limit for _, limit in load.pools], scale=group_scale,
        adjust=curves.adjust if curves.any else None, routes=nesting.routes, servers=nesting.servers,
    )
    return latencies, notes


class _Nesting:
    """HTTP calls served by a route the graphs also hold: simulated as sub-requests (see :class:`Load`).

    A node ``http GET /ad`` calls route ``GET /ad`` when the graphs have that route: the app called itself, or
    a service traced in the same process. The call then lasts the sub-request's simulated latency plus its
    client side: the call's sampled duration (with the scenario's changes, ``+20 ms`` per round trip) minus
    the route's median latency, at least 0; so at load 1 the call keeps its recorded distribution, tails
    included. Calls drawn from a profile (tier, size) stay plain calls: the profile measured the whole call. Users issue each route in proportion to its recorded
    requests that were *not* such calls (a route only ever called by others gets no users).
    """

    def __init__(self, graphs: Sequence[CausalGraph], models: Sequence[NodeDurations], mode: str) -> None:
        self.graphs, self.models, self.mode = graphs, models, mode
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
        self.nodes: dict[tuple[int, int], tuple[tuple[str, str, tuple[tuple[str, str], ...]], FloatArray]] = {}
        self.how: dict[str, str] = {}

    @property
    def any(self) -> bool:
        return bool(self.nodes)

    def register(self, k: int, j: int, node: Node, row: FloatArray) -> None:
        if self.store is None:
            return
        tiers = [c for c in self.scenario.changes if isinstance(c, Tier) and matches(c.resource, node)]
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
            self.nodes[(k, j)] = (key, ranks)

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
        entry = self.nodes.get((k, j))
        if entry is None or level <= 1:
            return 0.0
        key, ranks = entry
        u = ranks[col]
        hi, lo = self.quantiles(key, level), self.found[key][1]
        return float(hi[int(u * (hi.size - 1))] - lo[int(u * (lo.size - 1))])

    def describe(self) -> list[str]:
        out = [f"io {api}: + concurrency profile shift Q_L(u) - Q_1(u) ({how})" for api, how in sorted(self.how.items())]
        if self.missing:
            out.append("io without a concurrency profile (latency as recorded, queueing only in pools): "
                       + ", ".join(sorted(self.missing)))
        return out
