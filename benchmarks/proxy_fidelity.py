"""How faithfully the latency proxy applies a scenario: what it adds beyond the delay asked for.

The accuracy benchmark (``whatif_accuracy.py``) measures its ground truths through ``replayer.proxy.LatencyProxy``
(at 0 ms for today, at the scenario's delay for a location change), so whatever the proxy itself adds, or takes
away, is in the ground truth. Two figures:

1. *Round trips*: an echo server's round trip directly, through the proxy at 0 ms and at ``--delay`` ms, taking
   turns on one connection. What the delayed round trip gains over the undelayed one should be the delay: the
   proxy keeps its own forwarding at 0 ms under a delay, as a longer wire would.
2. *Bulk transfers* (with ``--forum``, Redis and PostgreSQL on 127.0.0.1): the forum app's index page with its
   ten blobs grown to ``--size`` bytes, paired with today's in one deployment as the accuracy benchmark measures
   it, once with the blob service behind its proxy and once with the app fetching from it directly. Printed: how
   many index pages had a blob's body arrive more than 10 ms after its fetch's span ended (a stall), and the
   index page's median on each side.

Run::

    python benchmarks/proxy_fidelity.py [--delay 10] [--trips 360] [--forum] [--size 262144] [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from replayer import groundtruth  # noqa: E402
from replayer.proxy import LatencyProxy, Upstream  # noqa: E402


def _echo_server() -> int:
    """A threaded echo server on a free port: its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def _echo(conn: socket.socket) -> None:
    while data := conn.recv(65536):
        conn.sendall(data)


def _trips(sock: socket.socket, n: int, pause_s: float = 0.002) -> list[float]:
    """``n`` round trips of 100 bytes (ms), ``pause_s`` apart."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        sock.sendall(b"x" * 100)
        got = 0
        while got < 100:
            got += len(sock.recv(65536))
        out.append((time.perf_counter() - start) * 1e3)
        time.sleep(pause_s)
    return out


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


async def round_trips(delay_ms: float, trips: int) -> dict[str, list[float]]:
    """Round trips (ms) directly, through the proxy at 0 ms and at ``delay_ms``, in turns of 60 (5 not kept)."""
    port = _echo_server()
    out: dict[str, list[float]] = {"direct": [], "0 ms": [], f"{delay_ms:g} ms": []}
    async with LatencyProxy([Upstream("127.0.0.1", port)]) as proxy:
        via, direct = _connect(proxy.port), _connect(port)
        with via, direct:
            for _ in range(max(trips // 60, 1)):
                out["direct"] += _trips(direct, 60)
                for key, ms in (("0 ms", 0.0), (f"{delay_ms:g} ms", delay_ms)):
                    proxy.delay_ms = ms
                    _trips(via, 5)
                    out[key] += _trips(via, 60)
    return out


def _stalls(direct: bool, size: int, requests: int, work: Path) -> dict[str, tuple[float, float]]:
    """side -> (share of index pages with a stalled blob, median latency ms), the blob proxy in the path or not."""
    # Imported here: the forum case needs the benchmark's own helpers and the services it reads
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from whatif_accuracy import POSTGRES_URL, REDIS_URL, _recorded, _window_requests

    start = groundtruth._ProxyLoop.start
    if direct:
        class _Direct(LatencyProxy):
            @property
            def address(self) -> str:  # the app is pointed at the blob service itself
                return f"{self.upstreams[0].host}:{self.upstreams[0].port}"

        def start_direct(self: Any, upstreams: Any, delay_ms: float) -> LatencyProxy:
            if self.proxies:
                return start(self, upstreams, delay_ms)
            proxy = _Direct(list(upstreams), delay_ms=delay_ms)  # the first proxy a deployment starts: the blobs'
            self._run(proxy.start())
            self.proxies.append(proxy)
            return proxy

        groundtruth._ProxyLoop.start = start_direct  # type: ignore[method-assign]
    try:
        setup = groundtruth.ForumSetup(redis_url=REDIS_URL, postgres_url=POSTGRES_URL,
                                       app_args=("--cache-ttl-ms", "0"))
        bases, truths = groundtruth.measure_paired(setup, groundtruth.Applied(payload_bytes=size), requests=requests,
                                                   blocks=4, spans=work / f"{'direct' if direct else 'proxy'}.jsonl")
    finally:
        groundtruth._ProxyLoop.start = start  # type: ignore[method-assign]
    tasks: dict[str, list[Any]] = {}
    for span in _recorded(truths[0].spans[0]).spans:
        if span.name == "task Forum._fetch_blob":
            tasks.setdefault(span.trace_id, []).append(span)
    out = {}
    for side, runs in (("today", bases), ("bigger blobs", truths)):
        late = []
        for req in (r for t in runs for r in _window_requests(t) if r.route == "GET /"):
            fetches = [c for c in req.ios if "blob/" in c.api]
            if req.trace_id in tasks and fetches:
                answered = max(c.end_ns for c in fetches)
                late.append(max(t.end_ns - answered for t in tasks[req.trace_id]) / 1e6)
        latencies = [ms for t in runs for ms in t.latencies("GET /")]
        out[side] = (float(np.mean(np.array(late) > 10.0)), float(np.median(latencies)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay", type=float, default=10.0, help="the delay of the round-trip figure (ms, default 10)")
    p.add_argument("--trips", type=int, default=360, help="round trips of each kind (default 360)")
    p.add_argument("--forum", action="store_true", help="also the bulk-transfer figure (Redis and PostgreSQL)")
    p.add_argument("--size", type=int, default=262144, help="the blobs' bytes of the bulk figure (default 256 KiB)")
    p.add_argument("--requests", type=int, default=300, help="measured index and post pages a side (default 300)")
    ns = p.parse_args(argv)
    if ns.delay <= 0 or ns.trips < 60 or ns.size < 1 or ns.requests < 4:
        p.error(f"need --delay > 0 (got {ns.delay:g}), --trips >= 60 (got {ns.trips}), --size >= 1 (got {ns.size}) "
                f"and --requests >= 4 (got {ns.requests})")
    got = asyncio.run(round_trips(ns.delay, ns.trips))
    for key, ms in got.items():
        q = statistics.quantiles(ms, n=10)
        print(f"round trip {key:>8}: p10 {q[0]:.3f}  p50 {statistics.median(ms):.3f}  p90 {q[8]:.3f} ms")
    gained = statistics.median(got[f"{ns.delay:g} ms"]) - statistics.median(got["0 ms"])
    print(f"the delayed round trip gained {gained:.3f} ms at the median over the undelayed one "
          f"(asked: {ns.delay:g} ms, ratio {gained / ns.delay:.4f})")
    if ns.forum:
        if not (groundtruth.reachable("127.0.0.1", 6379) and groundtruth.reachable("127.0.0.1", 5432)):
            print("bulk transfers: Redis and PostgreSQL are not reachable on 127.0.0.1", file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory(prefix="perfcast-proxy-") as tmp:
            for direct in (False, True):
                sides = _stalls(direct, ns.size, ns.requests, Path(tmp))
                path = "the app fetching from the blob service itself" if direct else "through the blob proxy"
                (today_stall, today_ms), (big_stall, big_ms) = sides["today"], sides["bigger blobs"]
                print(f"{ns.size}-byte blobs, {path}: index pages with a stalled blob {100 * big_stall:.1f}% "
                      f"(today {100 * today_stall:.1f}%); median {big_ms:.2f} ms against today's {today_ms:.2f} "
                      f"(+{big_ms - today_ms:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
