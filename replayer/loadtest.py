"""A closed-loop load generator in the manner of The Grinder.

``N`` virtual users each send a request, wait for the whole answer, think (a constant or exponentially
distributed time), and start again. Levels of concurrency are run one at a time; each has a warm-up that is not
counted, then a steady-state window over which everything is measured: throughput, response times, errors, and
the utilisation of the monitored hosts and processes (counters read at both ends of the window, see
:mod:`replayer.monitor`).

The users are asyncio tasks sharing one :class:`aiohttp.ClientSession` in one process, so hundreds of them cost
little; the generator measures its own CPU use over each window (``generator_busy_cpus``) so a report can say
whether the generator, rather than the system under test, was the limit. A closed system obeys Little's law
``N = X (R + Z)`` by construction; the measured think time is kept so the law can be checked.

References
----------
.. [1] P. Aston, C. Fitzgerald, The Grinder, a Java load testing framework. https://grinder.sourceforge.net/
.. [2] A. Kattepur, M. Nambiar, "Performance Modeling of Multi-tiered Web Applications with Varying Service
   Demands", IPDPS Workshops 2015, section IV (load tests and monitoring).
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import psutil

from replayer.monitor import (
    HostCounters,
    HostMonitor,
    HostUtilisation,
    ProcessCounters,
    ProcessTarget,
    ProcessUtilisation,
    host_utilisation,
    pid_listening_on,
    process_utilisation,
    read_process_counters,
)

__all__ = [
    "FORMAT",
    "LevelResult",
    "LoadTestConfig",
    "LoadTestError",
    "LoadTestResult",
    "Progress",
    "ThinkTime",
    "local_pid_for_url",
    "parse_duration",
    "parse_users",
    "run_load_test",
]

FORMAT = "perfcast-loadtest/1"
"""The ``format`` tag of a load-test file."""

_ERROR_EXAMPLES = 3
_PROGRESS_EVERY_S = 0.25


class LoadTestError(Exception):
    """A load test cannot start or run: bad settings, the target URL does not answer, or a level got nothing
    done. The message names the setting, URL or level."""


class ThinkTime(enum.StrEnum):
    """How think times are drawn."""

    CONSTANT = "constant"
    """Always the mean: the users stay in the phase they start in, so they are started at random offsets."""
    EXPONENTIAL = "exponential"
    """Exponentially distributed with the given mean: the think station of a product-form network."""


@dataclass(frozen=True, slots=True)
class LoadTestConfig:
    """What to run."""

    url: str
    users: tuple[int, ...]
    """Concurrency levels, run in this order."""
    think_time_s: float
    """Mean think time between a user's answer and its next request."""
    duration_s: float
    """Length of each level's steady-state (measured) window."""
    warmup_s: float = 10.0
    """Time each level runs before the window opens, not counted."""
    think: ThinkTime = ThinkTime.EXPONENTIAL
    request_timeout_s: float = 30.0
    """A request that takes longer counts as an error."""
    seed: int | None = None
    """Seed of the think-time generator, for reproducible runs."""

    def __post_init__(self) -> None:
        if not self.users:
            raise LoadTestError("`users`: give at least one concurrency level")
        for n in self.users:
            if not isinstance(n, int) or n < 1:
                raise LoadTestError(f"`users`: each level must be a positive integer, got {n!r}")
        for name in ("think_time_s", "warmup_s", "request_timeout_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise LoadTestError(f"`{name}` must be non-negative, got {value!r}")
        if not math.isfinite(self.duration_s) or self.duration_s <= 0:
            raise LoadTestError(f"`duration_s` must be positive, got {self.duration_s!r}")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LoadTestError(f"`url`: expected an http:// or https:// URL with a host, got {self.url!r}")


@dataclass(frozen=True, slots=True)
class LevelResult:
    """Measurements of one concurrency level over its steady-state window."""

    users: int
    duration_s: float
    """Actual length of the window."""
    completed: int
    """Requests answered with a status below 400 whose answer arrived in the window."""
    errors: int
    """Requests that failed (status 400 or more, connection error, timeout) in the window."""
    throughput_per_s: float
    """``completed / duration_s``."""
    response_time_s: float
    """Mean response time of the completed requests (NaN when none completed)."""
    response_time_p50_s: float
    response_time_p90_s: float
    response_time_p99_s: float
    think_time_s: float
    """Mean think time the users actually slept (NaN when none ended in the window)."""
    generator_busy_cpus: float
    """CPU seconds per second the load generator's process used over the window."""
    hosts: tuple[HostUtilisation, ...] = ()
    processes: tuple[ProcessUtilisation, ...] = ()
    error_examples: tuple[str, ...] = field(default=())
    """The first few distinct error descriptions."""

    def to_json(self) -> dict[str, Any]:
        """The level's measurements as the load-test file stores them (without ``stations``, added by the
        caller from the operational laws)."""
        return {
            "users": self.users,
            "duration_s": self.duration_s,
            "completed": self.completed,
            "errors": self.errors,
            "throughput_per_s": self.throughput_per_s,
            "response_time_s": _finite_or_none(self.response_time_s),
            "response_time_p50_s": _finite_or_none(self.response_time_p50_s),
            "response_time_p90_s": _finite_or_none(self.response_time_p90_s),
            "response_time_p99_s": _finite_or_none(self.response_time_p99_s),
            "think_time_measured_s": _finite_or_none(self.think_time_s),
            "generator_busy_cpus": self.generator_busy_cpus,
            "hosts": {h.host: h.to_json() for h in self.hosts},
            "processes": {p.label: p.to_json() for p in self.processes},
            "error_examples": list(self.error_examples),
        }


@dataclass(frozen=True, slots=True)
class LoadTestResult:
    config: LoadTestConfig
    levels: tuple[LevelResult, ...]


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a running load test is; passed to the ``progress`` callback a few times a second."""

    level_index: int
    users: int
    phase: str
    """``warmup`` or ``measure``."""
    elapsed_s: float
    """Time since the level started (warm-up included)."""
    total_s: float
    """Warm-up plus window of this level."""
    completed: int
    """Requests completed since the level started."""


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, name: str = "duration") -> float:
    """Parse ``500ms``, ``1s``, ``1.5``, ``2m`` or ``1h`` into seconds.

    Examples
    --------
    >>> parse_duration("2m"), parse_duration("250ms"), parse_duration("1.5")
    (120.0, 0.25, 1.5)
    """
    match = _DURATION.match(text)
    if not match:
        raise LoadTestError(f"`{name}`: expected a duration such as 500ms, 10s, 2m, got {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_users(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of concurrency levels, e.g. ``1,20,105,203``.

    Examples
    --------
    >>> parse_users("1, 20,105")
    (1, 20, 105)
    """
    levels = []
    for i, item in enumerate(text.split(",")):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise LoadTestError(
                f"`users`: item {i + 1} of {text!r} is {item!r}; expected positive integers separated by commas"
            )
        levels.append(int(item))
    return tuple(levels)


def local_pid_for_url(url: str) -> int | None:
    """PID of the process serving ``url`` when its host is this machine (loopback or ``localhost``), else None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        local = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = False
    if not local:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return pid_listening_on(port)


@dataclass(slots=True)
class _Recorder:
    """Per-level bookkeeping of the users (one event loop: no locks)."""

    ends: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    ok: list[bool] = field(default_factory=list)
    think_ends: list[float] = field(default_factory=list)
    thinks: list[float] = field(default_factory=list)
    error_examples: dict[str, None] = field(default_factory=dict)

    def error(self, description: str) -> None:
        if len(self.error_examples) < _ERROR_EXAMPLES:
            self.error_examples.setdefault(description, None)


async def _user(
    session: aiohttp.ClientSession,
    config: LoadTestConfig,
    rng: np.random.Generator,
    recorder: _Recorder,
) -> None:
    def draw() -> float:
        if config.think is ThinkTime.EXPONENTIAL:
            return float(rng.exponential(config.think_time_s)) if config.think_time_s > 0 else 0.0
        return config.think_time_s

    # start at a random point of the think phase so that users do not fire in lock-step
    await asyncio.sleep(float(rng.uniform(0.0, config.think_time_s)))
    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
    while True:
        start = time.perf_counter()
        ok = False
        try:
            async with session.get(config.url, timeout=timeout) as response:
                await response.read()
                ok = response.status < 400
                if not ok:
                    recorder.error(f"HTTP {response.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            recorder.error(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        end = time.perf_counter()
        recorder.ends.append(end)
        recorder.latencies.append(end - start)
        recorder.ok.append(ok)
        await asyncio.sleep(draw())
        woke = time.perf_counter()
        recorder.think_ends.append(woke)
        recorder.thinks.append(woke - end)


async def _probe(session: aiohttp.ClientSession, config: LoadTestConfig) -> None:
    try:
        async with session.get(config.url, timeout=aiohttp.ClientTimeout(total=config.request_timeout_s)) as resp:
            await resp.read()
            if resp.status >= 400:
                raise LoadTestError(f"{config.url} answered HTTP {resp.status} {resp.reason or ''}".rstrip())
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise LoadTestError(f"cannot reach {config.url}: {exc or type(exc).__name__}") from exc


async def _read_all(
    monitors: Sequence[HostMonitor], processes: Sequence[ProcessTarget]
) -> tuple[list[HostCounters], list[ProcessCounters], float]:
    hosts = asyncio.gather(*(m.read() for m in monitors))
    procs = asyncio.gather(*(asyncio.to_thread(read_process_counters, p.pid, p.label, p.also) for p in processes))
    host_counters, proc_counters = await asyncio.gather(hosts, procs)
    own = psutil.Process().cpu_times()
    return list(host_counters), list(proc_counters), own.user + own.system


def _summary(users: int, recorder: _Recorder, window: tuple[float, float], generator_busy: float) -> dict[str, Any]:
    w0, w1 = window
    ends = np.asarray(recorder.ends)
    ok = np.asarray(recorder.ok, dtype=bool)
    latencies = np.asarray(recorder.latencies)
    inside = (ends >= w0) & (ends < w1)
    good = latencies[inside & ok]
    think_ends = np.asarray(recorder.think_ends)
    thinks = np.asarray(recorder.thinks)[(think_ends >= w0) & (think_ends < w1)]
    nan = float("nan")
    p50, p90, p99 = (float(v) for v in np.percentile(good, [50, 90, 99])) if good.size else (nan, nan, nan)
    duration = w1 - w0
    return {
        "users": users,
        "duration_s": duration,
        "completed": int(good.size),
        "errors": int(np.count_nonzero(inside & ~ok)),
        "throughput_per_s": good.size / duration,
        "response_time_s": float(good.mean()) if good.size else nan,
        "response_time_p50_s": p50,
        "response_time_p90_s": p90,
        "response_time_p99_s": p99,
        "think_time_s": float(thinks.mean()) if thinks.size else nan,
        "generator_busy_cpus": generator_busy,
    }


async def _run_level(
    index: int,
    users: int,
    session: aiohttp.ClientSession,
    config: LoadTestConfig,
    monitors: Sequence[HostMonitor],
    processes: Sequence[ProcessTarget],
    rng: np.random.Generator,
    progress: Callable[[Progress], None] | None,
) -> LevelResult:
    recorder = _Recorder()
    level_start = time.perf_counter()
    total = config.warmup_s + config.duration_s

    def report(phase: str) -> None:
        if progress is not None:
            elapsed = min(total, time.perf_counter() - level_start)
            progress(Progress(index, users, phase, elapsed, total, len(recorder.ends)))

    async def tick(phase: str, seconds: float) -> None:
        deadline = time.perf_counter() + seconds
        while (left := deadline - time.perf_counter()) > 0:
            report(phase)
            await asyncio.sleep(min(_PROGRESS_EVERY_S, left))
        report(phase)

    tasks = [asyncio.create_task(_user(session, config, rng, recorder)) for _ in range(users)]
    try:
        await tick("warmup", config.warmup_s)
        host_start, proc_start, own_start = await _read_all(monitors, processes)
        w0 = time.perf_counter()
        await tick("measure", config.duration_s)
        w1 = time.perf_counter()
        host_end, proc_end, own_end = await _read_all(monitors, processes)
    finally:
        for task in tasks:
            task.cancel()
        # the users only ever end by cancellation; anything else they raise is a bug worth seeing
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
    summary = _summary(users, recorder, (w0, w1), (own_end - own_start) / (w1 - w0))
    return LevelResult(
        **summary,
        hosts=tuple(host_utilisation(a, b) for a, b in zip(host_start, host_end, strict=True)),
        processes=tuple(
            process_utilisation(a, b, p.servers) for a, b, p in zip(proc_start, proc_end, processes, strict=True)
        ),
        error_examples=tuple(recorder.error_examples),
    )


def _allow_sockets(users: int) -> None:
    """Each user holds a connection: raise the soft open-files limit towards the hard one when it is too low."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = users + 256  # plus the event loop's, the monitors' and the agents' own descriptors
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


async def run_load_test(
    config: LoadTestConfig,
    *,
    monitors: Sequence[HostMonitor] = (),
    processes: Sequence[ProcessTarget] = (),
    progress: Callable[[Progress], None] | None = None,
) -> LoadTestResult:
    """Run a closed-loop load test, one concurrency level after the other.

    Parameters
    ----------
    config : LoadTestConfig
        URL, levels, think time, warm-up and window lengths.
    monitors : sequence of HostMonitor
        Hosts whose CPU, disk and network utilisation to measure over each window (this host through
        :class:`~replayer.monitor.LocalMonitor`, others through their agents).
    processes : sequence of ProcessTarget
        Processes whose CPU time, with their children's, to measure over each window.
    progress : callable, optional
        Called a few times a second with a :class:`Progress`.

    Raises
    ------
    LoadTestError
        If the URL does not answer (or answers an error) before the test starts.
    replayer.monitor.MonitorError
        If a monitored host's agent or a process cannot be read (checked before the test starts).
    """
    processes = tuple(processes)
    labels = [p.label for p in processes]
    if len(set(labels)) != len(labels):
        raise LoadTestError(f"`processes`: labels must differ, got {labels}")
    _allow_sockets(max(config.users))
    rng = np.random.default_rng(config.seed)
    connector = aiohttp.TCPConnector(limit=0)  # one connection per user at most; no pool queueing in the client
    async with aiohttp.ClientSession(connector=connector) as session:
        await _probe(session, config)
        await _read_all(monitors, processes)  # fail now, not after the first level, if an agent or PID is wrong
        levels = []
        for index, users in enumerate(config.users):
            levels.append(await _run_level(index, users, session, config, monitors, processes, rng, progress))
    return LoadTestResult(config=config, levels=tuple(levels))
