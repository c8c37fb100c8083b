"""Mean Value Analysis of closed networks: exact multi-server (without cancellation) and Schweitzer's approximation.

Both solvers take a :class:`~analyzer.queueing.ClosedModel` whose stations have constant demands and return an
:class:`MVAResult` for every population n = 1..N. MVASD, which lets the demands vary with the load, is in
:mod:`analyzer.mvasd` and is built on the same exact solution.

Why the exact solver is a scaled convolution and not the MVA recursion
------------------------------------------------------------------------
The load-dependent MVA of Reiser and Lavenberg carries each multi-server station's marginal queue-length
probabilities p_k(j | n) from population to population and gets the empty-station probability from a
normalisation (1 - sum of the others, or, with the utilisation law, ``c p(0) = c - D X - sum (c - j) p(j)``).
When a station with many servers is busy, p(0) is many orders of magnitude smaller than the terms it is the
difference of, so each step loses digits and the errors grow geometrically: in float64 the recursion returns
negative probabilities and throughput by a few hundred users on a model with three 16-server stations 30-78%
busy. We compute the same product-form solution from normalising constants (Buzen's convolution algorithm),
arranged so that every operation adds positive numbers:

* Each queue station's factor f_k(j) = D_k^j / prod_{i<=j} min(i, c_k) is a rational sequence (geometric once
  j >= c_k), so convolving with it is a recursive filter (:func:`scipy.signal.lfilter`) whose coefficients are
  all non-negative: O(N c_k) per station instead of O(N^2).
* Demands are scaled by theta = min_k c_k / D_k (the throughput bound), which keeps the queue-part constants
  between 1 and a polynomial in N: no overflow, no underflow.
* The think time (and any delay station), whose factor Z^m / m! spans thousands of orders of magnitude, is
  convolved last, in blocks that each carry their own exponent (log space between blocks).
* Queue lengths come from the complement networks (all stations but one), run as one batched filter.
* When the stations have so many busy servers at saturation (some 600 in all) that even the scaled constants
  overflow float64, the filters run again in extended precision (``np.longdouble``).

Throughput is then X(n) = G(n-1) / G(n), queue lengths Q_k(n) = sum_j j f_k(j) G_{-k}(n-j) / G(n): relative
accuracy near machine precision at any population (checked against mpmath at 1,500 users).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.signal import lfilter
from scipy.special import gammaln

from analyzer.errors import ModelError
from analyzer.queueing import ClosedModel, StationKind

__all__ = ["MVAResult", "exact_throughput", "exact_throughput_at", "solve_exact", "solve_schweitzer"]

FloatArray = npt.NDArray[np.float64]

_BLOCK_SPAN = 500.0
"""Largest spread of log-weights inside one block of the delay convolution (exp(-500) is far from underflow)."""

_BLOCK_ROWS = 256

_FLOAT64_HEADROOM = 1e280
"""Constants above this may overflow when combined with the think time: use extended precision instead."""
"""Most outputs per block: smaller blocks skip more of the zero upper triangle, larger ones make fewer calls."""


@dataclass(frozen=True, slots=True)
class MVAResult:
    """Performance of a closed network at every population n = 1..N (index i holds n = i + 1)."""

    method: str
    """``exact``, ``schweitzer`` or ``mvasd``."""
    users: npt.NDArray[np.int64]
    throughput_per_s: FloatArray
    """System throughput X(n), requests per second."""
    response_time_s: FloatArray
    """Response time R(n) = n / X(n) - Z, excluding think time."""
    utilization: Mapping[str, FloatArray]
    """Per queue station: the busy fraction of each server, D X / c (0..1)."""
    demand_s: Mapping[str, FloatArray]
    """Per station: the service demand used at each population (constant unless MVASD)."""
    think_time_s: float
    bottleneck: str
    """The queue station with the highest utilisation at the largest population."""
    queue_length: Mapping[str, FloatArray] | None = None
    """Per station: mean number of requests there (waiting or in service); None when not computed."""
    residence_time_s: Mapping[str, FloatArray] | None = None
    """Per station: mean time a request spends there over all its visits, Q_k / X."""

    @property
    def cycle_time_s(self) -> FloatArray:
        """R(n) + Z: the cycle time the MVASD paper compares (its Tables IV and V)."""
        return self.response_time_s + self.think_time_s

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form: one entry per population 1..N in each list."""
        out: dict[str, Any] = {
            "method": self.method,
            "think_time_s": self.think_time_s,
            "users": self.users.tolist(),
            "throughput_per_s": self.throughput_per_s.tolist(),
            "response_time_s": self.response_time_s.tolist(),
            "utilization": {k: v.tolist() for k, v in self.utilization.items()},
            "demand_s": {k: v.tolist() for k, v in self.demand_s.items()},
            "bottleneck": self.bottleneck,
        }
        if self.queue_length is not None:
            out["queue_length"] = {k: v.tolist() for k, v in self.queue_length.items()}
        if self.residence_time_s is not None:
            out["residence_time_s"] = {k: v.tolist() for k, v in self.residence_time_s.items()}
        return out


def _check_users(users: int) -> int:
    if isinstance(users, bool) or not isinstance(users, int | np.integer) or users < 1:
        raise ModelError(f"'users' must be an integer >= 1, got {users!r}")
    return int(users)


def _bottleneck(utilization: Mapping[str, FloatArray], demands: Mapping[str, FloatArray]) -> str:
    if utilization:
        return max(utilization, key=lambda k: (utilization[k][-1], demands[k][-1]))
    return max(demands, key=lambda k: demands[k][-1])


# --- exact multi-server solution ---------------------------------------------------------------------------


def _station_factor(d: float, c: int, dtype: type = np.float64) -> tuple[FloatArray, FloatArray]:
    """f(j) for j = 0..c of a c-server station with (scaled) demand d: d^j / j! up to c."""
    f: npt.NDArray[Any] = np.ones(c + 1, dtype=dtype)
    f[1:] = np.cumprod(dtype(d) / np.arange(1, c + 1, dtype=dtype))
    return f, f[:c]


def _filter_coeffs(d: float, c: int, dtype: type = np.float64) -> tuple[FloatArray, FloatArray]:
    """(b, a) of the recursive filter whose impulse response is f(j) = d^j / prod min(i, c).

    F(z) = sum_j f(j) z^-j = N(z) / (1 - (d/c) z^-1) with N(z) = sum_{j<c} f(j-1) d (1/j - 1/c) z^-j (and
    N_0 = 1): every coefficient is >= 0, so filtering a positive sequence only ever adds positive terms.
    """
    f, _ = _station_factor(d, c, dtype)
    b: npt.NDArray[Any] = np.empty(c, dtype=dtype)
    b[0] = 1.0
    if c > 1:
        j: npt.NDArray[Any] = np.arange(1, c, dtype=dtype)
        b[1:] = f[: c - 1] * dtype(d) * (1 / j - dtype(1) / c)
    return b, np.array([1, -dtype(d) / c], dtype=dtype)


def _queue_kernel(d: float, c: int, x: FloatArray) -> FloatArray:
    """sum_j j f(j) x(n - j) along the last axis, by positive filters only.

    For j < c the kernel is a short FIR; for j >= c, j f(j) = f(c) r^i ((c - 1) + (i + 1)) with i = j - c and
    r = d / c, i.e. a first-order filter plus two first-order filters in cascade.
    """
    f, _ = _station_factor(d, c, x.dtype.type)
    r = x.dtype.type(d) / c
    out = np.zeros_like(x)
    if c > 1:
        fir = np.arange(c) * f[:c]  # j f(j), j = 0..c-1
        out += lfilter(fir, [1.0], x, axis=-1)
    one = lfilter([1.0], [1.0, -r], x, axis=-1)
    two = lfilter([1.0], [1.0, -r], one, axis=-1)
    tail = f[c] * ((c - 1) * one + two)
    out[..., c:] += tail[..., : x.shape[-1] - c]
    return out


def _log_delay_convolve(lw: FloatArray, y: FloatArray) -> FloatArray:
    """log of sum_{m<=n} exp(lw[m]) y[:, n-m] for every n, for y >= 0 of moderate range and lw of any range.

    The weights exp(lw) (a delay station's Z^m / m!) overflow float64 long before n = 1,500, so the outputs are
    computed in blocks of n; within a block all weights are scaled by the block's largest, small enough that no
    term that matters underflows, and the block's exponent is added back in log space.
    """
    length = y.shape[-1]
    if not np.isfinite(lw[1:]).any():  # no delay at all: the identity
        with np.errstate(divide="ignore"):
            return np.log(y)
    out = np.empty_like(y)
    top = np.maximum.accumulate(lw)
    start = 0
    while start < length:
        stop = int(np.searchsorted(top, top[start] + _BLOCK_SPAN, side="right"))
        stop = min(max(stop, start + 1), start + _BLOCK_ROWS, length)
        shift = top[stop - 1]
        size = stop - start
        weights = np.exp(lw[:stop] - shift).astype(y.dtype)
        padded = np.concatenate([np.zeros(stop, dtype=y.dtype), weights])[::-1]
        # toeplitz[i, t] = weights[start + t - i] (zero where negative): a strided view, no copy
        toeplitz = np.lib.stride_tricks.sliding_window_view(padded, size)[:stop, ::-1]
        block = y[:, :stop] @ toeplitz
        with np.errstate(divide="ignore"):
            out[:, start:stop] = np.log(block) + shift
        start = stop
    return out


def _delay_log_weights(z: float, theta: float, users: int) -> FloatArray:
    m = np.arange(users + 1, dtype=np.float64)
    if z <= 0.0:
        lw = np.full(users + 1, -np.inf)
        lw[0] = 0.0
        return lw
    out: FloatArray = m * np.log(z * theta) - gammaln(m + 1.0)
    return out


def _station_constants(
    scaled: FloatArray, servers: npt.NDArray[np.int64], users: int, queues: bool, dtype: type
) -> npt.NDArray[Any]:
    """Rows [H, J_1..J_K]: the queue part's normalising constants and each station's queue-length numerator.

    J_k = sum_j j f_k(j) H_{-k}(n - j), with H_{-k} the complement network (every station but k); the
    complements are filtered in one batch, each station's filter applied to every row but its own.
    """
    k_count = len(scaled)
    coeffs = [_filter_coeffs(float(d), int(c), dtype) for d, c in zip(scaled, servers)]
    rows: npt.NDArray[Any] = np.zeros((k_count + 1 if queues else 1, users + 1), dtype=dtype)
    rows[:, 0] = 1
    for k, (b, a) in enumerate(coeffs):
        if queues:
            keep = np.arange(k_count + 1) != k + 1
            rows[keep] = lfilter(b, a, rows[keep], axis=-1)
        else:
            rows = lfilter(b, a, rows, axis=-1)
    if not queues:
        return rows
    ys = [rows[0]] + [_queue_kernel(float(d), int(c), rows[k + 1]) for k, (d, c) in enumerate(zip(scaled, servers))]
    return np.vstack(ys)


def _in_range(ys: npt.NDArray[Any]) -> bool:
    """True if float64 held the constants: they are finite and far from overflow.

    The scaled constants grow like the product over stations of (D_k theta)^c_k / c_k!, about e^(busy servers
    at saturation, summed over stations); past some 600 busy servers float64 overflows and the solution is
    recomputed in extended precision (np.longdouble: 64-bit mantissa, exponents up to 4932), about ten times
    slower.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.isfinite(ys).all() and ys.max() < _FLOAT64_HEADROOM)


def _exact_core(
    demands: FloatArray, servers: npt.NDArray[np.int64], z: float, users: int, *, queues: bool = True
) -> tuple[FloatArray, FloatArray | None]:
    """Throughput X(1..N) and queue lengths Q[k, 1..N] of queue stations (demands > 0) behind a delay z.

    The normalising constants are G = w * H, with w(m) = Z^m / m! and H the convolution of the station factors.
    """
    k_count = len(demands)
    if k_count == 0:
        if z <= 0.0:
            raise ModelError("every demand is zero and there is no think time: throughput is unbounded")
        n = np.arange(1, users + 1, dtype=np.float64)
        return n / z, np.zeros((0, users))
    theta = float(np.min(servers / demands))
    scaled = demands * theta
    with np.errstate(over="ignore", invalid="ignore"):
        ys = _station_constants(scaled, servers, users, queues, np.float64)
    if not _in_range(ys):
        ys = _station_constants(scaled, servers, users, queues, np.longdouble)
    logs = _log_delay_convolve(_delay_log_weights(z, theta, users), ys).astype(np.float64)
    log_g = logs[0]
    throughput = theta * np.exp(log_g[:-1] - log_g[1:])
    queue = np.exp(logs[1:, 1:] - log_g[1:]) if queues else None
    return throughput, queue


def solve_exact(model: ClosedModel, users: int) -> MVAResult:
    """Exact multi-server Mean Value Analysis of a closed network, for n = 1..users.

    A queue station with c servers serves at rate min(j, c) / S with j jobs present (the load-dependent
    station of Reiser and Lavenberg [1]_); c = 1 is the single-server station of exact MVA [2]_; a delay
    station and the think time are infinite-server stations. The network is product-form, so this is the
    exact answer. Exact rather than Schweitzer's approximation: at our sizes (1,500 users, 12 stations of
    up to 16 servers) it takes a few milliseconds.

    The numbers are those of the MVA recursion, but computed through normalising constants [3]_ with scaling
    and positive filters (see the module docstring), because the recursion itself, in floating point, loses all
    precision once multi-server stations are busy. The MVASD paper's Algorithm 1 [4]_ differs from it twice:
    its marginal-probability update overwrites p(j) in place (new values must come from the previous
    population's), and its empty-station probability does not weight each p(j) by its number of idle servers
    (the utilisation law gives ``sum_j (c - j) p(j) = c - D X``). Its residence-time correction
    ``R = D / c (1 + Q + sum_j (c - 1 - j) p(j))`` is the right one and is what this solution satisfies.

    Parameters
    ----------
    model : ClosedModel
        Stations with constant ``demand_s``.
    users : int
        The largest population N.

    Returns
    -------
    MVAResult
        With per-station ``queue_length`` and ``residence_time_s``.

    Raises
    ------
    ModelError
        ``users`` < 1, a station with only measured demands, or no demand and no think time at all.

    References
    ----------
    .. [1] M. Reiser, S. S. Lavenberg, "Mean-Value Analysis of Closed Multichain Queuing Networks",
       J. ACM 27(2):313-322, 1980. doi:10.1145/322186.322195
    .. [2] E. D. Lazowska, J. Zahorjan, G. S. Graham, K. C. Sevcik, Quantitative System Performance,
       Prentice-Hall, 1984, chapters 6 (exact MVA) and 8 (load-dependent centres).
    .. [3] J. P. Buzen, "Computational algorithms for closed queueing networks with exponential servers",
       Comm. ACM 16(9):527-531, 1973. doi:10.1145/362342.362345
    .. [4] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying
       Service Demands", IPDPS Workshops, 2015: section V-B, eq. 8 and Algorithm 1.

    Examples
    --------
    >>> from analyzer.queueing import ClosedModel, Station
    >>> m = ClosedModel((Station("cpu", 0.5, servers=2),), think_time_s=1.0)
    >>> r = solve_exact(m, 3)
    >>> round(float(r.throughput_per_s[0]), 6)  # one user: 1 / (Z + D)
    0.666667
    """
    users = _check_users(users)
    demands = np.array(model.constant_demands(), dtype=np.float64)
    return _assemble("exact", model, users, demands)


def _assemble(method: str, model: ClosedModel, users: int, demands: FloatArray) -> MVAResult:
    """Run the exact core on ``demands`` (model order) and name everything."""
    is_queue = np.array([s.kind is StationKind.QUEUE for s in model.stations])
    servers = np.array([s.servers for s in model.stations], dtype=np.int64)
    active = is_queue & (demands > 0)
    delay = model.think_time_s + float(demands[~is_queue].sum())
    throughput, queue = _exact_core(demands[active], servers[active], delay, users)
    assert queue is not None
    queue_length: dict[str, FloatArray] = {}
    utilization: dict[str, FloatArray] = {}
    demand_s: dict[str, FloatArray] = {}
    rows = iter(queue)
    for s, d, c, q, act in zip(model.stations, demands, servers, is_queue, active):
        demand_s[s.name] = np.full(users, d)
        if q:
            utilization[s.name] = d * throughput / c
            queue_length[s.name] = next(rows) if act else np.zeros(users)
        else:
            queue_length[s.name] = d * throughput
    return _result(method, model, throughput, utilization, demand_s, queue_length)


def exact_throughput(demands: FloatArray, servers: npt.NDArray[np.int64], delay_s: float, users: int) -> FloatArray:
    """Throughput X(1..users) only, of queue stations with ``demands`` behind a total delay ``delay_s``.

    The fast path of :func:`solve_exact` for callers that need no queue lengths (MVASD). Zero demands are
    allowed and dropped.
    """
    demands = np.asarray(demands, dtype=np.float64)
    servers = np.asarray(servers, dtype=np.int64)
    keep = demands > 0
    throughput, _ = _exact_core(demands[keep], servers[keep], delay_s, users, queues=False)
    return throughput


# --- Schweitzer's approximation -----------------------------------------------------------------------------


def solve_schweitzer(model: ClosedModel, users: int, *, tolerance: float = 1e-10, max_iterations: int = 100_000) -> MVAResult:
    """Bard-Schweitzer approximate MVA, for n = 1..users, all populations solved at once.

    Each population n is solved on its own by the fixed point Q_k(n - 1) ~ (n - 1) / n Q_k(n) [1]_ [2]_,
    which removes the recursion over n; it is the approximation of the MVASD paper's eq. 7. A station with
    c > 1 servers is replaced by Seidmann's equivalent [3]_: a single server with demand D / c in series with
    a delay of D (c - 1) / c, which is exact at both ends of the load range and approximate in between.

    References
    ----------
    .. [1] P. Schweitzer, "Approximate analysis of multiclass closed networks of queues", Proc. Int. Conf. on
       Stochastic Control and Optimization, Amsterdam, 1979.
    .. [2] Y. Bard, "Some extensions to multiclass queueing network analysis", Performance of Computer
       Systems, North-Holland, 1979, 51-62.
    .. [3] A. Seidmann, P. J. Schweitzer, S. Shalev-Oren, "Computerized closed queueing network models of
       flexible manufacturing systems", Large Scale Systems 12:91-107, 1987.

    Examples
    --------
    >>> from analyzer.queueing import ClosedModel, Station
    >>> m = ClosedModel((Station("cpu", 0.2), Station("disk", 0.3)), think_time_s=1.0)
    >>> round(float(solve_schweitzer(m, 1).throughput_per_s[0]), 6)  # exact at n = 1: 1 / (Z + sum D)
    0.666667
    """
    users = _check_users(users)
    demands = np.array(model.constant_demands(), dtype=np.float64)
    is_queue = np.array([s.kind is StationKind.QUEUE for s in model.stations])
    servers = np.array([s.servers for s in model.stations], dtype=np.float64)
    queue_part = np.where(is_queue, demands / servers, 0.0)
    fixed_part = np.where(is_queue, demands * (servers - 1) / servers, demands)
    n = np.arange(1, users + 1, dtype=np.float64)[:, None]
    if model.think_time_s <= 0 and not demands.any():
        raise ModelError("every demand is zero and there is no think time: throughput is unbounded")
    q = np.broadcast_to(n / (len(demands) + 1), (users, len(demands))).copy()
    shrink = (n - 1) / n
    for _ in range(max_iterations):
        residence = queue_part * (1.0 + shrink * q) + fixed_part
        throughput = n[:, 0] / (model.think_time_s + residence.sum(axis=1))
        new_q = throughput[:, None] * residence
        done = np.max(np.abs(new_q - q) / (1.0 + q)) <= tolerance
        q = new_q
        if done:
            break
    else:
        raise ModelError(f"Schweitzer's iteration did not converge in {max_iterations} iterations")
    utilization = {
        s.name: demands[k] * throughput / servers[k] for k, s in enumerate(model.stations) if is_queue[k]
    }
    demand_s = {s.name: np.full(users, demands[k]) for k, s in enumerate(model.stations)}
    queue_length = {s.name: q[:, k].copy() for k, s in enumerate(model.stations)}
    return _result("schweitzer", model, throughput, utilization, demand_s, queue_length)


def _result(method: str, model: ClosedModel, throughput: FloatArray, utilization: dict[str, FloatArray],
            demand_s: dict[str, FloatArray], queue_length: dict[str, FloatArray] | None = None) -> MVAResult:
    """An :class:`MVAResult` for n = 1..len(throughput): response times from Little's law, R = n / X - Z."""
    n = np.arange(1, throughput.size + 1)
    return MVAResult(
        method=method,
        users=n,
        throughput_per_s=throughput,
        response_time_s=n / throughput - model.think_time_s,
        utilization=utilization,
        demand_s=demand_s,
        think_time_s=model.think_time_s,
        bottleneck=_bottleneck(utilization, demand_s),
        queue_length=queue_length,
        residence_time_s=None if queue_length is None else {k: v / throughput for k, v in queue_length.items()},
    )


def exact_throughput_at(demands: FloatArray, servers: npt.NDArray[np.int64], delay_s: float, users: int) -> float:
    """Throughput X(users) of the product-form network with these demands, at that one population.

    O(users x total servers): the station factors by positive filters, then only the two normalising
    constants G(users - 1) and G(users) are combined with the delay, in log space.
    """
    demands = np.asarray(demands, dtype=np.float64)
    servers = np.asarray(servers, dtype=np.int64)
    keep = demands > 0
    demands, servers = demands[keep], servers[keep]
    if len(demands) == 0:
        if delay_s <= 0.0:
            raise ModelError("every demand is zero and there is no think time: throughput is unbounded")
        return users / delay_s
    theta = float(np.min(servers / demands))
    with np.errstate(over="ignore", invalid="ignore"):
        h = _station_constants(demands * theta, servers, users, False, np.float64)
    if not _in_range(h):
        h = _station_constants(demands * theta, servers, users, False, np.longdouble)
    lw = _delay_log_weights(delay_s, theta, users)
    with np.errstate(divide="ignore"):
        log_h = np.log(h[0]).astype(np.float64)
    log_g_n = _logsumexp(lw + log_h[::-1])
    log_g_prev = _logsumexp(lw[:-1] + log_h[-2::-1])
    return theta * float(np.exp(log_g_prev - log_g_n))


def _logsumexp(values: FloatArray) -> float:
    top = float(np.max(values))
    return top + float(np.log(np.sum(np.exp(values - top))))
