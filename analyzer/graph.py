"""The causal graph of one request kind: the data model at the centre of perfcast.

A :class:`CausalGraph` is a DAG of :class:`Node` objects from a ``start`` node to an ``end`` node. Edges are
happens-before. A node starts when its predecessors finish (all of them, any one of them, or the k-th of them,
as its :class:`WaitMode` and ``k`` say) and ends ``duration`` later. Every node carries its observed durations
across the requests of the variant (``samples_ms``), aligned: ``samples_ms[i]`` of every node comes from the
same request ``i``, so the dependence between nodes of one request is kept.

The JSON form (``perfcast graph -o graphs.json``) is ``{"format": "perfcast-graphs/1", "graphs": [...]}``, each
graph as :meth:`CausalGraph.to_json` writes it; ``docs/graphs.md`` describes it field by field.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import numpy.typing as npt

from analyzer.errors import GraphError, GraphFileError

__all__ = [
    "ANSWER_WAIT_SHARE",
    "FORMAT",
    "PER_REQUEST_EXTRAS",
    "CausalGraph",
    "Node",
    "NodeKind",
    "WaitMode",
    "dump_graphs",
    "evaluate",
    "expected_answer_wait",
    "load_graphs",
    "hidden_loop_ms",
    "loop_cpu_ms",
    "to_dot",
]

FORMAT = "perfcast-graphs/1"
"""The ``format`` tag of a graphs file."""


ANSWER_WAIT_SHARE = 0.5
"""The part of the uncertain span of an io call's recorded wait for the loop (``queued_ms``, a bound, less its
known part ``answered_ms``) taken as the answer's wait: the load simulation takes it out of the call, since its
loop queues the answer again, and the builder counts the call as still waiting for its answer until then when
it counts a request's calls in flight (``inflight``). The answer came at some point of the busy spell the bound
spans: half of it, expected for an answer arriving uniformly in it. On the example's index page with nothing
changed, the one-user simulation came out 0.45 ms above the recording keeping all of it, 0.59 below taking all
of it out and 0.12 below at half (``docs/accuracy.md``, with bounds from task steps alone)."""


def expected_answer_wait(bound: Any, known: Any) -> Any:
    """The expected part of an io call's recorded wait for the loop: its ``known`` part (``answered_ms``) and
    :data:`ANSWER_WAIT_SHARE` of the rest of its ``bound`` (``queued_ms``), for numbers and numpy arrays alike.

    >>> expected_answer_wait(2.0, 1.0)
    1.5
    """
    return known + ANSWER_WAIT_SHARE * (bound - known)


PER_REQUEST_EXTRAS: tuple[str, ...] = ("ready_ms", "wait_ms", "queued_ms", "answered_ms", "cpu_before_ms",
                                       "hidden_ms", "inflight", "open_calls")
"""Extra node fields the builder writes with one value per request, aligned with ``samples_ms``: a compute
node's wait for the loop before its task first ran and the waits folded into it, an io call's wait behind its
request's other work at its end (a bound) and the part of it known to follow the answer's arrival, the part of
its CPU before the wait, the loop's work inside its wait outside any step, the calls of its request in
flight to its resource, and those whose spans were open when it started."""


class NodeKind(enum.StrEnum):
    """What a node stands for."""

    START = "start"
    END = "end"
    COMPUTE = "compute"
    """A synchronous segment run on the event loop (holds the loop: serial with other compute)."""
    IO = "io"
    """A call to an external resource (Redis, PostgreSQL, HTTP, SQLite)."""
    SYNC = "sync"
    """A synchronisation point (gather, wait, TaskGroup, ...): its duration is the wake-up delay."""
    TIMER = "timer"
    """A timer raced against work (wait_for, timeout) or slept on (asyncio.sleep)."""
    WAIT = "wait"
    """A wait on something the collector could not attribute (a lock, a queue, an event)."""


class WaitMode(enum.StrEnum):
    """How a node waits for its predecessors."""

    ALL = "all"
    """Starts when every predecessor has finished (max)."""
    ANY = "any"
    """Starts when the first ``k`` predecessors have finished (k = 1: min; the k-th order statistic)."""


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a causal graph."""

    id: str
    """Stable across the requests of a variant (a canonical path such as ``root/io#2``)."""
    kind: NodeKind
    samples_ms: tuple[float, ...] = ()
    """Observed duration in each request of the variant, aligned across nodes."""
    wait: WaitMode = WaitMode.ALL
    k: int = 1
    """With ``wait == ANY``: how many predecessors must finish (1 = the first)."""
    task: str = ""
    """Canonical path of the task the node runs in (``root``, ``root/gather#0[1]``)."""
    label: str = ""
    """Human-readable description (coroutine name, SQL shape, ...)."""
    api: str = ""
    """io nodes: the API called, ``<system> <operation>`` such as ``redis GET``."""
    resource: str = ""
    """io nodes: what was hit, ``redis://127.0.0.1:6379/0``."""
    system: str = ""
    """io nodes: ``redis``, ``postgresql``, ``http``, ``sqlite``."""
    cpu_ms: tuple[float, ...] = ()
    """compute nodes: CPU time in each request, aligned with ``samples_ms``."""
    round_trips: tuple[int, ...] = ()
    """io nodes: network round trips in each request, aligned with ``samples_ms``."""
    request_bytes: tuple[int, ...] = ()
    response_bytes: tuple[int, ...] = ()
    timeout_ms: float | None = None
    """timer nodes that race work: the timeout."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further fields, kept through a JSON round trip."""

    _KNOWN = (
        "id kind samples_ms wait k task label api resource system cpu_ms round_trips "
        "request_bytes response_bytes timeout_ms"
    ).split()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind.value}
        if self.wait is not WaitMode.ALL:
            out["wait"] = self.wait.value
            if self.k != 1:
                out["k"] = self.k
        for name in ("task", "label", "api", "resource", "system"):
            if value := getattr(self, name):
                out[name] = value
        if self.timeout_ms is not None:
            out["timeout_ms"] = self.timeout_ms
        out["samples_ms"] = [round(x, 6) for x in self.samples_ms]
        if self.cpu_ms:
            out["cpu_ms"] = [round(x, 6) for x in self.cpu_ms]
        for name in ("round_trips", "request_bytes", "response_bytes"):
            if value := getattr(self, name):
                out[name] = list(value)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "node") -> Node:
        """Parse one node; ``where`` names it in error messages. Raises ``ValueError`` on bad fields."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
        try:
            node_id = obj["id"]
        except KeyError:
            raise ValueError(f"{where}: field 'id' is missing") from None
        if not isinstance(node_id, str) or not node_id:
            raise ValueError(f"{where}: field 'id' must be a non-empty string, got {node_id!r}")
        try:
            kind = NodeKind(obj.get("kind"))
        except ValueError:
            raise ValueError(
                f"node {node_id!r}: field 'kind' must be one of {[k.value for k in NodeKind]}, "
                f"got {obj.get('kind')!r}"
            ) from None
        try:
            wait = WaitMode(obj.get("wait", "all"))
        except ValueError:
            raise ValueError(f"node {node_id!r}: field 'wait' must be 'all' or 'any', got {obj.get('wait')!r}") from None
        k = obj.get("k", 1)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"node {node_id!r}: field 'k' must be a positive integer, got {k!r}")

        def numbers(name: str, typ: type = float) -> tuple[Any, ...]:
            values = obj.get(name, [])
            if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
            ):
                raise ValueError(f"node {node_id!r}: field '{name}' must be a list of numbers")
            if typ is float and any(v < 0 or v != v for v in values):
                raise ValueError(f"node {node_id!r}: field '{name}' has a negative or NaN value")
            return tuple(typ(v) for v in values)

        timeout = obj.get("timeout_ms")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"node {node_id!r}: field 'timeout_ms' must be a non-negative number")
        return cls(
            id=node_id,
            kind=kind,
            samples_ms=numbers("samples_ms"),
            wait=wait,
            k=k,
            task=str(obj.get("task", "")),
            label=str(obj.get("label", "")),
            api=str(obj.get("api", "")),
            resource=str(obj.get("resource", "")),
            system=str(obj.get("system", "")),
            cpu_ms=numbers("cpu_ms"),
            round_trips=numbers("round_trips", int),
            request_bytes=numbers("request_bytes", int),
            response_bytes=numbers("response_bytes", int),
            timeout_ms=None if timeout is None else float(timeout),
            extra={key: value for key, value in obj.items() if key not in cls._KNOWN},
        )


class CausalGraph:
    """A DAG of :class:`Node` from ``start`` to ``end`` for one variant of one request kind.

    Wraps an ``nx.DiGraph`` whose node attribute ``"node"`` holds the :class:`Node`, so code reads typed
    fields while graph algorithms come from networkx.
    """

    def __init__(
        self,
        route: str,
        nodes: Iterable[Node],
        edges: Iterable[tuple[str, str]],
        *,
        variant: int = 0,
        latency_ms: Sequence[float] = (),
        trace_ids: Sequence[str] = (),
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.route = route
        self.variant = variant
        self.latency_ms: tuple[float, ...] = tuple(latency_ms)
        """Observed latency of each request of the variant (the server span's duration)."""
        self.trace_ids: tuple[str, ...] = tuple(trace_ids)
        self.meta: dict[str, Any] = dict(meta or {})
        self.dag = nx.DiGraph()
        for node in nodes:
            if node.id in self.dag:
                raise GraphError(f"graph {route!r}: node id {node.id!r} appears twice")
            self.dag.add_node(node.id, node=node)
        for src, dst in edges:
            for end in (src, dst):
                if end not in self.dag:
                    raise GraphError(f"graph {route!r}: edge {src!r} -> {dst!r} names unknown node {end!r}")
            self.dag.add_edge(src, dst)
        self._order: list[str] | None = None

    @property
    def count(self) -> int:
        """Number of requests of this variant."""
        return len(self.latency_ms)

    @property
    def nodes(self) -> list[Node]:
        return [self.dag.nodes[n]["node"] for n in self.dag.nodes]

    def node(self, node_id: str) -> Node:
        return self.dag.nodes[node_id]["node"]  # type: ignore[no-any-return]

    def predecessors(self, node_id: str) -> list[str]:
        return list(self.dag.predecessors(node_id))

    def topological_order(self) -> list[str]:
        """Node ids in an order where every edge goes forward. Raises :class:`GraphError` on a cycle."""
        if self._order is None:
            # Kahn's order preferring earlier-inserted nodes: deterministic, and the same after a JSON round trip
            # (nodes are written in this order).
            index = {n: i for i, n in enumerate(self.dag.nodes)}
            try:
                self._order = list(nx.lexicographical_topological_sort(self.dag, key=index.__getitem__))
            except nx.NetworkXUnfeasible:
                cycle = nx.find_cycle(self.dag)
                path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
                raise GraphError(f"graph {self.route!r} (variant {self.variant}) has a cycle: {path}") from None
        return self._order

    def validate(self) -> None:
        """Check the graph is a DAG from ``start`` to ``end`` with consistent fields."""
        for required in ("start", "end"):
            if required not in self.dag:
                raise GraphError(f"graph {self.route!r}: no '{required}' node")
        self.topological_order()
        if self.dag.in_degree("start") != 0:
            raise GraphError(f"graph {self.route!r}: 'start' has predecessors")
        n = self.count
        for node in self.nodes:
            preds = self.dag.in_degree(node.id)
            if node.id != "start" and preds == 0:
                raise GraphError(f"graph {self.route!r}: node {node.id!r} has no predecessor")
            if node.wait is WaitMode.ANY and node.k > preds:
                raise GraphError(
                    f"graph {self.route!r}: node {node.id!r} waits for {node.k} of {preds} predecessors"
                )
            if n and node.samples_ms and len(node.samples_ms) != n:
                raise GraphError(
                    f"graph {self.route!r}: node {node.id!r} has {len(node.samples_ms)} samples for {n} requests"
                )
            for name in PER_REQUEST_EXTRAS:
                if name in node.extra:
                    _check_per_request(node.extra[name], len(node.samples_ms) or n,
                                       f"graph {self.route!r}: node {node.id!r} field {name!r}")

    def durations(self) -> dict[str, npt.NDArray[np.float64]]:
        """Each node's observed durations as arrays aligned by request (zeros where a node has none)."""
        n = max(self.count, 1)
        return {
            node.id: np.asarray(node.samples_ms, dtype=np.float64) if node.samples_ms else np.zeros(n)
            for node in self.nodes
        }

    def to_json(self) -> dict[str, Any]:
        order = self.topological_order()
        position = {n: i for i, n in enumerate(order)}
        return {
            "route": self.route,
            "variant": self.variant,
            "count": self.count,
            "latency_ms": [round(x, 6) for x in self.latency_ms],
            "trace_ids": list(self.trace_ids),
            **({"meta": self.meta} if self.meta else {}),
            "nodes": [self.node(n).to_json() for n in order],
            "edges": [[u, v] for u in order for v in sorted(self.dag.successors(u), key=position.__getitem__)],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "graph") -> CausalGraph:
        """Parse one graph; raises ``ValueError`` (with ``where`` in the message) on bad fields."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object")
        route = obj.get("route")
        if not isinstance(route, str):
            raise ValueError(f"{where}: field 'route' must be a string")
        raw_nodes = obj.get("nodes")
        raw_edges = obj.get("edges")
        if not isinstance(raw_nodes, list):
            raise ValueError(f"{where} ({route}): field 'nodes' must be a list")
        if not isinstance(raw_edges, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in raw_edges
        ):
            raise ValueError(f"{where} ({route}): field 'edges' must be a list of [from, to] id pairs")
        nodes = [Node.from_json(n, f"{where} ({route}) node #{i}") for i, n in enumerate(raw_nodes)]
        latency = obj.get("latency_ms", [])
        if not isinstance(latency, list) or not all(isinstance(x, (int, float)) for x in latency):
            raise ValueError(f"{where} ({route}): field 'latency_ms' must be a list of numbers")
        graph = cls(
            route,
            nodes,
            [(u, v) for u, v in raw_edges],
            variant=int(obj.get("variant", 0)),
            latency_ms=[float(x) for x in latency],
            trace_ids=[str(t) for t in obj.get("trace_ids", [])],
            meta=obj.get("meta") or {},
        )
        graph.validate()
        return graph


def _check_per_request(value: Any, n: int, where: str) -> None:
    """A per-request extra: a list of ``n`` finite numbers >= 0, else :class:`GraphError` saying what it is."""
    if not isinstance(value, list):
        raise GraphError(f"{where} must be a list of numbers, one per request, got {type(value).__name__}")
    if len(value) != n:
        raise GraphError(f"{where} has {len(value)} values for {n} requests")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise GraphError(f"{where}: value #{i} is {x!r}, expected a finite number >= 0")


def evaluate(
    graph: CausalGraph, durations: Mapping[str, npt.NDArray[np.float64]]
) -> dict[str, npt.NDArray[np.float64]]:
    """Finish time of every node, vectorised over samples.

    A node's start is the max (``wait == ALL``) or the k-th smallest (``wait == ANY``) of its predecessors'
    finish times; its finish is start + its duration. ``durations[node_id]`` are arrays of one shape (one
    entry per sample), or scalars. This is WebPerf's estimation over the dependency graph (Jiang et al.,
    SIGCOMM 2016, section 4): sum along edges, max at all-waits, min at any-waits; evaluating it on joint
    samples keeps the dependence between paths that share nodes.

    Returns a dict node id -> finish time; ``result["end"] - result["start"]`` is the request latency.
    """
    finish: dict[str, npt.NDArray[np.float64]] = {}
    for node_id in graph.topological_order():
        node = graph.node(node_id)
        preds = [finish[p] for p in graph.dag.predecessors(node_id)]
        if not preds:
            begin: npt.NDArray[np.float64] | float = 0.0
        elif len(preds) == 1:
            begin = preds[0]
        elif node.wait is WaitMode.ALL:
            begin = np.maximum.reduce(np.broadcast_arrays(*preds))
        elif node.k == 1:
            begin = np.minimum.reduce(np.broadcast_arrays(*preds))
        else:
            stacked = np.stack(np.broadcast_arrays(*preds))
            begin = np.partition(stacked, node.k - 1, axis=0)[node.k - 1]
        finish[node_id] = np.asarray(begin + durations.get(node_id, 0.0), dtype=np.float64)
    return finish


def loop_cpu_ms(graphs: Iterable[CausalGraph]) -> float:
    """CPU on the event loop the graphs' nodes record, summed over their requests: compute segments' CPU time
    (their duration when none was recorded) and io calls' CPU on the loop (the client library's work)."""
    total = 0.0
    for g in graphs:
        for node in g.nodes:
            if node.kind is NodeKind.COMPUTE:
                total += float(np.sum(node.cpu_ms if node.cpu_ms else node.samples_ms))
            elif node.kind is NodeKind.IO:
                total += float(np.sum(node.cpu_ms))
    return total


def hidden_loop_ms(graphs: Iterable[CausalGraph]) -> float:
    """The loop's work inside the io calls' waits that no step holds (``hidden_ms``: read callbacks, the loop's
    own turn), summed over the graphs' requests: wall time, which a CPU neighbour stretches."""
    return float(sum(np.sum(n.extra["hidden_ms"]) for g in graphs for n in g.nodes
                     if n.kind is NodeKind.IO and isinstance(n.extra.get("hidden_ms"), list)))


def load_graphs(path: str | Path) -> list[CausalGraph]:
    """Read a graphs file written by :func:`dump_graphs`; raises :class:`GraphFileError` naming the problem."""
    path = Path(path)
    text = GraphFileError.read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GraphFileError(path, exc.lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise GraphFileError(
            path, 1, "format", f"expected {FORMAT!r} (a file written by 'perfcast graph'), got "
            f"{doc.get('format') if isinstance(doc, dict) else type(doc).__name__!r}"
        )
    raw = doc.get("graphs")
    if not isinstance(raw, list):
        raise GraphFileError(path, None, "graphs", "must be a list")
    graphs = []
    for i, obj in enumerate(raw):
        try:
            graphs.append(CausalGraph.from_json(obj, f"graphs[{i}]"))
        except (ValueError, GraphError) as exc:
            raise GraphFileError(path, None, f"graphs[{i}]", str(exc)) from None
    return graphs


def dump_graphs(graphs: Iterable[CausalGraph], path: str | Path, **meta: Any) -> None:
    """Write graphs as a graphs file, atomically (a crash leaves the old file or the new one)."""
    path = Path(path)
    doc = {"format": FORMAT, **meta, "graphs": [g.to_json() for g in graphs]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def to_dot(graphs: Iterable[CausalGraph]) -> str:
    """Graphviz text for the graphs: one cluster per variant, any-waits drawn as diamonds."""
    shapes = {
        NodeKind.START: "circle", NodeKind.END: "doublecircle", NodeKind.COMPUTE: "box",
        NodeKind.IO: "box3d", NodeKind.SYNC: "octagon", NodeKind.TIMER: "cds", NodeKind.WAIT: "ellipse",
    }
    lines = ["digraph perfcast {", "  rankdir=LR; node [fontsize=10];"]
    for gi, graph in enumerate(graphs):
        lines.append(f'  subgraph cluster_{gi} {{ label="{_esc(graph.route)} (variant {graph.variant}, '
                     f'{graph.count} requests)";')
        for node in graph.nodes:
            med = float(np.median(node.samples_ms)) if node.samples_ms else 0.0
            text = node.api or node.label or node.kind.value
            if node.wait is WaitMode.ANY:
                text += " [any]" if node.k == 1 else f" [{node.k}-th]"
            shape = "diamond" if node.wait is WaitMode.ANY else shapes[node.kind]
            lines.append(f'    "g{gi}:{_esc(node.id)}" [shape={shape}, label="{_esc(text)}\\n{med:.2f} ms"];')
        for u, v in graph.dag.edges:
            lines.append(f'    "g{gi}:{_esc(u)}" -> "g{gi}:{_esc(v)}";')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
