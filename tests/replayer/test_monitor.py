"""Host and process counters read with psutil, and utilisation over a window."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
import time

import psutil
import pytest

from replayer.monitor import (
    HostCounters,
    LocalMonitor,
    MonitorError,
    host_utilisation,
    pid_listening_on,
    process_utilisation,
    read_host_counters,
    read_process_counters,
    sample,
)


def _spin_cpu(seconds: float) -> None:
    """Use ``seconds`` of this process's CPU time (not wall time: the machine is shared)."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_host_counters_are_sane() -> None:
    c = read_host_counters("h1")
    assert c.host == "h1"
    assert c.cpu_count == psutil.cpu_count()
    assert 0 < c.cpu_busy_s <= c.cpu_total_s
    assert c.disk_count >= 0 and c.disk_busy_s >= 0
    assert c.net_bytes_sent >= 0 and c.net_speed_bytes_per_s >= 0


def test_json_round_trip() -> None:
    c = read_host_counters()
    assert HostCounters.from_json(c.to_json(), "test") == c


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "x"}, r"field 'format': expected 'perfcast-metrics/1'"),
        ({"cpu_busy_s": -1.0}, r"field 'cpu_busy_s': expected a non-negative float"),
        ({"cpu_count": 2.5}, r"field 'cpu_count': expected a non-negative int"),
        ({"cpu_count": True}, r"field 'cpu_count'"),
        ({"host": ""}, r"field 'host': expected a non-empty string"),
        ({"disk_busy_s": float("inf")}, r"field 'disk_busy_s'"),
    ],
)
def test_malformed_metrics_name_the_field(change: dict[str, object], message: str) -> None:
    data = read_host_counters().to_json() | change
    with pytest.raises(MonitorError, match=r"http://agent/metrics: " + message):
        HostCounters.from_json(data, "http://agent/metrics")


def test_missing_field_is_named() -> None:
    data = read_host_counters().to_json()
    del data["net_bytes_recv"]
    with pytest.raises(MonitorError, match=r"field 'net_bytes_recv': missing"):
        HostCounters.from_json(data, "src")
    with pytest.raises(MonitorError, match="expected a JSON object"):
        HostCounters.from_json([1, 2], "src")


def test_utilisation_from_hand_made_counters() -> None:
    a = HostCounters("h", 100.0, 4, 50.0, 400.0, 2, 10.0, 0, 0, 1000, 2000, 125e6)
    # 10 s later: 40 of 40 CPU-seconds elapsed were busy 12 -> 1.2 busy CPUs; disks busy 5 s -> 0.5 busy disks
    b = HostCounters("h", 110.0, 4, 62.0, 440.0, 2, 15.0, 4096, 8192, 11000, 7000, 125e6)
    u = host_utilisation(a, b)
    assert u.elapsed_s == pytest.approx(10.0)
    assert u.cpu_busy_servers == pytest.approx(1.2)
    assert u.disk_busy_servers == pytest.approx(0.5)
    assert u.disk_read_bytes_per_s == pytest.approx(409.6)
    assert u.net_tx_bytes_per_s == pytest.approx(1000.0)
    assert u.net_rx_bytes_per_s == pytest.approx(500.0)
    assert u.net_bandwidth_bytes_per_s == 125e6


def test_utilisation_errors() -> None:
    a = read_host_counters("h")
    with pytest.raises(MonitorError, match="readings of two hosts"):
        host_utilisation(a, dataclasses.replace(a, host="other"))
    with pytest.raises(MonitorError, match="field 'time_s'"):
        host_utilisation(a, a)


async def test_local_monitor_sample_window() -> None:
    u = await sample(LocalMonitor("here"), 0.2)
    assert u.host == "here"
    assert u.elapsed_s >= 0.2
    assert 0.0 <= u.cpu_busy_servers <= u.cpu_servers == psutil.cpu_count()
    assert 0.0 <= u.disk_busy_servers <= max(u.disk_servers, 0)


def test_process_utilisation_counts_cpu_used() -> None:
    start = read_process_counters(os.getpid(), "me")
    _spin_cpu(0.2)
    end = read_process_counters(os.getpid(), "me")
    u = process_utilisation(start, end)
    assert u.label == "me" and u.pid == os.getpid()
    # CPU seconds used in the window are at least the 0.2 s spun, less two 10 ms ticks: user and system time
    # are separate counters in /proc/PID/stat and each is truncated to a tick at the end reading
    assert u.busy_servers * u.elapsed_s >= 0.18
    assert 1 <= u.servers <= psutil.cpu_count()
    assert process_utilisation(start, end, servers=4).servers == 4
    if sys.platform == "linux":  # run-queue waits come from /proc/PID/task/TID/schedstat
        assert u.runqueue_wait_servers is not None and u.runqueue_wait_servers >= 0


def test_a_python_process_is_one_server_whatever_its_threads() -> None:
    before = read_process_counters(os.getpid()).parallelism
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        assert psutil.Process().num_threads() >= 4
        assert read_process_counters(os.getpid()).parallelism == before
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_process_errors() -> None:
    proc = psutil.Popen(["true"])
    proc.wait()
    with pytest.raises(MonitorError, match=rf"process {proc.pid}"):
        read_process_counters(proc.pid)


def test_pid_listening_on_finds_this_process() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert pid_listening_on(port) == os.getpid()
    assert pid_listening_on(port) is None


def test_several_processes_as_one_station() -> None:
    parent = os.getppid()
    c = read_process_counters(os.getpid(), "group", also=(parent,))
    assert c.label == "group" and c.pid == os.getpid()
    # the parent's tree contains this process too: each process is counted once
    assert parent in c.cpu_s_by_pid and os.getpid() in c.cpu_s_by_pid
    assert len(c.cpu_s_by_pid) == len(set(c.cpu_s_by_pid))
    with pytest.raises(MonitorError, match="process 999999999"):
        read_process_counters(os.getpid(), also=(999999999,))
