"""Closed queueing network models for capacity planning: stations, demands, think time, and the TOML form.

A :class:`ClosedModel` is a single-class closed network: ``users`` customers cycle between thinking (mean
``think_time_s``) and a request that visits every :class:`Station`. A station is a queue with ``servers``
identical servers (FCFS, one job per server, the multi-core CPU of the MVASD paper) or a delay (no queue,
an infinite-server station). Each station's load is its *service demand* ``demand_s``: the total service time
a request needs there, summed over its ``visits`` (the service demand law, D = V S = U / X). A station may
instead carry demands measured at a few populations (:class:`MeasuredDemands`), which MVASD interpolates.

The TOML form, read by :func:`load_model`::

    think_time_s = 1.0
    [[station]]
    name = "db-cpu"
    servers = 16          # default 1
    visits = 1            # default 1
    demand_s = 0.0042     # or service_time_s (per visit), or measured demands:
    # demands = { users = [1, 20, 105, 203], demand_s = [0.0075, 0.0048, 0.0041, 0.0039] }
    # demands = { throughput_per_s = [0.9, 18.1, 88.0, 160.2], demand_s = [...] }
    kind = "queue"        # or "delay"
"""

from __future__ import annotations

import enum
import itertools
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import ModelError, ModelFileError

__all__ = [
    "ClosedModel",
    "DemandAxis",
    "MeasuredDemands",
    "Station",
    "StationKind",
    "load_model",
    "parse_model",
    "with_demands",
]


class StationKind(enum.StrEnum):
    """How a station serves its jobs."""

    QUEUE = "queue"
    """``servers`` identical servers and a FCFS queue: a job waits when all servers are busy."""
    DELAY = "delay"
    """No queue (an infinite-server station): every job is served at once, for ``demand_s`` in all."""


class DemandAxis(enum.StrEnum):
    """What measured demands are a function of."""

    USERS = "users"
    """The number of concurrent users (the load-test level): MVASD's Algorithm 2."""
    THROUGHPUT = "throughput_per_s"
    """The system throughput at that level: the variant of the MVASD paper's section VII."""


@dataclass(frozen=True, slots=True)
class MeasuredDemands:
    """Service demands of one station measured at a few load levels, for MVASD to interpolate."""

    axis: DemandAxis
    at: tuple[float, ...]
    """The abscissae, strictly increasing: users, or throughput in requests/s (see ``axis``)."""
    demand_s: tuple[float, ...]
    """The demand measured at each abscissa, seconds per request (all visits)."""

    def __post_init__(self) -> None:
        if len(self.at) != len(self.demand_s):
            raise ModelError(
                f"measured demands: {len(self.at)} values of '{self.axis}' but {len(self.demand_s)} of 'demand_s'"
            )
        if len(self.at) < 2:
            raise ModelError(
                f"measured demands: {len(self.at)} point(s) are too few to interpolate (need at least 2; "
                "give one constant 'demand_s' instead)"
            )
        if any(not math.isfinite(v) for v in (*self.at, *self.demand_s)):
            raise ModelError("measured demands: values must be finite numbers")
        if any(b <= a for a, b in itertools.pairwise(self.at)):
            raise ModelError(f"measured demands: '{self.axis}' must be strictly increasing, got {list(self.at)}")
        if any(d < 0 for d in self.demand_s):
            raise ModelError(f"measured demands: 'demand_s' must be non-negative, got {list(self.demand_s)}")


@dataclass(frozen=True, slots=True)
class Station:
    """One service centre of a closed network."""

    name: str
    demand_s: float | None = None
    """Service demand per request, seconds, summed over all visits (D = V S). None when only measured."""
    servers: int = 1
    """Identical servers (cores); a job in service holds one. Ignored by a delay station."""
    visits: float = 1.0
    """Visits per request (forced flow law: X_k = V_k X); used to report per-visit figures."""
    kind: StationKind = StationKind.QUEUE
    measured: MeasuredDemands | None = None
    """Demands measured at several load levels, for MVASD."""

    def __post_init__(self) -> None:
        where = f"station '{self.name}'"
        if not self.name:
            raise ModelError("station: field 'name' must be a non-empty string")
        if self.demand_s is None and self.measured is None:
            raise ModelError(f"{where}: needs 'demand_s' (or 'service_time_s', or measured 'demands')")
        if self.demand_s is not None and (not math.isfinite(self.demand_s) or self.demand_s < 0):
            raise ModelError(f"{where}: field 'demand_s' must be a non-negative number, got {self.demand_s}")
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ModelError(f"{where}: field 'servers' must be an integer >= 1, got {self.servers!r}")
        if not math.isfinite(self.visits) or self.visits <= 0:
            raise ModelError(f"{where}: field 'visits' must be a positive number, got {self.visits}")

    @property
    def service_time_s(self) -> float | None:
        """Mean service time per visit, S = D / V."""
        return None if self.demand_s is None else self.demand_s / self.visits


@dataclass(frozen=True, slots=True)
class ClosedModel:
    """A single-class closed queueing network with terminals (think time) in front of it."""

    stations: tuple[Station, ...]
    think_time_s: float = 0.0
    """Mean think time Z between a response and the user's next request."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.think_time_s) or self.think_time_s < 0:
            raise ModelError(f"field 'think_time_s' must be a non-negative number, got {self.think_time_s}")
        if not self.stations:
            raise ModelError("the model has no stations")
        seen: set[str] = set()
        for station in self.stations:
            if station.name in seen:
                raise ModelError(f"station '{station.name}' is defined twice")
            seen.add(station.name)

    @property
    def names(self) -> tuple[str, ...]:
        """Station names, in model order."""
        return tuple(s.name for s in self.stations)

    def station(self, name: str) -> Station:
        """The station called ``name``; :class:`ModelError` naming the known ones if there is none."""
        for s in self.stations:
            if s.name == name:
                return s
        raise ModelError(f"unknown station '{name}' (the model has: {', '.join(self.names)})")

    def constant_demands(self) -> tuple[float, ...]:
        """Each station's single demand; :class:`ModelError` for a station that only has measured ones."""
        out = []
        for s in self.stations:
            if s.demand_s is None:
                raise ModelError(
                    f"station '{s.name}': has only measured 'demands', no constant 'demand_s': "
                    "solve it with MVASD (--method mvasd)"
                )
            out.append(s.demand_s)
        return tuple(out)

    def has_measured_demands(self) -> bool:
        """True if any station carries demands measured at several load levels."""
        return any(s.measured is not None for s in self.stations)


_STATION_KEYS = {"name", "servers", "visits", "demand_s", "service_time_s", "demands", "kind"}
_TOP_KEYS = {"think_time_s", "station", "title", "description"}


class _Lines:
    """Best-effort line numbers for keys of a TOML text (tomllib does not report them)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.station_lines = [i + 1 for i, line in enumerate(self.lines) if re.match(r"\s*\[\[\s*station\s*\]\]", line)]

    def key(self, key: str, station: int | None = None) -> int | None:
        start, end = 0, len(self.lines)
        if station is not None and station < len(self.station_lines):
            start = self.station_lines[station] - 1
            if station + 1 < len(self.station_lines):
                end = self.station_lines[station + 1] - 1
        elif station is None and self.station_lines:
            end = self.station_lines[0] - 1
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        for i in range(start, end):
            if pattern.match(self.lines[i]):
                return i + 1
        return self.station_lines[station] if station is not None and station < len(self.station_lines) else None


def _number(value: Any, path: str, line: int | None, field_name: str, *, minimum: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelFileError(path, line, field_name, f"expected a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ModelFileError(path, line, field_name, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


def _numbers(value: Any, path: str, line: int | None, field_name: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise ModelFileError(path, line, field_name, f"expected an array of numbers, got {value!r}")
    return tuple(_number(v, path, line, field_name) for v in value)


def _measured(raw: Any, path: str, line: int | None, where: str) -> MeasuredDemands:
    if not isinstance(raw, Mapping):
        raise ModelFileError(path, line, f"{where}.demands", "expected a table like { users = [...], demand_s = [...] }")
    axes = [a for a in DemandAxis if a.value in raw]
    if len(axes) != 1 or "demand_s" not in raw or set(raw) - {"demand_s", *DemandAxis}:
        raise ModelFileError(
            path, line, f"{where}.demands",
            f"expected keys 'demand_s' and one of 'users' / 'throughput_per_s', got {sorted(raw)}",
        )
    at = _numbers(raw[axes[0].value], path, line, f"{where}.demands.{axes[0].value}")
    demands = _numbers(raw["demand_s"], path, line, f"{where}.demands.demand_s")
    try:
        return MeasuredDemands(axes[0], at, demands)
    except ModelError as exc:
        raise ModelFileError(path, line, f"{where}.demands", str(exc).removeprefix("measured demands: ")) from None


def parse_model(data: Mapping[str, Any], path: str | Path = "<model>", text: str = "") -> ClosedModel:
    """Build a :class:`ClosedModel` from the decoded TOML table ``data``; errors name ``path``, line and field."""
    path = str(path)
    lines = _Lines(text)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        key = min(unknown)
        raise ModelFileError(path, lines.key(key), key, f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})")
    think = _number(data.get("think_time_s", 0.0), path, lines.key("think_time_s"), "think_time_s")
    raw_stations = data.get("station")
    if not isinstance(raw_stations, list) or not raw_stations:
        raise ModelFileError(path, None, "station", "the model needs at least one [[station]] table")
    stations: list[Station] = []
    for i, raw in enumerate(raw_stations):
        if not isinstance(raw, Mapping):
            raise ModelFileError(path, lines.key("station"), f"station[{i}]", "expected a [[station]] table")
        name = raw.get("name")
        where = f"station[{i}]" if not isinstance(name, str) or not name else f"station[{name}]"
        at = lines.key("name", i)

        def line(key: str, i: int = i) -> int | None:
            return lines.key(key, i)

        if not isinstance(name, str) or not name:
            raise ModelFileError(path, at, f"{where}.name", f"expected a non-empty string, got {name!r}")
        if name in {s.name for s in stations}:
            raise ModelFileError(path, at, f"{where}.name", "a station of that name is already defined")
        unknown = set(raw) - _STATION_KEYS
        if unknown:
            key = min(unknown)
            raise ModelFileError(path, line(key), f"{where}.{key}", f"unknown field (known: {', '.join(sorted(_STATION_KEYS))})")
        kind_raw = raw.get("kind", "queue")
        try:
            kind = StationKind(kind_raw)
        except ValueError:
            raise ModelFileError(path, line("kind"), f"{where}.kind", f"expected 'queue' or 'delay', got {kind_raw!r}") from None
        servers_raw = raw.get("servers", 1)
        if isinstance(servers_raw, bool) or not isinstance(servers_raw, int) or servers_raw < 1:
            raise ModelFileError(path, line("servers"), f"{where}.servers", f"expected an integer >= 1, got {servers_raw!r}")
        visits_raw = raw.get("visits", 1.0)
        visits = _number(visits_raw, path, line("visits"), f"{where}.visits", minimum=None)
        if visits <= 0:
            raise ModelFileError(path, line("visits"), f"{where}.visits", f"must be > 0, got {visits_raw!r}")
        given = [k for k in ("demand_s", "service_time_s", "demands") if k in raw]
        if not given:
            raise ModelFileError(path, at, where, "needs one of 'demand_s', 'service_time_s' or 'demands'")
        if "demand_s" in raw and "service_time_s" in raw:
            raise ModelFileError(path, line("service_time_s"), f"{where}.service_time_s", "give 'demand_s' or 'service_time_s', not both")
        demand: float | None = None
        if "demand_s" in raw:
            demand = _number(raw["demand_s"], path, line("demand_s"), f"{where}.demand_s")
        elif "service_time_s" in raw:
            demand = visits * _number(raw["service_time_s"], path, line("service_time_s"), f"{where}.service_time_s")
        measured = _measured(raw["demands"], path, line("demands"), where) if "demands" in raw else None
        stations.append(Station(name, demand, servers_raw, visits, kind, measured))
    try:
        return ClosedModel(tuple(stations), think)
    except ModelError as exc:
        raise ModelFileError(path, None, None, str(exc)) from None


def load_model(path: str | Path) -> ClosedModel:
    """Read a model TOML file (the form in this module's docstring).

    Raises
    ------
    ModelFileError
        The file is unreadable, not TOML, or a field is missing or wrong; the message names file, line, field.
    """
    path = Path(path)
    text = ModelFileError.read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        raise ModelFileError(path, int(match.group(1)) if match else None, None, f"not valid TOML: {exc}") from None
    return parse_model(data, path, text)


def with_demands(model: ClosedModel, demands: Sequence[float]) -> ClosedModel:
    """A copy of ``model`` whose stations have the constant ``demands`` (model order) and no measured ones."""
    if len(demands) != len(model.stations):
        raise ModelError(f"expected {len(model.stations)} demands, got {len(demands)}")
    stations = tuple(
        Station(s.name, float(d), s.servers, s.visits, s.kind, None) for s, d in zip(model.stations, demands)
    )
    return ClosedModel(stations, model.think_time_s)

