"""A TCP proxy that applies network what-ifs for real: added latency, and round-robin over replicas.

Used to measure ground truth for the location and failure scenarios (``benchmarks/whatif_accuracy.py``,
``perfcast demo``): put it in front of Redis, PostgreSQL or an HTTP service and every round trip through it
gains ``delay_ms`` (half on the way out, half on the way back), while pipelined data keeps its pipelining:
each chunk is released ``delay/2`` after it arrived, independently of the chunks before it, as a longer wire
would do. Written by hand because ``tc netem`` needs its own network namespace to leave the rest of the
loopback traffic alone, and the proxy runs anywhere without privileges.

What it cannot emulate: the TCP handshake with the client is answered by the local kernel, so connection
set-up gains one added RTT only on the upstream side (the proxy connects upstream lazily, after the delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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

    Use as an async context manager; ``port`` is the listening port once started (0 picks a free one).
    ``down`` holds upstream indices taken out of the rotation (a failed replica).
    """

    upstreams: Sequence[Upstream]
    delay_ms: float = 0.0
    host: str = "127.0.0.1"
    port: int = 0
    down: set[int] = field(default_factory=set)
    connections: int = 0
    """Connections accepted so far."""
    _server: asyncio.Server | None = None
    _rr: itertools.count = field(default_factory=itertools.count)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> LatencyProxy:
        if not self.upstreams:
            raise ValueError("LatencyProxy needs at least one upstream")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be non-negative, got {self.delay_ms}")
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            # Closing the sockets ends the pumps by themselves; cancelling the connection tasks instead would make
            # asyncio's stream callback log their CancelledError.
            for writer in list(self._writers):
                writer.close()
            if self._tasks:
                _, pending = await asyncio.wait(self._tasks, timeout=2.0)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _pick(self) -> Upstream:
        alive = [i for i in range(len(self.upstreams)) if i not in self.down]
        if not alive:
            raise ConnectionRefusedError("every upstream is marked down")
        return self.upstreams[alive[next(self._rr) % len(alive)]]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(client_w)
        self.connections += 1
        try:
            upstream = self._pick()
            up_r, up_w = await asyncio.open_connection(upstream.host, upstream.port)
        except (OSError, ConnectionRefusedError):
            client_w.close()
            self._writers.discard(client_w)
            self._tasks.discard(task)
            return
        self._writers.add(up_w)
        half = self.delay_ms / 2000.0
        try:
            await asyncio.gather(self._pump(client_r, up_w, half), self._pump(up_r, client_w, half))
        finally:
            for writer in (client_w, up_w):
                writer.close()
                self._writers.discard(writer)
            self._tasks.discard(task)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
        """Copy reader -> writer, releasing each chunk ``delay_s`` after it arrived (order kept)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(chunk)
                await writer.drain()
            with contextlib.suppress(OSError):
                writer.write_eof()

        releaser = asyncio.create_task(release())
        try:
            while True:
                chunk = await reader.read(65536)
                queue.put_nowait((loop.time() + delay_s, chunk))
                if not chunk:
                    break
            await releaser
        except (OSError, asyncio.IncompleteReadError):
            releaser.cancel()
        finally:
            if not releaser.done():
                releaser.cancel()
            with contextlib.suppress(BaseException):
                await releaser
