"""The profile dictionary: empirical latency distributions of API calls, in a SQLite file.

WebPerf (Jiang et al., SIGCOMM 2016, section 4) keeps a *profile dictionary* of latency distributions of cloud
API calls, measured offline and independent of the application, keyed by the resource's configuration (tier,
location) and, for the few APIs whose latency depends on the workload, by a workload parameter (payload size,
concurrency, CPU interference). Two kinds of profile follow:

- *workload-independent*: ``param == ""``, one distribution per (api, resource, labels);
- *parameterised*: one distribution per measured value of ``param``; a value in between is served by
  quantile-by-quantile linear interpolation between the two nearest measured values.

Profile selection (:meth:`ProfileStore.select`) follows WebPerf: the parameterised profile when a parameter
value (the workload hint) is given and one exists, else the workload-independent one. The baseline (today's
configuration) comes from the spans, not from the store: :func:`baseline_profiles`.

Storage: one SQLite file, every :meth:`ProfileStore.add` one transaction, so a crash loses nothing that was
already written. Samples are kept per batch as little-endian float64 blobs.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Self
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from analyzer.errors import ProfileError

if TYPE_CHECKING:
    from analyzer.graph import CausalGraph

__all__ = [
    "PARAMS",
    "RTT_API",
    "ProfileKey",
    "ProfileStore",
    "Selection",
    "baseline_profiles",
    "interpolate_quantiles",
    "parse_labels",
    "resource_system",
]

RTT_API = "rtt"
"""The special api holding network round-trip times (a location profile)."""

PARAMS = ("size_bytes", "concurrency", "cpu_pct", "idle_ms")
"""The workload parameters a parameterised profile can be keyed by."""

FORMAT = "perfcast-profiles/3"

_PROFILE_COLUMNS = """(
    id INTEGER PRIMARY KEY,
    api TEXT NOT NULL,
    resource TEXT NOT NULL,
    labels TEXT NOT NULL,
    param TEXT NOT NULL,
    value REAL NOT NULL,
    concurrency INTEGER NOT NULL DEFAULT 1,
    UNIQUE (api, resource, labels, param, value, concurrency)
)"""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS profile {_PROFILE_COLUMNS};
CREATE TABLE IF NOT EXISTS batch (
    id INTEGER PRIMARY KEY,
    profile_id INTEGER NOT NULL REFERENCES profile(id),
    created_s REAL NOT NULL,
    count INTEGER NOT NULL,
    round_trips REAL,
    note TEXT NOT NULL,
    samples BLOB NOT NULL,
    cpu_ms REAL
);
CREATE INDEX IF NOT EXISTS batch_profile ON batch(profile_id);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}');
"""

_FROM_V1 = f"""
CREATE TABLE profile_v2 {_PROFILE_COLUMNS};
INSERT INTO profile_v2(id, api, resource, labels, param, value, concurrency)
    SELECT id, api, resource, labels, param, value,
           CASE WHEN param = 'concurrency' THEN CAST(value AS INTEGER) ELSE 1 END FROM profile;
DROP TABLE profile;
ALTER TABLE profile_v2 RENAME TO profile;
UPDATE meta SET value = 'perfcast-profiles/2' WHERE name = 'format';
"""
"""Format 1 had no ``concurrency`` column: every profile was measured with one caller, but those
parameterised by concurrency, whose callers are their value. The ids stay, so the batches keep their profile."""

_FROM_V2 = f"""
ALTER TABLE batch ADD COLUMN cpu_ms REAL;
UPDATE meta SET value = '{FORMAT}' WHERE name = 'format';
"""
"""Format 2 had no ``cpu_ms`` column (the caller's CPU per call): its batches have none."""


@dataclass(frozen=True, slots=True)
class ProfileKey:
    """Names one profile: what was called, where, in which configuration, under which workload."""

    api: str
    """``"<system> <operation>"``, the io node's ``api``: ``redis GET``, ``postgresql SELECT posts``,
    ``http GET /blob/{id}``; the special api ``rtt`` holds network round-trip times."""
    resource: str
    """The endpoint measured, as in io nodes' ``resource`` (``redis://127.0.0.1:6379/0``)."""
    labels: tuple[tuple[str, str], ...] = ()
    """Sorted (name, value) pairs naming the configuration; ``()`` is the configuration of the baseline."""
    param: str = ""
    """``""`` = workload-independent; else ``size_bytes`` | ``concurrency`` | ``cpu_pct`` | ``idle_ms``."""
    value: float = 0.0
    """The parameter's value for a parameterised profile."""
    concurrency: int = 1
    """The callers in flight while it was measured (its ``value`` for a profile parameterised by
    ``concurrency``). A payload profile measured at several concurrencies is two-dimensional: what a bigger
    payload adds to a call depends on how many calls share the server and the wire with it."""

    @classmethod
    def make(
        cls, api: str, resource: str, labels: Mapping[str, str] | None = None, param: str = "", value: float = 0.0,
        concurrency: int = 1,
    ) -> ProfileKey:
        """Build a key from a label mapping (sorted for you); checks ``param`` and ``concurrency``."""
        if param and param not in PARAMS:
            raise ProfileError(f"unknown profile parameter {param!r}: expected one of {', '.join(PARAMS)}")
        if param == "concurrency":
            concurrency = int(value)
        if concurrency < 1:
            raise ProfileError(f"profile key: concurrency must be at least 1, got {concurrency}")
        return cls(api, resource, tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items())),
                   param, float(value) if param else 0.0, int(concurrency))

    @property
    def label_text(self) -> str:
        """``location=eu-west,tier=C2``, or ``baseline`` for no labels."""
        return ",".join(f"{k}={v}" for k, v in self.labels) or "baseline"

    @property
    def param_text(self) -> str:
        """``size_bytes=1048576``, or ``workload-independent``; ``, concurrency=8`` when measured with 8 callers."""
        text = f"{self.param}={self.value:.15g}" if self.param else "workload-independent"
        return text + (f", concurrency={self.concurrency}" if self.concurrency != 1 and self.param != "concurrency"
                       else "")

    def describe(self) -> str:
        what = self.param_text
        return f"{self.api} @ {self.resource or '-'} [{self.label_text}] ({what})"


@dataclass(frozen=True, slots=True)
class Selection:
    """The distribution :meth:`ProfileStore.select` chose, and where it came from."""

    samples_ms: npt.NDArray[np.float64]
    keys: tuple[ProfileKey, ...]
    """The profile(s) used (two when interpolated)."""
    how: str
    """Human-readable: ``parameterised size_bytes=6e+06 (interpolated 1e+06..1e+07)``."""
    cpu_ms: float | None = None
    """The caller's CPU per call (ms) where the profiles recorded it, interpolated as the samples are: the client
    library's work to send the request and take in the answer, on the caller's thread (its event loop)."""


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    """``["tier=C2", "location=eu-west"]`` -> ``{"tier": "C2", "location": "eu-west"}``; raises ProfileError."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ProfileError(f"label {item!r}: expected NAME=VALUE, e.g. tier=C2")
        out[name.strip()] = value.strip()
    return out


def interpolate_quantiles(
    lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64], weight: float
) -> npt.NDArray[np.float64]:
    """Quantile-by-quantile linear interpolation between two samples: ``(1-w) Q_lo(q) + w Q_hi(q)``.

    Interpolating quantile functions (rather than mixing the CDFs) moves the distribution as a whole
    between the two measured ones, the displacement interpolation of 1-D optimal transport; a mixture would
    give a two-humped distribution that matches neither. The result has ``max(len(lo), len(hi))`` points at
    the mid-quantiles ``(i + 0.5) / m``.

    Examples
    --------
    >>> interpolate_quantiles(np.array([1.0, 3.0]), np.array([11.0, 13.0]), 0.5).tolist()
    [6.5, 7.5]
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1], got {weight}")
    m = max(len(lo), len(hi))
    q = (np.arange(m) + 0.5) / m
    return np.asarray((1.0 - weight) * np.quantile(lo, q) + weight * np.quantile(hi, q), dtype=np.float64)


def baseline_profiles(graphs: Iterable[CausalGraph]) -> dict[str, npt.NDArray[np.float64]]:
    """Baseline distributions from the spans: every io node's observed samples, pooled by ``api``.

    These are WebPerf's application-specific baseline latencies (section 4): today's configuration, measured
    in the application itself. Nodes without samples are skipped.
    """
    from analyzer.graph import NodeKind

    pooled: dict[str, list[float]] = {}
    for graph in graphs:
        for node in graph.nodes:
            if node.kind is NodeKind.IO and node.api and node.samples_ms:
                pooled.setdefault(node.api, []).extend(node.samples_ms)
    return {api: np.asarray(values, dtype=np.float64) for api, values in sorted(pooled.items())}


def _host_port(resource: str) -> str:
    parts = urlsplit(resource)
    return parts.netloc.rpartition("@")[2] if parts.scheme else ""


def resource_system(resource: str) -> str:
    """The system a resource URL names (``postgresql`` for ``postgresql+asyncpg://...``), '' for a bare name."""
    return urlsplit(resource).scheme.split("+")[0]


class ProfileStore:
    """A profile dictionary in a SQLite file (created when missing).

    Every :meth:`add` is one transaction, so a crash loses nothing written before it.

    Examples
    --------
    >>> import tempfile, os
    >>> store = ProfileStore(os.path.join(tempfile.mkdtemp(), "p.db"))
    >>> key = ProfileKey.make("redis GET", "redis://h:6379/0", {"tier": "C2"})
    >>> store.add(key, [1.0, 2.0, 3.0])
    >>> store.select("redis GET", "redis://h:6379/0", {"tier": "C2"}).samples_ms.tolist()
    [1.0, 2.0, 3.0]
    >>> store.close()
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.executescript(_SCHEMA)
            fmt = self._db.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ProfileError(f"{self.path}: not a perfcast profile store ({exc})") from None
        if fmt is not None and fmt[0] in ("perfcast-profiles/1", "perfcast-profiles/2"):
            upgrade = (_FROM_V1 if fmt[0].endswith("/1") else "") + _FROM_V2
            with self._transaction():  # one transaction: an interrupted upgrade leaves the old format as it was
                for statement in upgrade.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
            fmt = (FORMAT,)
        if fmt is None or fmt[0] != FORMAT:
            raise ProfileError(f"{self.path}: unknown profile store format {fmt and fmt[0]!r}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writing ------------------------------------------------------------------------------------------
    def add(
        self,
        key: ProfileKey,
        samples_ms: Sequence[float] | npt.NDArray[np.float64],
        *,
        round_trips: float | None = None,
        cpu_ms: float | None = None,
        note: str = "",
    ) -> None:
        """Append samples to the profile ``key`` (created on first use), in one transaction; ``cpu_ms``: the
        caller's CPU per call while they were measured, when known."""
        values = np.asarray(samples_ms, dtype="<f8").ravel()
        if not key.api:
            raise ProfileError("profile key: field 'api' must not be empty")
        if key.param and key.param not in PARAMS:
            raise ProfileError(f"profile key: field 'param' must be one of {', '.join(PARAMS)}, got {key.param!r}")
        if key.concurrency < 1 or (key.param == "concurrency" and key.concurrency != int(key.value)):
            raise ProfileError(f"profile key: field 'concurrency' must be at least 1 (and the value of a "
                               f"concurrency profile), got {key.concurrency}")
        if list(key.labels) != sorted(key.labels):
            raise ProfileError(f"profile key: field 'labels' must be sorted (use ProfileKey.make), got {key.labels}")
        if values.size == 0:
            raise ProfileError(f"{key.describe()}: no samples to add")
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ProfileError(f"{key.describe()}: samples must be finite and non-negative")
        if cpu_ms is not None and not (np.isfinite(cpu_ms) and cpu_ms >= 0):
            raise ProfileError(f"{key.describe()}: field 'cpu_ms' must be finite and non-negative, got {cpu_ms}")
        labels = json.dumps([list(p) for p in key.labels])
        with self._transaction():
            self._db.execute(
                "INSERT OR IGNORE INTO profile(api, resource, labels, param, value, concurrency) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (key.api, key.resource, labels, key.param, key.value, key.concurrency),
            )
            (pid,) = self._db.execute(
                "SELECT id FROM profile WHERE api=? AND resource=? AND labels=? AND param=? AND value=? "
                "AND concurrency=?",
                (key.api, key.resource, labels, key.param, key.value, key.concurrency),
            ).fetchone()
            self._db.execute(
                "INSERT INTO batch(profile_id, created_s, count, round_trips, note, samples, cpu_ms) "
                "VALUES (?,?,?,?,?,?,?)",
                (pid, time.time(), int(values.size), round_trips, note, values.tobytes(), cpu_ms),
            )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)

    # --- reading ------------------------------------------------------------------------------------------
    def keys(self) -> list[ProfileKey]:
        """Every profile in the store, sorted."""
        rows = self._db.execute("SELECT api, resource, labels, param, value, concurrency FROM profile").fetchall()
        keys = [
            ProfileKey(api, res, tuple((str(a), str(b)) for a, b in json.loads(lab)), param, float(value), int(c))
            for api, res, lab, param, value, c in rows
        ]
        return sorted(keys, key=lambda k: (k.api, k.resource, k.labels, k.param, k.concurrency, k.value))

    def _rows(self, key: ProfileKey, column: str) -> list[tuple[object, ...]]:
        return self._db.execute(
            f"SELECT {column} FROM batch JOIN profile ON profile.id = batch.profile_id "  # column: a fixed name from this module
            "WHERE api=? AND resource=? AND labels=? AND param=? AND value=? AND concurrency=? ORDER BY batch.id",
            (key.api, key.resource, json.dumps([list(p) for p in key.labels]), key.param, key.value,
             key.concurrency),
        ).fetchall()

    def samples(self, key: ProfileKey) -> npt.NDArray[np.float64]:
        """All samples of ``key`` in the order added; raises :class:`ProfileError` when there is no such profile."""
        rows = self._rows(key, "samples")
        if not rows:
            raise ProfileError(f"no profile {key.describe()} in {self.path}; {self._inventory()}")
        return np.concatenate([np.frombuffer(blob, dtype="<f8") for (blob,) in rows]).astype(np.float64)  # type: ignore[call-overload]

    def round_trips(self, key: ProfileKey) -> float | None:
        """Mean network round trips per call recorded with ``key``'s samples (None when never recorded)."""
        return self._per_call(key, "round_trips")

    def cpu_ms(self, key: ProfileKey) -> float | None:
        """The caller's mean CPU per call recorded with ``key``'s samples (None when no batch recorded it)."""
        return self._per_call(key, "cpu_ms")

    def _per_call(self, key: ProfileKey, column: str) -> float | None:
        """A per-batch mean of ``column`` weighted by the batches' sample counts, over the batches that have it."""
        rows = [(n, v) for n, v in self._rows(key, f"count, {column}") if v is not None]
        if not rows:
            return None
        total = sum(int(n) for n, _ in rows)  # type: ignore[call-overload]
        return sum(int(n) * float(v) for n, v in rows) / total  # type: ignore[call-overload,arg-type]

    def count(self, key: ProfileKey) -> int:
        return sum(int(n) for (n,) in self._rows(key, "count"))  # type: ignore[call-overload]

    def select(
        self, api: str, resource: str, labels: Mapping[str, str], param: str = "", value: float | None = None,
        concurrency: float | None = None,
    ) -> Selection:
        """Choose the profile for a call, as WebPerf's profile selection does.

        The parameterised profile of that ``api`` + ``labels`` when ``param`` is given with a ``value`` and
        one exists (interpolated at ``value`` between the two nearest measured values, quantile by quantile;
        clamped outside the measured range, saying so), else the workload-independent one. A payload (or other)
        profile measured at several concurrencies is read at ``concurrency`` the same way, the two nearest
        measured levels interpolated in turn; without ``concurrency``, at one caller (the fewest measured).

        Labels match exactly, else the profiles whose labels include all those asked (when they agree on one label set;
        never for the baseline, no labels).
        The resource matches exactly, else by host:port, else by system, else any resource with that api.

        Raises
        ------
        ProfileError
            Naming what was asked and what the store has, when nothing fits.
        """
        if param and param not in PARAMS:
            raise ProfileError(f"unknown profile parameter {param!r}: expected one of {', '.join(PARAMS)}")
        want = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        same_api = [k for k in self.keys() if k.api == api]
        exact = [k for k in same_api if k.labels == want]
        if not exact and want:  # the baseline () never widens to a labelled configuration
            wider = [k for k in same_api if set(want) <= set(k.labels)]
            if len({k.labels for k in wider}) == 1:
                exact = wider
        candidates, how_resource = self._match_resource(exact, resource)
        asked = f"api {api!r} resource {resource!r} labels [{','.join(f'{a}={b}' for a, b in want) or 'baseline'}]"
        if not candidates:
            raise ProfileError(f"no profile for {asked} in {self.path}; {self._inventory(api)}")
        suffix = f", {how_resource}" if how_resource else ""
        if param and value is not None:
            measured = sorted((k for k in candidates if k.param == param), key=lambda k: k.value)
            if measured and param != "concurrency":
                return self._at_concurrency(measured, float(value), concurrency, suffix)
            if measured:
                return self._interpolate(measured, float(value), suffix)
        independent = [k for k in candidates if not k.param]
        if not independent:
            params = sorted({f"{k.param}" for k in candidates})
            hint = f"; give a value for {params[0]}" if not param or value is None else ""
            raise ProfileError(
                f"no workload-independent profile for {asked} in {self.path}, only profiles parameterised by "
                f"{', '.join(params)}{hint}; {self._inventory(api)}"
            )
        key = independent[0]
        why = "" if not param else f" (no {param} profile)" if value is not None else f" (no {param} value given)"
        return Selection(self.samples(key), (key,), f"workload-independent{why}{suffix}", self.cpu_ms(key))

    def _match_resource(self, keys: list[ProfileKey], resource: str) -> tuple[list[ProfileKey], str]:
        """The keys of the best-matching resource, and how it matched ('' when exactly)."""
        tiers = (
            ("", lambda r: r == resource),
            ("same host:port", lambda r: bool(_host_port(r)) and _host_port(r) == _host_port(resource)),
            ("same system", lambda r: bool(resource_system(r)) and resource_system(r) == resource_system(resource)),
            ("any resource", lambda r: True),
        )
        for how, matches in tiers:
            hits = [k for k in keys if matches(k.resource)]
            if hits:
                # Several resources at one tier: take the one with most samples, deterministically.
                by_res: dict[str, list[ProfileKey]] = {}
                for k in hits:
                    by_res.setdefault(k.resource, []).append(k)
                best = max(sorted(by_res), key=lambda r: sum(self.count(k) for k in by_res[r]))
                return by_res[best], (f"resource {best} ({how})" if how else "")
        return [], ""

    def _at_concurrency(self, measured: list[ProfileKey], value: float, concurrency: float | None,
                        suffix: str) -> Selection:
        """:meth:`_interpolate` at ``value`` on the measured level(s) of concurrency nearest ``concurrency``."""
        levels = sorted({k.concurrency for k in measured})
        at = {c: [k for k in measured if k.concurrency == c] for c in levels}
        if concurrency is None or len(levels) == 1:
            c = 1 if 1 in at else levels[0]
            asked = concurrency is not None and concurrency != c
            note = f", measured with {c} caller{'s' if c != 1 else ''}{' only' if asked else ''}" \
                if c != 1 or asked else ""
            sel = self._interpolate(at[c], value, suffix)
            return replace(sel, how=sel.how + note)
        if concurrency <= levels[0] or concurrency >= levels[-1] or concurrency in at:
            c = min(levels, key=lambda level: abs(level - concurrency))
            how = "measured" if c == concurrency else f"clamped to {c}: measured {levels[0]}..{levels[-1]}"
            sel = self._interpolate(at[c], value, suffix)
            return replace(sel, how=f"{sel.how}, at concurrency {concurrency:g} ({how})")
        i = int(np.searchsorted(levels, concurrency))
        lo, hi = levels[i - 1], levels[i]
        a, b = self._interpolate(at[lo], value, ""), self._interpolate(at[hi], value, "")
        w = (concurrency - lo) / (hi - lo)
        samples = interpolate_quantiles(a.samples_ms, b.samples_ms, w)
        return Selection(samples, a.keys + b.keys,
                         f"{a.how}, at concurrency {concurrency:g} (interpolated {lo}..{hi}){suffix}",
                         _between(a.cpu_ms, b.cpu_ms, w))

    def _interpolate(self, measured: list[ProfileKey], value: float, suffix: str) -> Selection:
        param = measured[0].param
        values = [k.value for k in measured]
        span = f"{values[0]:g}..{values[-1]:g}"
        for k in measured:
            if k.value == value:
                return Selection(self.samples(k), (k,), f"parameterised {param}={value:g} (measured){suffix}",
                                 self.cpu_ms(k))
        if value < values[0] or value > values[-1]:
            k = measured[0] if value < values[0] else measured[-1]
            return Selection(
                self.samples(k), (k,),
                f"parameterised {param}={value:g} (clamped to {k.value:g}: measured {span}){suffix}", self.cpu_ms(k),
            )
        i = int(np.searchsorted(values, value))
        lo, hi = measured[i - 1], measured[i]
        weight = (value - lo.value) / (hi.value - lo.value)
        samples = interpolate_quantiles(self.samples(lo), self.samples(hi), weight)
        return Selection(
            samples, (lo, hi), f"parameterised {param}={value:g} (interpolated {lo.value:g}..{hi.value:g}){suffix}",
            _between(self.cpu_ms(lo), self.cpu_ms(hi), weight),
        )

    def _inventory(self, api: str | None = None) -> str:
        keys = self.keys()
        if not keys:
            return "the store is empty"
        shown = [k for k in keys if k.api == api] or keys
        more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
        which = "the store has" if shown is keys or api is None else f"the store has for {api!r}"
        return f"{which}: " + "; ".join(k.describe() for k in shown[:10]) + more


def _between(a: float | None, b: float | None, weight: float) -> float | None:
    """Linear interpolation of two recorded values; None unless both were recorded."""
    return None if a is None or b is None else (1.0 - weight) * a + weight * b


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
