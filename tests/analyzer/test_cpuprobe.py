"""CPU-work probes under a neighbour (``perfcast profile --cpu``): what is stored, pairing, calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzer.cpuprobe import calibrate, iterations_per_ms, profile_cpu
from analyzer.profiles import ProfileStore
from analyzer.profiling import ProfilingError, StopRule
from replayer.hog import CpuHog

QUICK = StopRule(rse=1.0, min_count=20, budget_s=0.6)


class Recorder:
    """A neighbour that takes nothing and remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, percent: float, cores: frozenset[int]) -> Recorder:
        self.calls.append(f"start {percent:g}")
        return self

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls.append("stop")

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def test_each_level_is_paired_with_the_neighbour_paused(tmp_path: Path) -> None:
    neighbour = Recorder()
    with ProfileStore(tmp_path / "p.db") as store:
        results = profile_cpu([50], neighbour, work_ms=[0.05, 0.5], gap_classes=((0.02, 0.18), (1.0, 5.0)),
                              rule=QUICK, store=store, seed=1)
        keys = {(k.api, k.param, k.value) for k in store.keys()}
    # each work size after sleeps of each class (named by the class's mean sleep)
    apis = [f"cpu {w}ms gap {g}ms" for w in ("0.05", "0.5") for g in ("0.1", "3")]
    assert keys == {(api, "cpu_pct", v) for api in apis for v in (0.0, 50.0)}
    assert [(r.key.api, r.key.value) for r in results] == [(api, v) for api in apis for v in (50.0, 0.0)]
    # running and paused blocks alternate inside one start of the neighbour
    assert neighbour.calls[0] == "start 50" and neighbour.calls[-1] == "stop"
    inner = [c for i, c in enumerate(neighbour.calls[1:-1]) if i == 0 or neighbour.calls[i] != c]
    assert inner[0] == "resume" and inner[-1] == "resume" and "pause" in inner
    assert all(a != b for a, b in zip(inner, inner[1:]))
    for r in results:  # a sample is at least most of its work (and the wake-up)
        work = 0.05 if "0.05" in r.key.api else 0.5
        assert r.samples_ms.size >= 20 and float(np.median(r.samples_ms)) > 0.5 * work


def test_calibration_scales_with_the_work() -> None:
    # one measured rate for both sizes: two measurements of it can be far apart on a shared VM (2.5x seen)
    rate = iterations_per_ms()
    assert rate > 0
    small, large = calibrate(0.1, rate), calibrate(1.0, rate)
    assert small == round(0.1 * rate) and large == pytest.approx(10 * small, abs=10)


def test_bad_levels_and_sizes_are_refused() -> None:
    with pytest.raises(ProfilingError, match=r"--cpu 100: a neighbour's share must be in \(0, 100\) %"):
        profile_cpu([100], Recorder(), rule=QUICK)
    with pytest.raises(ProfilingError, match="--cpu: give at least one"):
        profile_cpu([], Recorder(), rule=QUICK)
    with pytest.raises(ProfilingError, match="--work -1: a work size must be positive"):
        profile_cpu([50], Recorder(), work_ms=[-1], rule=QUICK)
    with pytest.raises(ProfilingError, match=r"gap classes must be ranges 0 <= low < high \(ms\), got \[\(2, 1\)\]"):
        profile_cpu([50], Recorder(), gap_classes=[(2, 1)], rule=QUICK)


def test_a_probe_sleeps_a_draw_from_its_gap_class() -> None:
    rng = np.random.default_rng(3)
    # no work: a sample is the oversleep of one sleep, from the wake-up asked for, and the sleeps are drawn
    # within the class (timed around the probe)
    import time

    from analyzer.cpuprobe import _probe

    took = []
    for _ in range(30):
        t0 = time.perf_counter()
        _probe(1, rng, (2.0, 3.0))
        took.append((time.perf_counter() - t0) * 1e3)
    assert min(took) >= 2.0 and np.median(took) < 3.5


def test_a_real_neighbour_on_the_probes_core_slows_the_work(tmp_path: Path) -> None:
    results = profile_cpu([60], lambda pct, cores: CpuHog(pct, cpus=cores), work_ms=[0.2], gap_classes=[(1.0, 5.0)],
                          rule=StopRule(rse=1.0, min_count=200, budget_s=2.0), seed=2)
    loaded, idle = (r.samples_ms for r in results)
    # the neighbour runs 6 of every 10 ms on the same core: a wake-up that finds it running waits
    assert loaded.mean() > idle.mean()
    assert np.quantile(loaded, 0.95) > np.quantile(idle, 0.95)
