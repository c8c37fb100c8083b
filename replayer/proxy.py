"""A TCP proxy that applies network what-ifs for real: added latency, and round-robin over replicas.

Used to measure ground truth for the location and failure scenarios (``benchmarks/whatif_accuracy.py``,
``perfcast demo``): put it in front of Redis, PostgreSQL or an HTTP service and every round trip through it
gains ``delay_ms`` (half on the way out, half on the way back), while pipelined data keeps its pipelining:
each chunk is released ``delay/2`` after it arrived, independently of the chunks before it, as a longer wire
would do. Written by hand because ``tc netem`` needs its own network namespace to leave the rest of the
loopback traffic alone, and the proxy runs anywhere without privileges.

Each direction of each connection has a reader thread and a releasing thread that sleeps until each chunk is
due with ``time.sleep`` (sub-millisecond precision): an event loop's timers round every wait up to the next
millisecond (epoll's resolution), which added about 1 ms per round trip on top of the asked delay. A chunk is
due half the delay after the kernel received it (its ``SO_TIMESTAMPNS`` receive time), not after the reader
thread read it: the reader sleeps in ``recv`` while no data comes, and its wake-up after a long wait is slower
than after a short one (the answer direction waits half the delay longer for each answer when the delay is
on), which a wire does not add.

A chunk also keeps what forwarding it costs at 0 ms: the reader's wake-up and the hand-over to the releasing
thread, 0.12 ms a round trip on an idle machine, are in a baseline measured through the proxy at 0 ms, and a
longer wire would not take them away. Timed from its arrival alone, a delayed chunk hid them inside its sleep,
and a round trip through a 10 ms proxy gained 9.91 ms over one at 0 ms: a location ground truth 0.1 ms short
per round trip, more than the whole spread of a 2 ms page's answers about their median. A delayed chunk is
therefore due half the delay after its arrival *plus* the median forwarding time of the proxy's recent undelayed
chunks; a proxy started with its delay on knows that median from a few chunks it forwards to itself at start.
The median, not a draw: the delayed chunk's sleep brings a wake-up's spread of its own, and with a draw on top the
delayed round trips spread twice as wide as the undelayed ones (0.14 ms between the 10th and 90th percentiles
against 0.06).

``delay_ms`` can be changed while the proxy runs: each chunk takes the delay in force when it arrives, so a
ground truth can switch a scenario on and off in one deployment, its connections left open (pooled database
connections last for the app's life).

What it cannot emulate: the TCP handshake with the client is answered by the local kernel, so connection
set-up gains one added RTT only on the upstream side.
"""

from __future__ import annotations

import itertools
import queue
import socket
import statistics
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LatencyProxy", "Upstream"]


@dataclass(frozen=True, slots=True)
class Upstream:
    """An address the proxy forwards to."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """``host:port`` -> Upstream; raises ``ValueError`` naming the text when malformed."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"upstream {text!r}: expected HOST:PORT")
        return cls(host.strip("[]"), int(port))


@dataclass
class LatencyProxy:
    """Forward TCP connections to ``upstreams`` (round robin per connection), adding ``delay_ms`` per round trip.

    Use as an async context manager (or ``await start()`` / ``await stop()``); ``port`` is the listening port
    once started (0 picks a free one). ``down`` holds upstream indices taken out of the rotation (a failed
    replica). The proxy's own threads serve it, so it keeps its timing whatever the caller's loop is doing.
    """

    upstreams: Sequence[Upstream]
    delay_ms: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    down: set[int] = field(default_factory=set)
    connections: int = 0
    """Connections accepted so far."""
    _listener: socket.socket | None = None
    _rr: itertools.count = field(default_factory=itertools.count)
    _sockets: set[socket.socket] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _overshoot_s: float = 0.0
    """How long ``time.sleep`` oversleeps: measured at start, then learnt from the delayed chunks' lateness."""
    _late: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    """[sum of the half delays asked for the delayed chunks, sum of how late each left (negative: early),
    chunks], under ``_late_lock``: three numbers however long the proxy runs."""
    _late_lock: threading.Lock = field(default_factory=threading.Lock)
    _forwarding: deque[float] = field(default_factory=lambda: deque(maxlen=_FORWARDING_KEPT))
    """Seconds from arrival to release of the latest undelayed chunks (under ``_late_lock``)."""
    _forwarding_median_s: float = 0.0
    """Their median, updated every ``_FORWARDING_EVERY`` chunks."""
    _forwarded: int = 0
    """Undelayed chunks released so far."""

    def applied_delay_ms(self) -> float:
        """The delay per round trip this proxy actually added to the delayed chunks since the last
        :meth:`reset_lateness`, beyond what it takes to forward them at 0 ms: the mean delay asked for them plus
        their mean lateness, once per direction;
        ``delay_ms`` when no chunk was delayed.

        Its threads wake late when the machine is busy (about 0.15 ms per chunk when idle, more under load); it
        learns by how much from every delayed chunk and sleeps that much less, but what is left (the learning's
        lag behind the machine, the spread about the mean) makes a ground truth measured through it one for
        this delay, not exactly ``delay_ms``. The delay switched off
        since (a ground truth taking turns) does not change what was added while it was on.
        """
        with self._late_lock:
            asked, late, count = self._late
        if not count:
            return self.delay_ms
        return 2000.0 * (asked + late) / count

    def reset_lateness(self) -> None:
        """Forget the delays measured so far (at the start of a measured window)."""
        with self._late_lock:
            self._late = [0.0, 0.0, 0.0]

    async def start(self) -> LatencyProxy:
        if not self.upstreams:
            raise ValueError("LatencyProxy needs at least one upstream")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be non-negative, got {self.delay_ms}")
        self._overshoot_s = _sleep_overshoot_s()  # measured even at 0 ms: the delay may be switched on later
        self._probe_forwarding()
        listener = socket.create_server((self.host, self.port), backlog=256)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept, "accept")
        return self

    async def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=2.0)
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=f"proxy-{self.port}-{name}", daemon=True)  # type: ignore[arg-type]
        with self._lock:  # the accept thread and connection threads spawn at the same time
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _pick(self) -> Upstream:
        alive = [i for i in range(len(self.upstreams)) if i not in self.down]
        if not alive:
            raise ConnectionRefusedError("every upstream is marked down")
        return self.upstreams[alive[next(self._rr) % len(alive)]]

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._spawn(self._serve, "conn", client)

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._pick()
            server = socket.create_connection((upstream.host, upstream.port), timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._sockets.update((client, server))
        done = threading.Barrier(2, action=lambda: self._close(client, server))
        self._spawn(self._pump, "up", client, server, done)
        self._pump(server, client, done)

    def _close(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(socks)
        for sock in socks:
            sock.close()

    def _probe_forwarding(self, chunks: int = 16) -> None:
        """Forward ``chunks`` small chunks at 0 ms through the proxy's own reader and releasing threads between two
        loopback connections, so that the median forwarding time is known before the first undelayed chunk of a
        client (a proxy started with its delay on, as a scenario measured in a deployment of its own is)."""
        with socket.create_server(("127.0.0.1", 0)) as listener:
            sender = socket.create_connection(listener.getsockname())
            src, _ = listener.accept()
            dst = socket.create_connection(listener.getsockname())
            receiver, _ = listener.accept()
        done = threading.Barrier(2)
        pump = threading.Thread(target=self._pump, args=(src, dst, done, False), daemon=True)
        pump.start()
        try:
            for _ in range(chunks):
                sender.sendall(b"probe")
                got = 0
                while got < 5:
                    data = receiver.recv(64)
                    if not data:
                        raise OSError("the probe's connection closed")
                    got += len(data)
                time.sleep(0.0005)
            sender.shutdown(socket.SHUT_WR)
            done.wait(timeout=5)
        except (OSError, threading.BrokenBarrierError):
            pass  # unmeasured: delayed chunks then wait from their arrival alone until undelayed ones come
        finally:
            for sock in (sender, src, dst, receiver):
                sock.close()
            pump.join(timeout=5)

    def _pump(self, src: socket.socket, dst: socket.socket, done: threading.Barrier, delayed: bool = True) -> None:
        """Copy src -> dst, releasing each chunk half the delay in force when it arrived later (order kept); every
        chunk at 0 ms unless ``delayed``."""
        chunks: queue.SimpleQueue[tuple[float, float, bytes]] = queue.SimpleQueue()
        releaser = threading.Thread(target=self._release, args=(chunks, dst), daemon=True)
        releaser.start()
        stamped = _stamp_arrivals(src)
        try:
            while True:
                try:
                    chunk, arrived = _receive(src, stamped)
                except OSError:
                    chunk, arrived = b"", time.monotonic()
                delay_s = self.delay_ms / 2000.0 if delayed else 0.0
                chunks.put((arrived + delay_s, delay_s, chunk))
                if not chunk:
                    break
        finally:
            releaser.join()
            try:
                done.wait(timeout=30)
            except threading.BrokenBarrierError:
                self._close(src, dst)

    def _release(self, chunks: queue.SimpleQueue[tuple[float, float, bytes]], dst: socket.socket) -> None:
        while True:
            due, delay_s, chunk = chunks.get()
            if delay_s > 0:
                due += self._forwarding_median_s  # what the same chunk would have taken at 0 ms, then the delay
            wait = due - time.monotonic() - self._overshoot_s
            if wait > 0:
                time.sleep(wait)
            if delay_s > 0 and chunk:
                late = time.monotonic() - due
                with self._late_lock:
                    self._late[0] += delay_s
                    self._late[1] += late
                    self._late[2] += 1
                    if wait > 0:
                        # How much a sleep oversleeps grows with its length and with the machine's load (a
                        # halted vCPU wakes slower): learn it from every delayed chunk, so that the delay added
                        # is the delay asked for on average (the start-up estimate left round trips through a
                        # 10 ms proxy 0.06-0.07 ms long, a third of a post page's spread about its median)
                        self._overshoot_s = max(self._overshoot_s + _LATE_GAIN * late, 0.0)
            if not chunk:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            forwarded_s = time.monotonic() - due
            try:
                dst.sendall(chunk)
            except OSError:
                # the other side is gone: drain what is queued until the reader's end-of-stream marker
                while chunks.get()[2]:
                    pass
                return
            if delay_s == 0:
                self._learn_forwarding(forwarded_s)  # once sent: the chunk does not wait for the bookkeeping

    def _learn_forwarding(self, seconds: float) -> None:
        """Keep an undelayed chunk's time from arrival to release; update the median every few chunks."""
        with self._late_lock:
            self._forwarding.append(seconds)
            self._forwarded += 1
            if self._forwarded % _FORWARDING_EVERY == 1 or self._forwarded < _FORWARDING_EVERY:
                self._forwarding_median_s = statistics.median(self._forwarding)


_FORWARDING_KEPT = 256
"""Undelayed chunks whose median forwarding time a delayed chunk waits on top of its delay: the last few seconds
of a paired ground truth's turn at 0 ms."""

_FORWARDING_EVERY = 16
"""Undelayed chunks between updates of their median forwarding time, past the first few."""

_LATE_GAIN = 0.02
"""Share of each delayed chunk's lateness added to the proxy's overshoot estimate (an integral controller: the
mean lateness goes to zero within a few hundred chunks)."""


def _sleep_overshoot_s(trials: int = 15) -> float:
    """Median time ``time.sleep`` oversleeps on this machine now: subtracted so a delay is the delay asked for."""
    late = []
    for _ in range(trials):
        start = time.monotonic()
        time.sleep(0.002)
        late.append(time.monotonic() - start - 0.002)
    late.sort()
    return max(late[len(late) // 2], 0.0)


_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
"""Linux's ``SO_TIMESTAMPNS`` (and its control message's type), which the socket module does not export: the
kernel's receive time of the data, a ``struct timespec`` of ``CLOCK_REALTIME``, also for TCP."""

_READ_BYTES = 1 << 20
"""The most one read takes from a socket: all a loopback socket holds, in practice. At 64 KiB, ten 256 KiB blobs
fetched at once through the proxy, beside the other proxies' threads in the same process, stalled one of them
10-100 ms on 8-10% of the forum's index pages (0% with the app fetching them from the blob service itself), and
the index page took 3.2-4.0 ms more at the median with the bigger blobs where it took 1.2 ms more without the
proxy; at 1 MiB 0.7% stalled and the page took 2.1-2.5 ms more. The small messages of a database's round trip
cost the same either way (0.16 ms a round trip through the proxy at 0 ms)."""

_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)


def _stamp_arrivals(sock: socket.socket) -> bool:
    """Ask the kernel for the receive time of what ``sock`` reads; False where it cannot give it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def _receive(sock: socket.socket, stamped: bool) -> tuple[bytes, float]:
    """Up to :data:`_READ_BYTES` from ``sock`` and when it arrived, on the ``time.monotonic`` clock: the kernel's
    receive time of its last segment where ``stamped`` and the kernel stamped it (never after now), else now.
    Linux turns receive timestamps on for the whole stack in deferred work after the first socket asks, so the
    first chunks of a proxy started alone may come unstamped."""
    if not stamped:
        return sock.recv(_READ_BYTES), time.monotonic()
    chunk, ancillary, _, _ = sock.recvmsg(_READ_BYTES, _ANCILLARY)
    now_mono, now_real = time.monotonic(), time.time()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return chunk, now_mono - min(max(now_real - (sec + nsec / 1e9), 0.0), 1.0)
    return chunk, now_mono
