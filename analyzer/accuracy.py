"""Prediction accuracy: the vertical deviations between a predicted and a measured latency CDF.

WebPerf (Jiang et al., SIGCOMM 2016, section 6.2) scores a predicted distribution against the ground truth by
the distribution of the vertical deviations ``|F1(x) - F2(x)|`` of the two CDFs and reports its maximum (the
Kolmogorov-Smirnov D statistic), mean and median. This module computes them from samples, and reads the
sample files ``perfcast compare`` and ``perfcast e2e`` accept.

A measured ground truth is itself uncertain: :func:`repeatability` says how far a measurement taken in rounds
is from itself, the floor under any prediction's score against it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.errors import InputFileError

__all__ = [
    "CdfDeviation",
    "Repeatability",
    "cdf_deviation",
    "cdf_deviations",
    "read_samples",
    "repeatability",
    "whatif_samples",
]


@dataclass(frozen=True, slots=True)
class CdfDeviation:
    """Summary of the vertical deviations ``|F1(x) - F2(x)|`` between two empirical CDFs."""

    max: float
    """The largest deviation: the two-sample Kolmogorov-Smirnov statistic D."""
    mean: float
    median: float
    n_predicted: int
    n_measured: int

    def to_json(self) -> dict[str, float | int]:
        return {"max": self.max, "mean": self.mean, "median": self.median,
                "n_predicted": self.n_predicted, "n_measured": self.n_measured}


def _check(name: str, samples: Sequence[float] | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    values = np.sort(np.asarray(samples, dtype=np.float64).ravel())
    if values.size == 0:
        raise ValueError(f"`{name}` must hold at least one sample")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"`{name}` holds a NaN or infinite sample")
    return values


def cdf_deviations(
    predicted: Sequence[float] | npt.NDArray[np.float64], measured: Sequence[float] | npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The vertical deviations ``|F1(x) - F2(x)|`` at every distinct point of the union of both samples.

    ``F1`` and ``F2`` are the right-continuous empirical CDFs, ``F(x) = #{samples <= x} / n``. Both are step
    functions that change only at sample points, so evaluating there covers every value the deviation takes
    (WebPerf, section 6.2); in particular the maximum is the two-sample Kolmogorov-Smirnov D.

    Examples
    --------
    >>> cdf_deviations([1.0, 2.0], [2.0, 3.0]).tolist()
    [0.5, 0.5, 0.0]
    """
    a, b = _check("predicted", predicted), _check("measured", measured)
    x = np.union1d(a, b)
    f1 = np.searchsorted(a, x, side="right") / a.size
    f2 = np.searchsorted(b, x, side="right") / b.size
    return np.asarray(np.abs(f1 - f2), dtype=np.float64)


def cdf_deviation(
    predicted: Sequence[float] | npt.NDArray[np.float64], measured: Sequence[float] | npt.NDArray[np.float64]
) -> CdfDeviation:
    """Max (= KS D), mean and median of :func:`cdf_deviations`.

    References
    ----------
    .. [1] J. Jiang, L. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If Scenarios
       for Cloud-hosted Web Applications", SIGCOMM 2016, section 6.2. doi:10.1145/2934872.2934882

    Examples
    --------
    >>> d = cdf_deviation([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    >>> (d.max, d.mean, d.median)
    (0.0, 0.0, 0.0)
    """
    dev = cdf_deviations(predicted, measured)
    return CdfDeviation(
        max=float(dev.max()), mean=float(dev.mean()), median=float(np.median(dev)),
        n_predicted=int(np.size(predicted)), n_measured=int(np.size(measured)),
    )


@dataclass(frozen=True, slots=True)
class Repeatability:
    """How far the rounds of one measurement are from each other (:func:`repeatability`)."""

    median: float
    """Median over the rounds of the median deviation between the round and the other rounds pooled."""
    ks_d: float
    """The same for the KS D."""
    sampling_median: float
    """What sampling alone gives: ``median`` with the samples shuffled across the rounds (median over the
    shuffles)."""
    sampling_ks_d: float
    """``ks_d`` with the samples shuffled across the rounds."""
    rounds: int

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "ks_d": self.ks_d, "sampling_median": self.sampling_median,
                "sampling_ks_d": self.sampling_ks_d, "rounds": self.rounds}


def _round_vs_rest(rounds: Sequence[npt.NDArray[np.float64]]) -> tuple[float, float]:
    medians, maxima = [], []
    for i, one in enumerate(rounds):
        d = cdf_deviation(one, np.concatenate([r for j, r in enumerate(rounds) if j != i]))
        medians.append(d.median)
        maxima.append(d.max)
    return float(np.median(medians)), float(np.median(maxima))


def repeatability(
    rounds: Sequence[Sequence[float] | npt.NDArray[np.float64]],
    shuffles: int = 200,
    rng: np.random.Generator | None = None,
) -> Repeatability:
    """How well a measurement taken in ``rounds`` (the same configuration measured at different times)
    reproduces itself: each round scored against the other rounds pooled, as a prediction is scored against
    the measurement (:func:`cdf_deviation`), and the median over the rounds.

    Two things make a round differ from the rest: sampling (a round holds few samples) and drift (the machine
    is not the same from one minute to the next). The same score with the samples shuffled across the rounds,
    sizes kept, has sampling alone; an observed score well above it is drift. A prediction scored against the
    pooled rounds cannot be judged finer than the drift between them.

    Raises ``ValueError`` for fewer than two rounds or an empty one.

    Examples
    --------
    >>> r = repeatability([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], shuffles=10)
    >>> (r.median, r.ks_d, r.rounds)
    (0.0, 0.0, 2)
    """
    arrays = [_check(f"rounds[{i}]", r) for i, r in enumerate(rounds)]
    if len(arrays) < 2:
        raise ValueError("repeatability needs two rounds or more")
    median, ks_d = _round_vs_rest(arrays)
    gen = rng if rng is not None else np.random.default_rng(0)
    pooled = np.concatenate(arrays)
    cuts = np.cumsum([a.size for a in arrays])[:-1]
    null = np.array([_round_vs_rest(np.split(gen.permutation(pooled), cuts)) for _ in range(max(shuffles, 1))])
    return Repeatability(median=median, ks_d=ks_d, sampling_median=float(np.median(null[:, 0])),
                         sampling_ks_d=float(np.median(null[:, 1])), rounds=len(arrays))


# --- sample files -----------------------------------------------------------------------------------------

def read_samples(
    path: str | Path, route: str | None = None, scenario: str | None = None
) -> npt.NDArray[np.float64]:
    """Read latency samples (ms) from a file, naming the line or field on error.

    Accepted forms: one number per line (blank lines and ``#`` comments skipped); a JSON list of numbers;
    a JSON object with ``samples_ms``; a ``perfcast whatif --json`` result, from which ``route``'s
    predicted samples are taken (:func:`whatif_samples`; ``scenario`` picks one of several); or a graphs file
    (``perfcast graph``), from which ``route``'s recorded latencies are taken.
    """
    path = Path(path)
    text = InputFileError.read_text(path)
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputFileError(path, exc.lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        if isinstance(doc, list):
            return _numbers(path, doc, "[]")
        if isinstance(doc, dict) and "samples_ms" in doc and route is None:
            return _numbers(path, doc["samples_ms"], "samples_ms")
        if isinstance(doc, dict) and str(doc.get("format", "")).startswith("perfcast-graphs/"):
            return _graph_latencies(path, doc, route)
        return whatif_samples(doc, route, path, scenario)
    values: list[float] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            value = float(item.removesuffix("ms").strip())
        except ValueError:
            raise InputFileError(path, lineno, None, f"expected a number of milliseconds, got {item!r}") from None
        if not np.isfinite(value) or value < 0:
            raise InputFileError(path, lineno, None, f"expected a non-negative finite number, got {item!r}")
        values.append(value)
    if not values:
        raise InputFileError(path, None, None, "holds no samples")
    return np.asarray(values, dtype=np.float64)


def _numbers(path: Path, values: Any, field: str) -> npt.NDArray[np.float64]:
    if not isinstance(values, list) or not values:
        raise InputFileError(path, None, field, "expected a non-empty list of numbers")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise InputFileError(path, None, f"{field}[{i}]", f"expected a non-negative number, got {v!r}")
    return np.asarray(values, dtype=np.float64)


_PREDICTED_KEYS = ("predicted", "prediction", "scenario")


def _graph_latencies(path: Path, doc: dict[str, Any], route: str | None) -> npt.NDArray[np.float64]:
    raw = doc.get("graphs")
    graphs: list[Any] = raw if isinstance(raw, list) else []
    routes = sorted({g["route"] for g in graphs if isinstance(g, dict) and isinstance(g.get("route"), str)})
    if route is None or route not in routes:
        problem = "name the request with --route" if route is None else f"no request {route!r}"
        raise InputFileError(path, None, "route", f"{problem}; the graphs have {', '.join(map(repr, routes))}")
    parts = [_numbers(path, g.get("latency_ms"), f"graphs[{i}].latency_ms")
             for i, g in enumerate(graphs) if isinstance(g, dict) and g.get("route") == route]
    return np.concatenate(parts)


def whatif_samples(
    doc: Any, route: str | None, path: str | Path = "<whatif json>", scenario: str | None = None
) -> npt.NDArray[np.float64]:
    """The predicted samples of ``route`` in a ``perfcast whatif --json`` result.

    Looks for objects with ``"route": route`` (and ``"scenario": scenario`` when given) and takes their
    predicted samples: ``predicted.samples_ms`` (or ``predicted`` as a list), else ``samples_ms``. Several
    matching objects of one scenario (variants) are pooled; several scenarios need ``scenario``.
    """
    path = Path(path)
    found: list[tuple[str, Any]] = []
    routes: set[str] = set()

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, dict):
            if isinstance(obj.get("route"), str):
                routes.add(obj["route"])
                if obj["route"] == route:
                    found.append((where, obj))
                    return
            for name, value in obj.items():
                walk(value, f"{where}.{name}" if where else name)
        elif isinstance(obj, list):
            for i, value in enumerate(obj):
                walk(value, f"{where}[{i}]")

    if route is None:
        raise InputFileError(path, None, "route", "a whatif result holds several requests: name one with --route "
                             f"(it has {', '.join(sorted(_routes(doc))) or 'none'})")
    walk(doc, "")
    if not found:
        raise InputFileError(path, None, "route", f"no request {route!r}; the file has "
                             f"{', '.join(repr(r) for r in sorted(routes)) or 'no routes'}")
    names = sorted({str(obj["scenario"]) for _, obj in found if "scenario" in obj})
    if scenario is not None:
        found = [(w, obj) for w, obj in found if str(obj.get("scenario")) == scenario]
        if not found:
            raise InputFileError(path, None, "scenario", f"no scenario {scenario!r} for {route!r}; the file has "
                                 f"{', '.join(map(repr, names)) or 'none'}")
    elif len(names) > 1:
        raise InputFileError(path, None, "scenario", f"{route!r} is predicted under several scenarios "
                             f"({', '.join(map(repr, names))}): choose one with --scenario")
    parts = []
    for where, obj in found:
        for name in _PREDICTED_KEYS:
            pred = obj.get(name)
            if isinstance(pred, dict) and "samples_ms" in pred:
                parts.append(_numbers(path, pred["samples_ms"], f"{where}.{name}.samples_ms"))
                break
            if isinstance(pred, list):
                parts.append(_numbers(path, pred, f"{where}.{name}"))
                break
        else:
            if "samples_ms" not in obj:
                raise InputFileError(path, None, where, f"request {route!r} has no predicted 'samples_ms'")
            parts.append(_numbers(path, obj["samples_ms"], f"{where}.samples_ms"))
    return np.concatenate(parts)


def _routes(doc: Any) -> set[str]:
    out: set[str] = set()
    stack = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if isinstance(obj.get("route"), str):
                out.add(obj["route"])
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return out
