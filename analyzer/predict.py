"""The what-if engine: causal graphs x baseline samples x profiles x a scenario -> latency distributions.

WebPerf's what-if engine (Jiang et al., SIGCOMM 2016, section 4): every node of a request's causal graph gets
a latency distribution (its baseline samples when the scenario does not touch it, else the profile the
scenario implies), and the distributions are combined over the graph (sum along edges, max at all-waits,
min / k-th at any-waits). perfcast does the combination by joint Monte Carlo (:mod:`analyzer.distribution`):
it bootstraps whole recorded requests, so the nodes of one request stay together, and draws profile samples
for the touched nodes. Load and failure scenarios change how requests share the event loop and the
connection pools; they are simulated (:mod:`analyzer.loadsim`), and so is a scenario whose calls meet a
connection pool or wake-up and CPU profiles, at one user: at that load, the recorded one, the simulation
predicts the change to each recorded request rather than its latency
(:func:`analyzer.loadsim.simulate_scenario`).

How each change turns into node durations (``--explain`` prints it for every node):

- ``location:R=+Xms``: an io node's sample i gains ``round_trips[i] * X`` (round trips measured at
  collection; a call that pipelines or reuses a prepared statement makes fewer, a new connection more), less
  what of it the call's recorded wait for the loop absorbs (``queued_ms``, bounded by :func:`_answer_waited`:
  the loop was busy until then anyway, :func:`_absorbed`): a long delay's answer comes after the work it
  waited behind, and nothing added changes nothing.
- ``location:R=LABEL``: each round trip gains a draw of the ``rtt`` profile ``location=LABEL``, minus the
  median of the baseline ``rtt`` profile of that resource when the store has one (the recorded call already
  paid one baseline round trip each time).
- ``tier:R=LABEL``: the node's samples are drawn from the profile of its api with ``tier=LABEL``.
- ``size:R=BYTES``: drawn from the ``size_bytes`` profile (interpolated at BYTES) when the store has one;
  else a linear cost model fitted on the baseline: ``d_i + b * (BYTES - payload_i)`` with the per-byte cost
  ``b`` the Theil-Sen slope of duration on payload (max of request and response bytes) over every recorded
  call of that api to that resource. That needs payloads that vary; otherwise a ProfileError says to profile.
- ``interference:cpu=PCT``: with CPU profiles in the store the scenario is simulated (:mod:`analyzer.loadsim`),
  and each spell of the loop's work, from a wake-up until the loop idles again, takes what the profiles say a
  neighbour at PCT adds to a wake-up and that much work, at the quantile of the neighbour's phase when the
  spell starts (:mod:`analyzer.interference`): the probes measure exactly that, a sleep and then W ms of
  work. Without profiles, a compute node's CPU time ``c_i`` and an io call's own CPU on the loop (its
  ``cpu_ms``, and the loop's work inside its wait, ``hidden_ms``) are stretched by the fair share
  :func:`~analyzer.interference.cpu_slowdown`, their waiting parts unchanged (without a CPU measurement the
  whole segment counts as CPU).
- timer nodes racing work (``timeout_ms`` set) take their timeout, whatever the recorded request did.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from analyzer.distribution import (
    DagPlan,
    Distribution,
    Rows,
    compile_dag,
    evaluate_plan,
)
from analyzer.errors import GraphError, ProfileError, ScenarioError
from analyzer.graph import CausalGraph, Node, NodeKind, expected_answer_wait
from analyzer.interference import cpu_slowdown, stretch_profile
from analyzer.loadsim import WAIT_SCALE_KEY, Queueing, check_meta
from analyzer.scenario import (
    Failure,
    Interference,
    Load,
    Location,
    Scenario,
    Size,
    Targeted,
    Tier,
    applies,
    check_resources,
    matches,
    parse_scenario,
    target_of,
)
from analyzer.wakeup import service_wake_profiles, wake_profile

__all__ = [
    "NodeDurations",
    "NodeSource",
    "Prediction",
    "SupportsSelect",
    "cpu_slowdown",
    "node_durations",
    "predict",
    "select_routes",
]

FloatArray = npt.NDArray[np.float64]


class _SelectionLike(Protocol):
    @property
    def samples_ms(self) -> FloatArray: ...
    @property
    def keys(self) -> tuple[Any, ...]: ...
    @property
    def how(self) -> str: ...


class SupportsSelect(Protocol):
    """What the engine needs of a profile store: :meth:`analyzer.profiles.ProfileStore.select`."""

    def select(
        self, api: str, resource: str, labels: Mapping[str, str], param: str = "", value: float | None = None,
        concurrency: float | None = None,
    ) -> _SelectionLike: ...


@dataclass(frozen=True, slots=True)
class NodeSource:
    """Where a node's predicted durations came from (``--explain``)."""

    node: str
    kind: str
    source: str
    """``baseline``, ``profile``, ``model`` or ``timeout``."""
    how: str
    """Human-readable detail: the profile used, the model applied."""

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "kind": self.kind, "source": self.source, "how": self.how}


@dataclass(frozen=True, slots=True, eq=False)
class Prediction:
    """The predicted latency of one request kind (route) under one scenario, with today's beside it."""

    route: str
    scenario: str
    predicted: Distribution
    baseline: Distribution
    """The model without the scenario, on the same bootstrap draws (so differences are the scenario's)."""
    observed: Distribution | None
    """The latencies recorded at collection (the server spans), when the graphs carry them."""
    requests: int
    """Recorded requests of this route, over its variants."""
    sources: tuple[tuple[int, tuple[NodeSource, ...]], ...] = ()
    """(variant, the source of each node) for every variant of the route."""
    notes: tuple[str, ...] = field(default=())

    def to_json(self, *, samples: bool = True) -> dict[str, Any]:
        return {
            "route": self.route,
            "scenario": self.scenario,
            "requests": self.requests,
            "predicted": self.predicted.to_json(samples=samples),
            "baseline": self.baseline.to_json(samples=samples),
            "observed": self.observed.to_json(samples=samples) if self.observed else None,
            "sources": [{"variant": v, "nodes": [s.to_json() for s in ss]} for v, ss in self.sources],
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True, eq=False)
class NodeDurations:
    """Every node's durations under a scenario, ready for :func:`~analyzer.distribution.evaluate_plan`."""

    plan: DagPlan
    base: FloatArray
    """``(nodes, n)``: the baseline model's durations per recorded request."""
    per_request: Rows
    """``(nodes, n)``: the scenario's durations that are functions of the recorded request."""
    per_sample: dict[int, FloatArray]
    """position -> ``(S,)`` durations drawn per Monte Carlo sample (profiles)."""
    idx: npt.NDArray[np.intp]
    """``(S,)``: the recorded request each sample bootstraps."""
    sources: tuple[NodeSource, ...]
    loop_cpu: dict[int, tuple[FloatArray, FloatArray]] = field(default_factory=dict)
    """position -> ``(S,)`` CPU the scenario adds to an io call on the caller's loop after its wait, and ``(S,)``
    the part of the call's new duration that was the profile's callers queueing for each other's share of it
    (a bigger payload: :func:`_size_shift`). The DAG's estimate keeps both in the call's duration; the load
    simulation holds the loop for the CPU and queues the calls itself (:mod:`analyzer.loadsim`)."""

    def baseline(self) -> NodeDurations:
        """The same samples (the same recorded request in each) with the baseline's durations."""
        return NodeDurations(self.plan, self.base, _CopyOnWrite(self.base), {}, self.idx, self.sources)

    def sample_matrix(self) -> FloatArray:
        """``(nodes, S)``: every node's duration in every sample."""
        out = self.base[:, self.idx]
        changed = getattr(self.per_request, "rows", None)  # an overlay knows its changed rows
        for j in changed if changed is not None else range(self.plan.size):
            if j not in self.per_sample:
                out[j] = self.per_request[j][self.idx]
        for j, row in self.per_sample.items():
            out[j] = row
        return out


def predict(
    graphs: Sequence[CausalGraph],
    scenario: Scenario | str,
    store: SupportsSelect | None = None,
    samples: int = 10_000,
    rng: np.random.Generator | None = None,
    *,
    queueing: Queueing | None = None,
) -> list[Prediction]:
    """Predict each route's latency distribution under ``scenario``.

    Parameters
    ----------
    graphs
        Causal graphs (``load_graphs``); the variants of one route are mixed by their request counts.
    scenario
        A :class:`~analyzer.scenario.Scenario` or a spec string (``"location:redis=+20ms"``).
    store
        The profile store (:class:`~analyzer.profiles.ProfileStore`), needed by tier, size (unless the
        baseline payloads vary), location labels, and for io latencies under load.
    samples
        Monte Carlo samples per route (simulated requests under load).
    rng
        Source of randomness; pass ``np.random.default_rng(seed)`` to reproduce a prediction.
    queueing
        Filled, where the scenario is simulated (load, failure, wake-ups), with where its requests waited and
        how busy its loops were (:class:`~analyzer.loadsim.Queueing`).

    Raises
    ------
    ScenarioError
        A change names a resource the graphs do not have, or needs data they lack (round trips).
    ProfileError
        A profile the scenario needs does not exist.
    GraphError
        A graph has a cycle.

    References
    ----------
    .. [1] J. Jiang, R. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If
       Scenarios for Cloud-hosted Web Applications", SIGCOMM 2016, sections 4.3-4.4.
       doi:10.1145/2934872.2934882
    """
    if isinstance(scenario, str):
        scenario = parse_scenario(scenario)
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rng = rng if rng is not None else np.random.default_rng()
    if not graphs:
        raise ScenarioError("no graphs to predict from")
    for graph in graphs:
        if graph not in _COMPILED:  # validated when first compiled
            graph.validate()
        check_meta(graph)
    check_resources(scenario, graphs)
    scenario, pool_note = _with_observed_pools(scenario, graphs)
    if store is not None:
        store = _MemoStore(store)
        neighbour = [c for c in scenario.changes if isinstance(c, Interference)]
        if not scenario.needs_simulation and (
                scenario.changes_calls and (wake_profile(store) is not None or service_wake_profiles(store))
                or neighbour and stretch_profile(store, neighbour[-1].cpu_pct) is not None):
            # the loop's and the services' idle gaps, which wake-up profiles price and where a CPU neighbour's
            # wake-up latency falls, are known to the simulation only
            scenario = replace(scenario, changes=scenario.changes + (Load(users=1),))
    routes: dict[str, list[CausalGraph]] = {}
    for graph in graphs:
        routes.setdefault(graph.route, []).append(graph)
    allocation: dict[int, int] = {}
    for members in routes.values():
        weights = np.array([max(g.count, 1) for g in members], dtype=np.float64)
        for g, s in zip(members, rng.multinomial(samples, weights / weights.sum()), strict=True):
            allocation[id(g)] = int(s)
    # Monte Carlo columns per graph: its share of the samples; under simulation every variant may be drawn
    # at any time, so each gets enough columns not to replay a handful of requests
    columns = {id(g): max(allocation[id(g)], min(samples, 4096) if scenario.needs_simulation else 1)
               for g in graphs}
    typical = _uncontended(graphs, scenario)
    models = {id(g): node_durations(g, scenario, graphs, store, columns[id(g)], rng, typical=typical)
              for g in graphs}
    notes = _scenario_notes(scenario, graphs) + ([pool_note] if pool_note else [])
    if scenario.needs_simulation:
        from analyzer.loadsim import as_recorded, at_recorded_load, simulate_scenario

        # at the recorded load, the same requests with no change but the load (and pools) the simulation runs at:
        # the recording as the simulation models it, against which the prediction's change is taken
        recorded = ([node_durations(g, as_recorded(scenario), graphs, store, columns[id(g)], rng, typical=typical,
                                    idx=models[id(g)].idx) for g in graphs]
                    if at_recorded_load(scenario, graphs) else None)
        latencies, sim_notes = simulate_scenario(graphs, [models[id(g)] for g in graphs], scenario, store, samples,
                                                 rng, recorded, queueing)
        notes += sim_notes
        predicted = {id(g): lat for g, lat in zip(graphs, latencies, strict=True)}
    else:
        predicted = {}
        for g in graphs:
            m = models[id(g)]
            predicted[id(g)] = evaluate_plan(m.plan, m.per_request, m.idx, m.per_sample)
    picked: dict[str, FloatArray] = {}
    for route, members in routes.items():
        if scenario.needs_simulation:
            parts = [predicted[id(g)] for g in members if predicted[id(g)].size]
        else:
            parts = [predicted[id(g)] for g in members if allocation[id(g)] > 0]
        if parts:
            picked[route] = np.concatenate(parts)
    missing = [route for route in routes if route not in picked]
    if missing:
        notes.append(f"not reached in the simulation (no prediction): {', '.join(missing)}")
    out = []
    for route, pred in picked.items():
        members = routes[route]
        used = [g for g in members if allocation[id(g)] > 0] or members[:1]
        base = np.concatenate([_baseline_latency(g)[models[id(g)].idx[: max(allocation[id(g)], 1)]] for g in used])
        seen = [x for g in members for x in g.latency_ms]
        out.append(Prediction(
            route=route,
            scenario=scenario.name,
            predicted=Distribution.of(pred),
            baseline=Distribution.of(base),
            observed=Distribution.of(seen) if seen else None,
            requests=sum(g.count for g in members),
            sources=tuple((g.variant, models[id(g)].sources) for g in members),
            notes=tuple(notes),
        ))
    return out


def _with_observed_pools(scenario: Scenario, graphs: Sequence[CausalGraph]) -> tuple[Scenario, str]:
    """Enforce the connection pools the spans revealed (graph ``meta["pools"]``, see
    :func:`analyzer.build.observed_pools`) when the scenario changes I/O latencies.

    A slower database holds each pooled connection longer, so requests that fan out wider than the pool queue
    for connections longer too: the recorded waits for a free connection cannot say how much. A scenario that
    touches I/O is therefore simulated (one user when it has no ``load:`` of its own) with those limits, unless
    the scenario sets a ``pool.R`` itself.
    """
    pools: dict[str, int] = {}
    for graph in graphs:
        for resource, limit in (graph.meta.get("pools") or {}).items():
            if isinstance(limit, int) and limit > 0:
                pools[resource] = max(pools.get(resource, 0), limit)
    # interference too: it slows the loop's work, which a fan-out's calls queue for (their recorded durations
    # hold that queueing at today's speed; the simulation queues them again)
    touches_io = any(isinstance(c, (Location, Tier, Size, Failure, Interference)) for c in scenario.changes)
    if not pools or not (touches_io or scenario.load is not None):
        return scenario, ""
    load = scenario.load or Load(users=1)
    given = {r for r, _ in load.pools}
    added = tuple((r, n) for r, n in sorted(pools.items()) if r not in given)
    if not added:
        return scenario, ""
    load = replace(load, pools=load.pools + added)
    changes = tuple(c for c in scenario.changes if not isinstance(c, Load)) + (load,)
    note = ("connection pools seen in the spans (callers waited for a slot), enforced: "
            + ", ".join(f"{r} at most {n} calls in flight" for r, n in added))
    return replace(scenario, changes=changes), note


def _scenario_notes(scenario: Scenario, graphs: Sequence[CausalGraph]) -> list[str]:
    """What a reader of the table should know about how the changes applied."""
    notes = []
    for change in scenario.changes:
        if isinstance(change, Location):
            hits = [(g, n) for g in graphs for n in g.nodes if applies(change, n) and n.round_trips]
            trips = [float(_array(g, n, "round_trips").mean()) for g, n in hits]
            if hits and max(trips) == 0:
                notes.append(f"location:{target_of(change)}: its {len(hits)} calls made no network round trip "
                             "when recorded (a local file or an in-process call), so nothing changes")
            elif hits:
                notes.append(f"location:{target_of(change)}: {len(hits)} calls, {np.mean(trips):.2g} round trips "
                             "each on average (as recorded)")
        elif isinstance(change, Interference):
            compute = [n for g in graphs for n in g.nodes if n.kind is NodeKind.COMPUTE]
            blind = sum(1 for n in compute if not n.cpu_ms)
            if blind:
                notes.append(f"interference: {blind} of {len(compute)} compute nodes have no CPU time recorded: "
                             "all of their time is stretched")
    return notes


def select_routes(graphs: Sequence[CausalGraph], routes: Sequence[str]) -> list[CausalGraph]:
    """The graphs of ``routes`` (all when empty); raises :class:`ScenarioError` naming the routes there are.

    Under load the users issue the selected routes only, in their recorded proportions: leave out the
    routes of other services that the graphs file also holds (a backend traced in the same process).
    """
    if not routes:
        return list(graphs)
    have = list(dict.fromkeys(g.route for g in graphs))
    unknown = [r for r in routes if r not in have]
    if unknown:
        raise ScenarioError(f"unknown route {unknown[0]!r}; the graphs have: {', '.join(have)}")
    return [g for g in graphs if g.route in routes]


# --- node durations under a scenario --------------------------------------------------------------------------


_COMPILED: weakref.WeakKeyDictionary[CausalGraph, tuple[DagPlan, FloatArray, tuple[NodeSource, ...]]] = (
    weakref.WeakKeyDictionary()
)
"""Graphs are not changed once built: their plan and baseline matrix are computed once per graph, so that
exploring many scenarios does not convert the nodes' sample tuples to arrays again."""


def _compiled(graph: CausalGraph) -> tuple[DagPlan, FloatArray, tuple[NodeSource, ...]]:
    hit = _COMPILED.get(graph)
    if hit is None:
        plan = compile_dag(graph)
        base, sources = _base_matrix(graph, plan)
        base.setflags(write=False)
        hit = _COMPILED[graph] = (plan, base, tuple(sources))
    return hit


_BASELINE: weakref.WeakKeyDictionary[CausalGraph, FloatArray] = weakref.WeakKeyDictionary()


def _baseline_latency(graph: CausalGraph) -> FloatArray:
    """The baseline model's latency of each recorded request (bootstrapping it = bootstrapping requests)."""
    if graph not in _BASELINE:
        plan, base, _ = _compiled(graph)
        _BASELINE[graph] = evaluate_plan(plan, base, np.arange(base.shape[1]))
    return _BASELINE[graph]


def _base_matrix(graph: CausalGraph, plan: DagPlan) -> tuple[FloatArray, list[NodeSource]]:
    n = graph.count or max((len(graph.node(i).samples_ms) for i in plan.ids), default=1) or 1
    rows = np.zeros((plan.size, n))
    sources = []
    for j, node_id in enumerate(plan.ids):
        node = graph.node(node_id)
        if node.samples_ms and len(node.samples_ms) != n:
            raise GraphError(f"graph {graph.route!r} (variant {graph.variant}): node {node_id!r} has "
                             f"{len(node.samples_ms)} samples, other nodes {n}: samples must be aligned by request")
        if node.kind is NodeKind.TIMER and node.timeout_ms is not None:
            rows[j] = node.timeout_ms
            sources.append(NodeSource(node_id, node.kind.value, "timeout", f"its timeout, {node.timeout_ms:g} ms"))
            continue
        if node.samples_ms:
            rows[j] = node.samples_ms
        sources.append(NodeSource(node_id, node.kind.value, "baseline", "recorded samples"))
    return rows, sources


def _size_shift(
    graph: CausalGraph,
    node: Node,
    store: SupportsSelect,
    labels: Mapping[str, str],
    size_bytes: float,
    payload: FloatArray,
    new: _SelectionLike,
    recorded: FloatArray,
    idx: npt.NDArray[np.intp],
) -> tuple[FloatArray, str, tuple[FloatArray, FloatArray] | None] | None:
    """A size change as a shift of the recorded calls: ``d + Q_S(u) - Q_P(u)``, ``Q_S`` the size profile at the
    new size, ``Q_P`` at the recorded payload (its median) and ``u`` the call's rank among the node's recorded
    durations.

    WebPerf replaces the call's latency by the profile's. The shift keeps what the app's call holds beyond the
    profiled one, as the concurrency shift of :mod:`analyzer.loadsim` does: the client library's work, and the
    queueing of a fan-out (the example's index page fetches ten blobs at once, each recorded at 1.8-3.1 ms,
    where the size profile's single caller took 0.32 ms at the same payload).

    When the store has the size profile at several concurrencies (``perfcast profile --size ... --concurrency
    ...``), both quantile functions are read at the call's place in its fan-out: the calls of a fan-out share
    the server and the wire, so the n-th call's answer waits for the extra bytes of the ones before it (ten 256
    KiB blobs fetched at once: the last answered 1.6 ms later than at 4 KiB, where one alone took 0.2-0.4 ms
    longer). Its place is the io node's ``open_calls`` for a bigger payload (its request's calls to the resource
    whose spans were open when it started: a bigger answer comes in no sooner than today's did) and its
    ``inflight`` for a smaller one (those still waiting for their answers). The profile's ``L`` callers start
    together and are answered one after the other, so its shift at ``L`` is the mean over places 1..L of a
    queue, ``(L + 1) / 2`` answers' extra; the call at place ``L`` waits for ``L`` of them, ``2L / (L + 1)``
    times that. Read at its recorded ``inflight`` as a mean over places, the example's index page came out
    1.6-1.9 ms short of its measured +2.1-2.3 ms with 256 KiB blobs; read at its place, with its client's
    queueing as below, 0.4-0.5 ms short (``docs/accuracy.md``, runs 140-141). None when today's payload lies
    outside the measured sizes: the profile cannot say what a call of it takes.

    Where the profiles recorded their caller's CPU per call, the third item is what the new size adds to it
    (``c_S - c_P``, on the loop after the wait: taking in the bigger answer) and, of each call's shift, the part
    that was the profile's callers queueing for each other's extra on the client's loop: for the call at place
    ``L``, ``L - 1`` times what the client's CPU per answer exceeded the pace the answers came at, at the new
    size less at today's (:func:`_client_lag`; with 256 KiB blobs at ten callers the answers came 0.71 ms apart
    and took 0.23 ms of the client's CPU each: nothing queued). Ten 256 KiB answers cost the
    example app's loop about 2 ms more than ten of 4 KiB, which delays its other steps too: the index page
    measured 1.7-2.7 ms slower where the calls' shifts alone gave 0.2-0.9 ms.
    """
    today = float(np.median(payload))
    old = store.select(node.api, node.resource, labels, "size_bytes", today)
    if len(old.keys) == 1 and old.keys[0].value != today:
        return None
    n = recorded.size
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(recorded, kind="stable")] = (np.arange(n) + 0.5) / n
    u = ranks[idx]
    place = node.extra.get("open_calls" if size_bytes > today else "inflight")
    if place is None:
        place = node.extra.get("inflight")
    levels = (np.maximum(np.asarray(place, dtype=np.float64)[idx], 1.0)
              if place is not None and _measured_levels(store, node.api) else np.ones(idx.size))
    shift = np.empty(idx.size)
    cpu, queued = np.zeros(idx.size), np.zeros(idx.size)
    hows = []
    met = np.unique(levels)
    for level in met:
        at = levels == level
        q_new, q_old = (new, old) if met.size == 1 and level == 1.0 else (
            store.select(node.api, node.resource, labels, "size_bytes", size_bytes, float(level)),
            store.select(node.api, node.resource, labels, "size_bytes", today, float(level)))
        # the profile's mean place in its queue of ``level`` answers against this call's, the last of them
        place_factor = 2.0 * level / (level + 1.0)
        shift[at] = place_factor * (np.quantile(np.asarray(q_new.samples_ms, dtype=np.float64), u[at])
                                    - np.quantile(np.asarray(q_old.samples_ms, dtype=np.float64), u[at]))
        if q_new.cpu_ms is not None and q_old.cpu_ms is not None:
            cpu[at] = q_new.cpu_ms - q_old.cpu_ms
            if level > 1.0:
                queued[at] = (level - 1.0) * (_client_lag(q_new, new, level) - _client_lag(q_old, old, level))
        hows.append(q_new.how)
    drawn = np.maximum(recorded[idx] + shift, 0.0)
    # a smaller payload saves CPU, but never more than the call held; nor does the queueing go below nothing
    held = _array(graph, node, "cpu_ms")[idx] if len(node.cpu_ms) == n else 0.0
    cpu = np.maximum(cpu, -np.minimum(held, drawn))
    queued = np.clip(queued, 0.0, np.maximum(drawn - np.maximum(cpu, 0.0), 0.0))
    loop = (cpu, queued) if np.any(cpu != 0.0) else None
    places = (f"{int(levels.min())}" if levels.min() == levels.max()
              else f"{int(levels.min())}..{int(levels.max())}")
    where = (f"({hows[0]})" if levels.max() <= 1.0 else f"at each call's place in its fan-out, {places}, the last of "
             f"a queue of that many answers ({hows[-1]})")
    cpu_note = (f"; the caller's CPU {float(np.mean(cpu)):+.3g} ms a call on the loop after the wait, of which the "
                f"profile's callers queued {float(np.mean(queued)):.3g} ms for each other" if loop is not None else "")
    return drawn, (f"baseline + profile {node.api} at {size_bytes:g} B {where} - at today's payload "
                   f"{today:g} B, at the call's rank among its recorded durations (median shift "
                   f"{float(np.median(shift)):+.3g} ms){cpu_note}"), loop


def _client_lag(at_level: _SelectionLike, one: _SelectionLike, level: float) -> float:
    """How much longer the profile's client took to take in each answer than the answers took to come, with
    ``level`` callers (``at_level``) against one (``one``), at one size (ms, at least 0): what each answer
    queued on the client's loop behind the one before it.

    Its ``level`` callers start together and are answered one after the other: the answers come ``pace = 2 (Q_L
    - Q_1) / (L + 1)`` apart (medians at ``L`` callers and at one), and a client spending ``c`` ms of CPU on each
    falls behind by ``c - pace`` an answer when that is positive, else keeps up.
    """
    pace = 2.0 * (float(np.median(at_level.samples_ms)) - float(np.median(one.samples_ms))) / (level + 1.0)
    return max((at_level.cpu_ms or 0.0) - max(pace, 0.0), 0.0)


def _measured_levels(store: SupportsSelect, api: str) -> bool:
    """Whether the store has a size profile of ``api`` measured with more than one caller."""
    listing = getattr(store, "keys", None)
    return listing is not None and any(
        getattr(k, "api", "") == api and getattr(k, "param", "") == "size_bytes" and getattr(k, "concurrency", 1) > 1
        for k in listing())


def _payload(node: Node, graph: CausalGraph | None = None) -> FloatArray | None:
    """Payload of each recorded call: the larger of its request and response bytes."""
    req, resp = node.request_bytes, node.response_bytes
    if not req and not resp:
        return None
    if graph is not None:
        a, b = _array(graph, node, "request_bytes"), _array(graph, node, "response_bytes")
    else:
        a, b = np.asarray(req, dtype=np.float64), np.asarray(resp, dtype=np.float64)
    if not a.size or not b.size:
        return a if a.size else b
    return np.maximum(a, b)


_ARRAYS: weakref.WeakKeyDictionary[CausalGraph, dict[tuple[str, str], FloatArray]] = weakref.WeakKeyDictionary()


def _array(graph: CausalGraph, node: Node, name: str) -> FloatArray:
    """A node's per-request field (``round_trips``, ``cpu_ms``, bytes) as a cached read-only float array."""
    cache = _ARRAYS.setdefault(graph, {})
    key = (node.id, name)
    if key not in cache:
        arr = np.asarray(getattr(node, name), dtype=np.float64)
        arr.setflags(write=False)
        cache[key] = arr
    return cache[key]


class _MemoStore:
    """A profile store whose answers are remembered for one prediction (one SQLite query per profile)."""

    def __init__(self, store: SupportsSelect) -> None:
        self.store = store
        self.memo: dict[tuple[Any, ...], _SelectionLike | ProfileError] = {}
        self._keys: list[Any] | None = None

    def keys(self) -> list[Any]:
        """The store's profile keys (none for a store that cannot list them)."""
        if self._keys is None:
            listing = getattr(self.store, "keys", None)
            self._keys = list(listing()) if listing is not None else []
        return self._keys

    def select(
        self, api: str, resource: str, labels: Mapping[str, str], param: str = "", value: float | None = None,
        concurrency: float | None = None,
    ) -> _SelectionLike:
        key = (api, resource, tuple(sorted(labels.items())), param, value, concurrency)
        if key not in self.memo:
            try:
                self.memo[key] = (self.store.select(api, resource, labels, param, value) if concurrency is None
                                  else self.store.select(api, resource, labels, param, value, concurrency))
            except ProfileError as exc:
                self.memo[key] = exc
        hit = self.memo[key]
        if isinstance(hit, ProfileError):
            raise hit
        return hit


def _per_byte_ms(change: Size, api: str, graphs: Sequence[CausalGraph]) -> tuple[float, str] | None:
    """Theil-Sen slope of duration on payload over every recorded call of ``api`` to the resource."""
    from scipy.stats import theilslopes  # type: ignore[import-untyped]

    xs, ys = [], []
    for graph in graphs:
        for node in graph.nodes:
            p = _payload(node, graph) if node.api == api and matches(change.resource, node) else None
            if p is not None and p.size == len(node.samples_ms):
                xs.append(p)
                ys.append(np.asarray(node.samples_ms))
    if not xs:
        return None
    x, y = np.concatenate(xs), np.concatenate(ys)
    if x.size < 5 or x.max() < 1.5 * max(x.min(), 1.0):
        return None
    if x.size > 2000:  # Theil-Sen is O(n^2): a fixed-seed subset keeps it fast and reproducible
        keep = np.random.default_rng(0).choice(x.size, 2000, replace=False)
        x, y = x[keep], y[keep]
    slope = max(float(theilslopes(y, x).slope), 0.0)
    return slope, f"{x.size} calls, {x.min():.0f}..{x.max():.0f} bytes"


def node_durations(
    graph: CausalGraph,
    scenario: Scenario,
    graphs: Sequence[CausalGraph],
    store: SupportsSelect | None,
    samples: int,
    rng: np.random.Generator,
    *,
    typical: Mapping[str, float] | None = None,
    idx: npt.NDArray[np.intp] | None = None,
) -> NodeDurations:
    """Each node's durations under ``scenario``, with where they came from (profile selection, section 4.3).

    ``typical``: :func:`_uncontended` of ``graphs`` (worked out here when not given; :func:`predict` works it
    out once for all the graphs). ``idx``: the recorded request each sample bootstraps (drawn here when not
    given; :func:`predict` gives the scenario's to the recording's model, so that both hold the same requests).
    """
    if typical is None:
        typical = _uncontended(graphs, scenario)
    plan, base, baseline_sources = _compiled(graph)
    sources = list(baseline_sources)
    n = base.shape[1]
    if idx is None:
        idx = rng.integers(0, n, samples)
    per_request = _CopyOnWrite(base)
    per_sample: dict[int, FloatArray] = {}
    loop_cpu: dict[int, tuple[FloatArray, FloatArray]] = {}
    cpu = [c for c in scenario.changes if isinstance(c, Interference)]
    stretch = stretch_profile(store, cpu[-1].cpu_pct) if cpu and store is not None else None
    for j, node_id in enumerate(plan.ids):
        node = graph.node(node_id)
        notes: list[str] = []
        if node.kind is NodeKind.IO:
            notes = _io_node(j, node, graph, scenario, graphs, store, idx, per_request, per_sample, rng, typical,
                             loop_cpu)
            if cpu and stretch is None and node.cpu_ms and len(node.cpu_ms) == n:
                notes.append(_io_cpu_stretch(j, graph, node, cpu[-1].cpu_pct, per_request, per_sample, idx))
        elif node.kind is NodeKind.COMPUTE and cpu and stretch is not None:
            notes = ["interference: simulated: each spell of the loop's work, from a wake-up until it idles, takes "
                     "what the CPU profiles say a neighbour adds to a wake-up and that much work, at its phase"]
        elif node.kind is NodeKind.COMPUTE and cpu:
            p = cpu[-1].cpu_pct / 100.0
            if node.cpu_ms and len(node.cpu_ms) == n:
                c = np.minimum(_array(graph, node, "cpu_ms"), per_request[j])
                what = "CPU time"
            else:
                c = per_request[j].copy()
                what = "whole segment (no CPU time recorded)"
            factor = cpu_slowdown(cpu[-1].cpu_pct)
            per_request[j] = per_request[j] + c * (factor - 1.0)
            notes = [f"interference: {what} x {factor:.3g} (fair share with a neighbour busy {p:.0%} of the "
                     "time; no CPU profile in the store: perfcast profile --cpu)"]
        if notes:
            src = "profile" if j in per_sample else "model"
            sources[j] = NodeSource(node_id, node.kind.value, src, "; ".join(notes))
    return NodeDurations(plan, base, per_request, per_sample, idx, tuple(sources), loop_cpu)


def _io_cpu_stretch(j: int, graph: CausalGraph, node: Node, cpu_pct: float, per_request: _CopyOnWrite,
                    per_sample: dict[int, FloatArray], idx: npt.NDArray[np.intp]) -> str:
    """Interference without CPU profiles on an io call's own CPU (the client library's work on the loop, the
    node's ``cpu_ms``) and on the loop's work inside its wait (``hidden_ms``, :func:`analyzer.build._hidden_work`):
    the fair share (:func:`~analyzer.interference.cpu_slowdown`)."""
    factor = cpu_slowdown(cpu_pct)
    own = _array(graph, node, "cpu_ms")
    raw = node.extra.get("hidden_ms")
    hidden = np.asarray(raw, dtype=np.float64) if isinstance(raw, list) and len(raw) == own.size else None
    c = np.minimum(own if hidden is None else own + hidden, per_request[j])
    if j in per_sample:
        per_sample[j] = per_sample[j] + c[idx] * (factor - 1.0)
    else:
        per_request[j] = per_request[j] + c * (factor - 1.0)
    inside = "" if hidden is None else f", and the loop's work inside its wait, {float(np.mean(hidden)):.3g} ms"
    return (f"interference: the call's CPU on the loop (the client library's work, {float(np.mean(own)):.3g} ms"
            f"{inside}) x {factor:.3g} (fair share with a neighbour busy {cpu_pct:g}% of the time; no CPU profile "
            "in the store)")


class _CopyOnWrite:
    """The baseline matrix with some rows replaced, without copying the rest (most rows stay baseline)."""

    def __init__(self, base: FloatArray) -> None:
        self.base = base
        self.shape = base.shape
        self.rows: dict[int, FloatArray] = {}

    def __getitem__(self, j: int) -> FloatArray:
        row = self.rows.get(j)
        return self.base[j] if row is None else row

    def __setitem__(self, j: int, row: FloatArray) -> None:
        self.rows[j] = np.asarray(row, dtype=np.float64)


def _spec(change: Targeted) -> str:
    """The change as a spec writes it, API filter included: what an ``--explain`` note comes from."""
    if isinstance(change, Size):
        return f"size:{target_of(change)}={change.size_bytes:.0f}B"
    if isinstance(change, Tier):
        return f"tier:{target_of(change)}={change.label}"
    value = f"{change.added_ms:+g}ms" if change.added_ms is not None else change.label
    return f"location:{target_of(change)}={value}"


def _need_store(store: SupportsSelect | None, scenario: Scenario, what: str) -> SupportsSelect:
    if store is None:
        raise ProfileError(f"scenario {scenario.name!r}: {what} needs a profile store (--profiles FILE)")
    return store


def _uncontended(graphs: Sequence[CausalGraph], scenario: Scenario) -> dict[str, float]:
    """How soon an answer can come, per resource: the 10th percentile of the recorded durations of its io calls
    whose answer did not wait for the loop's task steps (``queued_ms`` 0). Only a location change and the load
    simulation ask (:func:`_answer_waited`): empty without either.

    Per resource, not per api: an api only ever called beside others is never seen alone. The example's top-users
    query, always in a ``gather`` with ten blob fetches, took 3.5 ms at its fastest tenth with ``queued_ms`` 0 (the
    loop was taking in the blobs' answers, work outside any task step), and 10.8 ms under +10 ms of round trip:
    its server answered in 0.8. Floored at the api's 3.5 ms, only 0.4 ms of its recorded 4.7 could absorb the
    delay, where 3.8 did, and the index page came out 1-2.5 ms long under the database's location change
    (``docs/accuracy.md``, runs 57-58)."""
    if not any(isinstance(c, Location) for c in scenario.changes) and not scenario.needs_simulation:
        return {}
    by: dict[str, list[float]] = {}
    for graph in graphs:
        for node in graph.nodes:
            queued = node.extra.get("queued_ms")  # one per request when present (CausalGraph.validate)
            if node.kind is not NodeKind.IO or queued is None:
                continue
            by.setdefault(node.resource, []).extend(
                d for d, q in zip(node.samples_ms, queued, strict=True) if q <= _UNCONTENDED_MS)
    return {k: float(np.quantile(v, 0.1)) for k, v in by.items() if v}


_UNCONTENDED_MS = 0.1
"""A call counts as uncontended (:func:`_uncontended`) when its answer waited no more than this for the loop:
with the loop's sleeps recorded the bound holds the loop's own turn between the answer's read callback and the
task's step (tens of us), never exactly zero."""


def _typical_of(node: Node, typical: Mapping[str, float]) -> float | None:
    return typical.get(node.resource)


def _answer_waited(graph: CausalGraph, node: Node, durations: FloatArray,
                   typical: Mapping[str, float]) -> tuple[FloatArray, FloatArray]:
    """How long each recorded call's answer waited for the event loop, per recorded request (ms): an upper
    bound, and the part of it known for certain.

    ``queued_ms`` (:meth:`analyzer.build._Builder._queued`: the loop's busy spell before the call returned,
    less the call's own work) bounds it from above, since the answer may have come in the middle of the
    spell; the answer cannot have come sooner than a call to the same resource takes when nothing else runs
    (the fastest tenth of those calls, :func:`_uncontended`), so what the call took beyond that bounds it too.
    ``answered_ms``, the wait after the answer's read callback, is known (within the bound). The call's own
    CPU (the client library's) stays. Zero without either (graphs from an older collector, no such calls).
    """
    queued = node.extra.get("queued_ms")  # one per recorded request when present (CausalGraph.validate)
    base = _typical_of(node, typical)
    if base is None or queued is None:
        return np.zeros_like(durations), np.zeros_like(durations)
    cpu = np.minimum(_array(graph, node, "cpu_ms"), durations) if len(node.cpu_ms) == durations.size else 0.0
    room = np.minimum(durations - base, durations - cpu)
    bound = np.clip(np.minimum(np.asarray(queued, dtype=np.float64), room), 0.0, None)
    answered = node.extra.get("answered_ms")
    known = (np.minimum(np.asarray(answered, dtype=np.float64), bound) if answered is not None
             else np.zeros_like(bound))
    return bound, np.maximum(known, 0.0)


def _absorbed(added: FloatArray, waited: FloatArray, taken: FloatArray) -> FloatArray:
    """What a call's added delay adds to its duration, given the bound ``waited`` on how long its answer waited
    for the event loop as recorded, of which ``taken`` was taken out of the duration already.

    The answer arrives ``added`` later. While the rest of the recorded wait lasts, the loop was busy anyway, so a
    delay up to it changes nothing; beyond it, every millisecond counts: ``max(added - (waited - taken), 0)``.
    With nothing added the duration is the recording's; with a long delay the whole recorded wait is gone. A
    negative change (a nearer resource) is added as it is: its answer comes sooner, and the simulated loop
    decides whether it waits.

    >>> _absorbed(np.array([0.0, 1.0, 20.0, -1.0]), np.array([2.0, 2.0, 2.0, 2.0]), np.ones(4)).tolist()
    [0.0, 0.0, 19.0, -1.0]
    """
    rest = waited - taken
    return np.asarray(np.where(added >= 0.0, np.maximum(added - rest, 0.0), added), dtype=np.float64)


def _io_node(
    j: int,
    node: Node,
    graph: CausalGraph,
    scenario: Scenario,
    graphs: Sequence[CausalGraph],
    store: SupportsSelect | None,
    idx: npt.NDArray[np.intp],
    per_request: _CopyOnWrite,
    per_sample: dict[int, FloatArray],
    rng: np.random.Generator,
    typical: Mapping[str, float],
    loop_cpu: dict[int, tuple[FloatArray, FloatArray]],
) -> list[str]:
    notes: list[str] = []
    tiers = [c for c in scenario.changes if isinstance(c, Tier) and applies(c, node)]
    sizes = [c for c in scenario.changes if isinstance(c, Size) and applies(c, node)]
    locations = [c for c in scenario.changes if isinstance(c, Location) and applies(c, node)]
    labels = {"tier": tiers[-1].label} if tiers else {}
    size = sizes[-1] if sizes else None
    drawn: FloatArray | None = None
    if tiers or size:
        # the changes behind the profile or model, filters included: "size:blob[GET /blob/*]=262144B: ..."
        why = " + ".join(_spec(c) for c in ([tiers[-1]] if tiers else []) + ([size] if size else [])) + ": "
        what = f"{'tier ' + tiers[-1].label if tiers else ''}{' and ' if tiers and size else ''}" \
               f"{f'size {size.size_bytes:g} B' if size else ''} for {node.api!r}"
        sel = None
        if store is not None or tiers:
            s = _need_store(store, scenario, what)
            try:
                sel = s.select(node.api, node.resource, labels, "size_bytes" if size else "",
                               size.size_bytes if size else None)
            except ProfileError:
                if tiers or size is None:
                    raise
        payload = _payload(node, graph) if size is not None else None
        if (sel is not None and size is not None and not tiers and sel.keys[0].param == "size_bytes"
                and payload is not None):
            # today's calls, shifted by what the profile says the new size adds to a call of today's payload
            shifted = _size_shift(graph, node, s, labels, size.size_bytes, payload, sel, per_request[j], idx)
            if shifted is not None:
                drawn = shifted[0]
                notes.append(f"{why}{shifted[1]}")
                if shifted[2] is not None:
                    loop_cpu[j] = shifted[2]
        if drawn is None and sel is not None and (size is None or sel.keys[0].param == "size_bytes"):
            drawn = rng.choice(np.asarray(sel.samples_ms, dtype=np.float64), size=idx.size)
            outside = " (today's payload lies outside the measured sizes: the profile replaces the call)" \
                if size is not None and payload is not None and not tiers else ""
            notes.append(f"{why}profile {sel.keys[0].api} [{','.join(f'{a}={b}' for a, b in sel.keys[0].labels)}]: "
                         f"{sel.how}{outside}")
        if size is not None and drawn is None:
            fit = _per_byte_ms(size, node.api, graphs)
            if fit is None or payload is None:
                have = f"; the store's answer: {sel.how}" if sel is not None else ""
                raise ProfileError(
                    f"scenario {scenario.name!r}: no size_bytes profile for {node.api!r} at {node.resource!r}, "
                    f"and its recorded payloads do not vary enough to fit a per-byte cost{have}; measure one with "
                    f"'perfcast profile ... --size' (node {node.id!r}, route {graph.route!r})"
                )
            slope, span = fit
            if sel is not None:
                # a tier profile measured at today's payloads, shifted by the fitted per-byte cost
                drawn = rng.choice(np.asarray(sel.samples_ms, dtype=np.float64), size=idx.size)
                drawn = np.maximum(drawn + slope * (size.size_bytes - payload[idx]), 0.0)
                notes.append(f"{why}profile {sel.how}, + {slope * 1e6:.3g} ms/MB x (size - payload) fitted on "
                             f"{span}")
            else:
                per_request[j] = np.maximum(per_request[j] + slope * (size.size_bytes - payload), 0.0)
                notes.append(f"{why}baseline + {slope * 1e6:.3g} ms/MB x ({size.size_bytes:g} B - payload), "
                             f"Theil-Sen fit on {span}")
    if drawn is not None:
        per_sample[j] = drawn
    # Each recorded call's wait for the loop after its answer came (a bound, :func:`_answer_waited`; nothing for
    # durations drawn from a profile, which hold none). The simulated loop queues an answer again, so it takes
    # out the expected part of the wait (ANSWER_WAIT_SHARE), from every call alike so that the simulation with no
    # change gives back the recording; graphs calibrated to a light run, whose wait scale absorbs it, keep it.
    simulated = scenario.needs_simulation and WAIT_SCALE_KEY not in graph.meta
    waited = taken = None
    if simulated or (locations and j not in per_sample):
        bound, known = _answer_waited(graph, node, per_request[j], typical)
        expected = expected_answer_wait(bound, known) if simulated else np.zeros_like(bound)
        if j in per_sample:
            if simulated and expected.any():
                per_sample[j] = np.maximum(per_sample[j] - expected[idx], 0.0)
        else:
            waited, taken = bound, expected
            per_request[j] = per_request[j] - expected
        if simulated and expected.any():
            notes.append(f"without the expected part of its recorded wait for the loop (answered_ms, and half of "
                         f"the rest of queued_ms), which the simulated loop queues again: {expected.mean():.3g} ms "
                         "on average")
    if not locations:
        return notes
    for loc in locations:
        if not node.round_trips or len(node.round_trips) != per_request.shape[1]:
            raise ScenarioError(
                f"scenario {scenario.name!r}: io node {node.id!r} of route {graph.route!r} ({node.api}) has no "
                "round-trip counts, so the added RTT cannot be applied; collect the spans again with perfcast's "
                "collector (it records perfcast.io.round_trips)"
            )
    trips = _array(graph, node, "round_trips")
    added: FloatArray = np.zeros(per_request.shape[1])
    per_sample_added = False
    for loc in locations:
        if loc.added_ms is not None:
            added = added + trips * loc.added_ms
            notes.append(f"{_spec(loc)}: + {loc.added_ms:g} ms x round trips (mean {trips.mean():.3g})")
            continue
        s = _need_store(store, scenario, f"location {loc.label}")
        sel = s.select("rtt", node.resource, {"location": str(loc.label)})
        rtt = np.asarray(sel.samples_ms, dtype=np.float64)
        offset = 0.0
        try:
            here = s.select("rtt", node.resource, {})
            if here.keys and here.keys[0].labels == ():
                offset = float(np.median(here.samples_ms))
        except ProfileError:
            pass
        k = trips[idx].astype(np.int64)
        draws = rng.choice(rtt, size=int(k.sum())) - offset
        drawn_rtt = np.zeros(idx.size)
        nz = k > 0
        if nz.any():
            # sum each sample's k round-trip draws: reduceat over the segment starts
            starts = np.concatenate([[0], np.cumsum(k[nz])[:-1]])
            drawn_rtt[nz] = np.add.reduceat(draws, starts)
        added = (added if per_sample_added else added[idx]) + drawn_rtt
        per_sample_added = True
        notes.append(f"{_spec(loc)}: + rtt [location={loc.label}] x round trips ({sel.how}"
                     f"{f'; minus baseline rtt median {offset:.3g} ms' if offset else ''})")
    if waited is not None and taken is not None and waited.any():
        # the answer comes later; what it waited for the loop as recorded (less the part taken out above) absorbs
        # the delay first, since the loop was busy until then anyway; a long delay leaves none of it
        added = (_absorbed(added, waited[idx], taken[idx]) if per_sample_added
                 else _absorbed(added, waited, taken))
        notes.append(f"its recorded wait for the loop (queued_ms; {waited.mean():.3g} ms on average, at most what it "
                     f"took beyond {_typical_of(node, typical) or 0.0:.3g} ms, the fastest tenth of the calls to its "
                     "resource while nothing else ran) absorbs the added delay first")
    if j in per_sample or per_sample_added:
        row = per_sample[j] if j in per_sample else per_request[j][idx]
        per_sample[j] = np.maximum(row + (added if per_sample_added else added[idx]), 0.0)
    else:
        per_request[j] = np.maximum(per_request[j] + added, 0.0)
    return notes
