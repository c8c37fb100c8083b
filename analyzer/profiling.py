"""The profiler: drive a real Redis / PostgreSQL / HTTP endpoint and record its latency distribution.

WebPerf (Jiang et al., SIGCOMM 2016, section 4) builds its profile dictionary offline by calling each cloud
API repeatedly "until a good enough latency distribution is obtained". Here "good enough" is a stopping rule
on the standard error of the mean: stop once ``sd / sqrt(n) / mean < rse`` with at least ``min_count``
samples, or when the time budget runs out. A profile is *workload-independent* (one point) or
*parameterised* by payload size or concurrency (one point per value, each stored under its own key).

Targets name their calls as the collector names io nodes (``perfcast.io.operation``): ``redis GET``,
``postgresql SELECT <table>``, ``http GET /path``; ``--rtt HOST:PORT`` measures TCP connect times under the
special api ``rtt``. Every target keeps its connections open between calls (a warm pool), so one call is one
network round trip, the figure stored with the samples.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from analyzer.errors import AnalyzerError
from analyzer.profiles import RTT_API, ProfileKey, ProfileStore
from analyzer.wakeup import WAKE_API

__all__ = [
    "HttpTarget",
    "Measurement",
    "PostgresTarget",
    "ProfilingError",
    "RedisTarget",
    "RttTarget",
    "StopRule",
    "Target",
    "is_stable",
    "measure",
    "parse_duration",
    "parse_sizes",
    "path_template",
    "profile_target",
    "relative_standard_error",
    "sql_operation",
]


class ProfilingError(AnalyzerError, ValueError):
    """An endpoint cannot be profiled: bad URL or operation, unreachable server, a failing call."""


@dataclass(frozen=True, slots=True)
class StopRule:
    """When to stop measuring one profile point."""

    rse: float = 0.02
    """Stop once the standard error of the mean, relative to the mean, is below this."""
    min_count: int = 30
    """... and at least this many samples were taken."""
    budget_s: float = 60.0
    """Stop anyway after this long (wall time, per profile point)."""
    max_count: int = 100_000


@dataclass(frozen=True, slots=True)
class Measurement:
    """The outcome of measuring one profile point."""

    key: ProfileKey
    samples_ms: npt.NDArray[np.float64] = field(repr=False)
    round_trips: float
    stopped: str
    """Why measuring stopped: ``stable``, ``budget`` or ``max count`` (each reason of its spells, when points took
    turns: ``budget, stable``)."""
    elapsed_s: float
    cpu_ms: float | None = None
    """The caller's CPU per call (ms): its thread's CPU time while measuring over the calls made."""

    @property
    def rse(self) -> float:
        return relative_standard_error(self.samples_ms)


def relative_standard_error(samples: npt.ArrayLike) -> float:
    """``sd / sqrt(n) / mean`` (infinite with fewer than two samples or a zero mean)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < 2 or x.mean() <= 0:
        return math.inf
    return float(x.std(ddof=1) / math.sqrt(x.size) / x.mean())


def is_stable(samples: npt.ArrayLike, rse: float, min_count: int) -> bool:
    """The stopping rule: at least ``min_count`` samples and a relative standard error below ``rse``."""
    return int(np.size(samples)) >= min_count and relative_standard_error(samples) < rse


# --- argument parsing (shared with the CLI) ----------------------------------------------------------------

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def parse_sizes(text: str) -> list[int]:
    """``"1k,64k,1m"`` -> ``[1024, 65536, 1048576]`` (binary multiples); raises ProfilingError."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", item)
        if not m or m.group(2).lower() not in _UNITS:
            raise ProfilingError(f"size {item!r}: expected a number with an optional k, m or g suffix (64k)")
        out.append(int(float(m.group(1)) * _UNITS[m.group(2).lower()]))
    return out


def parse_duration(text: str) -> float:
    """``"60s"``, ``"10m"``, ``"1h"``, ``"500ms"`` or a bare number of seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", text)
    if not m:
        raise ProfilingError(f"duration {text!r}: expected a number with a unit: 500ms, 60s, 10m, 1h")
    scale = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) * scale


def _strip_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


# The two functions below follow the collector's naming of io nodes (collector/_io.py) rule for rule, so that
# profiles and graph nodes agree on ``api``; the analyzer does not import the collector.
_SQL_TABLE = re.compile(
    r"^\s*(?:(?P<verb>select|delete)\b.*?\bfrom\s+(?P<t1>[\w.\"]+)"
    r"|(?P<verb2>insert|replace)\b.*?\binto\s+(?P<t2>[\w.\"]+)"
    r"|(?P<verb3>update)\s+(?:or\s+\w+\s+)?(?P<t3>[\w.\"]+))",
    re.IGNORECASE | re.DOTALL,
)
_ID_SEGMENT = re.compile(r"^(?:\d+|[0-9a-fA-F]{8,}|[0-9a-fA-F-]{36})$")


def sql_operation(sql: str) -> str:
    """The operation shape the collector records for SQL: the verb and the first table (``SELECT posts``).

    Examples
    --------
    >>> sql_operation("select * from posts p join users u on p.uid = u.id")
    'SELECT posts'
    """
    text = re.sub(r"^\s*(?:/\*.*?\*/\s*)+", "", sql, flags=re.DOTALL)
    if not text.strip():
        raise ProfilingError("the SQL text is empty")
    m = _SQL_TABLE.match(text)
    if m:
        verb = m.group("verb") or m.group("verb2") or m.group("verb3")
        table = m.group("t1") or m.group("t2") or m.group("t3")
        return f"{verb.upper()} {table.strip(chr(34))}"
    return text.split(None, 1)[0].upper()


def path_template(path: str) -> str:
    """An HTTP path as the collector names it: id-like segments (numbers, hex, uuids) become ``{id}``.

    Examples
    --------
    >>> path_template("/blob/42/meta")
    '/blob/{id}/meta'
    """
    return "/".join("{id}" if _ID_SEGMENT.match(seg) else seg for seg in path.split("/")) or "/"


# --- targets --------------------------------------------------------------------------------------------------

class Target(Protocol):
    """One endpoint and one operation to measure. ``call`` must be safe to run concurrently.

    ``call`` returns None to be timed as a whole, or the milliseconds it timed itself (when part of it,
    such as closing a connection, is not what is measured).
    """

    api: str
    resource: str
    round_trips: float

    async def open(self, concurrency: int) -> None: ...
    async def prepare(self, size_bytes: int | None) -> None: ...
    async def call(self) -> float | None: ...
    async def close(self) -> None: ...


class RedisTarget:
    """A Redis command through ``redis.asyncio`` with a pool of ``concurrency`` connections.

    ``GET`` reads and ``SET`` writes a value of ``size_bytes`` (default 64) under a perfcast key; any other
    operation is sent as written (``"PING"``, ``"HGETALL user:1"``).
    """

    KEY = "perfcast:profile:{size}"

    def __init__(self, url: str, op: str = "GET", *, api: str | None = None) -> None:
        words = op.split()
        if not words:
            raise ProfilingError("--op: the Redis command is empty")
        self.url = url
        self.words = words
        self.api = api or f"redis {words[0].upper()}"
        self.resource = _strip_credentials(url)
        self.round_trips = 1.0
        self._client: Any = None
        self._size = 64

    async def open(self, concurrency: int) -> None:
        import redis.asyncio as redis

        self._pool = redis.BlockingConnectionPool.from_url(self.url, max_connections=max(concurrency, 1))
        self._client = redis.Redis(connection_pool=self._pool)
        try:
            await self._client.ping()
        except (OSError, redis.RedisError) as exc:
            await self.close()
            raise ProfilingError(f"cannot reach Redis at {self.resource}: {exc}") from None

    async def prepare(self, size_bytes: int | None) -> None:
        self._size = 64 if size_bytes is None else size_bytes
        self._key = self.KEY.format(size=self._size)
        self._value = b"x" * self._size
        await self._client.set(self._key, self._value)

    async def call(self) -> None:
        command = self.words[0].upper()
        if command == "GET" and len(self.words) == 1:
            await self._client.get(self._key)
        elif command == "SET" and len(self.words) == 1:
            await self._client.set(self._key, self._value)
        else:
            await self._client.execute_command(*self.words)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            await self._pool.aclose()  # a pool passed in is not the client's to close
            self._client = None


class PostgresTarget:
    """A SQL statement on ``concurrency`` ``asyncpg`` connections, each held for the whole run (prepared, cached).

    The connections come from a pool but are not released between calls: a release resets the connection, one
    more round trip that is not the statement's, which would make an RTT profile of ``SELECT 1`` two round trips.

    ``op="SELECT"`` reads one row holding ``size_bytes`` (default 64) from the table ``perfcast_profile``
    (created when missing); any other text is run as written, with ``$1`` bound to ``size_bytes`` when it
    has a ``$1``.
    """

    TABLE = "perfcast_profile"

    def __init__(self, url: str, op: str = "SELECT", *, api: str | None = None) -> None:
        self.url = url
        self.sql = (
            f"SELECT payload FROM {self.TABLE} WHERE id = $1" if op.strip().upper() == "SELECT" else op.strip()
        )
        self.api = api or f"postgresql {sql_operation(self.sql)}"
        self.resource = _strip_credentials(url)
        self.round_trips = 1.0
        self._pool: Any = None
        self._held: list[Any] = []
        self._free: asyncio.Queue[Any] | None = None
        self._args: tuple[Any, ...] = ()

    async def open(self, concurrency: int) -> None:
        import asyncpg  # type: ignore[import-untyped]

        try:
            self._pool = await asyncpg.create_pool(self.url, min_size=concurrency, max_size=concurrency)
            self._free = asyncio.Queue()
            for _ in range(concurrency):
                conn = await self._pool.acquire()
                self._held.append(conn)
                self._free.put_nowait(conn)
        except (OSError, asyncpg.PostgresError) as exc:
            await self.close()
            raise ProfilingError(f"cannot reach PostgreSQL at {self.resource}: {exc}") from None

    async def prepare(self, size_bytes: int | None) -> None:
        size = 64 if size_bytes is None else size_bytes
        if self.TABLE in self.sql:
            conn = self._held[0]  # every connection is held: the pool has none to lend
            await conn.execute(
                f"CREATE TABLE IF NOT EXISTS {self.TABLE} (id bigint PRIMARY KEY, payload bytea NOT NULL)"
            )
            await conn.execute(
                f"INSERT INTO {self.TABLE} VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET payload = $2",
                size, b"x" * size,
            )
        self._args = (size,) if "$1" in self.sql else ()

    async def call(self) -> None:
        import asyncpg

        assert self._free is not None
        conn = await self._free.get()
        try:
            await conn.fetch(self.sql, *self._args)
        except asyncpg.PostgresError as exc:
            raise ProfilingError(f"{self.api}: the statement failed: {exc}") from None
        finally:
            self._free.put_nowait(conn)

    async def close(self) -> None:
        if self._pool is not None:
            for conn in self._held:
                await self._pool.release(conn)
            self._held = []
            await self._pool.close()
            self._pool = None


class HttpTarget:
    """An HTTP request through one ``aiohttp`` session (keep-alive, ``concurrency`` connections).

    With a payload size, ``{size}`` in the URL is replaced by the size in bytes (``/blob?bytes={size}``);
    without the placeholder a POST/PUT sends a body of that size.
    """

    def __init__(self, url: str, op: str = "GET", *, api: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ProfilingError(f"--http {url!r}: expected an http:// or https:// URL")
        self.url = url
        self.method = op.strip().upper() or "GET"
        if not re.fullmatch(r"[A-Z]+", self.method):
            raise ProfilingError(f"--op {op!r}: expected an HTTP method (GET, POST, ...)")
        self.api = api or f"http {self.method} {path_template(parts.path or '/')}"
        self.resource = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", "", ""))
        self.round_trips = 1.0
        self._session: Any = None
        self._target = url
        self._body: bytes | None = None

    async def open(self, concurrency: int) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(concurrency, 1)))

    async def prepare(self, size_bytes: int | None) -> None:
        self._target, self._body = self.url.replace("{size}", str(size_bytes or 0)), None
        if size_bytes is not None and "{size}" not in self.url:
            if self.method not in ("POST", "PUT", "PATCH"):
                raise ProfilingError(
                    f"--size with {self.method}: put a {{size}} placeholder in the URL "
                    f"(e.g. {self.url}?bytes={{size}}), or profile a POST/PUT"
                )
            self._body = b"x" * size_bytes

    async def call(self) -> None:
        import aiohttp

        try:
            async with self._session.request(self.method, self._target, data=self._body) as resp:
                await resp.read()
                if resp.status >= 400:
                    raise ProfilingError(f"{self.method} {self._target} answered HTTP {resp.status}")
        except aiohttp.ClientError as exc:
            raise ProfilingError(f"{self.method} {self._target} failed: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class RttTarget:
    """Network round-trip time to ``host:port``, measured as the TCP connect time (SYN to SYN-ACK)."""

    def __init__(self, address: str) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ProfilingError(f"--rtt {address!r}: expected HOST:PORT")
        self.host, self.port = host.strip("[]"), int(port)
        self.api = RTT_API
        self.resource = f"tcp://{host}:{port}"
        self.round_trips = 1.0

    async def open(self, concurrency: int) -> None:
        return None

    async def prepare(self, size_bytes: int | None) -> None:
        if size_bytes is not None:
            raise ProfilingError("--rtt measures connect times: it takes no --size")

    async def call(self) -> float:
        t0 = time.perf_counter_ns()
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise ProfilingError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        elapsed_ms = (time.perf_counter_ns() - t0) / 1e6
        writer.close()  # not timed: the round trip is the handshake
        await writer.wait_closed()
        return elapsed_ms

    async def close(self) -> None:
        return None


# --- the measuring loop ---------------------------------------------------------------------------------------

Progress = Callable[[int, float, float], None]
"""Called as ``progress(count, rse, elapsed_s)`` while measuring."""


async def measure(
    call: Callable[[], Awaitable[float | None]],
    rule: StopRule,
    *,
    concurrency: int = 1,
    progress: Progress | None = None,
    clock: Callable[[], int] = time.perf_counter_ns,
    pause_s: float = 0.0,
) -> tuple[npt.NDArray[np.float64], str]:
    """Time ``call`` with ``concurrency`` callers in a closed loop until :func:`is_stable` or the budget ends.

    Each caller awaits ``call()`` again as soon as the previous one returns (after ``pause_s``, untimed), so
    ``concurrency`` calls are always in flight (the load of ``concurrency`` concurrent users). A call that
    returns a number has timed itself (ms); that number is the sample. Returns the samples (ms) and why it
    stopped.
    """
    if concurrency < 1:
        raise ProfilingError(f"concurrency must be at least 1, got {concurrency}")
    samples: list[float] = []
    total = total_sq = 0.0  # running sums: the rse is O(1) per sample
    start = time.monotonic()
    deadline = start + rule.budget_s
    done = asyncio.Event()
    reason = "budget"

    def running_rse() -> float:
        n = len(samples)
        mean = total / n
        if n < 2 or mean <= 0:
            return math.inf
        var = max(total_sq - n * mean * mean, 0.0) / (n - 1)
        return math.sqrt(var / n) / mean

    def check() -> None:
        nonlocal reason
        if done.is_set():
            return
        n = len(samples)
        rse = running_rse()
        if progress is not None and (n < 64 or n % 16 == 0):
            progress(n, rse, time.monotonic() - start)
        if n >= rule.max_count:
            reason = "max count"
            done.set()
        elif n >= rule.min_count and rse < rule.rse:
            reason = "stable"
            done.set()
        elif time.monotonic() >= deadline:
            done.set()

    async def worker() -> None:
        nonlocal total, total_sq
        while not done.is_set():
            if pause_s > 0:
                await asyncio.sleep(pause_s)
            t0 = clock()
            try:
                timed = await call()
            except ProfilingError:
                raise
            except Exception as exc:  # the driver's own errors (connection lost, server error): one message
                raise ProfilingError(f"a call failed: {type(exc).__name__}: {exc}") from exc
            ms = (clock() - t0) / 1e6 if timed is None else float(timed)
            samples.append(ms)
            total += ms
            total_sq += ms * ms
            check()

    try:
        # A call that hangs past the budget is abandoned; what was measured before it is kept.
        async with asyncio.timeout(rule.budget_s + 5.0), asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
    except TimeoutError:
        reason = "budget"
    except ExceptionGroup as group:
        failures = [e for e in group.exceptions if isinstance(e, ProfilingError)]
        if not failures:
            raise
        raise failures[0] from None
    if not samples:
        raise ProfilingError(f"no call finished within the budget of {rule.budget_s:g} s")
    if progress is not None:
        progress(len(samples), relative_standard_error(samples), time.monotonic() - start)
    return np.asarray(samples, dtype=np.float64), reason


async def profile_target(
    target: Target,
    *,
    labels: Mapping[str, str] | None = None,
    sizes: Sequence[int] = (),
    concurrencies: Sequence[int] = (),
    idle_ms: Sequence[float] = (),
    rule: StopRule = StopRule(),
    rounds: int = 1,
    store: ProfileStore | None = None,
    progress: Callable[[ProfileKey], Progress] | None = None,
    note: str = "",
) -> list[Measurement]:
    """Measure ``target`` at each parameter value; store each point as soon as it is measured (its last spell).

    Without sizes or concurrencies: one workload-independent profile. Sizes give profiles parameterised by
    ``size_bytes`` (measured with one caller); concurrencies give profiles parameterised by ``concurrency``.
    Both together measure the grid: every size with one caller and with each number of callers (a payload
    profile in two dimensions, what a bigger payload adds to each of a fan-out's calls), the first size's
    points also stored as the concurrency profile. Idle gaps give a wake-up profile (api ``wake``,
    parameterised by ``idle_ms``, 0 included: :mod:`analyzer.wakeup`): one caller pauses that long before each
    call. ``rule.budget_s`` applies to each point. ``progress(key)`` returns the callback for that point.

    With ``rounds`` > 1 the points take turns: each is measured in ``rounds`` spells of ``1/rounds`` of the
    rule's budget and counts, the points visited in order, then in reverse, and so on, and stored after its last
    spell. What the engine reads is the *difference* between points (a payload's extra over the smaller one at
    the same callers); on a shared host whose speed drifts over the minutes a profile takes, points measured
    one after the other would carry that drift into the difference, while taking turns spreads it over all.
    """
    if rounds < 1:
        raise ProfilingError(f"rounds must be at least 1, got {rounds}")
    points: list[tuple[str, float, int | None, int]] = []
    if idle_ms:
        if sizes or concurrencies:
            raise ProfilingError("idle gaps (a wake-up profile) go without sizes or concurrencies")
        if any(not math.isfinite(g) or g < 0 for g in idle_ms):
            raise ProfilingError(f"idle gaps must be finite and >= 0 ms, got {list(idle_ms)}")
        if not isinstance(target, HttpTarget):
            raise ProfilingError("a wake-up profile (idle gaps) times one of the app's own HTTP endpoints")
        points = [("idle_ms", g, None, 1) for g in sorted({0.0, *map(float, idle_ms)})]
    elif not sizes and not concurrencies:
        points.append(("", 0.0, None, 1))
    for c in concurrencies:
        if c < 1:
            raise ProfilingError(f"--concurrency {c}: must be at least 1")
    for n_bytes in sizes:
        for c in sorted({1, *concurrencies}) if concurrencies else [1]:
            points.append(("size_bytes", float(n_bytes), n_bytes, c))
    if not sizes:
        points += [("concurrency", float(c), None, c) for c in concurrencies]
    if len(points) == 1:
        rounds = 1  # nothing to take turns with
    spell = rule if rounds == 1 else StopRule(
        rse=rule.rse, min_count=max(2, math.ceil(rule.min_count / rounds)), budget_s=rule.budget_s / rounds,
        max_count=max(1, math.ceil(rule.max_count / rounds)))
    keys: list[tuple[ProfileKey, ProfileKey | None]] = []
    for param, value, size, concurrency in points:
        if param == "idle_ms":  # named by the route it times, which the engine matches to its graphs
            key = ProfileKey.make(WAKE_API, f"{target.resource} {target.api.removeprefix('http ')}", labels or {},
                                  param, value)
        else:
            key = ProfileKey.make(target.api, target.resource, labels or {}, param, value, concurrency)
        # the first size's points with several callers are the concurrency profile too (loadsim reads that)
        also = (ProfileKey.make(target.api, target.resource, labels or {}, "concurrency", concurrency)
                if sizes and size == sizes[0] and concurrency in concurrencies else None)
        keys.append((key, also))
    parts: list[list[npt.NDArray[np.float64]]] = [[] for _ in points]
    cpu_ns = [0] * len(points)
    spent = [0.0] * len(points)
    why: list[set[str]] = [set() for _ in points]
    callbacks = [progress(key) if progress else None for key, _ in keys]
    results: dict[int, Measurement] = {}
    for turn in range(rounds):
        order = range(len(points)) if turn % 2 == 0 else reversed(range(len(points)))
        for i in order:
            param, value, size, concurrency = points[i]
            await target.open(concurrency)
            try:
                await target.prepare(size)
                for _ in range(concurrency):  # warm the pool: connections opened here are not timed
                    await target.call()
                began = time.monotonic()
                # The caller's CPU per call: the client library's work on this thread (the event loop), which a
                # bigger payload adds to the app's loop as well as to the call's latency (analyzer.predict,
                # size). The timing loop's own bookkeeping is the same at every point and cancels in a difference.
                cpu0 = time.thread_time_ns()
                samples, stopped = await measure(
                    target.call, spell, concurrency=concurrency,
                    progress=_carried(callbacks[i], sum(p.size for p in parts[i]), spent[i]),
                    pause_s=value / 1000.0 if param == "idle_ms" else 0.0,
                )
                cpu_ns[i] += time.thread_time_ns() - cpu0
            finally:
                await target.close()
            parts[i].append(samples)
            spent[i] += time.monotonic() - began
            why[i].add(stopped)
            if len(parts[i]) < rounds:
                continue
            key, also = keys[i]
            every = np.concatenate(parts[i])
            cpu_ms = cpu_ns[i] / 1e6 / every.size
            reason = ", ".join(sorted(why[i]))
            results[i] = Measurement(key, every, target.round_trips, reason, spent[i], cpu_ms)
            if store is not None:
                for k in (key, also):
                    if k is not None:
                        store.add(k, every, round_trips=target.round_trips, cpu_ms=cpu_ms,
                                  note=note or f"perfcast profile ({reason})")
    return [results[i] for i in range(len(points))]


def _carried(progress: Progress | None, count: int, elapsed_s: float) -> Progress | None:
    """A point's progress over its spells: this spell's count and time added to the earlier spells'."""
    if progress is None:
        return None
    return lambda n, rse, t: progress(count + n, rse, elapsed_s + t)
