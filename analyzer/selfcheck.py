"""The self-check: does a causal graph, evaluated with its own observed durations, give the observed latency?

Each node's duration is its own observed interval (an I/O call's span, a compute segment, a wake-up delay),
measured without reference to the graph's edges. Evaluating the graph with those durations (a node starts
when all / any of its predecessors have finished) therefore reproduces a request's observed latency only when
the edges and wait modes are right: a missing edge lets a node start too early, a parallel call recorded as
serial adds its duration, a race recorded as all-of waits for the loser. The relative error per request is
the acceptance test of the collector and the graph builder.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzer.graph import CausalGraph, evaluate

__all__ = ["CheckSummary", "evaluated_latency", "self_check", "summarize"]


def evaluated_latency(graph: CausalGraph) -> npt.NDArray[np.float64]:
    """Latency of each request of ``graph`` (ms) as the graph evaluated with its observed durations says."""
    finish = evaluate(graph, graph.durations())
    return np.broadcast_to(finish["end"], (max(graph.count, 1),)).astype(np.float64)


def self_check(graph: CausalGraph) -> npt.NDArray[np.float64]:
    """Relative error ``|evaluated - observed| / observed`` of each request of the variant.

    Parameters
    ----------
    graph
        A variant built by :func:`analyzer.build.build_graphs` (``latency_ms`` and ``samples_ms`` aligned).

    Returns
    -------
    numpy.ndarray
        One error per request, aligned with ``graph.latency_ms`` (empty when the graph has no requests).

    Notes
    -----
    evaluated is ``evaluate(graph, graph.durations())["end"]``, the WebPerf estimation (sum along edges, max
    at all-waits, k-th smallest at any-waits; Jiang et al., SIGCOMM 2016, section 4) applied to one request's
    own durations; observed is the request span's duration. A request of zero observed latency counts as
    error 0 when evaluated is 0 too, else as infinite.
    """
    if graph.count == 0:
        return np.zeros(0)
    observed = np.asarray(graph.latency_ms, dtype=np.float64)
    diff = np.abs(evaluated_latency(graph) - observed)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(observed > 0, diff / np.where(observed > 0, observed, 1.0), np.where(diff > 0, np.inf, 0.0))
    return err


@dataclass(frozen=True, slots=True)
class CheckSummary:
    """The distribution of the self-check error over a set of requests (fractions, not percent)."""

    count: int
    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, errors: npt.ArrayLike) -> CheckSummary:
        err = np.asarray(errors, dtype=np.float64)
        if err.size == 0:
            return cls(0, float("nan"), float("nan"), float("nan"))
        return cls(int(err.size), float(np.median(err)), float(np.quantile(err, 0.9)), float(err.max()))


def summarize(graphs: Iterable[CausalGraph]) -> tuple[dict[tuple[str, int], CheckSummary], CheckSummary]:
    """The self-check per (route, variant) and over all requests."""
    per: dict[tuple[str, int], CheckSummary] = {}
    every = []
    for graph in graphs:
        err = self_check(graph)
        per[(graph.route, graph.variant)] = CheckSummary.of(err)
        every.append(err)
    return per, CheckSummary.of(np.concatenate(every) if every else np.zeros(0))
