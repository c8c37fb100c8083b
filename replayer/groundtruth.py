"""Ground truth for what-if scenarios: deploy the example forum app with a scenario applied for real, and measure.

A prediction is only as good as its agreement with what really happens, so every scenario the engine predicts
can also be *applied*, as WebPerf's evaluation did (Jiang et al., SIGCOMM 2016, section 6.2), and measured:

============== ===============================================================================================
scenario       applied for real by
============== ===============================================================================================
location       a :class:`~replayer.proxy.LatencyProxy` in front of the blob service, Redis or PostgreSQL,
               adding ``added_ms`` per round trip (every deployment has the proxies, at 0 ms for today)
load           the load client's closed loop with ``users`` concurrent users
interference   a :class:`~replayer.hog.CpuHog` taking ``cpu_pct`` % of every core
size           the app's ``--payload-bytes``: every blob it fetches is that big
failure        ``app_replicas`` app processes sharing one port (the kernel balances them), one stopped
============== ===============================================================================================

The deployment: the blob service (``python -m examples.forum.blobs``, blobs, the key-value cache, ads and
recommendations) in its own process behind the ``blob`` proxy; the forum app (``python -m examples.forum``,
under the collector when a spans file is asked for) talking to the blob service, and to Redis / PostgreSQL
through their proxies when given; the recommendation replicas are the blob service reached directly, so that
moving the blob service does not move them. ``ForumSetup(pin=True)`` gives the app and the noisy neighbour a
core of their own. Each process runs in its own session and is stopped (SIGTERM, then SIGKILL of its process
group) on every way out, errors and Ctrl-C included.

Measured latencies are per route (``GET /``, ``GET /post/{id}``): server-side, from the request spans, when the
app ran under the collector (the quantity the engine predicts), and client-side from the load client always.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import random
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from replayer.hog import CpuHog
from replayer.proxy import LatencyProxy, Upstream

__all__ = [
    "APP_PATHS",
    "BLOB_NAME",
    "Applied",
    "Deployment",
    "ForumSetup",
    "GroundTruth",
    "GroundTruthError",
    "IDLE_MS",
    "IdleRun",
    "LoopLevel",
    "Resource",
    "client_mix",
    "cpu_s",
    "deploy",
    "host_cpu_s",
    "loop_cpu_s",
    "loop_switches",
    "measure",
    "measure_idle",
    "measure_loaded",
    "measure_paired",
    "measured_requests",
    "pooled_host",
    "pooled_levels",
    "pooled_light",
    "preempted_s",
    "route_of",
]

APP_PATHS: tuple[str, ...] = ("/?page={n}", "/post/{n}")
"""Paths the load client requests by default: the index page and a post page, half and half."""

Resource = str
"""A proxied dependency of the app: ``blob`` (the blob service), ``redis`` or ``postgres``."""

_RESOURCES = ("blob", "redis", "postgres")
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 15.0


class GroundTruthError(RuntimeError):
    """A deployment could not be started or measured: a process that did not start, a bad setting, a failed load.

    The message names what failed and ends with the tail of the process's log when there is one.
    """


@dataclass(frozen=True, slots=True)
class ForumSetup:
    """Today's deployment of the forum app (the configuration the baseline is collected on)."""

    redis_url: str | None = None
    """Real Redis for the page cache (behind the ``redis`` proxy); ``None``: the blob service's ``/kv`` API."""
    postgres_url: str | None = None
    """Real PostgreSQL (behind the ``postgres`` proxy); ``None``: the app's seeded SQLite file."""
    payload_bytes: int = 4096
    """Size of each blob the app fetches (``--payload-bytes``)."""
    seed: int | None = 1
    """Seeds the app's and the blob service's random choices and the load client's paths."""
    app_args: tuple[str, ...] = ()
    """More ``python -m examples.forum`` flags, e.g. ``("--cache-ttl-ms", "200")``."""
    pin: bool = False
    """On a machine with 2+ cores, give the app (and a noisy neighbour) core 0 and everything else started here
    (blob service, proxies, load client) the other cores, as a front end owns its own machine: otherwise a
    CPU hog or the load client would slow the app's dependencies too, which no scenario intends. Off by
    default: on a machine shared with other work, a pinned app cannot move away from a busy core."""


@dataclass(frozen=True, slots=True)
class Applied:
    """A what-if scenario applied for real (the default applies nothing: today's deployment)."""

    added_ms: tuple[tuple[Resource, float], ...] = ()
    """(resource, ms): every round trip through that resource's proxy gains ``ms``."""
    cpu_pct: float = 0.0
    """A noisy neighbour takes this % of every core while the load runs."""
    payload_bytes: int | None = None
    """Blob size instead of the setup's."""
    app_replicas: int = 1
    """App processes sharing one listening port (``--reuse-port``: the kernel's ``SO_REUSEPORT`` spreads the
    connections over them)."""
    failed_replicas: int = 0
    """App replicas stopped before the load starts: their sockets leave the port's group, and the kernel sends
    every connection to the others."""

    def __post_init__(self) -> None:
        for name, ms in self.added_ms:
            if name not in _RESOURCES:
                raise ValueError(f"added_ms: unknown resource {name!r}; expected one of {', '.join(_RESOURCES)}")
            if ms < 0:
                raise ValueError(f"added_ms: {name} must gain a non-negative delay, got {ms}")
        if not 0 <= self.cpu_pct < 100:
            raise ValueError(f"cpu_pct must be within [0, 100), got {self.cpu_pct}")
        if self.app_replicas < 1 or not 0 <= self.failed_replicas < self.app_replicas:
            raise ValueError(f"need 0 <= failed_replicas < app_replicas, got {self.failed_replicas} of "
                             f"{self.app_replicas}")
        if self.payload_bytes is not None and self.payload_bytes < 0:
            raise ValueError(f"payload_bytes must be non-negative, got {self.payload_bytes}")


@dataclass(frozen=True, slots=True)
class LoopLevel:
    """The app's event loop at a few users, measured beside a light run (:func:`measure_loaded`)."""

    users: int
    loop_cpu_ms: float
    """CPU the serving replica's loop was held for, per request (:func:`loop_cpu_s`)."""
    preempted_ms: float
    """Time that loop was preempted, per request (:func:`preempted_s`)."""
    requests: int
    throughput_rps: float
    host_cpu_ms: float = 0.0
    """The whole host's busy CPU per request (:func:`host_cpu_s`), the app's and every other process's; 0 where
    it was not read."""

    def to_json(self) -> dict[str, float]:
        return {"users": self.users, "loop_cpu_ms": self.loop_cpu_ms, "preempted_ms": self.preempted_ms,
                "requests": self.requests, "throughput_rps": self.throughput_rps, "host_cpu_ms": self.host_cpu_ms}


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """What one deployment measured."""

    server_ms: Mapping[str, tuple[float, ...]]
    """route -> latency of each request handled in the measured window, from the request spans (empty when
    the app did not run under the collector)."""
    client_ms: Mapping[str, tuple[float, ...]]
    """route -> latency of each request as the load client saw it."""
    resources: Mapping[Resource, str]
    """resource -> ``host:port`` of its proxy, the address the app's spans name it by."""
    users: int
    throughput_rps: float
    errors: int
    elapsed_s: float
    spans: tuple[str, ...] = ()
    """The spans files written (one per app replica)."""
    window_ns: tuple[int, int] = (0, 0)
    """Wall-clock (``time.time_ns``) start and end of the measured window."""
    error_examples: tuple[str, ...] = field(default=())
    applied_delay_ms: Mapping[Resource, float] = field(default_factory=dict)
    """resource -> the delay per round trip its proxy actually added (``Applied.added_ms`` plus the proxy's
    lateness) over the run, warm-up included, for the resources given a delay."""
    app_cpu_ms: tuple[float, float] = (0.0, 0.0)
    """(user, system) CPU the serving app replicas spent in the measured window, per measured request (psutil)."""
    loop_cpu_ms: float = 0.0
    """CPU the serving replicas' event loops were held for in the measured window, per measured request
    (:func:`loop_cpu_s`): with the collector's spans off, the app's own demand on its loop
    (``analyzer.loadsim.calibrate``)."""
    loop_preempted_ms: float = 0.0
    """Time the serving replicas' event loops spent preempted in the measured window, per measured request
    (:func:`preempted_s`): the loop's capacity that the machine's other threads took."""
    slices_ns: tuple[tuple[int, int], ...] = ()
    """When the requests of two sides were interleaved (:func:`measure_paired`): the slices of the window, one
    per request of this side, that its requests started in. Empty: the whole window is this side's."""
    loop_wakeups: float = 0.0
    """Times the serving replicas' event loops went to sleep (in ``epoll_wait``: their voluntary context
    switches) in the measured window, per measured request: how often the loop idled and had to wake up. The
    last field but one, so that recordings pickled before it (``benchmarks/whatif_accuracy.py``) still load."""
    host_cpu_ms: tuple[float, float] = (0.0, 0.0)
    """(busy, steal) CPU time of the whole host in the measured window, summed over its cores, per measured
    request (:func:`host_cpu_s`): busy less the app's own CPU is what the processes beside it (its database, its
    cache, the load client) took from the same cores; steal is what the hypervisor gave to other guests."""
    levels: tuple[LoopLevel, ...] = ()
    """A light run's short runs at a few more users, right after it in the same deployment
    (:func:`measure_loaded`): the loop's demand as the load grows. The last field, so that recordings pickled
    before it still load."""

    def latencies(self, route: str) -> tuple[float, ...]:
        """Server-side latencies of ``route`` when recorded, else client-side."""
        return self.server_ms.get(route) or self.client_ms.get(route, ())

    @property
    def routes(self) -> list[str]:
        return sorted(set(self.server_ms) | set(self.client_ms))

    def to_json(self) -> dict[str, Any]:
        return {
            "server_ms": {r: list(v) for r, v in self.server_ms.items()},
            "client_ms": {r: list(v) for r, v in self.client_ms.items()},
            "resources": dict(self.resources), "users": self.users, "throughput_rps": self.throughput_rps,
            "errors": self.errors, "error_examples": list(self.error_examples), "elapsed_s": self.elapsed_s,
            "spans": list(self.spans), "window_ns": list(self.window_ns), "app_cpu_ms": list(self.app_cpu_ms),
            "loop_cpu_ms": self.loop_cpu_ms, "loop_preempted_ms": self.loop_preempted_ms,
            "loop_wakeups": self.loop_wakeups, "slices_ns": [list(s) for s in self.slices_ns],
            "host_cpu_ms": list(self.host_cpu_ms), "levels": [x.to_json() for x in self.levels],
        }


def reachable(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (a Redis or PostgreSQL the real deployment
    and the tests need)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def client_mix(paths: Sequence[str] = APP_PATHS, routes: Iterable[str] | None = None) -> str:
    """The load client's request mix, as options of a ``load:N`` scenario.

    The client picks one of ``paths`` uniformly at random per request, so a route weighs as many paths as lead
    to it. A prediction made with the baseline's recorded mix instead would be for another workload: the
    first 100 requests of the seeded client are 60% index pages, its loaded runs 50%. ``routes``: only these
    (the routes the baseline has graphs of).

    >>> client_mix(), client_mix(routes=["GET /"])
    ('mix.GET /=1&mix.GET /post/{id}=1', 'mix.GET /=1')
    """
    keep = None if routes is None else set(routes)
    counts: dict[str, int] = {}
    for path in paths:
        route = route_of(path.replace("{n}", "1"))  # the client's placeholder for a number
        if keep is not None and route not in keep:
            continue
        counts[route] = counts.get(route, 0) + 1
    return "&".join(f"mix.{route}={n}" for route, n in counts.items())


def route_of(path: str, method: str = "GET") -> str:
    """The route a request path belongs to, as the server spans name it: numeric segments become ``{id}``.

    >>> route_of("/?page=3"), route_of("/post/17")
    ('GET /', 'GET /post/{id}')
    """
    bare = urlsplit(path).path or "/"
    return f"{method} " + re.sub(r"(?<=/)\d+(?=/|$)", "{id}", bare)


# --- processes --------------------------------------------------------------------------------------------------


class _Process:
    """A child in its own session, its output in a log file; :meth:`stop` ends it and its process group."""

    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None,
                 pass_fds: Sequence[int] = ()) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    list(argv), stdout=subprocess.PIPE, stderr=log, env=dict(env) if env is not None else None,
                    start_new_session=True, pass_fds=tuple(pass_fds),
                )
            except OSError as exc:
                raise GroundTruthError(f"{name}: cannot run {argv[0]!r}: {exc.strerror}") from None

    def wait_listening(self, timeout_s: float = _START_TIMEOUT_S) -> str:
        """Block until the child prints ``listening on URL``; return the URL."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        buffer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buffer += chunk
                m = re.search(rb"listening on (http://\S+)", buffer)
                if m:
                    return m.group(1).decode()
        state = f"exited with code {self.proc.poll()}" if self.proc.poll() is not None else "is still silent"
        raise GroundTruthError(f"{self.name} did not start within {timeout_s:g} s ({state}){self.tail()}")

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return ("; its log ends:\n  " + "\n  ".join(text)) if text else ""

    def stop(self) -> None:
        """SIGTERM (the app flushes its spans on the way out), then SIGKILL of the group if it lingers."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group: a collected app's own child included
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class _ProxyLoop:
    """LatencyProxies served by an event loop on a background thread, so that the caller may block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: list[LatencyProxy] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="groundtruth-proxies", daemon=True)
        self.thread.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self, upstreams: Sequence[Upstream], delay_ms: float) -> LatencyProxy:
        proxy = LatencyProxy(list(upstreams), delay_ms=delay_ms)
        self._run(proxy.start())
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        async def stop_all() -> None:
            for proxy in self.proxies:
                await proxy.stop()

        with contextlib.suppress(Exception):
            self._run(stop_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


def _cpu_split(pin: bool) -> tuple[set[int], set[int]]:
    """(the app's cores, everything else's), or two empty sets when not pinning."""
    if not pin or not hasattr(os, "sched_getaffinity") or shutil.which("taskset") is None:
        return set(), set()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return set(), set()
    return {cpus[0]}, set(cpus[1:])


def _upstream(url: str, what: str) -> Upstream:
    parts = urlsplit(url)
    if not parts.hostname:
        raise GroundTruthError(f"{what} {url!r}: expected a URL with a host, e.g. redis://127.0.0.1:6379/0")
    return Upstream(parts.hostname, parts.port or {"redis": 6379, "postgresql": 5432, "postgres": 5432}.get(
        parts.scheme, 80))


def _via(url: str, proxy: LatencyProxy) -> str:
    """``url`` with its host:port replaced by the proxy's (credentials kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{proxy.address}" if userinfo else proxy.address
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# --- a deployment and a measurement -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deployment:
    """A running deployment (from :func:`deploy`)."""

    url: str
    """Where the load goes: the app (the port its replicas share)."""
    blob_url: str
    """The blob service as the app reaches it (through the ``blob`` proxy)."""
    resources: Mapping[Resource, str]
    """resource -> ``host:port`` of its proxy."""
    spans: tuple[str, ...]
    """The spans files being written (one per app replica; empty without the collector)."""
    proxies: Mapping[Resource, LatencyProxy] = field(default_factory=dict)
    """resource -> the proxy in front of it (their :meth:`~LatencyProxy.applied_delay_ms`)."""
    app_pids: tuple[int, ...] = ()
    """The app replicas' processes that serve (a stopped replica left out)."""
    blob_admin_url: str = ""
    """The blob service itself, not through its proxy: for switching the size of its blobs."""
    app_cpus: frozenset[int] = frozenset()
    """The cores the app is pinned to (``ForumSetup.pin``; empty: not pinned). A noisy neighbour of the app
    goes there."""


BLOB_NAME = "blob"
"""The name the blob service is given at collection (``perfcast.io.resource_name``): ``location:blob=+20ms``."""


@contextlib.contextmanager
def deploy(
    setup: ForumSetup = ForumSetup(),
    applied: Applied = Applied(),
    *,
    spans: str | os.PathLike[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> Iterator[Deployment]:
    """Start the forum app with ``applied`` in force; stop every process and proxy on leaving the block.

    Parameters
    ----------
    setup, applied
        Today's deployment, and the scenario applied to it (the noisy neighbour of ``cpu_pct`` runs for as
        long as the block does).
    spans
        Run the app under the collector, writing this spans file (``NAME.rK.jsonl`` per replica when there
        are several). The spans are complete once the block has been left.
    log_dir
        Where the processes' logs go (default: a temporary directory, removed afterwards).
    on_step
        Called with a short text at each step, for status lines.

    Raises
    ------
    GroundTruthError
        A process did not start.
    """
    step = on_step or (lambda text: None)
    for name, url in (("redis", setup.redis_url), ("postgres", setup.postgres_url)):
        if not url and any(r == name for r, _ in applied.added_ms):
            raise GroundTruthError(f"added_ms names {name!r}, but the setup has no {name} URL")
    app_cpus, other_cpus = _cpu_split(setup.pin)
    with contextlib.ExitStack() as stack:
        if other_cpus:
            # This thread's mask is inherited by the proxy thread and by every child started from here.
            before = os.sched_getaffinity(0)
            os.sched_setaffinity(0, other_cpus)
            stack.callback(os.sched_setaffinity, 0, before)
        logs = Path(log_dir) if log_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="perfcast-gt-")))
        logs.mkdir(parents=True, exist_ok=True)
        proxies = _ProxyLoop()
        stack.callback(proxies.close)
        processes: list[_Process] = []

        def stop_all() -> None:
            # Every process is stopped even when stopping one is interrupted (a second Ctrl-C).
            first: BaseException | None = None
            for p in reversed(processes):
                try:
                    p.stop()
                except BaseException as exc:  # noqa: BLE001 - re-raised once the others are stopped
                    first = first or exc
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.proc.pid, signal.SIGKILL)
            if first is not None:
                raise first

        pipes: list[Any] = []

        def write_spans() -> None:
            # once the apps have exited (this runs after stop_all): their spooled spans to the spans files
            for pipe in pipes:
                pipe.finish(_STOP_TIMEOUT_S)

        stack.callback(write_spans)
        stack.callback(stop_all)
        delays = dict(applied.added_ms)
        step("starting the blob service")
        seed_args = ["--seed", str(setup.seed)] if setup.seed is not None else []
        blob = _Process("blobs", [sys.executable, "-m", "examples.forum.blobs", "--port", "0", *seed_args], logs)
        processes.append(blob)
        blob_url = blob.wait_listening()
        resources: dict[Resource, str] = {}
        by_resource: dict[Resource, LatencyProxy] = {}
        blob_proxy = by_resource["blob"] = proxies.start([_upstream(blob_url, "blob service")], delays.get("blob", 0.0))
        resources["blob"] = blob_proxy.address
        app_args = [
            "--blob-url", f"http://{blob_proxy.address}",
            "--replica-url", blob_url, "--replica-url", blob_url,
            "--payload-bytes", str(applied.payload_bytes if applied.payload_bytes is not None
                                   else setup.payload_bytes),
            *seed_args, *setup.app_args,
        ]
        for name, url, flag in (("redis", setup.redis_url, "--redis"), ("postgres", setup.postgres_url,
                                                                        "--postgres")):
            if url:
                proxy = by_resource[name] = proxies.start([_upstream(url, name)], delays.get(name, 0.0))
                resources[name] = proxy.address
                app_args += [flag, _via(url, proxy)]
        spans_files = _spans_files(spans, applied.app_replicas)
        app_urls: list[str] = []
        for r in range(applied.app_replicas):
            which, port = "", ["--port", "0"]
            if applied.app_replicas > 1:
                which = f" (replica {r + 1} of {applied.app_replicas})"
                # Replicas share one port and the kernel balances them (SO_REUSEPORT): a balancer of threads
                # in this process cost 0.8 ms of the post page's median and 2.7 of the index page's at 8 users
                # on one replica, and 5% of the throughput, beside the app on the same two cores
                port = ["--port", str(urlsplit(app_urls[0]).port if app_urls else 0), "--reuse-port"]
            step(f"starting the app{which}{' under the collector' if spans_files else ''}")
            env = None
            pass_fds: tuple[int, ...] = ()
            if spans_files:
                from collector._launcher import child_environment
                from collector._pipe import SpanPipe

                Path(spans_files[r]).unlink(missing_ok=True)
                env = child_environment(spans_files[r], service_name="forum",
                                        resource_names=f"{BLOB_NAME}=http://{blob_proxy.address}")
                env["PERFCAST_QUIET"] = "1"
                # As `perfcast collect` runs it: the app sends compact frames down a pipe and this process spools
                # them, so that encoding OTLP JSON (8x the CPU) does not hold the app's GIL against its loop.
                pipes.append(SpanPipe(spans_files[r]))
                pass_fds = pipes[-1].child_env(env)
            pin = ["taskset", "-c", ",".join(map(str, sorted(app_cpus)))] if app_cpus else []
            try:
                app = _Process(f"app{r}", [*pin, sys.executable, "-m", "examples.forum", *port, *app_args], logs, env,
                               pass_fds)
            finally:
                if pass_fds:
                    pipes[-1].started()  # the app holds the write end now: the spool ends when it exits
            processes.append(app)
            app_urls.append(app.wait_listening())
        url = app_urls[0]
        for r in range(applied.failed_replicas):
            step(f"stopping app replica {applied.app_replicas - r}: the kernel sends its connections to the others")
            processes[-1 - r].stop()
        if applied.cpu_pct > 0:
            step(f"starting a noisy neighbour taking {applied.cpu_pct:g} % of each core")
            stack.enter_context(CpuHog(applied.cpu_pct, cpus=frozenset(app_cpus)))
        serving = tuple(p.proc.pid for p in processes[1:] if p.proc.poll() is None)
        yield Deployment(url, f"http://{blob_proxy.address}", resources, tuple(spans_files), by_resource, serving,
                         blob_url, frozenset(app_cpus))
        step("stopping")


def measure(
    setup: ForumSetup = ForumSetup(),
    applied: Applied = Applied(),
    *,
    users: int = 1,
    requests: int = 300,
    max_duration_s: float = 60.0,
    warmup_requests: int = 20,
    paths: Sequence[str] = APP_PATHS,
    spans: str | os.PathLike[str] | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> GroundTruth:
    """Deploy the forum app with ``applied`` in force (:func:`deploy`), load it, return the latencies per route.

    Parameters
    ----------
    users
        Concurrent closed-loop users of the load client (in its own process).
    requests, max_duration_s
        The measured window ends after this many requests or this long, whichever comes first.
    warmup_requests
        Sent first and not measured (connections opened, caches filled).
    paths
        Requested uniformly at random; ``{n}`` is a random integer in 1..20.
    setup, applied, spans, log_dir, on_step
        As for :func:`deploy`.

    Raises
    ------
    GroundTruthError
        A process did not start, or the load client failed.
    """
    if users < 1 or requests < 1 or max_duration_s <= 0 or warmup_requests < 0:
        raise ValueError("users and requests must be >= 1, max_duration_s > 0, warmup_requests >= 0")
    step = on_step or (lambda text: None)
    with deploy(setup, applied, spans=spans, log_dir=log_dir, on_step=on_step) as d:
        step(f"loading it: {users} user{'s' if users > 1 else ''}, {requests} requests")
        for proxy in d.proxies.values():
            proxy.reset_lateness()  # from here: the load (warm-up included), not the start-up's connection set-up
        result, window, cpu_s = _load(d.url, users, requests, max_duration_s, warmup_requests, paths, setup.seed,
                                      d.app_pids)
        applied_delays = {name: p.applied_delay_ms() for name, p in d.proxies.items() if p.delay_ms > 0}
    return _truth(d, users, result, window, cpu_s, applied_delays, _requests(d.spans) if d.spans else [])


def measure_loaded(
    setup: ForumSetup,
    applied: Applied,
    *,
    users: int,
    requests: int,
    light_requests: int,
    blocks: int = 3,
    warmup_requests: int = 20,
    max_duration_s: float = 60.0,
    paths: Sequence[str] = APP_PATHS,
    levels: Sequence[int] = (),
    level_requests: int | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> tuple[list[GroundTruth], list[GroundTruth]]:
    """One user and ``users`` users taking turns in one deployment of the app without the collector.

    ``blocks`` pairs of a light phase (one user, ``light_requests`` measured requests) and a loaded phase (``users``
    users, ``requests`` measured after ``warmup_requests``), both to the serving replicas' port, the two in a random
    order in each pair (seeded by ``setup.seed``). Returns (the light phases, the loaded phases), one
    :class:`GroundTruth` each, client-side: the light phases calibrate a prediction of the loaded ones
    (``analyzer.loadsim.calibrate``), and this machine's speed drifts by more between two deployments a minute apart
    than a prediction may be off, so both are measured in one deployment, a few seconds apart.

    ``levels``: a light phase also runs that many users (each fewer than ``users``), ``level_requests`` measured
    requests each (default ``light_requests // 2``), right after its one-user run and to the same replica; the
    loop's CPU and preempted time and the host's busy CPU there go into its :attr:`GroundTruth.levels`
    (:func:`pooled_levels`).
    """
    if users < 2 or requests < 1 or light_requests < 1 or blocks < 1 or warmup_requests < 0:
        raise ValueError("need users >= 2, requests, light_requests and blocks >= 1, warmup_requests >= 0")
    if any(not 1 < n < users for n in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"levels must be distinct user counts between 1 and {users} (exclusive), got {list(levels)}")
    level_requests = max(light_requests // 2, 1) if level_requests is None else level_requests
    if level_requests < 1:
        raise ValueError(f"level_requests must be positive, got {level_requests}")
    step = on_step or (lambda text: None)
    rng = random.Random(setup.seed)
    lights: list[GroundTruth] = []
    truths: list[GroundTruth] = []
    with deploy(setup, applied, log_dir=log_dir, on_step=on_step) as d:
        for k in range(blocks):
            seed = None if setup.seed is None else setup.seed + k
            for loaded in rng.sample([False, True], 2):
                step(f"block {k + 1} of {blocks}: " + (f"{users} users, {requests} requests" if loaded else
                                                       f"1 user, {light_requests} requests"
                                                       + "".join(f", then {n} users" for n in sorted(levels))))
                result, window, cpu = _load(d.url, users if loaded else 1,
                                            requests if loaded else light_requests, max_duration_s,
                                            warmup_requests if loaded else min(warmup_requests, 5), paths, seed,
                                            d.app_pids)
                truth = _truth(d, users if loaded else 1, result, window, cpu, {}, [])
                if loaded:
                    truths.append(truth)
                    continue
                measured = []
                for n in sorted(levels):
                    at = _truth(d, n, *_load(d.url, n, level_requests, max_duration_s,
                                             min(warmup_requests, 5), paths, seed, d.app_pids), {}, [])
                    count = sum(len(v) for v in at.client_ms.values())
                    measured.append(LoopLevel(n, at.loop_cpu_ms, at.loop_preempted_ms, count, at.throughput_rps,
                                              at.host_cpu_ms[0]))
                lights.append(replace(truth, levels=tuple(measured)))
    return lights, truths


def pooled_light(lights: Sequence[GroundTruth]) -> tuple[float, float, dict[str, list[float]]]:
    """Light runs without the collector pooled, as ``analyzer.loadsim.calibrate`` takes them: (the CPU the app's
    loop was held for per request, the time it was preempted per request, the client-side latencies by route).
    Per-request figures are weighted by each run's requests; where a run did not measure the loop's CPU, the
    app's user and system CPU stand for it (one thread, the loop's)."""
    counts = [sum(len(v) for v in t.client_ms.values()) for t in lights]
    # getattr: runs pickled before GroundTruth had these fields (the accuracy benchmark's recordings)
    loop_ms = _weighted([getattr(t, "loop_cpu_ms", 0.0) or sum(t.app_cpu_ms) for t in lights], counts)
    preempted_ms = _weighted([getattr(t, "loop_preempted_ms", 0.0) for t in lights], counts)
    return loop_ms, preempted_ms, _by_route(t.client_ms for t in lights)


def _weighted(values: Iterable[float], weights: Sequence[int]) -> float:
    """The mean of ``values`` weighted by ``weights`` (requests), 0 where they hold none."""
    return sum(x * n for x, n in zip(values, weights, strict=True)) / max(sum(weights), 1)


def pooled_levels(lights: Sequence[GroundTruth]) -> list[tuple[int, float, float, float | None]]:
    """The light runs' :attr:`GroundTruth.levels` pooled by users, as ``analyzer.loadsim.calibrate`` takes them
    (``levels=``): (users, the loop's CPU per request, its preempted time per request, the host's busy CPU per
    request or None where a run did not read it), weighted by each run's requests at that level, users
    ascending; empty where no run measured a level."""
    by_users: dict[int, list[LoopLevel]] = {}
    for t in lights:
        for x in getattr(t, "levels", ()):  # getattr: runs pickled before GroundTruth had the field
            by_users.setdefault(x.users, []).append(x)
    out: list[tuple[int, float, float, float | None]] = []
    for n, xs in sorted(by_users.items()):
        counts = [x.requests for x in xs]
        host = [getattr(x, "host_cpu_ms", 0.0) for x in xs]
        out.append((n, _weighted((x.loop_cpu_ms for x in xs), counts), _weighted((x.preempted_ms for x in xs), counts),
                    _weighted(host, counts) if all(h > 0 for h in host) else None))
    return out


def _by_route(runs: Iterable[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """route -> the latencies of every run's mapping for it, pooled in the runs' order."""
    out: dict[str, list[float]] = {}
    for run in runs:
        for route, xs in run.items():
            out.setdefault(route, []).extend(xs)
    return out


def client_side_ms(runs: Sequence[GroundTruth]) -> dict[str, float]:
    """Per route, the time a request spent outside its server span over ``runs`` (collected runs, which have
    both sides), as ``analyzer.loadsim.calibrate`` takes it (``client_ms=``): the mean client-side latency less
    the mean server-side one, pooled over the runs' requests, at least 0."""
    client, server = _by_route(t.client_ms for t in runs), _by_route(t.server_ms for t in runs)
    return {route: max(sum(xs) / len(xs) - sum(server[route]) / len(server[route]), 0.0)
            for route, xs in client.items() if xs and server.get(route)}


def pooled_host(runs: Sequence[GroundTruth]) -> tuple[float, int] | None:
    """(the whole host's busy CPU per request over ``runs``, weighted by their requests, and the host's CPUs), as
    ``analyzer.loadsim.calibrate`` takes them (``host=``); None when a run did not read the host. The runs were
    measured on this machine (:func:`host_cpu_s`), so its CPUs are theirs."""
    counts = [sum(len(v) for v in t.client_ms.values()) for t in runs]
    # getattr: runs pickled before GroundTruth had the field (the accuracy benchmark's recordings)
    busy = [getattr(t, "host_cpu_ms", (0.0, 0.0))[0] for t in runs]
    if not runs or not all(b > 0 for b in busy) or sum(counts) < 1:
        return None
    return _weighted(busy, counts), os.cpu_count() or 1


def measure_paired(
    setup: ForumSetup,
    applied: Applied,
    *,
    requests: int = 300,
    blocks: int = 10,
    run: int = 6,
    settle: int = 1,
    warmup_requests: int = 20,
    max_duration_s: float = 60.0,
    paths: Sequence[str] = APP_PATHS,
    spans: str | os.PathLike[str],
    log_dir: str | os.PathLike[str] | None = None,
    on_step: Callable[[str], None] | None = None,
) -> tuple[list[GroundTruth], list[GroundTruth]]:
    """Today's deployment and the scenario, a few requests at a time, in one deployment of the app under the
    collector.

    One user sends ``requests`` measured requests of each side in ``blocks`` runs of the load client. Before
    each request the client asks this process which side it is on (``examples.forum.load``'s controller), and
    ``applied`` is switched on or off for it: the proxies' delays, the noisy neighbour resumed or paused, the
    blob service's stored blobs grown to ``payload_bytes`` or back. The sides take turns in runs of ``run``
    requests, a run of each in an order drawn at random (seeded by ``setup.seed``), so both sides are measured
    at the same moments, whatever the machine's speed does meanwhile; the first ``settle`` requests of each run
    are sent but not measured. Returns (today's blocks, the scenario's blocks): one :class:`GroundTruth` per run
    of the client and side, all naming the one spans file, each with the slices of time its side's measured
    requests ran in (:attr:`GroundTruth.slices_ns`).

    Why a few requests at a time: this machine's speed drifts from second to second, and two deployments of the
    same configuration differ by more than the sampling of their requests does (their processes land on other
    cores, other memory). Blocks of a few dozen requests taking turns in one deployment share the deployment
    but not the moment: scored against each other like a prediction, the first and the second half of one
    side's blocks were more than 5 % apart (median CDF deviation) on most of the accuracy benchmark's rows.
    Runs of a few requests share both. Why not one request at a time: a request carries the state the one before
    left. After a request of the location scenario, whose long waits leave the machine idle, today's post page
    took 2.22 ms at the median where after one of today's it took 1.82; the first request of each run, which
    follows the other side, is therefore not measured. Only what can be switched in a running deployment is
    paired: a delay per round trip, a CPU neighbour and the blobs' size (replicas need deployments of their
    own, :func:`measure`).

    Raises
    ------
    ValueError
        ``applied`` changes the replicas, or the counts are not positive.
    GroundTruthError
        As for :func:`measure`.
    """
    if applied.app_replicas > 1:
        raise ValueError("measure_paired switches delays, a CPU neighbour and the blobs' size; replicas need "
                         "deployments of their own (measure)")
    if blocks < 1 or requests < blocks or warmup_requests < 0 or max_duration_s <= 0:
        raise ValueError("need blocks >= 1, requests >= blocks, warmup_requests >= 0 and max_duration_s > 0")
    if not 0 <= settle < run:
        raise ValueError(f"need 0 <= settle < run, got settle={settle}, run={run}")
    step = on_step or (lambda text: None)
    per_block = requests // blocks
    runs: list[tuple[Any, _Switchboard, tuple[int, int], dict[Resource, float]]] = []
    with deploy(setup, spans=spans, log_dir=log_dir, on_step=on_step) as d, contextlib.ExitStack() as stack:
        delayed = [(d.proxies[name], ms) for name, ms in applied.added_ms]
        hog = None
        if applied.cpu_pct > 0:
            # the app's cores as the deployment pinned them: inside the deployment this thread runs on the others
            hog = stack.enter_context(CpuHog(applied.cpu_pct, cpus=d.app_cpus, seed=setup.seed))
            time.sleep(0.5)  # its processes start (spawned interpreters) before the first pause
            hog.pause()

        def switch(on: bool | None) -> None:
            on = bool(on)
            for proxy, ms in delayed:
                proxy.delay_ms = ms if on else 0.0
            if hog is not None:
                (hog.resume if on else hog.pause)()
            if applied.payload_bytes is not None:
                _blob_bytes(d.blob_admin_url, applied.payload_bytes if on else None)

        if warmup_requests:
            step(f"warming up: {warmup_requests} requests")
            _load(d.url, 1, warmup_requests, max_duration_s, 0, paths, setup.seed)
        for k in range(blocks):
            seed = None if setup.seed is None else setup.seed + k
            turns = _turns(per_block, run, settle, seed)
            step(f"block {k + 1} of {blocks}: {len(turns)} requests, today and the scenario taking turns "
                 f"{run} at a time")
            board = _Switchboard(lambda on, changed: switch(on) if changed else None, turns,
                                 lambda on, measured: _LABELS[bool(on), measured], d.app_pids)
            for proxy, _ in delayed:
                proxy.reset_lateness()
            try:
                result, window = board.drive(d.url, max_duration_s, paths, seed, d.app_pids)
            finally:
                switch(False)
            added = {name: d.proxies[name].applied_delay_ms() for name, _ in applied.added_ms}
            runs.append((result, board, window, added))
    recorded = _requests(d.spans)  # complete once the app has stopped
    bases: list[GroundTruth] = []
    truths: list[GroundTruth] = []
    for result, board, window, added in runs:
        for on, side in ((False, bases), (True, truths)):
            slices = board.slices(on)
            client: dict[str, list[float]] = {}
            for path, ms, label in zip(result.paths, result.latencies_ms, result.labels, strict=True):
                if label == _LABELS[on, True]:
                    client.setdefault(route_of(path), []).append(ms)
            server: dict[str, list[float]] = {}
            for req in recorded:
                if _in_slices(req, slices):
                    server.setdefault(req.route, []).append(req.latency_ms)
            n = sum(len(v) for v in client.values())
            elapsed_s = sum(b - a for a, b in slices) / 1e9
            cpu = board.cpu.get(on, [0.0] * 4)
            side.append(GroundTruth(
                server_ms={r: tuple(v) for r, v in server.items()},
                client_ms={r: tuple(v) for r, v in client.items()},
                resources=d.resources, users=1, throughput_rps=n / elapsed_s if elapsed_s > 0 else 0.0,
                errors=result.errors if on else 0, elapsed_s=elapsed_s, spans=d.spans, window_ns=window,
                error_examples=result.error_examples if on else (), applied_delay_ms=added if on else {},
                app_cpu_ms=(1e3 * cpu[0] / max(n, 1), 1e3 * cpu[1] / max(n, 1)),
                loop_cpu_ms=1e3 * cpu[2] / max(n, 1), loop_preempted_ms=1e3 * cpu[3] / max(n, 1),
                slices_ns=tuple(slices),
            ))
    return bases, truths


_LABELS = {(False, True): "today", (True, True): "scenario",
           (False, False): "today (settling)", (True, False): "scenario (settling)"}
"""(the scenario on, measured) -> the label the switchboard gives the load client's request."""


def _turns(per_side: int, run: int, settle: int, seed: int | None,
           sides: Sequence[Any] = (False, True)) -> list[tuple[Any, bool]]:
    """(side, measured) for each request of a block: runs of ``run`` requests, a run of each of ``sides`` in a
    random order, the first ``settle`` of each run not measured, until each side has ``per_side`` measured.

    Today's side is ``b`` / ``B`` below, the scenario's ``s`` / ``S``, capitals measured:

    >>> "".join(("sS" if on else "bB")[measured] for on, measured in _turns(5, 3, 1, seed=2))
    'bBBsSSbBBsSSbBsS'
    """
    rng = random.Random(seed)
    out: list[tuple[Any, bool]] = []
    left = per_side
    while left > 0:
        n = min(run - settle, left)
        for side in rng.sample(list(sides), len(sides)):
            out += [(side, i >= settle) for i in range(settle + n)]
        left -= n
    return out


class _Switchboard:
    """The load client's controller (``examples.forum.load --control``): for each request it takes the next of
    ``turns`` (side, measured), readies the side (``prepare(side, changed)``: switch the scenario when the side
    changed, or pause before the request), notes when, and answers with ``label(side, measured)``.

    The CPU the app's ``pids`` spent between two answers is charged to the side of the measured request that
    ran between them (:func:`cpu_s` and :func:`preempted_s`, read at each request: about 0.1 ms, before
    ``prepare``).
    """

    def __init__(self, prepare: Callable[[Any, bool], None], turns: Sequence[tuple[Any, bool]],
                 label: Callable[[Any, bool], str], pids: Sequence[int] = ()) -> None:
        self._prepare = prepare
        self.requests = len(turns)
        self._order = iter(turns)
        self._label = label
        self._pids = tuple(pids)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(60.0)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.marks: list[tuple[int, Any, bool]] = []
        """(``time.time_ns()`` once the side is ready, side, measured) before each request."""
        self.cpu: dict[Any, list[float]] = {}
        """side -> [user, system, loop, preempted] seconds of the app's processes during that side's requests."""
        self._end_ns: int | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="groundtruth-switchboard", daemon=True)
        self._thread.start()

    def _reading(self) -> tuple[tuple[float, float, float], tuple[float, int, int]] | None:
        return (cpu_s(self._pids), loop_switches(self._pids)) if self._pids else None

    def _charge(self, before: Any, after: Any) -> None:
        if before is None or after is None or not self.marks or not self.marks[-1][2]:
            return
        (cpu0, pre0), (cpu1, pre1) = before, after
        total = self.cpu.setdefault(self.marks[-1][1], [0.0] * 4)
        for i in range(3):
            total[i] += cpu1[i] - cpu0[i]
        total[3] += preempted_s(pre0, pre1)

    def _serve(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        last = None
        try:
            with conn, conn.makefile("rb") as lines:
                for line in lines:
                    if line.strip() != b"next":
                        raise GroundTruthError(f"the load client sent {line[:40]!r} to the switchboard")
                    side, measured = next(self._order, (None, False))
                    now = self._reading()
                    self._charge(last, now)
                    last = now
                    self._prepare(side, not self.marks or self.marks[-1][1] != side)
                    self.marks.append((time.time_ns(), side, measured))
                    conn.sendall(f"{self._label(side, measured)}\n".encode())
        except BaseException as exc:  # noqa: BLE001 - the load client sees the connection close; close() raises
            self._failure = exc
        finally:
            self._charge(last, self._reading())

    def drive(self, url: str, max_duration_s: float, paths: Sequence[str], seed: int | None,
              pids: Sequence[int] = ()) -> tuple[Any, tuple[int, int]]:
        """One run of the load client (one user) that asks this switchboard before each of its ``turns``; the
        load's result and its window (:func:`_load`). The switchboard is closed afterwards, whatever happens."""
        try:
            result, window, _ = _load(url, 1, self.requests, max_duration_s, 0, paths, seed, pids,
                                      control=self.address)
            self.close(window[1])
        finally:
            self.close(time.time_ns())
        return result, window

    def close(self, end_ns: int) -> None:
        """Stop serving (once the client is done); ``end_ns`` ends the last request's slice. Raises what the
        serving thread met."""
        if self._end_ns is None:
            self._end_ns = end_ns
            self._listener.close()
            self._thread.join(timeout=10)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise GroundTruthError(f"the switchboard failed: {failure}") from failure

    def slices(self, side: Any) -> list[tuple[int, int]]:
        """The slices of time of the measured requests of one side: from each mark to the next (or the end)."""
        ends = [m[0] for m in self.marks[1:]] + [self._end_ns if self._end_ns is not None else time.time_ns()]
        return [(t, end) for (t, s, measured), end in zip(self.marks, ends, strict=True)
                if s == side and measured]


def _in_slices(req: Any, slices: Sequence[tuple[int, int]]) -> bool:
    """Whether the request started in one of the (sorted, disjoint) slices: its own request's, as the
    switchboard marks each slice before the client sends the request."""
    i = bisect.bisect_right(slices, (req.start_ns, float("inf"))) - 1
    return i >= 0 and slices[i][0] <= req.start_ns < slices[i][1]


def _blob_bytes(admin_url: str, size: int | None) -> None:
    """Set (or, with None, clear) the size of every blob the blob service serves (``/admin/blob-bytes``)."""
    request = urllib.request.Request(f"{admin_url}/admin/blob-bytes", method="DELETE" if size is None else "PUT",
                                     data=None if size is None else str(size).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
    except OSError as exc:
        raise GroundTruthError(f"the blob service at {admin_url} did not take the blob size {size}: {exc}") from None


def _truth(d: Deployment, users: int, result: Any, window: tuple[int, int],
           cpu: tuple[float, float, float, float, int, float, float],
           applied_delays: Mapping[Resource, float], recorded: Sequence[Any]) -> GroundTruth:
    """A load's result as a :class:`GroundTruth`, its server-side latencies from the ``recorded`` requests."""
    client: dict[str, list[float]] = {}
    for path, ms in zip(result.paths, result.latencies_ms, strict=True):
        client.setdefault(route_of(path), []).append(ms)
    server: dict[str, list[float]] = {}
    for req in recorded:
        if _inside(req, window):
            server.setdefault(req.route, []).append(req.latency_ms)
    n = len(result.latencies_ms)
    return GroundTruth(
        server_ms={r: tuple(v) for r, v in server.items()},
        client_ms={r: tuple(v) for r, v in client.items()},
        resources=d.resources, users=users, throughput_rps=result.throughput_rps, errors=result.errors,
        elapsed_s=result.elapsed_s, spans=d.spans, window_ns=window, error_examples=result.error_examples,
        applied_delay_ms=dict(applied_delays), app_cpu_ms=(1e3 * cpu[0] / n, 1e3 * cpu[1] / n),
        loop_cpu_ms=1e3 * cpu[2] / n, loop_preempted_ms=1e3 * cpu[3] / n, loop_wakeups=cpu[4] / n,
        host_cpu_ms=(1e3 * cpu[5] / n, 1e3 * cpu[6] / n),
    )


IDLE_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0)
"""Pauses (ms) before each request of a wake-up profile of the app (:func:`measure_idle`)."""


@dataclass(frozen=True, slots=True)
class IdleRun:
    """What :func:`measure_idle` measured, by pause (ms)."""

    requests: dict[float, list[Any]]
    """The requests (``analyzer.spans.Request``) from the spans: server-side."""
    client_ms: dict[float, list[float]]
    """The load client's latencies of the same requests: they also hold the app's reading and parsing of each
    request, before its server span starts, where an app woken from idle warms up unseen by the spans."""
    every: list[Any]
    """Every request the spans recorded, the warm-ups' too (a service's idle before a call runs from the call
    to it before, whichever request made that one)."""


def measure_idle(
    setup: ForumSetup,
    idle_ms: Sequence[float],
    *,
    requests: int = 100,
    rounds: int = 2,
    run: int = 6,
    settle: int = 1,
    path: str = "/post/{n}",
    spans: str | os.PathLike[str],
    on_step: Callable[[str], None] | None = None,
) -> IdleRun:
    """The requests for ``path`` sent one at a time, each after a pause of one of ``idle_ms``, by pause: the data
    of wake-up profiles (:func:`analyzer.wakeup.add_wake_profiles`; ``spans`` and ``IdleRun.every`` hold the
    warm-ups' too).

    One deployment of the app under the collector; ``requests`` measured requests per pause, in ``rounds`` runs
    of the load client. The pauses take turns a few requests at a time, as :func:`measure_paired`'s sides do
    (runs of ``run`` requests after the same pause, each pause's run in a random order, the first ``settle`` of
    each run not measured): a wake-up profile is the difference between pauses, and blocks of a hundred
    requests per pause, one pause after the other, had the machine's drift between them. The pause is taken
    by this process before it answers the client's question, so the app idles for the pause plus the question's
    round trip (about 0.2 ms, the same for every pause).
    """
    if not idle_ms or rounds < 1 or requests < rounds:
        raise ValueError("idle_ms must not be empty, rounds >= 1 and requests >= rounds")
    if not 0 <= settle < run:
        raise ValueError(f"need 0 <= settle < run, got settle={settle}, run={run}")
    step = on_step or (lambda text: None)
    levels = sorted({float(g) for g in idle_ms})
    boards: list[tuple[Any, _Switchboard]] = []
    with deploy(setup, spans=spans, on_step=on_step) as d:
        _load(d.url, 1, 5, 60.0, 0, (path,), setup.seed)  # warm-up
        for k in range(rounds):
            seed = None if setup.seed is None else setup.seed + k
            turns = _turns(requests // rounds, run, settle, seed, levels)
            step(f"round {k + 1} of {rounds}: {len(turns)} requests after pauses of "
                 f"{', '.join(f'{g:g}' for g in levels)} ms, taking turns {run} at a time")
            board = _Switchboard(lambda gap, changed: time.sleep(gap / 1000) if gap else None, turns,
                                 lambda gap, measured: f"{gap:g}" if measured else "settling")
            result, _ = board.drive(d.url, 120.0, (path,), seed)
            boards.append((result, board))
    recorded = _requests(d.spans)  # read once, split by slices
    client: dict[float, list[float]] = {g: [] for g in levels}
    for result, _ in boards:
        for ms, label in zip(result.latencies_ms, result.labels, strict=True):
            if label != "settling":
                client[float(label)].append(ms)
    slices = {g: [board.slices(g) for _, board in boards] for g in levels}
    by_gap = {g: [r for r in recorded if any(_in_slices(r, s) for s in slices[g])] for g in levels}
    return IdleRun(by_gap, client, recorded)


def _spans_files(spans: str | os.PathLike[str] | None, replicas: int) -> list[str]:
    if spans is None:
        return []
    path = Path(spans)
    if replicas == 1:
        return [str(path)]
    return [str(path.with_name(f"{path.stem}.r{r}{path.suffix or '.jsonl'}")) for r in range(replicas)]


def _load(url: str, users: int, requests: int, max_duration_s: float, warmup: int, paths: Sequence[str],
          seed: int | None, pids: Sequence[int] = (), think_ms: float = 0.0,
          control: str | None = None
          ) -> tuple[Any, tuple[int, int], tuple[float, float, float, float, int, float, float]]:
    """(the load's result, its wall-clock window, the (user, system, loop) CPU seconds ``pids`` spent in it, the
    seconds their loops were preempted (:func:`preempted_s`), the times they went to sleep (their voluntary
    switches, :func:`loop_switches`) and the host's busy and steal CPU seconds (:func:`host_cpu_s`));
    ``control``: the load client's controller."""
    from examples.forum.load import run_load_subprocess

    try:
        if warmup:
            run_load_subprocess(url, users=users, requests=warmup, paths=tuple(paths), seed=seed)
        cpu0, pre0, host0 = cpu_s(pids), loop_switches(pids), host_cpu_s()
        begin = time.time_ns()
        result = run_load_subprocess(url, users=users, requests=requests, duration_s=max_duration_s,
                                     paths=tuple(paths), seed=None if seed is None else seed + 1,
                                     think_ms=think_ms, control=control)
        end = time.time_ns()
        cpu1, pre1, host1 = cpu_s(pids), loop_switches(pids), host_cpu_s()
    except RuntimeError as exc:
        raise GroundTruthError(str(exc)) from None
    if not result.latencies_ms:
        raise GroundTruthError(f"no request succeeded: {'; '.join(result.error_examples) or 'no answer'}")
    # the host's CPU over the client's own run where it read it: around its process, the client's start-up
    # (about 0.35 s of CPU) was 1.7 ms of every request of a run of 200
    host = result.host_cpu_s if result.host_cpu_s[0] > 0 else (host1[0] - host0[0], host1[1] - host0[1])
    return result, (begin, end), (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], cpu1[2] - cpu0[2], preempted_s(pre0, pre1),
                                  pre1[1] - pre0[1], host[0], host[1])


def host_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole host so far, summed over its cores (psutil, ``/proc/stat``).

    Read as the collector reads the host into its ``process`` spans (:func:`collector._process.host_cpu_ns`);
    steal is time the hypervisor ran another guest on a vCPU that had work.
    """
    from collector._process import host_cpu_ns

    busy, steal = host_cpu_ns()
    return busy / 1e9, steal / 1e9


def cpu_s(pids: Sequence[int]) -> tuple[float, float, float]:
    """(user, system, loop) CPU seconds the processes ``pids`` have spent so far, each process read once.

    ``loop`` is what their event loops (each run by its process's main thread) have been held for. Every
    thread's user time: a thread runs Python code only while it holds the GIL, which the loop needs too. The
    main thread's system time: the loop's own syscalls (``send``, ``recv``, ``epoll_wait``) release the GIL but
    not the loop, which waits for them. Other threads' system time runs beside the loop (a database driver's
    worker thread in its syscalls). psutil reads both from ``/proc``; a process's user time includes that of
    its threads that have ended. ``/proc`` gives no snapshot of a process and its thread together, so a clock
    tick can fall between the two reads: the main thread's system time is capped at the process's.

    Those times come in clock ticks of 10 ms: over a light run of 100 requests, 0.1 ms of a loop's 3.5-5 ms per
    request, which the calibration of a load prediction scales the loop's demand by. The main thread's own time
    on a CPU (user and system) is therefore read exact, in nanoseconds, from ``/proc/PID/task/PID/schedstat``
    where there is one, and only the other threads' user time in ticks (the example app's are idle).
    """
    import psutil  # type: ignore[import-untyped]

    user = system = loop = 0.0
    for pid in pids:
        process = psutil.Process(pid)
        times = process.cpu_times()
        main = next((t for t in process.threads() if t.id == pid), None)
        user, system = user + times.user, system + times.system
        exact = _schedstat_s(pid)
        if exact is not None and main is not None:
            loop += exact[0] + max(times.user - main.user_time, 0.0)
        else:
            loop += times.user + (min(main.system_time, times.system) if main is not None else 0.0)
    return user, system, loop


def _schedstat_s(pid: int) -> tuple[float, float] | None:
    """(seconds the main thread of ``pid`` has run on a CPU, user and system; seconds it has waited on a run
    queue) so far, from ``/proc/PID/task/PID/schedstat`` (nanoseconds), or None where there is none."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def loop_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds the event loops of ``pids`` have been held so far (:func:`cpu_s`)."""
    return cpu_s(pids)[2]


def loop_switches(pids: Sequence[int]) -> tuple[float, int, int]:
    """(seconds waiting to run, voluntary switches, involuntary switches) of the main threads of ``pids`` so far.

    ``/proc/PID/task/PID/schedstat`` gives the thread's time on a run queue; ``sched`` its switches, voluntary
    (it slept: in ``epoll_wait``) and involuntary (another thread took its core). Zeros where ``/proc`` has no
    such files (not Linux, or no schedstats) or the process is gone.
    """
    wait = 0.0
    voluntary = involuntary = 0
    for pid in pids:
        stat = _schedstat_s(pid)
        if stat is None:
            continue
        try:
            counts: dict[str, int] = {}
            with open(f"/proc/{pid}/task/{pid}/sched") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name.strip() in ("nr_voluntary_switches", "nr_involuntary_switches"):
                        counts[name.strip()] = int(float(value))
        except (OSError, ValueError):
            continue
        wait += stat[1]
        voluntary += counts.get("nr_voluntary_switches", 0)
        involuntary += counts.get("nr_involuntary_switches", 0)
    return wait, voluntary, involuntary


def preempted_s(before: tuple[float, int, int], after: tuple[float, int, int]) -> float:
    """Seconds the loops spent preempted between two :func:`loop_switches` readings: ready to run while another
    thread held their core, time the loop had work and could not do it.

    The wait after a wake-up is already in the recorded durations of the calls it ends, so only the involuntary
    switches' share of the wait is counted, on the estimate that their waits are alike (the kernel does not
    split the sum).

    >>> preempted_s((1.0, 10, 10), (1.5, 12, 18))
    0.4
    """
    wait, voluntary, involuntary = (b - a for a, b in zip(before, after, strict=True))
    switches = voluntary + involuntary
    return max(wait, 0.0) * involuntary / switches if switches > 0 else 0.0


def _requests(files: Sequence[str]) -> list[Any]:
    """The requests recorded in ``files``; a missing file (a replica stopped before it served anything) is
    skipped."""
    from analyzer.spans import read_spans

    return [req for path in files if Path(path).is_file() for req in read_spans(path).requests]


def _inside(req: Any, window: tuple[int, int]) -> bool:
    return window[0] <= req.start_ns and req.end_ns <= window[1]


def _measured_by(req: Any, truth: GroundTruth) -> bool:
    return _in_slices(req, truth.slices_ns) if truth.slices_ns else _inside(req, truth.window_ns)


def measured_requests(requests: Iterable[Any], truths: Sequence[GroundTruth]) -> list[Any]:
    """The ``requests`` (``analyzer.spans.Request``) measured by one of ``truths``: inside its window, and in
    one of its slices when it has them; the warm-ups, and the other side of a paired run, left out."""
    return [r for r in requests if any(_measured_by(r, t) for t in truths)]
