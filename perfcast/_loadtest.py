"""``perfcast loadtest``: closed-loop load test, utilisation monitoring and service demands per station."""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from analyzer.demands import StationDemand, littles_law_deviation, station_demand
from replayer.loadtest import (
    FORMAT,
    LevelResult,
    LoadTestConfig,
    LoadTestError,
    LoadTestResult,
    ThinkTime,
    local_pid_for_url,
    parse_duration,
    parse_users,
    run_load_test,
)
from replayer.loadtest import Progress as LevelProgress
from replayer.monitor import AgentMonitor, HostMonitor, LocalMonitor, MonitorError, ProcessTarget

__all__ = ["level_stations", "loadtest", "to_document"]

GENERATOR_BUSY_WARNING = 0.8
"""The generator runs in one thread: above this many busy CPUs it may be what limits the throughput."""


def level_stations(level: LevelResult, host_sources: Sequence[str]) -> dict[str, StationDemand]:
    """Stations of one level and their service demands (operational laws, :mod:`analyzer.demands`).

    Per monitored host ``h``: ``h-cpu`` (servers = CPUs), ``h-disk`` (servers = whole disks) when it has disks,
    and ``h-net-tx`` / ``h-net-rx`` (one server each) when the link bandwidth is known. Per measured process
    ``p``: ``p-cpu`` (servers = its threads, at most the CPUs). ``host_sources[i]`` says where ``level.hosts[i]``
    came from (``host`` or ``agent``).

    Raises
    ------
    LoadTestError
        If two hosts or processes give the same station name.
    analyzer.errors.ModelError
        If a measurement breaks an operational law (names the station and field).
    """
    x = level.throughput_per_s
    stations: dict[str, StationDemand] = {}

    def add(name: str, busy: float, servers: int, source: str) -> None:
        if name in stations:
            raise LoadTestError(
                f"two monitors give station {name!r}: name them apart with --monitor NAME=URL or --pid LABEL=PID"
            )
        stations[name] = station_demand(name, busy, servers, x, source=source)

    for host, source in zip(level.hosts, host_sources, strict=True):
        add(f"{host.host}-cpu", host.cpu_busy_servers, host.cpu_servers, source)
        if host.disk_servers > 0:
            add(f"{host.host}-disk", host.disk_busy_servers, host.disk_servers, source)
        if host.net_bandwidth_bytes_per_s > 0:
            add(f"{host.host}-net-tx", host.net_tx_bytes_per_s / host.net_bandwidth_bytes_per_s, 1, source)
            add(f"{host.host}-net-rx", host.net_rx_bytes_per_s / host.net_bandwidth_bytes_per_s, 1, source)
    for proc in level.processes:
        add(f"{proc.label}-cpu", proc.busy_servers, proc.servers, "process")
    return stations


def to_document(result: LoadTestResult, host_sources: Sequence[str]) -> dict[str, Any]:
    """The load-test file (format ``perfcast-loadtest/1``, described in ``docs/loadtest.md``)."""
    levels = []
    for level in result.levels:
        if level.completed == 0:
            examples = "; ".join(level.error_examples) or "no answer in the window"
            raise LoadTestError(
                f"level users={level.users}: no request succeeded in the {level.duration_s:.1f} s window "
                f"({level.errors} errors: {examples})"
            )
        entry = level.to_json()
        entry["stations"] = {name: s.to_json() for name, s in level_stations(level, host_sources).items()}
        levels.append(entry)
    config = result.config
    return {
        "format": FORMAT,
        "url": config.url,
        "think_time_s": config.think_time_s,
        "think_distribution": str(config.think),
        "warmup_s": config.warmup_s,
        "levels": levels,
    }


def _split_named(value: str, option: str) -> tuple[str | None, str]:
    name, sep, rest = value.partition("=")
    if sep and name and "/" not in name and ":" not in name:
        return name, rest
    if sep and not name:
        raise click.BadParameter(f"{value!r}: empty name before '='", param_hint=option)
    return None, value


def _parse_pids(values: Sequence[str]) -> list[ProcessTarget]:
    targets: list[ProcessTarget] = []
    for value in values:
        label, spec = _split_named(value, "--pid")
        pids_text, _, servers_text = spec.partition(":")
        pids = pids_text.split(",")
        if not all(p.isdigit() for p in pids) or (servers_text and (not servers_text.isdigit() or int(servers_text) < 1)):
            raise click.BadParameter(f"{value!r}: expected [LABEL=]PID[,PID...][:SERVERS]", param_hint="--pid")
        pid, *also = (int(p) for p in pids)
        label = label or f"pid{pid}"
        if any(t.label == label for t in targets):
            raise click.BadParameter(f"{value!r}: label {label!r} given twice", param_hint="--pid")
        targets.append(ProcessTarget(label, pid, int(servers_text) if servers_text else None, tuple(also)))
    return targets


async def _run(
    config: LoadTestConfig,
    agents: Sequence[tuple[str | None, str]],
    local: bool,
    processes: list[ProcessTarget],
    progress: Progress,
) -> tuple[LoadTestResult, list[str]]:
    tasks: dict[int, TaskID] = {}

    def on_progress(p: LevelProgress) -> None:
        if p.level_index not in tasks:
            tasks[p.level_index] = progress.add_task("", total=p.total_s)
        label = f"users={p.users:<5} {p.phase:<7} {p.completed:>7} requests"
        progress.update(tasks[p.level_index], completed=p.elapsed_s, description=label)

    async with aiohttp.ClientSession() as session:
        monitors: list[HostMonitor] = [LocalMonitor()] if local else []
        monitors += [AgentMonitor(url, session, host=name) for name, url in agents]
        sources = (["host"] if local else []) + ["agent"] * len(agents)
        result = await run_load_test(config, monitors=monitors, processes=processes, progress=on_progress)
    return result, sources


def _render(console: Console, document: dict[str, Any], result: LoadTestResult) -> None:
    levels = Table(title=f"closed-loop load test of {result.config.url}")
    for column in ("users", "X (req/s)", "R mean (ms)", "R p90 (ms)", "errors", "X(R+Z)/N - 1", "generator CPUs"):
        levels.add_column(column, justify="right")
    stations = Table(title="stations (operational laws)")
    for column in ("users", "station", "servers", "utilisation", "demand (ms)", "source"):
        stations.add_column(column, justify="left" if column in ("station", "source") else "right")
    for level, entry in zip(result.levels, document["levels"], strict=True):
        deviation = littles_law_deviation(level.users, level.throughput_per_s, level.response_time_s, level.think_time_s)
        levels.add_row(
            str(level.users),
            f"{level.throughput_per_s:.2f}",
            f"{level.response_time_s * 1e3:.1f}",
            f"{level.response_time_p90_s * 1e3:.1f}",
            str(level.errors),
            f"{float(deviation):+.1%}",
            f"{level.generator_busy_cpus:.2f}",
        )
        for name, s in entry["stations"].items():
            stations.add_row(
                str(level.users), name, str(s["servers"]), f"{s['utilization']:.1%}", f"{s['demand_s'] * 1e3:.3f}",
                s["source"],
            )
    console.print(levels)
    console.print(stations)
    for level in result.levels:
        if level.generator_busy_cpus > GENERATOR_BUSY_WARNING:
            console.print(
                f"[yellow]warning:[/] users={level.users}: the load generator used {level.generator_busy_cpus:.2f} "
                "CPU; it runs on one core and may have limited the throughput"
            )
        asked = result.config.think_time_s
        # exponential think times: allow 3 standard errors of the mean of ~completed draws on top of 10%
        noise = 3 * asked / math.sqrt(max(level.completed, 1)) if result.config.think is ThinkTime.EXPONENTIAL else 0
        if asked > 0 and math.isfinite(level.think_time_s) and level.think_time_s > 1.1 * asked + noise:
            console.print(
                f"[yellow]warning:[/] users={level.users}: users thought {level.think_time_s:.3f} s on average, "
                f"not {asked:.3f} s: the generator's event loop was late"
            )


@click.command("loadtest")
@click.option("--url", required=True, help="URL every virtual user requests (GET).")
@click.option("--users", "users_text", required=True, help="Concurrency levels, e.g. 1,20,105,203.")
@click.option("--think", "think_text", default="1s", show_default=True, help="Mean think time (500ms, 1s, ...).")
@click.option(
    "--think-distribution",
    type=click.Choice([t.value for t in ThinkTime]),
    default=ThinkTime.EXPONENTIAL.value,
    show_default=True,
    help="Exponential (a product-form delay station) or constant think times.",
)
@click.option("--duration", "duration_text", default="60s", show_default=True, help="Measured window per level.")
@click.option("--warmup", "warmup_text", default="10s", show_default=True, help="Uncounted warm-up per level.")
@click.option("--monitor", "monitors", multiple=True, metavar="[NAME=]AGENT_URL", help="A remote host's agent.")
@click.option("--local-monitor/--no-local-monitor", default=True, show_default=True, help="Monitor this host.")
@click.option(
    "--pid",
    "pid_values",
    multiple=True,
    metavar="[LABEL=]PID[,PID...][:SERVERS]",
    help="Also measure these processes' CPU (with their children) as station LABEL-cpu with SERVERS servers "
    "(default: its threads, one per Python process). Default: the process listening on the URL's port when "
    "the URL is local, as app-cpu.",
)
@click.option("--timeout", "timeout_text", default="30s", show_default=True, help="Per-request timeout.")
@click.option("--seed", type=int, default=None, help="Seed for the think times.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("loadtest.json"),
              show_default=True, help="Where to write the results.")
def loadtest(
    url: str,
    users_text: str,
    think_text: str,
    think_distribution: str,
    duration_text: str,
    warmup_text: str,
    monitors: tuple[str, ...],
    local_monitor: bool,
    pid_values: tuple[str, ...],
    timeout_text: str,
    seed: int | None,
    output: Path,
) -> None:
    """Closed-loop load test at several concurrency levels; saves throughput, response times, utilisations
    and the service demand of each station (docs/loadtest.md)."""
    console = Console(stderr=True)
    try:
        config = LoadTestConfig(
            url=url,
            users=parse_users(users_text),
            think_time_s=parse_duration(think_text, "--think"),
            duration_s=parse_duration(duration_text, "--duration"),
            warmup_s=parse_duration(warmup_text, "--warmup"),
            think=ThinkTime(think_distribution),
            request_timeout_s=parse_duration(timeout_text, "--timeout"),
            seed=seed,
        )
    except LoadTestError as exc:
        raise click.UsageError(str(exc)) from exc
    agents = [_split_named(m, "--monitor") for m in monitors]
    processes = _parse_pids(pid_values)
    if not pid_values:
        pid = local_pid_for_url(url)
        if pid is not None and pid != os.getpid():
            processes.append(ProcessTarget("app", pid))
            console.print(f"measuring process {pid} (listening on the URL's port) as station app-cpu")
    try:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console, transient=False
        ) as progress:
            result, sources = asyncio.run(_run(config, agents, local_monitor, processes, progress))
        document = to_document(result, sources)
    except (LoadTestError, MonitorError) as exc:
        click.echo(f"{type(exc).__name__}: {exc}", err=True)
        raise SystemExit(1) from exc
    output.write_text(json.dumps(document, indent=2) + "\n")
    _render(Console(), document, result)
    console.print(f"wrote {output}")
