"""The replay agent: a small HTTP server that runs on each host perfcast measures or replays on.

Routes (JSON in and out):

* ``GET /health``: ``{"status": "ok", "host": ..., "version": ...}``, for a quick liveness check.
* ``GET /metrics``: the host's cumulative counters (:class:`replayer.monitor.HostCounters`, format
  ``perfcast-metrics/1``). A load test reads them at the start and the end of its steady-state window and takes
  the difference, so the agent keeps no state and needs no notion of a window.

:func:`create_app` builds the :class:`aiohttp.web.Application`; new routes (the replay endpoints) are added to
it there. :func:`serve` runs it until cancelled.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from aiohttp import web

from replayer.monitor import read_host_counters

__all__ = ["DEFAULT_PORT", "HOST_KEY", "create_app", "serve"]

DEFAULT_PORT = 9464
"""The agent's default TCP port."""

HOST_KEY = web.AppKey("host", str)
"""Application key: the host name the agent reports."""


def _version() -> str:
    try:
        return version("perfcast")
    except PackageNotFoundError:  # running from a source tree that was not installed
        return "unknown"


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "host": request.app[HOST_KEY], "version": _version()})


async def _metrics(request: web.Request) -> web.Response:
    # psutil reads /proc: quick, but still a blocking call, so it runs in a worker thread
    counters = await asyncio.to_thread(read_host_counters, request.app[HOST_KEY])
    return web.json_response(counters.to_json(), headers={"Cache-Control": "no-store"})


def create_app(host: str | None = None) -> web.Application:
    """Build the agent's web application.

    Parameters
    ----------
    host : str, optional
        Host name to report (and so to name this host's stations); defaults to ``socket.gethostname()``.
    """
    app = web.Application()
    app[HOST_KEY] = host or socket.gethostname()
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def serve(
    bind: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    host_name: str | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the agent on ``bind:port`` until cancelled.

    Parameters
    ----------
    bind, port : str, int
        Address to listen on; port 0 picks a free port.
    host_name : str, optional
        Host name to report (see :func:`create_app`).
    on_ready : callable, optional
        Called with the base URL (``http://HOST:PORT``, the real port) once the agent listens.
    """
    runner = web.AppRunner(create_app(host_name), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, bind, port)
        await site.start()
        real_port = runner.addresses[0][1] if runner.addresses else port
        if on_ready is not None:
            on_ready(f"http://{bind}:{real_port}")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
