"""Wake-up cost: how much longer the event loop's work takes after the host has been idle for a while.

On a virtual machine the first work after an idle spell runs slow: the vCPU was halted, its caches and branch
predictors went cold, and the host's frequency governor lowered its clock while it was idle (Linux's schedutil
follows a utilisation signal with a 32 ms half-life). Measured on the example app at one user: after a 20 ms
pause between requests, the post page's server-side latency grew from 2.2 to 2.9 ms, every step of the first
couple of milliseconds slower, and under a location scenario a 3 ms render that ran right after a 10 ms wait for
the database took 4.5 ms. A scenario that lengthens io waits (location, tier, size) leaves the loop idle longer
before each step it wakes up for, so it adds this cost as well as the longer waits.

A *wake-up profile* holds it: latencies of one request kind (or call) measured after idle gaps of ``idle_ms``
(api ``wake``, parameterised by ``idle_ms``, 0 included: back to back). What an idle gap ``g`` adds to the
first loop work after it is read off the profiles at an independent uniform quantile ``u``:

    extra(g, u) = Q_g(u) - Q_0(u)

linear in ``g`` between measured gaps, the largest gap's extra above it, nothing for ``g <= 0``. The profile
measured it on a whole request's work, but the work right after the gap pays most of it: what is still owed
falls by a factor e with every ``tau`` ms of loop work (:attr:`WakeProfile.decay_ms`), fitted by
:func:`fit_decay` to the steps of the profiled requests (on the example's post page 0.42 ms: the first 0.36 ms
of its 1.8 ms, reading the request, took 58-63% of the extra after every pause). A short step woken after a long
wait runs slow, but does not pay a whole request's warm-up. Spread evenly over the profiled requests' work
instead (1.8 ms), a 0.1 ms step after a 10 ms wait for the database was charged a fifth of the 0.13 ms the spans
showed, and under ``location:postgresql=+10ms`` the post page came out 0.6 ms and the index page, ten waits
long, 5.9 ms short (``docs/accuracy.md``, run 107); spread over the route's recorded loop work, 0.2-0.8 ms short
under every location change (run 58). Without step data (a profile timed from outside) ``tau`` is half the
work the extra was measured on, the mean position of an even spread. The load simulation
(:mod:`analyzer.loadsim`) knows the loop's idle gap before every piece of work; it charges each piece what its
gap adds under the scenario minus what its gap in the same request added under the baseline, so what the
recorded durations already hold is not counted twice. Gaps a little work apart add up there: a gap before the
last one's extra is paid is priced with that gap's idle in the share still owed.

Measured from outside the app (``perfcast profile --http URL --idle 5,10,20``), a profile also holds the
client's own wake-up, and the services' the app called. From the app's spans it holds the loop's work off the
io calls, and its reading of the request before the span started where the spans record when the loop woke
(``perfcast.loop.woke_ns``): between requests that is the first and coldest work after the pause, which in the
middle of a request falls on the steps after a wait.

The services go cold too. A database or a blob service idle for 20 ms answers the app's next call 0.2 ms later
(measured on the example app: PostgreSQL 0.35 -> 0.56 ms, the blob service 0.54 -> 0.74 ms; the loop's own steps
+0.21 ms in all), and what matters there is how long *that service* was idle, not the loop: under a +10 ms
location change of the database the blob service idles through both queries of the post page, and its fetch
measured +0.38 ms although the loop had just worked. From the spans of requests sent after pauses
(:func:`add_wake_profiles`) the loop's part and each service's are therefore kept apart: the loop's profile
(api ``wake``) times each request without its io calls, and a *service wake-up profile* (api ``wake service``,
one per resource) times the first call to that resource in each request, keyed by how long the resource had
been idle before it (from the start of the call before it to its start, as the simulation measures it: a
service also waits out the added round trip of a location change). The simulation charges each io call what its
resource's idle adds beyond what the same call's recorded idle did.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize_scalar

from analyzer.profiles import ProfileKey, resource_system
from analyzer.spans import Request

__all__ = [
    "SERVICE_WAKE_API",
    "WAKE_API",
    "WAKE_DECAY_API",
    "WakeProfile",
    "add_wake_profile",
    "add_wake_profiles",
    "fit_decay",
    "monotone_extra",
    "service_profile_for",
    "service_wake_profiles",
    "wake_profile",
]

FloatArray = npt.NDArray[np.float64]

WAKE_API = "wake"
"""The api of wake-up profiles (parameterised by ``idle_ms``)."""

SERVICE_WAKE_API = "wake service"
"""The api of service wake-up profiles: a resource's first call after it idled ``idle_ms`` (its lowest level the
reference)."""

WAKE_DECAY_API = "wake decay"
"""The api of a loop wake-up profile's decay length (ms, workload-independent, under the loop profile's resource):
:attr:`WakeProfile.decay_ms`, fitted by :func:`fit_decay` from the steps of the profiled requests."""

_MIN_SPREAD_MS = 5.0
"""A service's idle levels must span this much for a profile of it: a resource called at one pace only (the
second query of a step, always right after the first) says nothing about its idle."""

_GRID = 200
"""Quantiles kept per idle gap (u = (i + 0.5) / 200)."""


@dataclass(frozen=True, slots=True)
class WakeProfile:
    """What an idle gap adds to the loop work after it, per measured gap."""

    idle_ms: FloatArray
    """``(m,)`` increasing idle gaps: the first, the reference (0 for the loop), costs nothing."""
    extra_ms: FloatArray
    """``(m, 200)``: ``Q_g(u) - Q_0(u)`` at each gap on the grid ``u = (i + 0.5) / 200`` (row 0: zeros)."""
    how: str
    """Which profiles, for ``--explain``."""
    span_ms: float = 1.0
    """The loop work the extra was measured on: the profiled requests' median latency back to back."""
    resource: str = ""
    """What was timed: ``... GET /post/{id}`` for an endpoint of the app (its route last)."""
    decay_ms: float = 0.0
    """How fast the work after a gap pays its extra: what is still owed falls by a factor e with every
    ``decay_ms`` of loop work (fitted by :func:`fit_decay`); 0 when not fitted, read as ``span_ms / 2`` (the
    mean position of an extra spread evenly over the work it was measured on)."""
    _rows: list[list[float]] = field(init=False, repr=False, compare=False)
    _levels: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rows", self.extra_ms.tolist())
        object.__setattr__(self, "_levels", self.idle_ms.tolist())

    @property
    def tau_ms(self) -> float:
        """The decay length in use: :attr:`decay_ms`, else half of :attr:`span_ms`."""
        return self.decay_ms if self.decay_ms > 0 else self.span_ms / 2

    def at(self, gap_ms: float, u: float) -> float:
        """What an idle gap of ``gap_ms`` adds to the loop work after it, at the uniform quantile ``u``.

        Linear in the gap between measured gaps, the largest gap's extra above them, nothing for a gap at or
        below the first (the reference). Plain Python: the simulation asks once per piece of work.

        >>> p = WakeProfile(np.array([0.0, 10.0, 20.0]), np.vstack([np.zeros(200), np.full(200, 0.4),
        ...                                                         np.full(200, 0.6)]), "")
        >>> [round(p.at(g, 0.5), 3) for g in (-1.0, 0.0, 5.0, 10.0, 15.0, 40.0)]
        [0.0, 0.0, 0.2, 0.4, 0.5, 0.6]
        """
        levels, rows = self._levels, self._rows
        if gap_ms <= levels[0]:
            return 0.0
        k = min(max(int(u * _GRID), 0), _GRID - 1)
        hi = min(max(bisect_left(levels, gap_ms), 1), len(levels) - 1)
        lo = hi - 1
        t = min(max((gap_ms - levels[lo]) / (levels[hi] - levels[lo]), 0.0), 1.0)
        return (1.0 - t) * rows[lo][k] + t * rows[hi][k]


def add_wake_profile(store: Any, resource: str, latencies: Mapping[float, Sequence[float]], note: str = "") -> None:
    """Store a wake-up profile: ``latencies[g]``, the latencies (ms) of ``resource`` measured after idle gaps of
    ``g`` ms, 0 (back to back) included. ``resource`` names what was measured (``"forum GET /post/{id}"``).

    Raises ``ValueError`` when the gap 0 is missing or a gap has no latency.
    """
    if 0.0 not in {float(g) for g in latencies}:
        raise ValueError(f"wake-up profile of {resource!r}: the gap 0 (requests back to back) is missing")
    for gap, samples in latencies.items():
        if not samples:
            raise ValueError(f"wake-up profile of {resource!r}: no latency measured {gap:g} ms apart")
    for gap, samples in sorted(latencies.items()):  # checked first: nothing half stored
        store.add(ProfileKey.make(WAKE_API, resource, {}, "idle_ms", gap), list(samples), note=note)


def add_wake_profiles(
    store: Any,
    name: str,
    measured: Mapping[float, Sequence[Request]],
    every: Sequence[Request],
    note: str = "",
) -> list[str]:
    """Store the loop's and the services' wake-up profiles from the spans of requests sent after pauses.

    ``measured[g]``: the requests sent after a pause of ``g`` ms (0 included); ``every``: all the run's requests,
    warm-ups too (a service's idle before a call runs from the start of the call to it before, whichever request
    made that one). The loop's profile (api ``wake``, under ``name``, a route last as for
    :func:`add_wake_profile`) holds each request's latency without the time an io call was in flight, plus,
    where every request recorded the loop's wake-up before it (``Request.loop_woke_ns``), the loop's work from
    that wake-up to the request's span: the reading and parsing of the request, the first and coldest work
    after a pause, which a wait in the middle of a request leaves to the steps after it; each
    resource's (api ``wake service``) the duration of the first call to it in each request, one level per
    pause, at the median idle the resource had before those calls. A resource whose levels do not grow with the
    pause, or span under 5 ms, gets none. Returns one line per profile stored, saying what it holds.

    Only the server side counts: what the client-side latency gains after a pause beyond the server span's
    (the client's own wake-up and the kernel's delivery of the request to a sleeping app) has no part in a
    wait in the middle of a request. Added to the loop's levels (+0.24 ms at 10 ms, +0.51 at 20 on the
    example), it priced the location scenarios 0.3-3.5 ms above what was measured (``docs/accuracy.md``, runs
    54 and 55). The app's own part of it, the loop's work before the span, is measured on its own.
    """
    woke = all(r.loop_woke_ns is not None for rs in measured.values() for r in rs)
    steps = {g: [_steps_ms(r, woke) for r in rs] for g, rs in measured.items()}
    loop = {g: [sum(p) for p in pieces] for g, pieces in steps.items()}
    add_wake_profile(store, name, loop, note=note)
    held = "without its io calls, with its reading of the request" if woke else "without its io calls"
    lines = [f"loop ({name}, {held}): " + ", ".join(
        f"{np.median(x):.3f} ms at {g:g}" for g, x in sorted(loop.items()) if x)]
    decay = fit_decay(steps)
    if decay is not None:
        store.add(ProfileKey.make(WAKE_DECAY_API, name), [decay], note=note)
        lines[0] += f"; what is still owed falls by e every {decay:.3g} ms of work after the pause"
    starts: dict[str, list[int]] = {}
    for req in every:
        for call in req.ios:
            starts.setdefault(call.resource, []).append(call.start_ns)
    for xs in starts.values():
        xs.sort()
    per: dict[str, dict[float, tuple[list[float], list[float]]]] = {}
    for gap, reqs in measured.items():
        for req in reqs:
            seen: set[str] = set()
            for call in sorted(req.ios, key=lambda c: c.start_ns):
                if call.resource in seen or not call.resource:
                    continue
                seen.add(call.resource)
                xs = starts.get(call.resource, [])
                i = bisect_left(xs, call.start_ns)
                if i == 0:
                    continue  # the resource's first call of the run: its idle is not known
                idle, took = per.setdefault(call.resource, {}).setdefault(float(gap), ([], []))
                idle.append((call.start_ns - xs[i - 1]) / 1e6)
                took.append((call.end_ns - call.start_ns) / 1e6)
    for resource, by_gap in sorted(per.items()):
        gaps = sorted(g for g, (idle, _) in by_gap.items() if idle)
        levels = [round(float(np.median(by_gap[g][0])), 2) for g in gaps]
        if len(levels) < 2 or any(b <= a for a, b in zip(levels, levels[1:])) or levels[-1] - levels[0] < \
                _MIN_SPREAD_MS:
            lines.append(f"service {resource}: no profile (idle {', '.join(f'{x:g}' for x in levels)} ms at "
                         f"pauses {', '.join(f'{g:g}' for g in gaps)} ms)")
            continue
        for g, level in zip(gaps, levels, strict=True):
            store.add(ProfileKey.make(SERVICE_WAKE_API, resource, {}, "idle_ms", level), by_gap[g][1], note=note)
        lines.append(f"service {resource}: first call " + ", ".join(
            f"{np.median(by_gap[g][1]):.3f} ms after {level:g} ms idle" for g, level in zip(gaps, levels, strict=True)))
    return lines


def fit_decay(steps: Mapping[float, Sequence[Sequence[float]]]) -> float | None:
    """The decay length (ms of loop work) of a wake-up's extra, from the loop's work between waits in requests
    sent after pauses: ``steps[g]``, one list per request of its pieces of loop work (ms) in order, for each
    pause ``g`` (0, back to back, included). None when that cannot tell it (fewer than two pieces, no pause
    that slows the work, no requests back to back).

    The requests of the commonest shape (number of pieces) are kept; a pause's extra on piece ``i`` is the
    difference of its medians after the pause and back to back, at least 0. The model: what is still owed falls
    by a factor e with every ``tau`` ms of work, so a piece from ``x`` to ``x + w`` ms of work (back-to-back
    medians) pays ``exp(-x / tau) - exp(-(x + w) / tau)`` of it, normalised over the request's pieces; ``tau``
    minimises the squared differences to the measured extras of every pause (a bounded scalar search). On the
    example's post page after pauses of 1-40 ms, the first 0.36 ms (reading the request) took 58-63% of the
    extra, the last 0.7 ms 0-6%: fitted, 0.42 ms (the profile's 1.8 ms of work, spread evenly, had put 20% in
    the first piece and priced a 0.1 ms step after a 10 ms wait at a fifth of what the spans showed).

    >>> steps = {0.0: [[0.4, 0.2, 0.3, 0.7]] * 5, 20.0: [[0.7, 0.26, 0.33, 0.71]] * 5}
    >>> round(fit_decay(steps), 2)
    0.29
    >>> fit_decay({0.0: [[1.0]], 20.0: [[1.5]]}) is None
    True
    """
    shapes = Counter(len(p) for pieces in steps.values() for p in pieces)
    if not shapes or 0.0 not in steps:
        return None
    n = shapes.most_common(1)[0][0]
    med = {g: np.median(np.array([p for p in pieces if len(p) == n]), axis=0)
           for g, pieces in steps.items() if any(len(p) == n for p in pieces)}
    if n < 2 or 0.0 not in med:
        return None
    base = med[0.0]
    extras = [e for g, m in med.items() if g > 0 and (e := np.maximum(m - base, 0.0)).sum() > 0]
    if not extras:
        return None
    edges = np.concatenate([[0.0], np.cumsum(base)])

    def loss(tau: float) -> float:
        share = np.exp(-edges[:-1] / tau) - np.exp(-edges[1:] / tau)
        share /= share.sum()
        return float(sum(((e - e.sum() * share) ** 2).sum() for e in extras))

    return float(minimize_scalar(loss, bounds=(0.01, max(2 * edges[-1], 0.02)), method="bounded").x)


def _steps_ms(req: Request, woke: bool) -> list[float]:
    """A request's pieces of loop work between its io calls (ms), in order, its reading of the request first
    where ``woke``: its span's time outside the union of its calls' spans, one piece per gap of that union (a
    call that starts once the request has answered, a spawned task's, leaves pieces of 0)."""
    out = [_before_ms(req)] if woke else []
    end = req.start_ns
    for call in sorted(req.ios, key=lambda c: c.start_ns):
        if call.start_ns >= end:
            out.append(max(min(call.start_ns, req.end_ns) - end, 0) / 1e6)
        end = max(end, call.end_ns)
    out.append(max(req.end_ns - end, 0) / 1e6)
    return out


def _before_ms(req: Request) -> float:
    """The loop's work on a request before its span started (ms): from the return of the loop's last ``select()``
    that could block (``Request.loop_woke_ns``) to the span's start, reading and parsing the request; 0 when not
    recorded."""
    return max(req.start_ns - req.loop_woke_ns, 0) / 1e6 if req.loop_woke_ns is not None else 0.0


def service_wake_profiles(store: Any) -> dict[str, WakeProfile]:
    """The service wake-up profiles of ``store``, by resource: what an idle spell of that resource adds to the
    call that ends it, against its first level (the calls made with no pause before their request)."""
    return {resource: _stored(store, SERVICE_WAKE_API, resource, labels, levels,
                              f"service wake-up profile of {resource} ")
            for (resource, labels), levels in _stored_levels(store, SERVICE_WAKE_API).items()
            if not labels and len(levels) >= 2}


def service_profile_for(resource: str, profiles: Mapping[str, WakeProfile]) -> WakeProfile | None:
    """The service wake-up profile of ``resource``: its own, else the only one of the same system (a proxy's port
    changes from one deployment to the next: ``postgresql://127.0.0.1:40195/test`` takes the profile measured as
    ``postgresql://127.0.0.1:45123/test``), else None.

    >>> p = WakeProfile(np.array([2.0, 20.0]), np.zeros((2, 200)), "")
    >>> service_profile_for("postgresql://h:2/db", {"postgresql://h:1/db": p}) is p
    True
    >>> service_profile_for("blob", {"postgresql://h:1/db": p}) is None
    True
    """
    if resource in profiles:
        return profiles[resource]
    system = resource_system(resource)
    same = [p for name, p in profiles.items() if system and resource_system(name) == system]
    return same[0] if len(same) == 1 else None


def wake_profile(store: Any) -> WakeProfile | None:
    """The wake-up profile of ``store`` (anything with ``keys()`` and ``select``), or None when it has none.

    The first resource with a profile at ``idle_ms=0`` and at one gap or more is used.
    """
    for (resource, labels), levels in _stored_levels(store, WAKE_API).items():
        if 0.0 in levels and len(levels) >= 2:
            profile = _stored(store, WAKE_API, resource, labels, levels,
                              f"wake-up profile {resource} " if resource else "wake-up profile ")
            if any(k.api == WAKE_DECAY_API and k.resource == resource and k.labels == labels for k in store.keys()):
                decay = float(np.median(store.select(WAKE_DECAY_API, resource, dict(labels)).samples_ms))
                profile = replace(profile, decay_ms=decay, how=f"{profile.how}, decaying by e every {decay:.3g} ms")
            return profile
    return None


def _stored_levels(store: Any, api: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]:
    """(resource, labels) -> the ``idle_ms`` levels ``store`` holds for ``api``, sorted; resources in order.
    Empty for a store without ``keys()``."""
    keys = getattr(store, "keys", None)
    if keys is None:
        return {}
    levels: dict[tuple[str, tuple[tuple[str, str], ...]], set[float]] = {}
    for key in keys():
        if key.api == api and key.param == "idle_ms":
            levels.setdefault((key.resource, key.labels), set()).add(key.value)
    return {k: sorted(v) for k, v in sorted(levels.items())}


def monotone_extra(extra: FloatArray) -> FloatArray:
    """``extra`` (``(m, k)``: what each of ``m`` increasing idle gaps adds at each of ``k`` quantiles, row 0 the
    reference, all zeros) made what a wake-up can be: never below nothing, and no smaller after a longer gap.

    Each column's rows after the reference are fitted by isotonic regression over the gaps, and what is left below
    0 is set to 0, which with a non-decreasing fit is the isotonic fit held at or above the reference's 0 (R. E.
    Barlow et al., *Statistical Inference under Order Restrictions*, Wiley, 1972: the fit at gap ``i`` is
    ``max over j <= i of min over l >= i`` of the mean of rows ``j..l``, their max-min formula, here for every
    column at once; ``scipy.optimize.isotonic_regression`` fits one column a call, 0.2 ms each, 40 ms for a
    profile's 200 and several profiles per prediction). Measured on a page of 13 ms of loop work whose latency
    drifts by a few ms, the raw differences of quantiles went -0.53, -0.21, -0.02, -0.05, +0.39, +0.31 ms from 1
    to 40 ms: a pause does not speed the work after it up, and the simulation compounds what a profile says over
    each wait of a request.

    >>> monotone_extra(np.array([[0.0], [-0.53], [-0.21], [-0.02], [-0.05], [0.39], [0.31]])).ravel().round(6).tolist()
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.35, 0.35]
    """
    y = np.asarray(extra, dtype=np.float64)[1:]
    m = y.shape[0]
    out = np.zeros(np.shape(extra), dtype=np.float64)
    if m == 0:
        return out
    sums = np.concatenate([np.zeros((1,) + y.shape[1:]), np.cumsum(y, axis=0)])
    j, l = np.indices((m, m))
    upper = j <= l
    # mean[j, l] of rows j..l (j <= l), +inf elsewhere so that the min over l ignores it
    mean = np.where(upper[..., None], (sums[1:][None] - sums[:-1][:, None]) / np.maximum(l - j + 1, 1)[..., None],
                    np.inf)
    # least[j, i] = min over l >= i of mean[j, l]; the fit at i is the max of it over j <= i
    least = np.minimum.accumulate(mean[:, ::-1], axis=1)[:, ::-1]
    out[1:] = np.where(upper[..., None], least, -np.inf).max(axis=0)
    return np.maximum(out, 0.0)


def _stored(store: Any, api: str, resource: str, labels: tuple[tuple[str, str], ...], levels: Sequence[float],
            what: str) -> WakeProfile:
    """The profile of ``resource`` at ``levels`` (sorted): each level's quantiles less the first level's, spread
    over the first level's median (the work they were measured on); ``what`` begins its ``how``."""
    grid = (np.arange(_GRID) + 0.5) / _GRID
    q = [np.quantile(store.select(api, resource, dict(labels), "idle_ms", v).samples_ms, grid) for v in levels]
    return WakeProfile(np.asarray(levels, dtype=np.float64), monotone_extra(np.vstack([row - q[0] for row in q])),
                       f"{what}at idle {', '.join(f'{v:g}' for v in levels)} ms", max(float(q[0][_GRID // 2]), 1e-3),
                       resource)
