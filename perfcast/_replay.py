"""``perfcast agent``: the replay agent that serves this host's counters (and, later, replays)."""

from __future__ import annotations

import asyncio

import click

from replayer.agent import DEFAULT_PORT, serve

__all__ = ["agent"]


@click.command("agent")
@click.option("--host", "bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535), help="0: any.")
@click.option("--name", default=None, help="Host name to report (default: this machine's host name).")
def agent(bind: str, port: int, name: str | None) -> None:
    """Run the agent: GET /health and GET /metrics (this host's CPU, disk and network counters)."""

    def ready(url: str) -> None:
        click.echo(f"listening on {url}", err=False)

    try:
        asyncio.run(serve(bind, port, host_name=name, on_ready=ready))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        click.echo(f"OSError: cannot listen on {bind}:{port}: {exc.strerror or exc}", err=True)
        raise SystemExit(1) from exc
