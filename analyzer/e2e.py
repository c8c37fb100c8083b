"""End-to-end latency: cloud side + network + browser, by Monte Carlo (WebPerf's Algorithm 2).

WebPerf (Jiang et al., SIGCOMM 2016, section 5.1) predicts the load time of a web page from three parts:
the cloud-side latency of the requests the page makes to the application's frontend (perfcast's prediction
for that route), the network round-trip time between browser and frontend, and the browser side, a
WebProphet-like *ClientPrediction* that, given the page's object dependency graph and a fetch time per
object, gives the page load time. Algorithm 2 repeats: for every object, draw its fetch time (cloud sample
+ RTT sample when the frontend serves it, else a sample of the object's FetchTime, here the HAR's own
time), run ClientPrediction, keep the page load time; until the confidence interval of the chosen
percentile is within the target.

The page model comes from a HAR file (:func:`read_har`): objects, their fetch times and their dependencies,
taken from Chrome's ``_initiator`` when present and otherwise inferred from timing as WebProphet does: an
object depends on the latest object that had finished (or, for objects the HTML parser finds while the
document still streams in, the document whose first byte had arrived) when it started; the idle time
between the two (script execution, layout) is kept as a constant gap.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from analyzer.errors import AnalyzerError, InputFileError

__all__ = [
    "E2EResult",
    "HarFileError",
    "PageModel",
    "PageObject",
    "cloud_samples_from_graphs",
    "fetch_times",
    "percentile_ci",
    "predict_e2e",
    "read_har",
    "route_matcher",
]

_TOLERANCE_MS = 0.5
"""HAR times are rounded to the millisecond or so: an object that started within this much of another's end
is taken to have waited for it."""


class HarFileError(InputFileError):
    """A HAR file is malformed: the message names the entry index and field."""


@dataclass(frozen=True, slots=True)
class PageObject:
    """One object (HTTP request) of a page, from one HAR entry."""

    index: int
    """Position in the HAR's ``log.entries`` (objects are kept in start order)."""
    method: str
    url: str
    start_ms: float
    """Start relative to the page's first request."""
    fetch_ms: float
    """The entry's total ``time``: what one fetch of the object took in the HAR."""
    receive_ms: float
    """``timings.receive``: the download of the body after the first byte."""
    parent: int | None
    """Position (in :attr:`PageModel.objects`) of the object this one waited for; None for a root."""
    anchor: str
    """``end``: started after the parent finished; ``first_byte``: after the parent's first byte arrived."""
    gap_ms: float
    """Browser time between the parent's anchor and this object's start (parse, script, layout)."""
    how: str
    """How the dependency was found: ``initiator``, ``timing``, ``initiator+timing`` or ``root``."""
    connect_ms: float = 0.0
    """``timings.connect`` (a TCP handshake: one round trip), 0 when the connection was reused."""

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def path(self) -> str:
        return urlsplit(self.url).path or "/"


@dataclass(frozen=True, slots=True)
class PageModel:
    """A page as a dependency graph of objects: the browser side of the end-to-end model."""

    objects: tuple[PageObject, ...]
    onload_ms: float | None = None
    """The HAR's ``pageTimings.onLoad``, when it has one."""

    def load_time(self, fetch_ms: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """ClientPrediction: page load times for fetch times ``fetch_ms[object, sample]``, vectorised.

        An object starts at its parent's anchor (its end, or its first byte: start + fetch - receive)
        plus the gap; a root starts at its HAR offset. The page is loaded when its last object is.
        """
        n = fetch_ms.shape[1]
        start = np.empty_like(fetch_ms)
        for i, obj in enumerate(self.objects):
            if obj.parent is None:
                start[i] = obj.start_ms
                continue
            p = self.objects[obj.parent]
            if obj.anchor == "end":
                ready = start[obj.parent] + fetch_ms[obj.parent]
            else:
                ready = start[obj.parent] + np.maximum(fetch_ms[obj.parent] - p.receive_ms, 0.0)
            start[i] = ready + obj.gap_ms
        finish = start + fetch_ms
        return finish.max(axis=0) if n else np.zeros(0)

    def observed_fetch(self) -> npt.NDArray[np.float64]:
        return np.array([o.fetch_ms for o in self.objects], dtype=np.float64)


# --- the HAR reader ----------------------------------------------------------------------------------------------

def read_har(path: str | Path, page: str | None = None) -> PageModel:
    """Build a :class:`PageModel` from a HAR file (the entries of ``page``, or of the first page).

    Raises :class:`HarFileError` naming the entry index and field of anything malformed.
    """
    path = Path(path)
    text = HarFileError.read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HarFileError(path, exc.lineno, None, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    log = doc.get("log") if isinstance(doc, dict) else None
    if not isinstance(log, dict):
        raise HarFileError(path, None, "log", "missing: a HAR file is an object with a 'log' object")
    entries = log.get("entries")
    if not isinstance(entries, list) or not entries:
        raise HarFileError(path, None, "log.entries", "must be a non-empty list")
    pages = log.get("pages") or []
    if not isinstance(pages, list):
        raise HarFileError(path, None, "log.pages", "must be a list")
    page_id = page if page is not None else (pages[0].get("id") if pages and isinstance(pages[0], dict) else None)
    onload = None
    for i, p in enumerate(pages):
        if isinstance(p, dict) and p.get("id") == page_id:
            value = (p.get("pageTimings") or {}).get("onLoad")
            if isinstance(value, (int, float)) and value >= 0:
                onload = float(value)
    if page is not None and not any(isinstance(p, dict) and p.get("id") == page for p in pages):
        raise HarFileError(path, None, "log.pages", f"no page with id {page!r}")
    raw = [_entry(path, i, e) for i, e in enumerate(entries)]
    if page_id is not None:
        raw = [r for r in raw if r["pageref"] in (None, page_id)]
    if not raw:
        raise HarFileError(path, None, "log.entries", f"no entry belongs to page {page_id!r}")
    raw.sort(key=lambda r: (r["started"], r["index"]))
    t0 = raw[0]["started"]
    for r in raw:
        r["start_ms"] = (r["started"] - t0).total_seconds() * 1000.0
    return PageModel(tuple(_link(raw)), onload)


def _entry(path: Path, i: int, e: Any) -> dict[str, Any]:
    where = f"log.entries[{i}]"
    if not isinstance(e, dict):
        raise HarFileError(path, None, where, "expected an object")

    def need(obj: Any, name: str, kind: type | tuple[type, ...], field: str) -> Any:
        value = obj.get(name) if isinstance(obj, dict) else None
        if value is None:
            raise HarFileError(path, None, f"{where}.{field}", "missing")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise HarFileError(path, None, f"{where}.{field}", f"expected {_kind(kind)}, got {value!r}")
        return value

    started_text = need(e, "startedDateTime", str, "startedDateTime")
    try:
        started = datetime.fromisoformat(started_text)
    except ValueError:
        raise HarFileError(path, None, f"{where}.startedDateTime",
                           f"expected an ISO 8601 date-time, got {started_text!r}") from None
    total = float(need(e, "time", (int, float), "time"))
    if not math.isfinite(total) or total < 0:
        raise HarFileError(path, None, f"{where}.time", f"expected a non-negative number, got {total!r}")
    request = need(e, "request", dict, "request")
    url = need(request, "url", str, "request.url")
    if not urlsplit(url).scheme:
        raise HarFileError(path, None, f"{where}.request.url", f"expected an absolute URL, got {url!r}")
    method = need(request, "method", str, "request.method").upper()
    timings = e.get("timings") or {}
    if not isinstance(timings, dict):
        raise HarFileError(path, None, f"{where}.timings", "expected an object")
    parts = {}
    for name in ("blocked", "dns", "connect", "send", "wait", "receive", "ssl"):
        value = timings.get(name, -1)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HarFileError(path, None, f"{where}.timings.{name}", f"expected a number, got {value!r}")
        parts[name] = max(float(value), 0.0)  # -1 means "does not apply"
    receive = min(parts["receive"], total)
    initiator = e.get("_initiator")
    return {
        "index": i, "where": where, "started": started, "time": total, "method": method, "url": url,
        "receive": receive, "connect": parts["connect"], "pageref": e.get("pageref"),
        "initiator": _initiator_urls(initiator),
        "initiator_type": initiator.get("type") if isinstance(initiator, dict) else None,
    }


def _kind(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", dict: "an object", int: "a number", float: "a number"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(sorted({names.get(k, k.__name__) for k in kinds}))


def _initiator_urls(initiator: Any) -> list[str]:
    """URLs named by Chrome's ``_initiator``: its ``url``, then the stack's call frames (innermost first)."""
    if not isinstance(initiator, dict):
        return []
    urls = [initiator["url"]] if isinstance(initiator.get("url"), str) else []
    stack = initiator.get("stack")
    while isinstance(stack, dict):
        for frame in stack.get("callFrames") or []:
            if isinstance(frame, dict) and isinstance(frame.get("url"), str) and frame["url"]:
                urls.append(frame["url"])
        stack = stack.get("parent")
    return urls


def _link(raw: list[dict[str, Any]]) -> list[PageObject]:
    objects: list[PageObject] = []
    for j, r in enumerate(raw):
        start = r["start_ms"]
        parent, anchor, how = None, "end", "root"
        # Chrome's initiator: the latest earlier object with that URL.
        for url in r["initiator"]:
            found = [i for i in range(j) if raw[i]["url"] == url]
            if found:
                parent, how = found[-1], "initiator"
                break
        if j > 0 and (parent is None or r["initiator_type"] == "script"):
            # A script's request may wait on more than the script: a fetch whose callback issues it.
            # Take the timing parent when it finished after the initiator did.
            timed = _by_timing(raw, j)
            if timed is not None and (parent is None or _end(raw[timed]) > _end(raw[parent]) + _TOLERANCE_MS):
                parent, how = timed, "timing" if parent is None else "initiator+timing"
        how = how if parent is not None else "root"
        gap = 0.0
        if parent is not None:
            p = raw[parent]
            end = p["start_ms"] + p["time"]
            first_byte = end - p["receive"]
            if start >= end - _TOLERANCE_MS:
                anchor, gap = "end", max(start - end, 0.0)
            else:
                anchor, gap = "first_byte", max(start - first_byte, 0.0)
        objects.append(PageObject(
            index=r["index"], method=r["method"], url=r["url"], start_ms=start, fetch_ms=r["time"],
            receive_ms=r["receive"], parent=parent, anchor=anchor, gap_ms=gap, how=how, connect_ms=r["connect"],
        ))
    return objects


def _end(r: Mapping[str, Any]) -> float:
    return float(r["start_ms"] + r["time"])


def _by_timing(raw: list[dict[str, Any]], j: int) -> int | None:
    """The earlier object whose end (else first byte) came last before object ``j`` started."""
    start = raw[j]["start_ms"]
    best, best_t = None, -math.inf
    for i in range(j):
        end = raw[i]["start_ms"] + raw[i]["time"]
        if end <= start + _TOLERANCE_MS and end > best_t:
            best, best_t = i, end
    if best is not None:
        return best
    for i in range(j):
        first_byte = raw[i]["start_ms"] + raw[i]["time"] - raw[i]["receive"]
        if first_byte <= start + _TOLERANCE_MS and first_byte > best_t:
            best, best_t = i, first_byte
    return best


# --- matching frontend requests to routes ----------------------------------------------------------------------

def route_matcher(route: str) -> Callable[[str, str], bool]:
    """``"GET /post/{id}"`` -> a test ``(method, path) -> bool``; ``{name}`` matches one path segment."""
    method, _, template = route.strip().partition(" ")
    if not template.startswith("/"):
        raise AnalyzerError(f"route {route!r}: expected 'METHOD /path', e.g. 'GET /post/{{id}}'")
    pieces = re.split(r"(\{[^}/]+\})", template)
    pattern = "".join("[^/]+" if p.startswith("{") and p.endswith("}") else re.escape(p) for p in pieces)
    regex = re.compile(f"^{pattern}/?$")
    return lambda m, path: m.upper() == method.upper() and bool(regex.match(path))


# --- Algorithm 2 -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class E2EResult:
    """A predicted page-load-time distribution and how it was reached."""

    samples_ms: npt.NDArray[np.float64]
    percentile: float
    value_ms: float
    """The chosen percentile of the prediction."""
    ci_ms: tuple[float, float]
    """Its distribution-free 95% confidence interval (order statistics)."""
    converged: bool
    """The interval's half-width came within the target before ``max_samples``."""
    observed_ms: float
    """ClientPrediction on the HAR's own fetch times (the page as recorded)."""
    frontend: tuple[tuple[int, str], ...]
    """(object position, route) of each object given cloud + network samples."""


def percentile_ci(
    samples: npt.NDArray[np.float64], percentile: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """The ``percentile`` of ``samples`` and a distribution-free confidence interval for it.

    The number of samples below the true p-quantile is Binomial(n, p), so the order statistics at ranks
    ``n p -/+ z sqrt(n p (1 - p))`` bracket it with the given confidence (normal approximation of the
    binomial; Conover, *Practical Nonparametric Statistics*, 3rd ed., 1999, section 3.2).
    """
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = x.size
    p = percentile / 100.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    half = z * math.sqrt(n * p * (1.0 - p))
    lo = int(max(math.floor(n * p - half), 0))
    hi = int(min(math.ceil(n * p + half), n - 1))
    return float(np.percentile(x, percentile)), float(x[lo]), float(x[hi])


def predict_e2e(
    page: PageModel,
    cloud_ms: Mapping[str, npt.NDArray[np.float64]],
    rtt_ms: npt.NDArray[np.float64] | None,
    *,
    frontend_host: str | None = None,
    fetch_ms: Mapping[str, npt.NDArray[np.float64]] | None = None,
    percentile: float = 90.0,
    ci: float = 0.02,
    batch: int = 2000,
    max_samples: int = 1_000_000,
    rng: np.random.Generator,
) -> E2EResult:
    """WebPerf's Algorithm 2: Monte Carlo over cloud, network and page until the percentile's CI is tight.

    Parameters
    ----------
    page
        The browser-side model (:func:`read_har`).
    cloud_ms
        Route (``"GET /"``) -> predicted cloud-side latency samples. An object served by the frontend
        whose method and path match a route gets ``cloud sample + RTT sample`` as its fetch time.
    rtt_ms
        RTT samples between browser and frontend; None takes the HAR's TCP connect times to the frontend
        (one handshake is one round trip).
    frontend_host
        ``host:port`` of the application's frontend; default the host of the page's first object.
    fetch_ms
        URL -> FetchTime samples for other objects; an object without one keeps its HAR time.
    percentile, ci
        Stop once the 95% confidence interval of this percentile has a half-width within ``ci`` (relative).
    rng
        The random generator (every prediction can be reproduced).

    References
    ----------
    .. [1] J. Jiang, L. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If Scenarios
       for Cloud-hosted Web Applications", SIGCOMM 2016, section 5.1, Algorithm 2. doi:10.1145/2934872.2934882
    .. [2] Z. Li et al., "WebProphet: Automating Performance Prediction for Web Services", NSDI 2010.
    """
    if not 0.0 < percentile < 100.0:
        raise AnalyzerError(f"percentile must be between 0 and 100, got {percentile:g}")
    if ci <= 0:
        raise AnalyzerError(f"the confidence target must be positive, got {ci:g}")
    host = frontend_host or page.objects[0].host
    matchers = [(route, route_matcher(route)) for route in cloud_ms]
    frontend: list[tuple[int, str]] = []
    for i, obj in enumerate(page.objects):
        if obj.host != host:
            continue
        for route, matches in matchers:
            if matches(obj.method, obj.path):
                frontend.append((i, route))
                break
    if not frontend:
        paths = sorted({f"{o.method} {o.path}" for o in page.objects if o.host == host})
        raise AnalyzerError(
            f"no object of the page on frontend {host} matches route(s) {', '.join(map(repr, cloud_ms))}; "
            f"its requests to {host} are: {', '.join(paths[:10]) or 'none'}"
        )
    for route, samples in cloud_ms.items():
        if np.size(samples) == 0:
            raise AnalyzerError(f"route {route!r} has no cloud-side latency samples")
    if rtt_ms is None:
        connects = [o.connect_ms for o in page.objects if o.host == host and o.connect_ms > 0]
        if not connects:
            raise AnalyzerError(
                f"no RTT given and the HAR has no TCP connect time to {host} to take it from: give --rtt or "
                "--rtt-samples"
            )
        rtt_ms = np.asarray(connects, dtype=np.float64)
    rtt = np.asarray(rtt_ms, dtype=np.float64)
    if rtt.size == 0 or np.any(rtt < 0):
        raise AnalyzerError("the RTT samples must be a non-empty set of non-negative numbers")
    others = {i: np.asarray(fetch_ms[o.url], dtype=np.float64)
              for i, o in enumerate(page.objects) if fetch_ms and o.url in fetch_ms}
    base = page.observed_fetch()
    collected: list[npt.NDArray[np.float64]] = []
    total = 0
    converged = False
    while total < max_samples:
        size = min(batch, max_samples - total)
        fetch = np.repeat(base[:, None], size, axis=1)
        for i, samples in others.items():
            fetch[i] = rng.choice(samples, size)
        for i, route in frontend:
            fetch[i] = rng.choice(cloud_ms[route], size) + rng.choice(rtt, size)
        collected.append(page.load_time(fetch))
        total += size
        value, lo, hi = percentile_ci(np.concatenate(collected), percentile)
        if (hi - lo) / 2.0 <= ci * max(value, 1e-12):
            converged = True
            break
        batch = total  # double the sample count each round
    samples_all = np.concatenate(collected)
    value, lo, hi = percentile_ci(samples_all, percentile)
    observed = float(page.load_time(base[:, None])[0])
    return E2EResult(samples_all, percentile, value, (lo, hi), converged, observed, tuple(frontend))


def fetch_times(pages: Sequence[PageModel]) -> dict[str, npt.NDArray[np.float64]]:
    """FetchTime distributions: each URL's fetch times over several recordings of a page (HAR files).

    WebPerf profiles the fetch times of objects the cloud frontend does not serve offline; loading the page a
    few times and passing every HAR gives that distribution per object.
    """
    pooled: dict[str, list[float]] = {}
    for page in pages:
        for obj in page.objects:
            pooled.setdefault(obj.url, []).append(obj.fetch_ms)
    return {url: np.asarray(v, dtype=np.float64) for url, v in pooled.items()}


def cloud_samples_from_graphs(graphs: Sequence[Any], routes: Sequence[str]) -> dict[str, npt.NDArray[np.float64]]:
    """Each route's observed cloud-side latencies, pooled over its variants (graphs' ``latency_ms``)."""
    out: dict[str, npt.NDArray[np.float64]] = {}
    for route in routes:
        pooled = [x for g in graphs if g.route == route for x in g.latency_ms]
        if not pooled:
            known = sorted({g.route for g in graphs})
            raise AnalyzerError(f"route {route!r} is not in the graphs; they have {', '.join(map(repr, known))}")
        out[route] = np.asarray(pooled, dtype=np.float64)
    return out
