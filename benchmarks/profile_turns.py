"""How much taking turns steadies a parameterised profile: the size profile measured again and again.

The engine reads what a bigger payload adds to a call as the *difference* between two profile points (the
payload's median against the smaller one's, at the same number of callers). This benchmark measures the example
blob service's size profile (``GET /blob/{id}`` at 4 KiB and 256 KiB, one caller and 2, 4, 7 and 10 callers, as
``benchmarks/whatif_accuracy.py`` does) ``--repeats`` times each way, the two ways alternating:

- ``rounds 1``: the points one after the other (each up to its whole budget in one go);
- ``rounds 3``: the points taking turns (``perfcast profile --rounds 3``, the default).

It prints each repeat's shifts and, per number of callers, their spread over the repeats (standard deviation)
and median. A profile that says something else each time it is measured is noise in every prediction made from
it; the ratio of the two spreads, measured in the same run, is the figure.

Run: ``python benchmarks/profile_turns.py [--repeats 7] [--budget 8] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from analyzer.profiling import HttpTarget, StopRule, profile_target
from replayer.groundtruth import ForumSetup, deploy, reachable
from whatif_accuracy import FAN_OUT, POSTGRES_URL, REDIS_URL  # beside this script: the same size profile

BIG = 262144


def _shifts(setup: ForumSetup, rounds: int, budget_s: float) -> dict[int, float]:
    """One size profile: the big payload's median less the small one's, per number of callers (ms)."""
    rule = StopRule(rse=0.01, min_count=200, budget_s=budget_s)
    with deploy(setup) as d:
        got = asyncio.run(profile_target(HttpTarget(f"{d.blob_url}/blob/1?bytes={{size}}"),
                                         sizes=[setup.payload_bytes, BIG], concurrencies=FAN_OUT, rule=rule,
                                         rounds=rounds))
    med = {(m.key.value, m.key.concurrency): float(np.median(m.samples_ms)) for m in got}
    return {c: med[(float(BIG), c)] - med[(float(setup.payload_bytes), c)] for c in (1, *FAN_OUT)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="profiles measured each way (default 7)")
    p.add_argument("--budget", type=float, default=8.0, help="seconds per point at most (default 8)")
    p.add_argument("--out", type=Path, help="also write the figures as JSON here")
    ns = p.parse_args(argv)
    if ns.repeats < 2:
        p.error("--repeats: at least 2 (a spread needs two)")
    real = reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432)
    setup = ForumSetup(redis_url=REDIS_URL if real else None, postgres_url=POSTGRES_URL if real else None)
    shifts: dict[int, list[dict[int, float]]] = {1: [], 3: []}
    for rep in range(ns.repeats):
        for rounds in (1, 3) if rep % 2 == 0 else (3, 1):  # alternate which way goes first
            s = _shifts(setup, rounds, ns.budget)
            shifts[rounds].append(s)
            print(f"repeat {rep + 1}, rounds {rounds}: " + "  ".join(f"{c}: {v:+.2f}" for c, v in s.items()),
                  flush=True)
    print(f"\nwhat 256 KiB adds to a call (ms), over {ns.repeats} profiles each way: sd (median)")
    print(f"{'callers':>8} {'one after the other':>22} {'taking turns':>16} {'sd ratio':>9}")
    table = []
    for c in (1, *FAN_OUT):
        one = [s[c] for s in shifts[1]]
        turns = [s[c] for s in shifts[3]]
        sd1, sd3 = statistics.stdev(one), statistics.stdev(turns)
        table.append({"callers": c, "sd_one_after_other": sd1, "sd_turns": sd3, "median_one_after_other":
                      statistics.median(one), "median_turns": statistics.median(turns)})
        print(f"{c:>8} {sd1:>13.3f} ({statistics.median(one):+.2f}) {sd3:>9.3f} ({statistics.median(turns):+.2f}) "
              f"{sd3 / sd1 if sd1 > 0 else float('nan'):>9.2f}")
    if ns.out:
        ns.out.write_text(json.dumps({"repeats": ns.repeats, "budget_s": ns.budget, "rows": table,
                                      "shifts": {str(k): v for k, v in shifts.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
