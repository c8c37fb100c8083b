"""What-if scenarios: parsing ``--scenario`` specs and scenario TOML files, and matching resources.

A :class:`Scenario` is a named set of changes applied together. The spec of one change is
``KIND:BODY[?OPTION=VALUE&...]``; several changes joined with ``;`` form one scenario
(``"location:redis=+20ms; load:30"``). The kinds (WebPerf's Table 2, Jiang et al., SIGCOMM 2016):

===========================================  =====================================================================
``location:RESOURCE=+20ms``                  every round trip to RESOURCE gains 20 ms (``-5ms`` moves it closer)
``location:RESOURCE=LABEL``                  every round trip gains a draw of the ``rtt`` profile ``location=LABEL``
``tier:RESOURCE=LABEL``                      RESOURCE's calls take the profile of their api with ``tier=LABEL``
``size:RESOURCE=BYTES``                      RESOURCE's calls carry BYTES (``6MB``, ``512KiB``, ``6e6``)
``size:RESOURCE[API]=BYTES``                 only the calls to RESOURCE whose api matches API (a glob) carry BYTES;
                                             ``location:`` and ``tier:`` take the same ``[API]`` filter
``load:N[?think=0ms&replicas=1&pool.R=10]``  N concurrent users (closed loop), spread over ``replicas`` front ends,
                                             with at most ``pool.R`` calls in flight to resource R per front end
                                             (``&nested=shared|separate|off``: see :class:`Load`;
                                             ``&mix.ROUTE=W``: the users' requests in these shares)
``interference:cpu=PCT``                     a neighbour takes PCT % of the CPU the event loop runs on
``failure:RESOURCE[?replicas=2]``            one of RESOURCE's replicas fails; the survivors carry its load
                                             (RESOURCE ``app`` is the front end itself)
===========================================  =====================================================================

RESOURCE matches an io node by system (``redis``), by ``host:port``, by its full resource URL, or by the name
given at collection (``perfcast collect --resource-names``: the graph builder puts it in the node's
``resource``; a ``resource_name`` field, if present, is honoured too).

``[API]`` narrows a change to some of RESOURCE's calls, for services that answer several APIs at one address
(a blob store that also serves ads, a gateway routing paths to different backends). API is a case-sensitive
glob (:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[seq]``) matched against the io node's ``api``
(``http GET /blob/{id}``) and against its operation, the api without the system (``GET /blob/{id}``). Inside
the brackets ``=``, ``?`` and ``;`` are part of the API; a scenario file can give the API in a field of its
own instead (:func:`load_scenarios`). A filter that matches none of the resource's calls is an error listing
the apis it has (:func:`check_resources`).
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import urlsplit

from analyzer.errors import ScenarioError, ScenarioFileError
from analyzer.graph import CausalGraph, Node, NodeKind

__all__ = [
    "APP",
    "KINDS",
    "Change",
    "Failure",
    "Interference",
    "Load",
    "Location",
    "Scenario",
    "Size",
    "Targeted",
    "Tier",
    "api_matches",
    "applies",
    "check_resources",
    "known_resources",
    "load_scenarios",
    "matches",
    "parse_scenario",
    "route_matches",
    "target_of",
]

APP = ("app", "frontend")
"""Names that ``failure:`` accepts for the front end (the event loop running the app) itself."""


@dataclass(frozen=True, slots=True)
class Location:
    """``location:RESOURCE=+Xms`` (``added_ms``) or ``location:RESOURCE=LABEL`` (``label``)."""

    resource: str
    added_ms: float | None = None
    label: str | None = None
    api: str | None = None
    """``location:RESOURCE[API]=...``: only the calls whose api matches this glob (``None``: every call)."""


@dataclass(frozen=True, slots=True)
class Tier:
    """``tier:RESOURCE=LABEL``: the profiles with label ``tier=LABEL``."""

    resource: str
    label: str
    api: str | None = None
    """``tier:RESOURCE[API]=LABEL``: only the calls whose api matches this glob (``None``: every call)."""


@dataclass(frozen=True, slots=True)
class Size:
    """``size:RESOURCE=BYTES``: calls to RESOURCE carry ``size_bytes`` of payload."""

    resource: str
    size_bytes: float
    api: str | None = None
    """``size:RESOURCE[API]=BYTES``: only the calls whose api matches this glob (``None``: every call)."""


@dataclass(frozen=True, slots=True)
class Load:
    """``load:N``: N concurrent closed-loop users."""

    users: int
    think_ms: float = 0.0
    """Think time between a user's requests."""
    replicas: int = 1
    """Front ends sharing the users (a load balancer spreads them evenly)."""
    pools: tuple[tuple[str, int], ...] = ()
    """(RESOURCE, limit): at most ``limit`` calls in flight to RESOURCE per front end (a connection pool)."""
    nested: str = "shared"
    """HTTP calls to a route the graphs also hold are simulated as sub-requests whose compute runs on the
    caller's CPU (``shared``: one process, one GIL), on a server of their own per endpoint (``separate``),
    or not at all (``off``: calls keep their recorded latency, users issue every route)."""
    mix: tuple[tuple[str, float], ...] = ()
    """(ROUTE, weight): the users request ROUTE (``GET /post/{id}``, or its path ``/post/{id}``) in proportion
    to ``weight``, and no route left out; empty: in the proportions the graphs recorded."""


@dataclass(frozen=True, slots=True)
class Interference:
    """``interference:cpu=PCT``: a co-located process takes ``cpu_pct`` % of the loop's CPU."""

    cpu_pct: float


@dataclass(frozen=True, slots=True)
class Failure:
    """``failure:RESOURCE``: one of ``replicas`` replicas fails (``None``: from the graphs, else 2)."""

    resource: str
    replicas: int | None = None

    @property
    def is_app(self) -> bool:
        return self.resource in APP


Change = Location | Tier | Size | Load | Interference | Failure

Targeted = Location | Tier | Size
"""The changes that name calls (``RESOURCE`` or ``RESOURCE[API]``) and change their durations."""

KINDS = ("location", "tier", "size", "load", "interference", "failure")

NESTED = ("shared", "separate", "off")
"""The values of ``load:N?nested=``."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named set of changes applied together."""

    name: str
    changes: tuple[Change, ...] = field(default=())

    def of(self, kind: type) -> list[Change]:
        return [c for c in self.changes if isinstance(c, kind)]

    @property
    def load(self) -> Load | None:
        loads = [c for c in self.changes if isinstance(c, Load)]
        return loads[-1] if loads else None

    @property
    def needs_simulation(self) -> bool:
        """Load and failure change how requests share the loop and the pools: :mod:`analyzer.loadsim`."""
        return any(isinstance(c, (Load, Failure)) for c in self.changes)

    @property
    def changes_calls(self) -> bool:
        """Some change (location, tier, size: :data:`Targeted`) makes calls take another time."""
        return any(isinstance(c, Targeted) for c in self.changes)


# --- parsing ----------------------------------------------------------------------------------------------------

_UNITS_MS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
_UNITS_BYTES = {
    "": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2**10, "mib": 2**20, "gib": 2**30,
}
_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


def _duration_ms(text: str, where: str) -> float:
    m = re.fullmatch(rf"\s*([-+]?{_NUMBER})\s*(us|µs|ms|s)\s*", text)
    if not m:
        raise ScenarioError(f"{where}: expected a duration such as +20ms, 0.5s or 300us, got {text!r}")
    return float(m.group(1)) * _UNITS_MS[m.group(2)]


def _bytes(text: str, where: str) -> float:
    m = re.fullmatch(rf"\s*({_NUMBER})\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS_BYTES:
        raise ScenarioError(f"{where}: expected a size such as 6MB, 512KiB or 6e6 (bytes), got {text!r}")
    return float(m.group(1)) * _UNITS_BYTES[m.group(2).lower()]


def _weight(text: str, where: str) -> float:
    """A route's share of a load's requests: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ScenarioError(f"{where}: expected a weight >= 0 (a number such as 1 or 0.25), got {text!r}")
    return value


def _positive_int(text: str, where: str, minimum: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ScenarioError(f"{where}: expected an integer >= {minimum}, got {text!r}")
    return value


def _options(text: str, where: str, allowed: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, text.split("&")):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ScenarioError(f"{where}: option {part!r} must read NAME=VALUE")
        if not any(name == a or (a.endswith(".") and name.startswith(a)) for a in allowed):
            raise ScenarioError(f"{where}: unknown option {name!r}; options are {', '.join(allowed)}")
        out[name] = value.strip()
    return out


def _cut(text: str, sep: str) -> tuple[str, str, str]:
    """``text.partition(sep)`` at the first ``sep`` outside ``[...]``, where an API filter may hold it."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        elif ch == sep and depth == 0:
            return text[:i], sep, text[i + 1:]
    return text, "", ""


def _check_brackets(text: str, where: str) -> None:
    """Every ``[`` closed, no stray ``]``: else the filter's extent, and so the spec, would be a guess."""
    depth = 0
    for ch in text:
        if ch == "]" and depth == 0:
            raise ScenarioError(f"{where}: unmatched ']'; an API filter reads RESOURCE[API], e.g. blob[GET /ad]")
        depth += {"[": 1, "]": -1}.get(ch, 0)
    if depth:
        raise ScenarioError(f"{where}: unclosed '['; an API filter reads RESOURCE[API], e.g. blob[GET /ad]")


def _api_filter(text: str, where: str) -> str:
    """An API filter's glob, stripped; empty is an error (leave the filter out to change every call)."""
    api = text.strip()
    if not api:
        raise ScenarioError(f"{where}: empty API filter; give one such as [GET /blob/*], or none to change "
                            "every call to the resource")
    return api


def _split_target(target: str, where: str) -> tuple[str, str | None]:
    """``RESOURCE[API]`` -> (RESOURCE, API); ``RESOURCE`` -> (RESOURCE, None). Brackets are balanced."""
    if not target.endswith("]"):
        return target, None
    depth = 0
    for i in range(len(target) - 1, -1, -1):  # the '[' that opens the final ']'
        depth += {"]": 1, "[": -1}.get(target[i], 0)
        if depth == 0:
            break
    resource = target[:i].strip()
    if resource.endswith("://"):  # an IPv6 host in a URL without a port, http://[::1]: no filter
        return target, None
    if not resource:
        raise ScenarioError(f"{where}: expected RESOURCE[API], with the resource before '['")
    return resource, _api_filter(target[i + 1:-1], where)


def _with_api(change: Change, api: str, where: str) -> Change:
    """``change`` narrowed to the calls whose api matches ``api`` (a scenario file's ``api`` field)."""
    if not isinstance(change, (Location, Tier, Size)):
        raise ScenarioError(f"{where}: only location, tier and size take an API filter")
    if change.api is not None:
        raise ScenarioError(f"{where}: the API filter is given twice (RESOURCE[API] and api); keep one")
    return replace(change, api=_api_filter(api, where))


def _split_changes(spec: str) -> list[str]:
    """A scenario's changes: ``spec`` split at the ``;`` outside API filters."""
    parts = []
    rest = spec
    while rest:
        part, _, rest = _cut(rest, ";")
        parts.append(part.strip())
    return [p for p in parts if p]


def _parse_change(spec: str) -> Change:
    where = f"scenario {spec!r}"
    kind, colon, rest = spec.partition(":")
    kind = kind.strip().lower()
    if not colon or kind not in KINDS:
        raise ScenarioError(
            f"{where}: unknown kind {kind!r}; kinds are {', '.join(KINDS)} "
            "(e.g. location:redis=+20ms, tier:redis=C2, size:blob=6MB, load:60, interference:cpu=50, failure:app)"
        )
    _check_brackets(rest, where)
    body, _, opts = _cut(rest, "?")
    body = body.strip()
    target, eq, value = _cut(body, "=")
    target, api = _split_target(target.strip(), where)
    value = value.strip()
    if kind == "load":
        o = _options(opts, where, ["think", "replicas", "nested", "pool.", "mix."])
        pools = tuple(sorted((k[5:], _positive_int(v, f"{where} option {k}")) for k, v in o.items()
                             if k.startswith("pool.")))
        if any(not r for r, _ in pools):
            raise ScenarioError(f"{where}: option pool.RESOURCE needs a resource, e.g. pool.postgresql=10")
        think = _duration_ms(o["think"], f"{where} option think") if "think" in o else 0.0
        if think < 0:
            raise ScenarioError(f"{where}: option think must be >= 0")
        nested = o.get("nested", "shared")
        if nested not in NESTED:
            raise ScenarioError(f"{where}: option nested must be one of {', '.join(NESTED)}, got {nested!r}")
        mix = tuple((k[4:].strip(), _weight(v, f"{where} option {k}")) for k, v in o.items() if k.startswith("mix."))
        if any(not r for r, _ in mix):
            raise ScenarioError(f"{where}: option mix.ROUTE needs a route, e.g. mix.GET /=3&mix.GET /post/{{id}}=1")
        if mix and not any(w > 0 for _, w in mix):
            raise ScenarioError(f"{where}: the mix gives every route a weight of 0; at least one must be positive")
        return Load(_positive_int(body, where), think, _positive_int(o.get("replicas", "1"), where), pools, nested,
                    mix)
    if kind == "failure":
        o = _options(opts, where, ["replicas"])
        if api is not None:
            raise ScenarioError(f"{where}: failure takes no API filter (a failed replica serves none of its apis)")
        if not body or eq:
            raise ScenarioError(f"{where}: expected failure:RESOURCE[?replicas=R], e.g. failure:app?replicas=2")
        replicas = _positive_int(o["replicas"], f"{where} option replicas", 2) if "replicas" in o else None
        return Failure(body, replicas)
    _options(opts, where, [])
    if not eq or not target or not value:
        raise ScenarioError(f"{where}: expected {kind}:RESOURCE=VALUE")
    if kind == "interference":
        if api is not None:
            raise ScenarioError(f"{where}: interference takes no API filter")
        if target.lower() != "cpu":
            raise ScenarioError(f"{where}: only interference:cpu=PCT is modelled, got {target!r}")
        try:
            pct = float(value.rstrip("%"))
        except ValueError:
            pct = -1.0
        if not 0 <= pct < 100:
            raise ScenarioError(f"{where}: PCT must be a number in [0, 100), got {value!r}")
        return Interference(pct)
    if kind == "location":
        if value[0] in "+-" or value[0].isdigit():
            return Location(target, added_ms=_duration_ms(value, where), api=api)
        return Location(target, label=value, api=api)
    if kind == "tier":
        return Tier(target, value, api)
    size = _bytes(value, where)
    if size <= 0 or not math.isfinite(size):
        raise ScenarioError(f"{where}: BYTES must be positive")
    return Size(target, size, api)


def parse_scenario(spec: str, name: str | None = None) -> Scenario:
    """Parse ``"kind:body[?opts]; kind:body..."`` into a :class:`Scenario`; raises :class:`ScenarioError`.

    Examples
    --------
    >>> sc = parse_scenario("location:redis=+20ms; load:30?pool.postgresql=10")
    >>> sc.changes[0]
    Location(resource='redis', added_ms=20.0, label=None, api=None)
    >>> sc.load.users, sc.load.pools
    (30, (('postgresql', 10),))
    >>> parse_scenario("size:blob[GET /blob/*]=256KiB").changes
    (Size(resource='blob', size_bytes=262144.0, api='GET /blob/*'),)
    """
    parts = _split_changes(spec)
    if not parts:
        raise ScenarioError("empty scenario: expected e.g. location:redis=+20ms")
    return _scenario(name or "; ".join(parts), [_parse_change(p) for p in parts], spec)


def _scenario(name: str, changes: Sequence[Change], spec: str) -> Scenario:
    if sum(isinstance(c, Load) for c in changes) > 1:
        raise ScenarioError(f"scenario {spec!r}: more than one load: change")
    return Scenario(name, tuple(changes))


def load_scenarios(path: str | Path) -> list[Scenario]:
    """Read a scenario TOML file; raises :class:`ScenarioFileError` naming file, line and field.

    The file holds one table per scenario, each with ``changes``, a spec or a list of specs::

        [scenario.far-cache]
        changes = "location:redis=+20ms"

        [scenario.peak]
        changes = ["load:60?pool.postgresql=10", "interference:cpu=30"]

    An item of the list may also be a table holding one change's ``spec`` and the ``api`` filter it applies
    to, the same as ``size:blob[GET /blob/{id}]=256KiB`` but with no characters the spec would reserve::

        [scenario.big-blobs]
        changes = [{ spec = "size:blob=256KiB", api = "GET /blob/{id}" }]
    """
    path = Path(path)
    text = ScenarioFileError.read_text(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ScenarioFileError(path, int(m.group(1)) if m else None, None, f"not valid TOML: {exc}") from None
    lines = text.splitlines()

    def line_of(name: str) -> int | None:
        pattern = re.compile(rf"^\s*\[\s*scenarios?\.(\"?){re.escape(name)}\1\s*\]")
        return next((i + 1 for i, line in enumerate(lines) if pattern.match(line)), None)

    table = doc.get("scenario", doc.get("scenarios"))
    unknown = sorted(set(doc) - {"scenario", "scenarios"})
    if unknown:
        raise ScenarioFileError(path, None, unknown[0], "unknown table; scenarios go in [scenario.NAME] tables")
    if not isinstance(table, dict) or not table:
        raise ScenarioFileError(path, None, "scenario", "no [scenario.NAME] table with changes = [...]")
    out = []
    for name, body in table.items():
        line = line_of(name)
        fname = f"scenario.{name}.changes"
        if not isinstance(body, dict) or "changes" not in body:
            raise ScenarioFileError(path, line, fname, "missing (a spec or a list of specs)")
        extra = sorted(set(body) - {"changes", "description"})
        if extra:
            raise ScenarioFileError(path, line, f"scenario.{name}.{extra[0]}", "unknown field (use changes)")
        changes = body["changes"]
        items = [changes] if isinstance(changes, str) else changes
        if not isinstance(items, list) or not items or not all(isinstance(s, (str, dict)) for s in items):
            raise ScenarioFileError(path, line, fname, "must be a spec string or a non-empty list of specs "
                                    "and { spec, api } tables")
        parsed: list[Change] = []
        specs: list[str] = []
        for i, item in enumerate(items):
            where = fname if isinstance(item, str) else f"{fname}[{i}]"
            try:
                if isinstance(item, str):
                    parts = _split_changes(item)
                    specs += parts
                    parsed += [_parse_change(p) for p in parts]
                else:
                    spec, api = _file_change(path, line, where, item)
                    specs.append(spec)
                    parsed.append(_with_api(_parse_change(spec), api, f"scenario {spec!r}"))
            except ScenarioError as exc:
                raise ScenarioFileError(path, line, where, str(exc)) from None
        try:
            if not parsed:
                raise ScenarioError("empty scenario: expected e.g. location:redis=+20ms")
            out.append(_scenario(name, parsed, "; ".join(specs)))
        except ScenarioError as exc:
            raise ScenarioFileError(path, line, fname, str(exc)) from None
    return out


def _file_change(path: Path, line: int | None, where: str, item: dict[str, object]) -> tuple[str, str]:
    """``{ spec = "size:blob=256KiB", api = "GET /blob/{id}" }`` -> (spec, api): one change and its filter."""
    extra = sorted(set(item) - {"spec", "api"})
    if extra:
        raise ScenarioFileError(path, line, f"{where}.{extra[0]}", "unknown field (a change table has spec and api)")
    spec, api = item.get("spec"), item.get("api")
    if not isinstance(spec, str) or not spec.strip():
        raise ScenarioFileError(path, line, f"{where}.spec", "missing: the change, e.g. spec = \"size:blob=256KiB\"")
    if not isinstance(api, str):
        raise ScenarioFileError(path, line, f"{where}.api", "missing: the api filter, e.g. api = \"GET /blob/*\" "
                                "(without one, give the spec as a plain string)")
    if len(_split_changes(spec)) != 1:
        raise ScenarioFileError(path, line, f"{where}.spec", "must hold exactly one change (no ';')")
    return spec.strip(), api


# --- resources --------------------------------------------------------------------------------------------------


def _names(node: Node) -> frozenset[str]:
    return _names_of(node.system, node.resource, str(node.extra.get("resource_name") or ""))


@functools.lru_cache(maxsize=4096)
def _names_of(system: str, resource: str, name: str) -> frozenset[str]:
    names = {system, resource, name}
    if resource:
        parts = urlsplit(resource)
        if parts.hostname:
            names.add(f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname)
    names.discard("")
    return frozenset(names)


def matches(selector: str, node: Node) -> bool:
    """Whether RESOURCE ``selector`` names io node ``node`` (system, host:port, URL or collection name)."""
    return node.kind is NodeKind.IO and selector in _names(node)


def api_matches(pattern: str, node: Node) -> bool:
    """Whether glob ``pattern`` matches the node's api (``http GET /blob/{id}``) or its operation, the api
    without the system (``GET /blob/{id}``); case-sensitive.

    Examples
    --------
    >>> node = Node("b", NodeKind.IO, api="http GET /blob/{id}", system="http")
    >>> api_matches("GET /blob/{id}", node), api_matches("http GET /blob/*", node), api_matches("GET /ad", node)
    (True, True, False)
    """
    api = node.api
    operation = api[len(node.system) + 1:] if node.system and api.startswith(node.system + " ") else api
    return fnmatchcase(api, pattern) or fnmatchcase(operation, pattern)


def applies(change: Targeted, node: Node) -> bool:
    """Whether ``change`` touches ``node``: an io node of its resource whose api passes its filter, if any."""
    return matches(change.resource, node) and (change.api is None or api_matches(change.api, node))


def target_of(change: Targeted) -> str:
    """What ``change`` applies to, as a spec writes it: ``RESOURCE`` or ``RESOURCE[API]``."""
    return change.resource if change.api is None else f"{change.resource}[{change.api}]"


def route_matches(name: str, route: str) -> bool:
    """Whether a route as a scenario names it (``GET /post/{id}``, or the path alone) is ``route``.

    >>> route_matches("/post/{id}", "GET /post/{id}"), route_matches("GET /", "GET /post/{id}")
    (True, False)
    """
    return name == route or name == route.partition(" ")[2]


def known_resources(graphs: Iterable[CausalGraph]) -> list[str]:
    """Every name a scenario may use for the resources of ``graphs``, sorted."""
    out: set[str] = set()
    for graph in graphs:
        for node in graph.nodes:
            if node.kind is NodeKind.IO:
                out |= _names(node)
    return sorted(out)


def check_resources(scenario: Scenario, graphs: Sequence[CausalGraph]) -> None:
    """Raise :class:`ScenarioError` when a change names a resource none of ``graphs`` has."""
    for change in scenario.changes:
        selectors: list[str] = []
        if isinstance(change, (Location, Tier, Size)) or isinstance(change, Failure) and not change.is_app:
            selectors = [change.resource]
        elif isinstance(change, Load):
            selectors = [r for r, _ in change.pools]
            routes = sorted({g.route for g in graphs})
            for route, _ in change.mix:
                if not any(route_matches(route, r) for r in routes):
                    raise ScenarioError(f"scenario {scenario.name!r}: option mix.{route}: no graph has that route; "
                                        f"the routes are: {', '.join(routes) or 'none'}")
        for sel in selectors:
            if not any(matches(sel, n) for g in graphs for n in g.nodes):
                have = ", ".join(known_resources(graphs)) or "none (the graphs have no io nodes)"
                raise ScenarioError(f"scenario {scenario.name!r}: unknown resource {sel!r}; the graphs have: {have}")
        if isinstance(change, (Location, Tier, Size)) and change.api is not None:
            if not any(applies(change, n) for g in graphs for n in g.nodes):
                apis = sorted({n.api for g in graphs for n in g.nodes if matches(change.resource, n)})
                kind = type(change).__name__.lower()
                raise ScenarioError(
                    f"scenario {scenario.name!r}: {kind}:{target_of(change)}: no call to resource "
                    f"{change.resource!r} has an api matching {change.api!r}; its apis are: {', '.join(apis)} "
                    "(the filter is a case-sensitive glob on the api or on its operation, e.g. GET /blob/*)"
                )
