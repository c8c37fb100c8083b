"""Service demands from measurements: the operational laws of Denning and Buzen.

A load test measures, over a steady-state window of one concurrency level, the system throughput ``X``, the
mean response time ``R``, the mean think time ``Z`` and, per resource (a *station*: a host's CPU, its disks, a
process), the mean number of busy servers. The operational laws turn these into the inputs of Mean Value
Analysis: the service demand ``D_k`` of each station, the total time one request spends being served there.

.. math::

    U_k = X_k S_k \\qquad X_k = V_k X \\qquad D_k = V_k S_k = U_k / X \\qquad N = X (R + Z)

(utilisation law, forced-flow law, service demand law, Little's law applied to the whole closed loop of users
and think times). For a station with ``c`` servers, ``U_k`` in the service demand law is the mean number of busy
servers (0..c); the utilisation of each server is that divided by ``c``.

The functions are pure and accept floats or numpy arrays (one value per concurrency level); they check their
inputs and raise :class:`~analyzer.errors.ModelError` naming the field when a law cannot hold, e.g. a station
busier than 100% or a negative throughput.

References
----------
.. [1] P. J. Denning, J. P. Buzen, "The Operational Analysis of Queueing Network Models", ACM Computing
   Surveys 10(3):225-261, 1978. doi:10.1145/356733.356735
.. [2] E. D. Lazowska, J. Zahorjan, G. S. Graham, K. C. Sevcik, "Quantitative System Performance", Prentice-Hall,
   1984, chapter 3 (the operational laws).
.. [3] J. D. C. Little, "A Proof for the Queuing Formula: L = lambda W", Operations Research 9(3):383-387, 1961.
.. [4] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying Service
   Demands", IPDPS Workshops 2015, section III, equations 1-4 (the laws as used by MVASD).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.errors import ModelError

__all__ = [
    "BUSY_TOLERANCE",
    "StationDemand",
    "littles_law_deviation",
    "littles_law_users",
    "service_demand",
    "station_demand",
    "station_throughput",
    "utilization",
]

FloatLike = float | npt.NDArray[np.float64]

BUSY_TOLERANCE = 0.02
"""Measured utilisation may exceed 100% by this fraction (counter granularity, sampling skew) before it is an
error; within the tolerance it is clipped to 100%."""


def _as_array(value: Any, field: str) -> npt.NDArray[np.float64]:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"field '{field}': expected a number, got {value!r}") from exc
    if not np.all(np.isfinite(array)):
        raise ModelError(f"field '{field}': expected finite numbers, got {value!r}")
    return array


def _non_negative(value: Any, field: str) -> npt.NDArray[np.float64]:
    array = _as_array(value, field)
    if np.any(array < 0):
        raise ModelError(f"field '{field}': must be non-negative, got {_show(array)}")
    return array


def _positive(value: Any, field: str) -> npt.NDArray[np.float64]:
    array = _as_array(value, field)
    if np.any(array <= 0):
        raise ModelError(f"field '{field}': must be positive, got {_show(array)}")
    return array


def _show(array: npt.NDArray[np.float64]) -> str:
    return repr(float(array)) if array.ndim == 0 else repr(array.tolist())


def _out(array: npt.NDArray[np.float64]) -> FloatLike:
    return float(array) if array.ndim == 0 else array


def utilization(throughput_per_s: FloatLike, service_time_s: FloatLike) -> FloatLike:
    """Utilisation law: the mean number of busy servers of a station, ``U_k = X_k S_k``.

    Parameters
    ----------
    throughput_per_s : float or array
        Completions per second at the station, ``X_k``.
    service_time_s : float or array
        Mean service time per visit, ``S_k``.

    Raises
    ------
    ModelError
        If either is negative.

    Examples
    --------
    >>> utilization(40.0, 0.005)
    0.2
    """
    x = _non_negative(throughput_per_s, "throughput_per_s")
    s = _non_negative(service_time_s, "service_time_s")
    return _out(x * s)


def station_throughput(visits: FloatLike, throughput_per_s: FloatLike) -> FloatLike:
    """Forced-flow law: the throughput of a station, ``X_k = V_k X``.

    Examples
    --------
    >>> station_throughput(3, 10.0)
    30.0
    """
    v = _non_negative(visits, "visits")
    x = _non_negative(throughput_per_s, "throughput_per_s")
    return _out(v * x)


def service_demand(busy_servers: FloatLike, throughput_per_s: FloatLike) -> FloatLike:
    """Service demand law: the total service time of one request at a station, ``D_k = U_k / X``.

    ``busy_servers`` is ``U_k`` counted in servers (a 16-core CPU that is 50% busy has 8 busy servers), so the
    demand is the CPU time one request consumes, whatever the number of cores.

    Raises
    ------
    ModelError
        If ``busy_servers`` is negative or ``throughput_per_s`` is not positive (no completions, no demand).

    Examples
    --------
    >>> service_demand(0.5, 25.0)
    0.02
    """
    u = _non_negative(busy_servers, "busy_servers")
    x = _positive(throughput_per_s, "throughput_per_s")
    return _out(u / x)


def littles_law_users(throughput_per_s: FloatLike, response_time_s: FloatLike, think_time_s: FloatLike) -> FloatLike:
    """Little's law over the closed loop: the mean number of users, ``N = X (R + Z)``.

    Examples
    --------
    >>> littles_law_users(10.0, 0.25, 1.75)
    20.0
    """
    x = _non_negative(throughput_per_s, "throughput_per_s")
    r = _non_negative(response_time_s, "response_time_s")
    z = _non_negative(think_time_s, "think_time_s")
    return _out(x * (r + z))


def littles_law_deviation(
    users: FloatLike, throughput_per_s: FloatLike, response_time_s: FloatLike, think_time_s: FloatLike
) -> FloatLike:
    """Relative deviation of a measurement from Little's law: ``X (R + Z) / N - 1``.

    A closed load test obeys the law by construction, so a large deviation means the measurement window was
    not in steady state (too short, or users still ramping up) or the think time was not what was asked for
    (an overloaded load generator sleeps longer than it should).

    Examples
    --------
    >>> round(littles_law_deviation(20, 9.5, 0.25, 1.75), 6)
    -0.05
    """
    n = _positive(users, "users")
    return _out(np.asarray(littles_law_users(throughput_per_s, response_time_s, think_time_s)) / n - 1.0)


@dataclass(frozen=True, slots=True)
class StationDemand:
    """One station at one concurrency level, as the load-test file stores it."""

    name: str
    """Station name, e.g. ``web1-cpu`` or ``web1-disk``."""
    servers: int
    """Number of servers (CPU cores, disks); MVA treats the station as a ``servers``-server queue."""
    utilization: float
    """Mean utilisation of each server, 0..1 (``busy_servers / servers``)."""
    busy_servers: float
    """Mean number of busy servers, ``U_k`` of the utilisation law."""
    demand_s: float
    """Service demand of one request, ``D_k = U_k / X`` (seconds)."""
    visits: float
    """Visits per request, ``V_k``; the per-visit service time is ``demand_s / visits``."""
    source: str
    """Where ``busy_servers`` came from: ``host`` (whole-host counters via psutil), ``agent`` (a remote host's
    agent), or ``process`` (CPU time of given processes only)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "utilization": self.utilization,
            "busy_servers": self.busy_servers,
            "demand_s": self.demand_s,
            "servers": self.servers,
            "visits": self.visits,
            "source": self.source,
        }


def station_demand(
    name: str,
    busy_servers: float,
    servers: int,
    throughput_per_s: float,
    *,
    visits: float = 1.0,
    source: str = "host",
) -> StationDemand:
    """Apply the utilisation and service demand laws to one station measured at one concurrency level.

    Parameters
    ----------
    name : str
        Station name, used in error messages.
    busy_servers : float
        Mean number of busy servers over the window (CPU seconds per second, disk busy seconds per second).
    servers : int
        Number of servers of the station; utilisation per server is ``busy_servers / servers``.
    throughput_per_s : float
        System throughput ``X`` over the same window.
    visits : float
        Visits per request (forced-flow law); the demand is per request, whatever the visits.
    source : str
        Where the measurement came from (stored, not interpreted).

    Raises
    ------
    ModelError
        Naming the station and field: fewer than one server, a negative measurement, a utilisation above 100%
        (beyond :data:`BUSY_TOLERANCE`), or a throughput that is not positive.

    Examples
    --------
    >>> d = station_demand("db-cpu", busy_servers=1.2, servers=4, throughput_per_s=60.0)
    >>> d.utilization, d.demand_s
    (0.3, 0.02)
    """
    if not isinstance(servers, int | np.integer) or servers < 1:
        raise ModelError(f"station '{name}': field 'servers': must be a positive integer, got {servers!r}")
    try:
        busy = float(_non_negative(busy_servers, "busy_servers"))
        v = float(_positive(visits, "visits"))
        demand = float(service_demand(busy, throughput_per_s))
    except ModelError as exc:
        raise ModelError(f"station '{name}': {exc}") from exc
    per_server = busy / servers
    if per_server > 1.0 + BUSY_TOLERANCE:
        raise ModelError(
            f"station '{name}': field 'utilization': {per_server:.1%} is over 100% "
            f"({busy:.3f} busy of {servers} servers): is 'servers' too small?"
        )
    if per_server > 1.0:
        busy, per_server = float(servers), 1.0
        demand = float(service_demand(busy, throughput_per_s))
    return StationDemand(
        name=name,
        servers=int(servers),
        utilization=per_server,
        busy_servers=busy,
        demand_s=demand,
        visits=v,
        source=source,
    )
