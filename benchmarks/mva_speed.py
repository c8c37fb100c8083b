"""Speed and accuracy of perfcast's exact multi-server MVA against line-solver, on the same model.

The model: 12 stations (six 16-server CPUs, an 8- and a 4-server station, four single-server disks) behind
1 s of think time, N = 1,500 users; at N the 16-server stations are 30% to 100% busy, the regime where the
marginal-probability recursion loses its precision. perfcast solves n = 1..N in one call; the figure is the
median of repeated runs. line-solver (PyPI ``line-solver``, the ``bench`` extra: ``pip install -e '.[bench]'``)
solves the same network with its exact MVA (``MVA(model, method="exact")``); it is slow, so it runs once. With
``--reference`` the float64 recursion and an mpmath one (600 digits) are run too, as ground truth.

    python benchmarks/mva_speed.py [--users 1500] [--repeat 50] [--line-users 1500] [--reference]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# one BLAS thread: the machine's cores are shared, and the solver is meant to cost one core
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzer.mva import solve_exact, solve_schweitzer
from analyzer.queueing import ClosedModel, Station

DEMANDS = [0.032, 0.025, 0.0096, 0.02, 0.015, 0.01, 0.0015, 0.001, 0.0008, 0.0005, 0.003, 0.004]
SERVERS = [16, 16, 16, 16, 16, 16, 1, 1, 1, 1, 4, 8]
THINK = 1.0


def model() -> ClosedModel:
    return ClosedModel(tuple(Station(f"s{k}", d, c) for k, (d, c) in enumerate(zip(DEMANDS, SERVERS))), THINK)


def timed(fn, repeat: int) -> tuple[float, float, object]:  # type: ignore[no-untyped-def]
    """Median wall-clock and median CPU time of ``repeat`` calls (CPU time is steadier on a busy machine)."""
    out = fn()
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu), out


def line_solver_exact(users: int) -> tuple[float, float, dict[str, float]] | None:
    try:
        from line_solver import (
            MVA,
            ClosedClass,
            Delay,
            Exp,
            Network,
            Queue,
            SchedStrategy,
        )
    except ImportError as exc:
        print(f"line-solver is not importable ({exc}); install the bench extra: pip install -e '.[bench]'")
        return None
    net = Network("bench")
    think = Delay(net, "Think")
    queues = []
    for k, c in enumerate(SERVERS):
        q = Queue(net, f"s{k}", SchedStrategy.FCFS)
        q.setNumberOfServers(c)
        queues.append(q)
    job = ClosedClass(net, "C", users, think)
    think.setService(job, Exp(1.0 / THINK))
    for q, d in zip(queues, DEMANDS):
        q.setService(job, Exp(1.0 / d))
    net.link(Network.serialRouting(think, *queues))
    start = time.perf_counter()
    solver = MVA(net, method="exact")
    table = solver.getAvgTable()
    elapsed = time.perf_counter() - start
    x = float(np.ravel(solver.getAvgSysTput())[0])
    qlen = {str(row.Station): float(row.QLen) for row in table.itertuples()}
    return elapsed, x, qlen


def float64_recursion(users: int) -> np.ndarray:
    """The load-dependent MVA recursion (Reiser and Lavenberg, utilisation-law form) in plain float64."""
    d = np.array(DEMANDS)
    c = np.array(SERVERS)
    cmax = c.max()
    p = np.zeros((len(d), cmax))
    p[:, 0] = 1.0
    q = np.zeros(len(d))
    j = np.arange(cmax)
    mask = j[None, :] < c[:, None]
    xs = np.empty(users)
    for n in range(1, users + 1):
        f = ((c[:, None] - 1 - j[None, :]) * p * mask).sum(axis=1)
        r = d / c * (1 + q + f)
        x = n / (THINK + r.sum())
        new = np.zeros_like(p)
        new[:, 1:] = (d[:, None] * x / j[None, 1:]) * p[:, :-1]
        new *= mask
        new[:, 0] = (c - d * x - ((c[:, None] - j[None, :]) * new * mask)[:, 1:].sum(axis=1)) / c
        p, q, xs[n - 1] = new, x * r, x
    return xs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--line-users", type=int, default=None, help="population for line-solver (default: --users)")
    parser.add_argument("--reference", action="store_true", help="also run the float64 and mpmath recursions")
    args = parser.parse_args()
    n = args.users
    m = model()
    bound = min(c / d for d, c in zip(DEMANDS, SERVERS))
    print(f"model: {len(DEMANDS)} stations, servers {SERVERS}, think {THINK} s, N = {n}; bottleneck bound {bound:.4g}/s")

    t_exact, c_exact, exact = timed(lambda: solve_exact(m, n), args.repeat)
    t_schw, c_schw, schw = timed(lambda: solve_schweitzer(m, n), max(3, args.repeat // 5))
    x = exact.throughput_per_s  # type: ignore[attr-defined]
    print(f"perfcast exact      n = 1..{n}: median {t_exact * 1e3:7.2f} ms wall, {c_exact * 1e3:7.2f} ms CPU "
          f"over {args.repeat} runs;  X({n}) = {x[-1]:.6f}/s")
    sx = schw.throughput_per_s  # type: ignore[attr-defined]
    print(f"perfcast schweitzer n = 1..{n}: median {t_schw * 1e3:7.2f} ms wall, {c_schw * 1e3:7.2f} ms CPU;  "
          f"X({n}) = {sx[-1]:.6f}/s, "
          f"max |dev| from exact {np.max(np.abs(sx / x - 1)) * 100:.2f}%")
    util = {k: float(v[-1]) for k, v in exact.utilization.items()}  # type: ignore[attr-defined]
    print("perfcast utilisation at N: " + ", ".join(f"{k} {u * 100:.1f}%" for k, u in util.items()))

    line_n = args.line_users or n
    start_cpu = time.process_time()
    got = line_solver_exact(line_n)
    if got is not None:
        t_line, x_line, q_line = got
        c_line = time.process_time() - start_cpu
        ref_x = x[line_n - 1] if line_n <= n else solve_exact(m, line_n).throughput_per_s[-1]
        q_ref = solve_exact(m, line_n).queue_length
        worst = max(abs(q_line[k] - q_ref[k][-1]) for k in q_ref)
        print(f"line-solver exact   N = {line_n}: {t_line * 1e3:10.1f} ms (one run);  X = {x_line:.6f}/s "
              f"({'ABOVE' if x_line > bound * (1 + 1e-9) else 'within'} the bound), perfcast {ref_x:.6f}/s, "
              f"rel. diff {abs(x_line / ref_x - 1):.2e}; largest queue-length difference {worst:.3g} jobs")
        print(f"ratio line-solver / perfcast: {t_line / t_exact:,.0f}x wall time, {c_line / c_exact:,.0f}x CPU time"
              + ("" if line_n == n else f" (line-solver at N = {line_n}, perfcast at N = {n})"))

    if args.reference:
        xs = float64_recursion(n)
        bad = np.flatnonzero(~(xs > 0) | (xs > bound * (1 + 1e-9)))
        first = f"first impossible value at n = {bad[0] + 1}" if bad.size else "no impossible value"
        print(f"float64 recursion: max rel. diff from perfcast {np.nanmax(np.abs(xs / x - 1)):.2e}; {first}")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analyzer"))
        from test_mva import reference_ld_mva

        start = time.perf_counter()
        ref, _ = reference_ld_mva(DEMANDS, SERVERS, THINK, n, dps=600)
        print(f"mpmath recursion (600 digits, {time.perf_counter() - start:.1f} s): "
              f"max rel. diff from perfcast {np.max(np.abs(ref / x - 1)):.2e}")


if __name__ == "__main__":
    main()
