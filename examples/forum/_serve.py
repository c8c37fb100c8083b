"""Serve an aiohttp application until SIGINT or SIGTERM, announcing the real address on stdout."""

from __future__ import annotations

import asyncio
import signal
import socket

from aiohttp import web


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening, non-blocking TCP socket (port 0 picks a free port).

    ``reuse_port``: ``SO_REUSEPORT``, so that several processes can listen on the same port and the kernel
    spreads the new connections over them (replicas behind the kernel's own balancer); a replica that stops
    leaves the group and the others take every connection."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve_until_signalled(app: web.Application, host: str, port: int, reuse_port: bool = False) -> None:
    """Serve ``app`` on ``host:port`` (shared with other processes where ``reuse_port``: :func:`bind`); print
    ``listening on http://HOST:PORT`` once ready.

    The line is what scripts wait for. SIGINT and SIGTERM end the server gracefully, so that the
    application's cleanup (and anything registered with ``atexit``) runs.
    """
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        sock = bind(host, port, reuse_port)
        await web.SockSite(runner, sock).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"listening on http://{host}:{sock.getsockname()[1]}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
