"""An independent discrete-event simulation of a product-form closed network, to check the MVA solvers.

Nothing here comes from analyzer.mva: ``users`` customers think (exponential, mean ``think_time_s``), then
visit each station in order. A queue station has ``servers`` FCFS servers with exponential service times of
mean ``demand_s``; a delay station serves everyone at once. Such a network (exponential FCFS servers, a
Markov route) is product-form (BCMP), so its steady state is what exact MVA computes. Estimates come with
batch-means confidence intervals.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    half_width: float
    """Half-width of the confidence interval at the level asked for."""

    def covers(self, value: float) -> bool:
        return abs(value - self.mean) <= self.half_width


@dataclass(frozen=True, slots=True)
class SimResult:
    throughput_per_s: Estimate
    queue_length: tuple[Estimate, ...]
    """Mean number at each station (waiting or in service)."""
    busy_servers: tuple[Estimate, ...]
    """Mean number of busy servers at each station (utilisation law: D X)."""


def simulate(
    demands: Sequence[float],
    servers: Sequence[int],
    delay: Sequence[bool],
    think_time_s: float,
    users: int,
    *,
    batch_time_s: float,
    batches: int = 20,
    warmup_s: float = 0.0,
    confidence: float = 0.999,
    seed: int = 1,
) -> SimResult:
    """Simulate for ``warmup_s`` plus ``batches`` batches of ``batch_time_s`` and return batch-means CIs."""
    rng = random.Random(seed)
    k_count = len(demands)
    count = [0] * k_count
    busy = [0] * k_count
    waiting: list[deque[int]] = [deque() for _ in range(k_count)]
    area_n = [0.0] * k_count
    area_b = [0.0] * k_count
    last = [0.0] * k_count
    events: list[tuple[float, int, int, int]] = []  # (time, sequence, customer, station; -1 = thinking)
    seq = 0
    completions = 0

    def draw(mean: float) -> float:
        return rng.expovariate(1.0 / mean) if mean > 0 else 0.0

    def account(k: int, now: float) -> None:
        dt = now - last[k]
        area_n[k] += count[k] * dt
        area_b[k] += busy[k] * dt
        last[k] = now

    def arrive(customer: int, k: int, now: float) -> None:
        nonlocal seq
        account(k, now)
        count[k] += 1
        if delay[k] or busy[k] < servers[k]:
            busy[k] += 1
            seq += 1
            heapq.heappush(events, (now + draw(demands[k]), seq, customer, k))
        else:
            waiting[k].append(customer)

    for customer in range(users):
        seq += 1
        heapq.heappush(events, (draw(think_time_s), seq, customer, -1))

    samples_x: list[float] = []
    samples_q: list[list[float]] = [[] for _ in range(k_count)]
    samples_b: list[list[float]] = [[] for _ in range(k_count)]
    boundaries = [warmup_s + i * batch_time_s for i in range(batches + 1)]
    for b_index, end in enumerate(boundaries):
        while events and events[0][0] <= end:
            now, _, customer, k = heapq.heappop(events)
            if k >= 0:
                account(k, now)
                count[k] -= 1
                busy[k] -= 1
                if waiting[k]:
                    nxt = waiting[k].popleft()
                    busy[k] += 1
                    seq += 1
                    heapq.heappush(events, (now + draw(demands[k]), seq, nxt, k))
            nxt_station = k + 1
            if nxt_station < k_count:
                arrive(customer, nxt_station, now)
            else:
                if k >= 0:
                    completions += 1
                seq += 1
                heapq.heappush(events, (now + draw(think_time_s), seq, customer, -1))
        for k in range(k_count):
            account(k, end)
        if b_index > 0:
            samples_x.append(completions / batch_time_s)
            for k in range(k_count):
                samples_q[k].append(area_n[k] / batch_time_s)
                samples_b[k].append(area_b[k] / batch_time_s)
        completions = 0
        area_n = [0.0] * k_count
        area_b = [0.0] * k_count
    t = float(stats.t.ppf(0.5 + confidence / 2, batches - 1))

    def estimate(values: list[float]) -> Estimate:
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return Estimate(mean, t * math.sqrt(var / len(values)))

    return SimResult(
        estimate(samples_x),
        tuple(estimate(q) for q in samples_q),
        tuple(estimate(b) for b in samples_b),
    )
