"""Host and process utilisation over a window, from cumulative counters read with psutil.

A monitor reads *cumulative* counters (CPU seconds busy and total, disk busy time, bytes sent and received) at
the start and at the end of a window; the utilisation over the window is the difference divided by the elapsed
time. Counters rather than sampled percentages make the window exact whatever its length, and let a remote
host's agent serve them without knowing the window (``GET /metrics``, see :mod:`replayer.agent`).

* :func:`read_host_counters` reads this host (psutil); :class:`LocalMonitor` does it off the event loop, and
  :class:`AgentMonitor` fetches another host's counters from its agent.
* :func:`host_utilisation` turns two readings into a :class:`HostUtilisation`: CPU (busy cores of all cores),
  disks (busy disks of all whole disks), network (bytes per second, and the link bandwidth when known).
* :func:`read_process_counters` and :func:`process_utilisation` do the same for a process and its children,
  a better source of an application's CPU demand when other programs (the load generator) share the host.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

import aiohttp
import psutil

__all__ = [
    "METRICS_FORMAT",
    "AgentMonitor",
    "HostCounters",
    "HostMonitor",
    "HostUtilisation",
    "LocalMonitor",
    "MonitorError",
    "ProcessCounters",
    "ProcessTarget",
    "ProcessUtilisation",
    "host_utilisation",
    "pid_listening_on",
    "process_utilisation",
    "read_host_counters",
    "read_process_counters",
    "sample",
]

METRICS_FORMAT = "perfcast-metrics/1"
"""The ``format`` tag of an agent's ``GET /metrics`` answer."""

# CPU time fields psutil reports that are not work: idle and waiting for I/O (the CPU could run something else).
_IDLE_FIELDS = frozenset({"idle", "iowait"})
# guest time is already counted in user time on Linux; adding it would count it twice.
_SKIP_FIELDS = frozenset({"guest", "guest_nice"})
# Block devices that are not disks: loop devices, RAM disks, compressed swap in RAM.
_NOT_DISKS = ("loop", "ram", "zram")


class MonitorError(Exception):
    """A host's counters could not be read: its agent did not answer, answered an error, or sent bad metrics.

    The message names the agent (its URL) and, for malformed metrics, the field.
    """


@dataclass(frozen=True, slots=True)
class HostCounters:
    """Cumulative counters of one host at one instant (what an agent's ``/metrics`` serves)."""

    host: str
    """Host name, used to name its stations (``<host>-cpu``, ``<host>-disk``)."""
    time_s: float
    """Monotonic clock of that host, seconds; only differences between two readings of one host are used."""
    cpu_count: int
    """Logical CPUs: the servers of the ``<host>-cpu`` station."""
    cpu_busy_s: float
    """CPU seconds spent working (not idle, not waiting for I/O), summed over all CPUs."""
    cpu_total_s: float
    """CPU seconds of any kind, summed over all CPUs."""
    disk_count: int
    """Whole disks (partitions, loop devices and RAM disks left out): the servers of ``<host>-disk``."""
    disk_busy_s: float
    """Seconds during which a disk had I/O in flight, summed over the disks (0 where the OS does not say)."""
    disk_read_bytes: int
    disk_write_bytes: int
    net_bytes_sent: int
    """Bytes sent on all interfaces but loopback."""
    net_bytes_recv: int
    net_speed_bytes_per_s: float
    """Summed link speed of the interfaces that are up and report one; 0 when unknown (virtual NICs)."""

    def to_json(self) -> dict[str, Any]:
        return {"format": METRICS_FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any, source: str) -> HostCounters:
        """Parse an agent's answer; ``source`` (the URL) is named in errors."""
        if not isinstance(data, Mapping):
            raise MonitorError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != METRICS_FORMAT:
            raise MonitorError(f"{source}: field 'format': expected {METRICS_FORMAT!r}, got {data.get('format')!r}")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                raise MonitorError(f"{source}: field '{f.name}': missing")
            value = data[f.name]
            if f.type == "str":
                if not isinstance(value, str) or not value:
                    raise MonitorError(f"{source}: field '{f.name}': expected a non-empty string, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
                or (f.type == "int" and not isinstance(value, int))
            ):
                raise MonitorError(f"{source}: field '{f.name}': expected a non-negative {f.type}, got {value!r}")
            values[f.name] = value
        return cls(**values)


def _whole_disks(names: list[str]) -> list[str]:
    sys_block = "/sys/block"
    if os.path.isdir(sys_block):
        # a whole disk has /sys/block/<name>/device; partitions are not in /sys/block at all
        return [n for n in names if os.path.exists(f"{sys_block}/{n}/device") and not n.startswith(_NOT_DISKS)]
    return [n for n in names if not n.startswith(_NOT_DISKS)]


def read_host_counters(host: str | None = None) -> HostCounters:
    """Read this host's cumulative CPU, disk and network counters (blocking; fast: reads /proc on Linux).

    Parameters
    ----------
    host : str, optional
        Name to give the host; defaults to ``socket.gethostname()``.
    """
    cpu = psutil.cpu_times()._asdict()
    busy = sum(v for k, v in cpu.items() if k not in _IDLE_FIELDS and k not in _SKIP_FIELDS)
    total = sum(v for k, v in cpu.items() if k not in _SKIP_FIELDS)
    per_disk = psutil.disk_io_counters(perdisk=True) or {}
    disks = [per_disk[name] for name in _whole_disks(sorted(per_disk))]
    nics = psutil.net_io_counters(pernic=True) or {}
    stats = psutil.net_if_stats()
    real_nics = [name for name in nics if not (name in stats and "loopback" in (stats[name].flags or ""))]
    real_nics = [name for name in real_nics if name != "lo"]
    speed_mbit = sum(stats[n].speed for n in real_nics if n in stats and stats[n].isup and stats[n].speed > 0)
    return HostCounters(
        host=host or socket.gethostname(),
        time_s=time.monotonic(),
        cpu_count=psutil.cpu_count() or 1,
        cpu_busy_s=float(busy),
        cpu_total_s=float(total),
        disk_count=len(disks),
        disk_busy_s=sum(getattr(d, "busy_time", 0) for d in disks) / 1000.0,
        disk_read_bytes=sum(d.read_bytes for d in disks),
        disk_write_bytes=sum(d.write_bytes for d in disks),
        net_bytes_sent=sum(nics[n].bytes_sent for n in real_nics),
        net_bytes_recv=sum(nics[n].bytes_recv for n in real_nics),
        net_speed_bytes_per_s=speed_mbit * 1e6 / 8,
    )


@dataclass(frozen=True, slots=True)
class HostUtilisation:
    """Utilisation of one host over a window: the difference of two :class:`HostCounters`."""

    host: str
    elapsed_s: float
    cpu_servers: int
    cpu_busy_servers: float
    """Mean number of busy CPUs (0..cpu_servers)."""
    disk_servers: int
    disk_busy_servers: float
    """Mean number of disks with I/O in flight (0..disk_servers)."""
    disk_read_bytes_per_s: float
    disk_write_bytes_per_s: float
    net_tx_bytes_per_s: float
    net_rx_bytes_per_s: float
    net_bandwidth_bytes_per_s: float
    """Link bandwidth (0 when unknown): utilisation of the network is bytes per second over this."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def host_utilisation(start: HostCounters, end: HostCounters) -> HostUtilisation:
    """Utilisation of a host between two readings of its counters.

    CPU busy servers are ``cpu_count * d(busy) / d(total)``: a ratio of the host's own CPU clocks, so it does
    not depend on the monitor's clock. Disk busy servers are ``d(busy time) / d(time)`` (the OS counts the time
    each disk had a request in flight, the ``%util`` of iostat).

    Raises
    ------
    MonitorError
        If the readings are of different hosts or the second is not later than the first.
    """
    if start.host != end.host:
        raise MonitorError(f"readings of two hosts: {start.host!r} and {end.host!r}")
    elapsed = end.time_s - start.time_s
    if elapsed <= 0:
        raise MonitorError(f"host {end.host!r}: field 'time_s': second reading is not later than the first")
    d_total = end.cpu_total_s - start.cpu_total_s
    d_busy = end.cpu_busy_s - start.cpu_busy_s
    cpu_busy = end.cpu_count * min(1.0, max(0.0, d_busy / d_total)) if d_total > 0 else 0.0
    disk_busy = min(float(end.disk_count), max(0.0, (end.disk_busy_s - start.disk_busy_s) / elapsed))
    return HostUtilisation(
        host=end.host,
        elapsed_s=elapsed,
        cpu_servers=end.cpu_count,
        cpu_busy_servers=cpu_busy,
        disk_servers=end.disk_count,
        disk_busy_servers=disk_busy,
        disk_read_bytes_per_s=max(0, end.disk_read_bytes - start.disk_read_bytes) / elapsed,
        disk_write_bytes_per_s=max(0, end.disk_write_bytes - start.disk_write_bytes) / elapsed,
        net_tx_bytes_per_s=max(0, end.net_bytes_sent - start.net_bytes_sent) / elapsed,
        net_rx_bytes_per_s=max(0, end.net_bytes_recv - start.net_bytes_recv) / elapsed,
        net_bandwidth_bytes_per_s=end.net_speed_bytes_per_s,
    )


class HostMonitor(Protocol):
    """Something that reads one host's counters: :class:`LocalMonitor` or :class:`AgentMonitor`."""

    @property
    def name(self) -> str: ...

    async def read(self) -> HostCounters: ...


class LocalMonitor:
    """Reads this host's counters with psutil, in a worker thread so the event loop is never blocked."""

    def __init__(self, host: str | None = None) -> None:
        self._host = host or socket.gethostname()

    @property
    def name(self) -> str:
        return self._host

    async def read(self) -> HostCounters:
        return await asyncio.to_thread(read_host_counters, self._host)


class AgentMonitor:
    """Reads a remote host's counters from its agent's ``GET /metrics``.

    Parameters
    ----------
    url : str
        The agent's base URL, e.g. ``http://10.0.0.5:9464``.
    session : aiohttp.ClientSession
        Session to use (owned by the caller).
    host : str, optional
        Name for the host's stations instead of the one the agent reports.
    timeout_s : float
        How long to wait for an answer before calling the agent unresponsive.
    """

    def __init__(
        self, url: str, session: aiohttp.ClientSession, host: str | None = None, timeout_s: float = 5.0
    ) -> None:
        self.url = url.rstrip("/")
        self._session = session
        self._host = host
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    @property
    def name(self) -> str:
        return self._host or self.url

    async def read(self) -> HostCounters:
        metrics_url = f"{self.url}/metrics"
        try:
            async with self._session.get(metrics_url, timeout=self._timeout) as response:
                if response.status != 200:
                    raise MonitorError(f"agent {metrics_url} answered HTTP {response.status}")
                data = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MonitorError(f"agent {metrics_url} is not answering: {exc or type(exc).__name__}") from exc
        except ValueError as exc:
            raise MonitorError(f"agent {metrics_url} sent invalid JSON: {exc}") from exc
        counters = HostCounters.from_json(data, metrics_url)
        if self._host is not None:
            return _renamed(counters, self._host)
        return counters


def _renamed(counters: HostCounters, host: str) -> HostCounters:
    values = asdict(counters)
    values["host"] = host
    return HostCounters(**values)


async def sample(monitor: HostMonitor, window_s: float) -> HostUtilisation:
    """Utilisation of a host over the next ``window_s`` seconds."""
    if window_s <= 0:
        raise ValueError(f"`window_s` must be positive, got {window_s!r}")
    start = await monitor.read()
    await asyncio.sleep(window_s)
    return host_utilisation(start, await monitor.read())


@dataclass(frozen=True, slots=True)
class ProcessTarget:
    """A process to measure, with its children: the ``<label>-cpu`` station."""

    label: str
    pid: int
    servers: int | None = None
    """CPUs it can use at once; ``None``: estimated (see :func:`process_utilisation`)."""
    also: tuple[int, ...] = ()
    """More processes (each with its children) measured with ``pid`` as one station, e.g. the database
    backends that serve one application's connection pool."""


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """Cumulative CPU time of a process and its children, per PID, at one instant."""

    label: str
    """Name of the process station (``<label>-cpu``)."""
    pid: int
    time_s: float
    cpu_s_by_pid: dict[int, float] = field(hash=False)
    """User + system CPU seconds of each live process of the tree (the process and its descendants)."""
    wait_s_by_pid: dict[int, float] | None = field(hash=False)
    """Seconds the threads of each process spent runnable but waiting for a CPU (Linux schedstat); None where
    the OS does not say."""
    parallelism: int
    """Threads that can run at once in the tree: each Python process counts once (the GIL), any other process
    counts its threads."""


def _is_python(proc: psutil.Process) -> bool:
    return bool(proc.name().lower().startswith(("python", "pypy")))


def _runqueue_wait_s(proc: psutil.Process) -> float | None:
    """Run-queue wait of all threads of ``proc``: field 2 of /proc/PID/task/TID/schedstat (nanoseconds).

    psutil does not expose it; it is the time a thread was ready to run while every CPU was taken.
    """
    total_ns = 0
    try:
        for thread in proc.threads():
            with open(f"/proc/{proc.pid}/task/{thread.id}/schedstat", encoding="ascii") as f:
                total_ns += int(f.read().split()[1])
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{proc.pid}/schedstat"):
            return None  # not Linux, or no schedstats in this kernel
        # a thread ended between listing and reading: its wait is lost, as at any later reading
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    return total_ns / 1e9


def read_process_counters(pid: int, label: str | None = None, also: Sequence[int] = ()) -> ProcessCounters:
    """Read the CPU time of process ``pid`` and of its descendants (blocking; fast).

    ``also`` lists more processes whose trees are counted with it.

    Raises
    ------
    MonitorError
        If there is no such process or it may not be inspected.
    """
    tree: dict[int, psutil.Process] = {}
    for root_pid in (pid, *also):
        try:
            root = psutil.Process(root_pid)
            tree |= {p.pid: p for p in (root, *root.children(recursive=True))}
            if root_pid == pid:
                name = label or f"{root.name()}-{pid}"
        except (psutil.NoSuchProcess, psutil.AccessDenied) as exc:
            raise MonitorError(f"process {root_pid}: cannot be read: {exc}") from exc
    cpu: dict[int, float] = {}
    wait: dict[int, float] | None = {}
    parallelism = 0
    for proc in tree.values():
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu[proc.pid] = times.user + times.system
                parallelism += 1 if _is_python(proc) else proc.num_threads()
                waited = _runqueue_wait_s(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a child that exited meanwhile: its time is lost, as it would be at the next reading
        if wait is not None and waited is not None:
            wait[proc.pid] = waited
        else:
            wait = None
    if pid not in cpu:
        raise MonitorError(f"process {pid}: exited")
    return ProcessCounters(
        label=name, pid=pid, time_s=time.monotonic(), cpu_s_by_pid=cpu, wait_s_by_pid=wait, parallelism=parallelism
    )


@dataclass(frozen=True, slots=True)
class ProcessUtilisation:
    """CPU use of a process tree over a window."""

    label: str
    pid: int
    elapsed_s: float
    servers: int
    """CPUs the tree can use at once."""
    busy_servers: float
    """Mean number of CPUs busy for the tree (CPU seconds per second)."""
    runqueue_wait_servers: float | None = None
    """Mean number of the tree's threads ready to run but waiting for a CPU (None where unknown). Added to
    ``busy_servers`` it is the tree's occupancy on a host where other programs take CPU from it."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def process_utilisation(
    start: ProcessCounters, end: ProcessCounters, servers: int | None = None
) -> ProcessUtilisation:
    """CPU use of a process tree between two readings.

    Unless ``servers`` is given, the tree's servers are its parallelism (a Python process is one server
    whatever its threads, as the GIL lets one run at a time; others count their threads), at most the CPUs this
    host lets it run on. A process born during the window counts all its CPU time; one that exited during it
    loses the time it used in the window (its counters are gone), so short-lived children are under-counted.
    """
    elapsed = end.time_s - start.time_s
    if elapsed <= 0:
        raise MonitorError(f"process {end.pid}: field 'time_s': second reading is not later than the first")
    used = sum(max(0.0, cpu - start.cpu_s_by_pid.get(pid, 0.0)) for pid, cpu in end.cpu_s_by_pid.items())
    waited = None
    if start.wait_s_by_pid is not None and end.wait_s_by_pid is not None:
        before = start.wait_s_by_pid
        waited = sum(max(0.0, w - before.get(pid, 0.0)) for pid, w in end.wait_s_by_pid.items()) / elapsed
    return ProcessUtilisation(
        label=end.label,
        pid=end.pid,
        elapsed_s=elapsed,
        servers=servers or max(1, min(end.parallelism, _cpus_available())),
        busy_servers=used / elapsed,
        runqueue_wait_servers=waited,
    )


def _cpus_available() -> int:
    try:
        return len(psutil.Process().cpu_affinity() or []) or (psutil.cpu_count() or 1)
    except (AttributeError, psutil.Error):  # no cpu_affinity on macOS
        return psutil.cpu_count() or 1


def pid_listening_on(port: int) -> int | None:
    """PID of the process listening on TCP ``port`` on this host, or None (not found, or not allowed to see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None
