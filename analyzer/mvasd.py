"""MVASD: exact multi-server MVA fed with service demands that vary with the load, and its accuracy (eq. 13).

Load tests at a few concurrency levels give, per station, the service demand D = U / X at each level (the
service demand law); they usually fall as the load grows (caching, batching). MVASD [1]_ interpolates them
with a cubic spline and uses, at population n, the demand interpolated at n. The pieces a load-test tool
needs are pure functions:

* :func:`read_loadtest` / :meth:`LoadTest.from_json`: the ``perfcast-loadtest/1`` file (docs/mva.md);
* :func:`model_from_loadtest`: a :class:`~analyzer.queueing.ClosedModel` with measured demands;
* :func:`solve_mvasd`: the prediction for n = 1..N;
* :func:`holdout_deviation`: fit on some levels, predict the others, eq. 13's mean % deviation.

References
----------
.. [1] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying Service
   Demands", IPDPS Workshops, 2015: Algorithm 2, eqs. 9, 12 and 13, section VII.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.interpolate import CubicSpline

from analyzer.errors import ModelError, ModelFileError
from analyzer.mva import (
    MVAResult,
    _check_users,
    _result,
    exact_throughput,
    exact_throughput_at,
)
from analyzer.queueing import (
    ClosedModel,
    DemandAxis,
    MeasuredDemands,
    Station,
    StationKind,
)

__all__ = [
    "FORMAT",
    "HoldoutResult",
    "LoadLevel",
    "LoadTest",
    "StationMeasurement",
    "holdout_deviation",
    "interpolate_demands",
    "model_from_loadtest",
    "percent_deviation",
    "read_loadtest",
    "solve_mvasd",
]

FORMAT = "perfcast-loadtest/1"
"""The ``format`` tag of a load-test result file."""

FloatArray = npt.NDArray[np.float64]


def interpolate_demands(measured: MeasuredDemands, at: npt.ArrayLike) -> FloatArray:
    """The demand at each abscissa in ``at``: a not-a-knot cubic spline through the measured points.

    Outside the measured range the demand is held at the nearest measured value (the paper's eq. 12).
    Between points a spline can overshoot, badly so with few, unevenly spaced points (three points give the
    interpolating parabola, which can dip below zero between 20 and 200 users); the demand is therefore kept
    within the range of the measured demands. Two points give a straight line.

    Examples
    --------
    >>> m = MeasuredDemands(DemandAxis.USERS, (1.0, 20.0, 105.0), (0.0075, 0.0048, 0.0041))
    >>> interpolate_demands(m, [0, 1, 105, 500]).round(4).tolist()
    [0.0075, 0.0075, 0.0041, 0.0041]
    """
    return _interpolator(measured)(np.asarray(at, dtype=np.float64))


def _interpolator(measured: MeasuredDemands) -> Callable[[FloatArray], FloatArray]:
    xs = np.asarray(measured.at, dtype=np.float64)
    ys = np.asarray(measured.demand_s, dtype=np.float64)
    spline = CubicSpline(xs, ys, bc_type="not-a-knot")
    lo, hi = xs[0], xs[-1]
    floor, ceiling = float(ys.min()), float(ys.max())

    def demand(x: FloatArray) -> FloatArray:
        return np.clip(np.asarray(spline(np.clip(x, lo, hi)), dtype=np.float64), floor, ceiling)

    return demand


def solve_mvasd(model: ClosedModel, users: int) -> MVAResult:
    """MVASD: exact multi-server MVA with service demands interpolated at each population, n = 1..users.

    At population n each station with measured demands gets the demand :func:`interpolate_demands` gives at
    n (demands measured against users) or at X(n - 1), the throughput predicted one user earlier (demands
    measured against throughput, the paper's section VII; X(0) = 0 takes the first measured value). Stations
    with a constant ``demand_s`` keep it, so a model without measured demands gives exactly
    :func:`~analyzer.mva.solve_exact`'s throughput.

    How this differs from the paper's Algorithm 2: the paper carries the multi-server recursion's queue
    lengths and marginal probabilities from population n - 1 (computed with the demands of n - 1) into
    population n (computed with those of n). With multi-server stations that recursion is not usable in
    floating point (see :mod:`analyzer.mva`), and with demands changing underneath it, its probabilities need
    not even stay in [0, 1]. Here X(n) is instead the exact throughput, at population n, of the product-form
    network whose demands are those interpolated for n: the same model where demands are constant, always
    within the asymptotic bounds, and computed without cancellation (:func:`~analyzer.mva.exact_throughput_at`).
    Beyond the last measured population the demands are constant and one exact solve gives the rest.

    Returns an :class:`~analyzer.mva.MVAResult` whose ``demand_s`` holds the demands used at each n and whose
    ``queue_length`` / ``residence_time_s`` are None (they are not computed per population).

    References
    ----------
    .. [1] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying
       Service Demands", IPDPS Workshops, 2015: Algorithm 2 and eqs. 9 and 12.
    .. [2] C. de Boor, A Practical Guide to Splines, Springer, 2001 (the not-a-knot end condition).
    """
    users = _check_users(users)
    stations = model.stations
    servers = np.array([s.servers for s in stations], dtype=np.int64)
    is_queue = np.array([s.kind is StationKind.QUEUE for s in stations])
    n = np.arange(1, users + 1, dtype=np.float64)
    demands = np.empty((len(stations), users))
    by_throughput: list[int] = []
    settle = 1  # from this population on, every demand is constant
    for k, s in enumerate(stations):
        if s.measured is None:
            assert s.demand_s is not None
            demands[k] = s.demand_s
        elif s.measured.axis is DemandAxis.USERS:
            demands[k] = interpolate_demands(s.measured, n)
            settle = max(settle, math.ceil(s.measured.at[-1]))
        else:
            by_throughput.append(k)
    throughput = np.empty(users)
    if by_throughput:
        curves = {k: _interpolator(stations[k].measured) for k in by_throughput}  # type: ignore[arg-type]
        previous = 0.0
        for i in range(users):
            for k, curve in curves.items():
                demands[k, i] = curve(np.array([previous]))[0]
            previous = throughput[i] = _throughput(demands[:, i], servers, is_queue, model.think_time_s, i + 1)
    else:
        head = min(settle, users + 1) - 1  # populations 1..head have their own demands
        for i in range(head):
            throughput[i] = _throughput(demands[:, i], servers, is_queue, model.think_time_s, i + 1)
        if head < users:
            last = demands[:, -1]
            delay = model.think_time_s + float(last[~is_queue].sum())
            tail = exact_throughput(np.where(is_queue, last, 0.0), servers, delay, users)
            throughput[head:] = tail[head:]
    utilization = {
        s.name: demands[k] * throughput / s.servers for k, s in enumerate(stations) if is_queue[k]
    }
    demand_s = {s.name: demands[k].copy() for k, s in enumerate(stations)}
    return _result("mvasd", model, throughput, utilization, demand_s)


def _throughput(demands: FloatArray, servers: npt.NDArray[np.int64], is_queue: npt.NDArray[np.bool_], think: float, n: int) -> float:
    delay = think + float(demands[~is_queue].sum())
    return exact_throughput_at(np.where(is_queue, demands, 0.0), servers, delay, n)


def percent_deviation(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Mean absolute % deviation of predicted from measured values: the MVASD paper's eq. 13.

    .. math:: \\%Deviation = \\frac{100}{M} \\sum_{m=1}^{M} \\frac{|P(m) - M(m)|}{M(m)}

    >>> percent_deviation([110, 90], [100, 100])
    10.0
    """
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape or p.size == 0:
        raise ModelError(f"percent_deviation needs two equally long, non-empty sequences, got {p.shape} and {m.shape}")
    if np.any(m <= 0):
        raise ModelError("percent_deviation: measured values must be positive")
    return float(np.mean(np.abs(p - m) / m) * 100.0)


# --- load-test measurements ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StationMeasurement:
    """One resource at one load level."""

    utilization: float
    """Busy fraction of each server over the steady-state window (0..1)."""
    demand_s: float
    """Service demand per request, seconds: U c / X by the service demand law."""
    servers: int = 1
    visits: float = 1.0


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """The steady-state measurements at one concurrency level."""

    users: int
    throughput_per_s: float
    response_time_s: float
    """Mean response time, excluding think time."""
    stations: Mapping[str, StationMeasurement]


@dataclass(frozen=True, slots=True)
class LoadTest:
    """A closed-loop load test at several concurrency levels (the ``perfcast-loadtest/1`` file)."""

    think_time_s: float
    levels: tuple[LoadLevel, ...]
    """Sorted by ``users``."""

    @property
    def users(self) -> tuple[int, ...]:
        return tuple(level.users for level in self.levels)

    @classmethod
    def from_json(cls, data: Any, path: str | Path = "<loadtest>") -> LoadTest:
        """Validate and build from the decoded JSON; errors name the file and the field's path."""
        path = str(path)

        def fail(where: str, problem: str) -> ModelFileError:
            return ModelFileError(path, None, where, problem)

        if not isinstance(data, Mapping):
            raise fail("", "expected a JSON object")
        if data.get("format") != FORMAT:
            raise fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
        think = _json_number(data.get("think_time_s"), "think_time_s", fail)
        raw_levels = data.get("levels")
        if not isinstance(raw_levels, list) or not raw_levels:
            raise fail("levels", "expected a non-empty array of levels")
        levels: list[LoadLevel] = []
        names: tuple[str, ...] | None = None
        for i, raw in enumerate(raw_levels):
            at = f"levels[{i}]"
            if not isinstance(raw, Mapping):
                raise fail(at, "expected an object")
            users = raw.get("users")
            if isinstance(users, bool) or not isinstance(users, int) or users < 1:
                raise fail(f"{at}.users", f"expected an integer >= 1, got {users!r}")
            x = _json_number(raw.get("throughput_per_s"), f"{at}.throughput_per_s", fail)
            if x <= 0:
                raise fail(f"{at}.throughput_per_s", f"must be > 0, got {x}")
            r = _json_number(raw.get("response_time_s"), f"{at}.response_time_s", fail)
            raw_stations = raw.get("stations")
            if not isinstance(raw_stations, Mapping) or not raw_stations:
                raise fail(f"{at}.stations", "expected a non-empty object of stations")
            if names is None:
                names = tuple(raw_stations)
            elif set(raw_stations) != set(names):
                extra = sorted(set(raw_stations) - set(names))
                missing = sorted(set(names) - set(raw_stations))
                problem = f"unknown station '{extra[0]}' (levels[0] has {', '.join(names)})" if extra else f"station '{missing[0]}' is missing"
                raise fail(f"{at}.stations", problem)
            stations = {name: _station(raw_stations[name], f"{at}.stations.{name}", x, fail) for name in names}
            levels.append(LoadLevel(users, x, r, stations))
        levels.sort(key=lambda level: level.users)
        for a, b in itertools.pairwise(levels):
            if a.users == b.users:
                raise fail("levels", f"two levels with users = {a.users}")
        return cls(think, tuple(levels))

    def level(self, users: int) -> LoadLevel:
        """The level measured at ``users``; :class:`ModelError` listing the measured ones if there is none."""
        for level in self.levels:
            if level.users == users:
                return level
        raise ModelError(f"no level with users = {users} (measured: {', '.join(map(str, self.users))})")


def _json_number(value: Any, where: str, fail: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(where, f"expected a number, got {value!r}")
    if value < 0:
        raise fail(where, f"must be non-negative, got {value!r}")
    return float(value)


def _station(raw: Any, at: str, throughput: float, fail: Any) -> StationMeasurement:
    if not isinstance(raw, Mapping):
        raise fail(at, "expected an object with 'utilization' and 'demand_s'")
    u = _json_number(raw.get("utilization"), f"{at}.utilization", fail)
    if u > 1.0:
        raise fail(f"{at}.utilization", f"{u:g} is over 100% (utilisation is a fraction of each server's time, 0..1)")
    servers = raw.get("servers", 1)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise fail(f"{at}.servers", f"expected an integer >= 1, got {servers!r}")
    visits = _json_number(raw.get("visits", 1.0), f"{at}.visits", fail)
    if visits <= 0:
        raise fail(f"{at}.visits", f"must be > 0, got {visits}")
    if "demand_s" in raw and raw["demand_s"] is not None:
        demand = _json_number(raw["demand_s"], f"{at}.demand_s", fail)
    else:
        demand = u * servers / throughput  # service demand law, D = U / X with U in busy servers
    return StationMeasurement(u, demand, servers, visits)


def read_loadtest(path: str | Path) -> LoadTest:
    """Read a ``perfcast-loadtest/1`` JSON file (docs/mva.md describes it field by field)."""
    path = Path(path)
    text = ModelFileError.read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(path, exc.lineno, None, f"not valid JSON: {exc.msg}") from None
    return LoadTest.from_json(data, path)


def model_from_loadtest(
    loadtest: LoadTest, users: Iterable[int] | None = None, *, axis: DemandAxis = DemandAxis.USERS
) -> ClosedModel:
    """The closed model whose stations carry the demands measured at the levels ``users`` (default: all).

    Servers and visits come from the first level. Against ``axis`` = throughput, the abscissae are the
    measured throughputs, which must then increase with the load.
    """
    chosen = loadtest.levels if users is None else tuple(loadtest.level(u) for u in sorted(set(users)))
    if len(chosen) < 2:
        raise ModelError(f"{len(chosen)} load level(s) are too few to interpolate demands (need at least 2)")
    first = chosen[0]
    stations: list[Station] = []
    for name, m in first.stations.items():
        if axis is DemandAxis.USERS:
            at = tuple(float(level.users) for level in chosen)
        else:
            at = tuple(level.throughput_per_s for level in chosen)
        demand_s = tuple(level.stations[name].demand_s for level in chosen)
        try:
            measured = MeasuredDemands(axis, at, demand_s)
        except ModelError as exc:
            raise ModelError(f"station '{name}': {exc}") from None
        stations.append(Station(name, None, m.servers, m.visits, StationKind.QUEUE, measured))
    return ClosedModel(tuple(stations), loadtest.think_time_s)


@dataclass(frozen=True, slots=True)
class HoldoutResult:
    """Held-out levels predicted from the others, and eq. 13's mean % deviations."""

    users: tuple[int, ...]
    """The held-out levels."""
    fitted_users: tuple[int, ...]
    predicted_throughput_per_s: FloatArray
    measured_throughput_per_s: FloatArray
    predicted_response_time_s: FloatArray
    measured_response_time_s: FloatArray
    throughput_deviation_pct: float
    cycle_time_deviation_pct: float
    """Of R + Z, as the paper's Tables IV and V report it."""
    response_time_deviation_pct: float
    """Of R alone: stricter, since the think time is not there to dilute the error."""
    result: MVAResult
    """The MVASD prediction from the fitted levels, for n = 1..max(users)."""


def holdout_deviation(
    measurements: LoadTest, holdout_levels: Sequence[int], *, axis: DemandAxis = DemandAxis.USERS
) -> HoldoutResult:
    """Fit MVASD on the levels not in ``holdout_levels``, predict those, and give eq. 13's deviations.

    Raises
    ------
    ModelError
        A held-out level that was not measured, or fewer than two levels left to fit.
    """
    held = tuple(sorted({int(u) for u in holdout_levels}))
    if not held:
        raise ModelError("no held-out levels given")
    for u in held:
        measurements.level(u)
    fitted = tuple(u for u in measurements.users if u not in held)
    model = model_from_loadtest(measurements, fitted, axis=axis)
    result = solve_mvasd(model, max(held))
    idx = np.array(held) - 1
    levels = [measurements.level(u) for u in held]
    px, pr = result.throughput_per_s[idx], result.response_time_s[idx]
    mx = np.array([level.throughput_per_s for level in levels])
    mr = np.array([level.response_time_s for level in levels])
    z = measurements.think_time_s
    return HoldoutResult(
        users=held,
        fitted_users=fitted,
        predicted_throughput_per_s=px,
        measured_throughput_per_s=mx,
        predicted_response_time_s=pr,
        measured_response_time_s=mr,
        throughput_deviation_pct=percent_deviation(px, mx),
        cycle_time_deviation_pct=percent_deviation(pr + z, mr + z),
        response_time_deviation_pct=percent_deviation(pr, mr) if np.all(mr > 0) else float("nan"),
        result=result,
    )
