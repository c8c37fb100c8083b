"""Cost of the collector per task step: ns per step with and without it, in one process, one run.

Each round runs N tasks of S steps each (``await asyncio.sleep(0)`` between trivial steps) inside a traced
request span, once without the collector and once with it (spans go to an in-memory exporter), alternating,
and prints the median ns per step of each mode and their difference (the collector's cost per step); a
third mode turns off the per-step CPU clock (``cpu_time=False``, ``PERFCAST_CPU_TIME=0``).
The cost is measured as the process's CPU time (``time.process_time_ns``), which other processes on a
shared machine disturb far less than wall time; the wall-time figures are printed too.

    python benchmarks/collector_step_cost.py [--tasks 200] [--steps 50] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import collector


async def _worker(steps: int) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


async def _workload(
    tracer_provider: TracerProvider, tasks: int, steps: int
) -> tuple[float, float]:
    with tracer_provider.get_tracer("bench").start_as_current_span("request"):
        cpu, wall = time.process_time_ns(), time.perf_counter_ns()
        await asyncio.gather(*(_worker(steps) for _ in range(tasks)))
        n = tasks * (steps + 1)
        return (time.process_time_ns() - cpu) / n, (time.perf_counter_ns() - wall) / n


def _plain(tasks: int, steps: int) -> tuple[float, float]:
    return asyncio.run(_workload(TracerProvider(), tasks, steps))


def _collected(tasks: int, steps: int, cpu_time: bool = True) -> tuple[float, float]:
    provider = collector.instrument(
        output=None, exporter=InMemorySpanExporter(), quiet=True, cpu_time=cpu_time
    )
    try:
        return asyncio.run(_workload(provider, tasks, steps))
    finally:
        collector.uninstrument()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {
        "plain": [],
        "collector": [],
        "collector, no CPU clock": [],
    }
    for _ in range(args.rounds):
        runs["plain"].append(_plain(args.tasks, args.steps))
        runs["collector"].append(_collected(args.tasks, args.steps))
        runs["collector, no CPU clock"].append(
            _collected(args.tasks, args.steps, cpu_time=False)
        )
    print(
        f"steps per round: {args.tasks * (args.steps + 1)}  rounds: {args.rounds}  (medians, ns per step)"
    )
    base = [statistics.median(r[i] for r in runs["plain"]) for i in (0, 1)]
    for name, results in runs.items():
        cpu, wall = (statistics.median(r[i] for r in results) for i in (0, 1))
        print(
            f"  {name:24} cpu {cpu:7.0f} (cost {cpu - base[0]:6.0f}, x{cpu / base[0]:.2f})   "
            f"wall {wall:7.0f} (cost {wall - base[1]:6.0f}, x{wall / base[1]:.2f})"
        )


if __name__ == "__main__":
    main()
