"""A load client for the forum (or any HTTP service): closed- or open-loop, per-request latencies.

Closed loop: ``users`` concurrent users, each sending its next request when the previous one answers (plus
an optional think time). Open loop: requests arrive as a Poisson process at ``rate_rps`` whatever the answers,
at most ``users`` in flight; a request's latency then counts from its scheduled arrival, so a server that
falls behind is charged for the queueing it causes (no coordinated omission).

Closed loop with one user and a *control* address: before each request the client asks a controller (a line
``next``, answered by a line naming a label) and tags the request with the label. A ground-truth harness uses
it to switch a what-if scenario on or off between requests (``replayer.groundtruth.measure_paired``), so that
both sides of a comparison are measured at the same moments.

Library use::

    result = await run_load("http://127.0.0.1:8080", users=16, duration_s=10)
    result.throughput_rps, result.percentile_ms(50)

or, to keep the client's CPU off the server's process, :func:`run_load_subprocess` (same arguments), which
runs ``python -m examples.forum.load --json`` and parses its output. Command line::

    python -m examples.forum.load --url http://127.0.0.1:8080 --users 16 --duration 10 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

__all__ = ["DEFAULT_PATHS", "LoadResult", "main", "run_load", "run_load_subprocess"]

DEFAULT_PATHS: tuple[str, ...] = ("/?page={n}",)
"""Paths requested by default; ``{n}`` is replaced by a random integer in ``1..n_max`` for each request."""

_MAX_ERROR_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one load run measured."""

    latencies_ms: tuple[float, ...]
    """Latency of each successful request (status < 400) sent after the warm-up and answered before the end
    of the measured window, in completion order."""
    paths: tuple[str, ...]
    """The path of each successful request, aligned with ``latencies_ms``."""
    errors: int
    """Requests that failed (status >= 400, a connection error or a client timeout)."""
    error_examples: tuple[str, ...]
    """The first few errors, as text."""
    elapsed_s: float
    """Length of the measured window (after the warm-up)."""
    users: int
    mode: str
    """``closed`` or ``open``."""
    labels: tuple[str, ...] = ()
    """With a controller: the label it gave each successful request, aligned with ``latencies_ms``."""
    host_cpu_s: tuple[float, float] = (0.0, 0.0)
    """(busy, steal) CPU seconds of the whole host over the client's run, its start-up and shut-down left out
    (``collector._process.host_cpu_ns``); zeros where ``/proc/stat`` could not be read. The client's start-up
    alone takes about 0.35 s of CPU: read around its process, it was 1.7 ms of every request of a run of 200."""

    @property
    def throughput_rps(self) -> float:
        """Successful requests per second over the measured window."""
        return len(self.latencies_ms) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of the latencies, nearest-rank; NaN when there are none."""
        if not 0 <= q <= 100:
            raise ValueError(f"q must be between 0 and 100, got {q}")
        if not self.latencies_ms:
            return math.nan
        ordered = sorted(self.latencies_ms)
        return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (with the derived throughput and percentiles, for readers)."""
        out = asdict(self)
        out["throughput_rps"] = self.throughput_rps
        for q in (50, 90, 99):
            value = self.percentile_ms(q)
            out[f"p{q}_ms"] = None if math.isnan(value) else value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadResult:
        """The inverse of :meth:`to_json` (derived fields are ignored)."""
        busy, steal = data.get("host_cpu_s", (0.0, 0.0))
        return cls(
            latencies_ms=tuple(float(x) for x in data["latencies_ms"]),
            paths=tuple(str(p) for p in data["paths"]),
            errors=int(data["errors"]),
            error_examples=tuple(str(e) for e in data["error_examples"]),
            elapsed_s=float(data["elapsed_s"]),
            users=int(data["users"]),
            mode=str(data["mode"]),
            labels=tuple(str(x) for x in data.get("labels", ())),
            host_cpu_s=(float(busy), float(steal)),
        )

    def summary(self) -> str:
        """One line for people."""
        return (
            f"{len(self.latencies_ms)} requests in {self.elapsed_s:.2f} s ({self.mode} loop, {self.users} users): "
            f"{self.throughput_rps:.1f} req/s, latency p50 {self.percentile_ms(50):.2f} ms, "
            f"p90 {self.percentile_ms(90):.2f} ms, p99 {self.percentile_ms(99):.2f} ms, errors {self.errors}"
        )


class _Recorder:
    """Collects outcomes; only requests sent after the warm-up count."""

    def __init__(self, measure_from: float, deadline: float) -> None:
        self.measure_from = measure_from
        self.deadline = deadline
        self.latencies_ms: list[float] = []
        self.paths: list[str] = []
        self.labels: list[str] = []
        self.errors = 0
        self.examples: list[str] = []

    def ok(self, start: float, path: str, label: str | None) -> None:
        # Requests still in flight at the deadline count neither way (as in wrk).
        end = time.perf_counter()
        if start >= self.measure_from and end <= self.deadline:
            self.latencies_ms.append((end - start) * 1000)
            self.paths.append(path)
            if label is not None:
                self.labels.append(label)

    def fail(self, start: float, what: str) -> None:
        if self.measure_from <= start and time.perf_counter() <= self.deadline:
            self.errors += 1
            if len(self.examples) < _MAX_ERROR_EXAMPLES:
                self.examples.append(what)


async def _one(session: aiohttp.ClientSession, base: str, path: str, start: float, rec: _Recorder,
               label: str | None = None) -> None:
    try:
        async with session.get(base + path) as resp:
            await resp.read()
            if resp.status >= 400:
                rec.fail(start, f"GET {path}: HTTP {resp.status}")
            else:
                rec.ok(start, path, label)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        rec.fail(start, f"GET {path}: {type(exc).__name__}: {exc}")


async def run_load(
    url: str,
    *,
    users: int = 8,
    duration_s: float | None = None,
    requests: int | None = None,
    rate_rps: float | None = None,
    paths: Sequence[str] = DEFAULT_PATHS,
    n_max: int = 20,
    warmup_s: float = 0.0,
    think_ms: float = 0.0,
    timeout_s: float = 30.0,
    seed: int | None = None,
    control: str | None = None,
) -> LoadResult:
    """Load ``url`` and measure each request's latency.

    Parameters
    ----------
    url : the service's base URL (``http://host:port``); ``paths`` are appended to it.
    users : closed loop: concurrent users; open loop: the most requests in flight at once.
    duration_s, requests : stop after this long (after the warm-up), or after this many measured requests
        (at least one of the two).
    rate_rps : open loop at this Poisson arrival rate; ``None`` for a closed loop.
    paths : chosen uniformly at random per request; ``{n}`` becomes a random integer in ``1..n_max``.
    warmup_s : requests sent during this first period are not measured.
    think_ms : closed loop: pause of each user between an answer and its next request.
    seed : seeds the choice of paths and the arrival times.
    control : ``host:port`` of a controller asked for a label before each request (closed loop, one user).
    """
    if users < 1:
        raise ValueError(f"users must be at least 1, got {users}")
    if duration_s is None and requests is None:
        raise ValueError("give duration_s or requests (or both)")
    if (duration_s is not None and duration_s <= 0) or (requests is not None and requests < 1):
        raise ValueError(f"duration_s must be positive and requests at least 1, got {duration_s}, {requests}")
    if rate_rps is not None and rate_rps <= 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    if not paths or n_max < 1:
        raise ValueError("paths must not be empty and n_max must be at least 1")
    if control is not None and (users != 1 or rate_rps is not None):
        raise ValueError("a controller labels the requests of one closed-loop user: give users=1 and no rate")
    if control is not None and not re.fullmatch(r"\[?[^\s\]]+\]?:\d+", control):
        raise ValueError(f"control {control!r}: expected HOST:PORT, e.g. 127.0.0.1:5000")
    from collector._process import host_cpu_ns  # the host's CPU read as the collector reads it

    rng = random.Random(seed)
    base = url.rstrip("/")
    host0 = host_cpu_ns()
    start = time.perf_counter()
    measure_from = start + warmup_s
    deadline = math.inf if duration_s is None else measure_from + duration_s
    rec = _Recorder(measure_from, deadline)
    budget = [math.inf if requests is None else requests]

    def next_path(start: float) -> str | None:
        """The path of the next request, sent at ``start``, or None when the run is over. The request counts
        against the budget when the recorder measures it: both decide on ``start``."""
        if time.perf_counter() >= deadline or budget[0] <= 0:
            return None
        if start >= rec.measure_from:
            budget[0] -= 1
        return rng.choice(paths).replace("{n}", str(rng.randint(1, n_max)))

    connector = aiohttp.TCPConnector(limit=users)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if control is not None:
            await _controlled_loop(session, base, control, think_ms / 1000, next_path, rec)
            mode = "closed"
        elif rate_rps is None:
            await _closed_loop(session, base, users, think_ms / 1000, next_path, rec)
            mode = "closed"
        else:
            await _open_loop(session, base, users, rate_rps, rng, next_path, rec)
            mode = "open"
    end = time.perf_counter()
    host1 = host_cpu_ns()
    measured_s = (min(end, deadline) if duration_s is not None else end) - rec.measure_from
    host = (0.0, 0.0) if not (host0[0] and host1[0]) else ((host1[0] - host0[0]) / 1e9, (host1[1] - host0[1]) / 1e9)
    return LoadResult(tuple(rec.latencies_ms), tuple(rec.paths), rec.errors, tuple(rec.examples),
                      max(measured_s, 0.0), users, mode, tuple(rec.labels), host)


async def _closed_loop(session: aiohttp.ClientSession, base: str, users: int, think_s: float,
                       next_path: Any, rec: _Recorder) -> None:
    async def user() -> None:
        while (path := next_path(start := time.perf_counter())) is not None:
            await _one(session, base, path, start, rec)
            if think_s > 0:
                await asyncio.sleep(think_s)

    async with asyncio.TaskGroup() as tg:
        for _ in range(users):
            tg.create_task(user())


async def _controlled_loop(session: aiohttp.ClientSession, base: str, control: str, think_s: float,
                           next_path: Any, rec: _Recorder) -> None:
    """One user whose every request waits for the controller's label first (it switches the scenario then)."""
    host, _, port = control.rpartition(":")
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    try:
        while (path := next_path(time.perf_counter())) is not None:
            writer.write(b"next\n")
            await writer.drain()
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise ConnectionError(f"the controller at {control} closed the connection")
            start = time.perf_counter()
            await _one(session, base, path, start, rec, line.decode().strip())
            if think_s > 0:
                await asyncio.sleep(think_s)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _open_loop(session: aiohttp.ClientSession, base: str, users: int, rate_rps: float,
                     rng: random.Random, next_path: Any, rec: _Recorder) -> None:
    slots = asyncio.Semaphore(users)

    async def send(path: str, scheduled: float) -> None:
        async with slots:
            await _one(session, base, path, scheduled, rec)

    async with asyncio.TaskGroup() as tg:
        arrival = time.perf_counter()
        while (path := next_path(arrival)) is not None:
            tg.create_task(send(path, arrival))
            arrival += rng.expovariate(rate_rps)
            delay = arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)


def _arguments(url: str, **kwargs: Any) -> list[str]:
    argv = ["--url", url, "--json"]
    for name, value in kwargs.items():
        if value is None:
            continue
        flag = "--" + {"duration_s": "duration", "rate_rps": "rate", "warmup_s": "warmup", "think_ms": "think-ms",
                       "timeout_s": "timeout", "n_max": "n-max"}.get(name, name).replace("_", "-")
        if name == "paths":
            for path in value:
                argv += ["--path", path]
        else:
            argv += [flag, str(value)]
    return argv


def run_load_subprocess(url: str, **kwargs: Any) -> LoadResult:
    """:func:`run_load` in a new Python process (so its CPU is not the caller's); same keyword arguments.

    Raises ``RuntimeError`` with the client's stderr when it fails.
    """
    argv = [sys.executable, "-m", "examples.forum.load", *_arguments(url, **kwargs)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"load client failed ({proc.returncode}): {proc.stderr.strip()}")
    return LoadResult.from_json(json.loads(proc.stdout))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m examples.forum.load``: print a summary line, or the whole result as JSON."""
    p = argparse.ArgumentParser(prog="python -m examples.forum.load", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--users", type=int, default=8, help="concurrent users (open loop: most in flight)")
    p.add_argument("--duration", type=float, help="seconds to measure (after --warmup)")
    p.add_argument("--requests", type=int, help="requests to measure")
    p.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    p.add_argument("--path", action="append", dest="paths", help="path to request (repeat for a mix; {n} random)")
    p.add_argument("--n-max", type=int, default=20, help="largest value of {n} in paths")
    p.add_argument("--warmup", type=float, default=0.0, help="seconds of unmeasured requests first")
    p.add_argument("--think-ms", type=float, default=0.0, help="closed loop: pause between requests of a user")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as failed")
    p.add_argument("--seed", type=int)
    p.add_argument("--control", metavar="HOST:PORT",
                   help="one user: ask this controller for a label before each request (and tag the request)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    ns = p.parse_args(argv)
    if ns.duration is None and ns.requests is None:
        p.error("give --duration or --requests")
    try:
        result = asyncio.run(run_load(
            ns.url, users=ns.users, duration_s=ns.duration, requests=ns.requests, rate_rps=ns.rate,
            paths=tuple(ns.paths or DEFAULT_PATHS), n_max=ns.n_max, warmup_s=ns.warmup, think_ms=ns.think_ms,
            timeout_s=ns.timeout, seed=ns.seed, control=ns.control,
        ))
    except ValueError as exc:
        p.error(str(exc))
    except (OSError, ConnectionError) as exc:
        print(f"python -m examples.forum.load: controller {ns.control}: {exc}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result.to_json()) if ns.json else result.summary())


if __name__ == "__main__":
    main()
