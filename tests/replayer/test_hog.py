"""The CPU hog takes the share of CPU it is asked for."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from replayer.hog import CpuHog


def test_hog_takes_about_its_share_of_one_core() -> None:
    with CpuHog(percent=50, cores=1) as hog:
        procs = [psutil.Process(p.pid) for p in hog._procs]
        time.sleep(0.3)  # let the child start
        before = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        time.sleep(1.0)
        after = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    share = after - before
    # half a core for a second, give or take scheduling on a shared machine
    assert 0.25 < share < 0.75


def test_hog_rejects_bad_percent() -> None:
    with pytest.raises(ValueError, match="percent"):
        CpuHog(percent=150).start()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_hog_stays_on_the_cores_it_is_given() -> None:
    core = min(os.sched_getaffinity(0))
    with CpuHog(percent=20, cpus=frozenset({core})) as hog:
        assert len(hog._procs) == 1  # one process per given core
        assert all(os.sched_getaffinity(p.pid) == {core} for p in hog._procs)
