"""Latency distributions and their algebra over a causal DAG.

A :class:`Distribution` is an empirical distribution (sorted samples, in ms) with the summaries perfcast
reports. The algebra is WebPerf's (Jiang et al., SIGCOMM 2016, section 4.4): sum along edges, max at
all-waits, min (or the k-th order statistic) at any-waits. It is computed by Monte Carlo on *joint* samples,
so that paths sharing a node see the same draw of that node (the independent ``ProbAdd``/``ProbMax`` of the
paper would count a shared node twice).

:func:`compile_dag` turns a :class:`~analyzer.graph.CausalGraph` into a :class:`DagPlan` once (topological
order, predecessor index arrays, the last consumer of each row), and :func:`evaluate_plan` runs it over sample
matrices with numpy only. Two facts make it fast:

- nodes whose durations are functions of the recorded request alone (untouched nodes, a ``+20 ms`` per round
  trip, a CPU slowdown) are evaluated once per *recorded request* (``n`` columns) and only the rows that feed a
  node drawn from a profile are gathered into *sample* space (``S`` columns): bootstrapping whole requests and
  evaluating commutes with evaluating and bootstrapping the result;
- a row whose last consumer is the current node is updated in place, so a chain costs one add per node and
  memory stays proportional to the graph's width, not its size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from analyzer.graph import CausalGraph, WaitMode

__all__ = [
    "DagPlan",
    "Distribution",
    "Rows",
    "compile_dag",
    "evaluate_plan",
    "prob_add",
    "prob_kth",
    "prob_max",
    "prob_min",
]

FloatArray = npt.NDArray[np.float64]


class Rows(Protocol):
    """Per-node duration rows, indexable by node position: a ``(nodes, n)`` array or an overlay of one."""

    def __getitem__(self, j: int, /) -> FloatArray: ...


@dataclass(frozen=True, slots=True, eq=False)
class Distribution:
    """An empirical latency distribution.

    Build it with :meth:`of`, which sorts and checks the samples.

    Examples
    --------
    >>> d = Distribution.of([3.0, 1.0, 2.0])
    >>> d.p50, d.mean, float(d.cdf(2.5))
    (2.0, 2.0, 0.6666666666666666)
    """

    samples_ms: FloatArray
    """The samples, sorted ascending, read-only."""

    @classmethod
    def of(cls, samples_ms: npt.ArrayLike) -> Distribution:
        values = np.sort(np.asarray(samples_ms, dtype=np.float64).ravel())
        if values.size == 0:
            raise ValueError("a distribution needs at least one sample")
        if not np.all(np.isfinite(values)):
            raise ValueError("a distribution's samples must be finite numbers")
        values.setflags(write=False)
        return cls(values)

    @property
    def count(self) -> int:
        return int(self.samples_ms.size)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1), linear interpolation between order statistics (numpy's default)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        x = self.samples_ms  # sorted: index directly instead of np.quantile's partition
        h = (x.size - 1) * q
        lo = int(h)
        if lo + 1 >= x.size:
            return float(x[-1])
        return float(x[lo] + (h - lo) * (x[lo + 1] - x[lo]))

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        return self.quantile(0.9)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    @property
    def mean(self) -> float:
        return float(self.samples_ms.mean())

    def cdf(self, x: npt.ArrayLike) -> FloatArray:
        """The empirical CDF F(x) = P(X <= x)."""
        return np.searchsorted(self.samples_ms, np.asarray(x, dtype=np.float64), side="right") / self.count

    def summary(self) -> dict[str, float]:
        """p50, p90, p99, mean (ms) and the sample count."""
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean, "count": self.count}

    def to_json(self, *, samples: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {k: round(v, 6) for k, v in self.summary().items()}
        out["count"] = self.count
        if samples:
            out["samples_ms"] = [round(float(x), 6) for x in self.samples_ms]
        return out


# --- WebPerf's ProbAdd / ProbMax / ProbMin for *independent* distributions ----------------------------------


def _draws(dists: Sequence[Distribution], rng: np.random.Generator, size: int) -> FloatArray:
    return np.stack([rng.choice(d.samples_ms, size=size) for d in dists])


def prob_add(dists: Sequence[Distribution], rng: np.random.Generator, size: int = 10_000) -> Distribution:
    """Distribution of the sum of independent latencies (WebPerf's ProbAdd), by Monte Carlo.

    Use it only for independent parts (a cloud latency plus a network RTT, as WebPerf's Algorithm 2 does);
    inside one request use :func:`evaluate_plan`, which keeps shared nodes jointly sampled.

    References
    ----------
    .. [1] J. Jiang, R. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If
       Scenarios for Cloud-hosted Web Applications", SIGCOMM 2016, section 4.4. doi:10.1145/2934872.2934882
    """
    return Distribution.of(_draws(dists, rng, size).sum(axis=0))


def prob_max(dists: Sequence[Distribution], rng: np.random.Generator, size: int = 10_000) -> Distribution:
    """Distribution of the max of independent latencies (WebPerf's ProbMax: a WhenAll of independent paths)."""
    return Distribution.of(_draws(dists, rng, size).max(axis=0))


def prob_min(dists: Sequence[Distribution], rng: np.random.Generator, size: int = 10_000) -> Distribution:
    """Distribution of the min of independent latencies (WebPerf's ProbMin: a WhenAny of independent paths)."""
    return Distribution.of(_draws(dists, rng, size).min(axis=0))


def prob_kth(
    dists: Sequence[Distribution], k: int, rng: np.random.Generator, size: int = 10_000
) -> Distribution:
    """Distribution of the k-th smallest of independent latencies (``asyncio.as_completed`` awaited k times)."""
    if not 1 <= k <= len(dists):
        raise ValueError(f"k must be between 1 and {len(dists)}, got {k}")
    return Distribution.of(np.partition(_draws(dists, rng, size), k - 1, axis=0)[k - 1])


# --- joint Monte Carlo over a causal DAG ---------------------------------------------------------------------

_SINGLE, _ALL, _ANY1, _KTH = 0, 1, 2, 3


@dataclass(frozen=True, slots=True, eq=False)
class DagPlan:
    """A causal graph compiled for repeated vectorised evaluation (built by :func:`compile_dag`)."""

    ids: tuple[str, ...]
    """Node ids in topological order; every array below is indexed by position in this order."""
    preds: tuple[tuple[int, ...], ...]
    mode: tuple[int, ...]
    """How each node combines its predecessors: single/none, all (max), any (min), k-th."""
    k: tuple[int, ...]
    uses: tuple[int, ...]
    """How many successors read each node's finish time (+1 for ``start``, which the result reads)."""
    start: int
    end: int

    @property
    def size(self) -> int:
        return len(self.ids)

    def position(self, node_id: str) -> int:
        return self.ids.index(node_id)

    def waits_for(self) -> list[int]:
        """How many predecessors each node waits for: all of them, the first (any-wait) or the k-th."""
        return [
            1 if m == _ANY1 else k if m == _KTH else len(p)
            for p, m, k in zip(self.preds, self.mode, self.k, strict=True)
        ]


def compile_dag(graph: CausalGraph) -> DagPlan:
    """Compile ``graph`` for :func:`evaluate_plan`; raises :class:`~analyzer.errors.GraphError` on a cycle."""
    order = graph.topological_order()
    pos = {node_id: i for i, node_id in enumerate(order)}
    preds: list[tuple[int, ...]] = []
    mode: list[int] = []
    ks: list[int] = []
    uses = [0] * len(order)
    for node_id in order:
        node = graph.node(node_id)
        p = tuple(sorted(pos[q] for q in graph.dag.predecessors(node_id)))
        for q in p:
            uses[q] += 1
        preds.append(p)
        if len(p) <= 1:
            mode.append(_SINGLE)
        elif node.wait is WaitMode.ALL or node.k >= len(p) and node.k > 1:
            # waiting for all k of k predecessors is a max
            mode.append(_ALL)
        elif node.k == 1:
            mode.append(_ANY1)
        else:
            mode.append(_KTH)
        ks.append(node.k)
    start, end = pos.get("start", 0), pos.get("end", len(order) - 1)
    uses[start] += 1
    uses[end] += 1
    return DagPlan(tuple(order), tuple(preds), tuple(mode), tuple(ks), tuple(uses), start, end)


def _kth_smallest(rows: Sequence[FloatArray], k: int) -> FloatArray:
    """Element-wise k-th smallest (1-based) of a few rows, as a new array.

    For up to 6 rows, an odd-even transposition network of element-wise min/max (at most 15 compare-exchanges)
    beats ``np.partition`` along a short axis of a stacked copy by an order of magnitude.
    """
    m = len(rows)
    if m > 6:
        return np.asarray(np.partition(np.stack(rows), k - 1, axis=0)[k - 1], dtype=np.float64).copy()
    work = [r.copy() for r in rows]
    for step in range(m):
        for i in range(step % 2, m - 1, 2):
            lo = np.minimum(work[i], work[i + 1])
            np.maximum(work[i], work[i + 1], out=work[i + 1])
            work[i] = lo
    return work[k - 1]


def _join(mode: int, k: int, rows: Sequence[FloatArray], out: FloatArray | None = None) -> FloatArray:
    """Predecessors' finish rows (two or more) combined as a node waits for them: the latest for all, the first
    for any (into ``out`` when given), the k-th smallest for k of them (a new row)."""
    if mode == _ALL or mode == _ANY1:
        op = np.maximum if mode == _ALL else np.minimum
        out = np.empty_like(rows[0]) if out is None else out
        op(rows[0], rows[1], out=out)
        for r in rows[2:]:
            op(out, r, out=out)
        return out
    return _kth_smallest(rows, k)


def evaluate_plan(
    plan: DagPlan,
    per_request: Rows,
    idx: npt.NDArray[np.intp],
    per_sample: Mapping[int, FloatArray] | None = None,
) -> FloatArray:
    """Latency (``end`` finish minus ``start`` finish) of each Monte Carlo sample.

    Parameters
    ----------
    plan
        The compiled graph.
    per_request
        ``(plan.size, n)``: each node's duration in each recorded request (row = position in ``plan.ids``).
    idx
        ``(S,)``: the recorded request each sample draws (the bootstrap over whole requests).
    per_sample
        position -> ``(S,)`` durations drawn per sample (profile draws); overrides ``per_request`` for
        that node.

    Returns
    -------
    ``(S,)`` latencies. The semantics are those of :func:`analyzer.graph.evaluate` applied to
    ``per_request[:, idx]`` with the ``per_sample`` rows substituted, which the tests check.
    """
    per_sample = dict(per_sample or {})
    dirty = [False] * plan.size
    for j in range(plan.size):
        dirty[j] = j in per_sample or any(dirty[p] for p in plan.preds[j])
    left = list(plan.uses)
    scratch = np.empty(idx.shape[0], dtype=np.float64)
    req_rows: dict[int, FloatArray] = {}  # finish times in request space (n columns)
    smp_rows: dict[int, FloatArray] = {}  # finish times in sample space (S columns)
    owned: set[tuple[int, bool]] = set()  # rows this function allocated and may overwrite

    def take(p: int, sample_space: bool) -> tuple[FloatArray, bool]:
        """Finish row of predecessor p in the wanted space, and whether the caller may overwrite it."""
        if sample_space and not dirty[p]:
            if p not in smp_rows:
                smp_rows[p] = req_rows[p][idx]
                owned.add((p, True))
            src = smp_rows
        else:
            src = smp_rows if dirty[p] else req_rows
        row = src[p]
        key = (p, sample_space)
        left[p] -= 1
        last = left[p] == 0
        if last:
            # free both spaces: nobody reads p any more
            req_rows.pop(p, None)
            smp_rows.pop(p, None)
        mine = last and key in owned
        if last:
            owned.discard(key)
        return row, mine

    for j in range(plan.size):
        space = dirty[j]
        preds = plan.preds[j]
        if space:
            if j in per_sample:
                dur = per_sample[j]
            else:  # gather into a reused buffer: no allocation per node
                dur = np.take(per_request[j], idx, out=scratch)
        else:
            dur = per_request[j]
        if not preds:
            row = np.array(dur, dtype=np.float64, copy=True)
        else:
            rows = [take(p, space) for p in preds]
            m = plan.mode[j]
            if m == _SINGLE:
                base, mine = rows[0]
                if mine:
                    base += dur
                    row = base
                else:
                    row = base + dur  # one pass, not a copy and an add
                (smp_rows if space else req_rows)[j] = row
                owned.add((j, space))
                continue
            # a row this node may overwrite takes the result of an all/any wait: no allocation
            reuse = next((r for r, mine in rows if mine), None)
            row = _join(m, plan.k[j], [r for r, _ in rows], out=reuse)
            row += dur
        (smp_rows if space else req_rows)[j] = row
        owned.add((j, space))
    start = smp_rows[plan.start] if dirty[plan.start] else req_rows[plan.start][idx]
    end = smp_rows[plan.end] if dirty[plan.end] else req_rows[plan.end][idx]
    return np.asarray(end - start, dtype=np.float64)
