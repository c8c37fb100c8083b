"""replayer.groundtruth: the forum app deployed with scenarios applied for real, real processes and proxies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from replayer.groundtruth import (
    BLOB_NAME,
    Applied,
    ForumSetup,
    GroundTruth,
    GroundTruthError,
    LoopLevel,
    client_side_ms,
    cpu_s,
    deploy,
    host_cpu_s,
    loop_cpu_s,
    loop_switches,
    measure,
    measure_idle,
    measure_loaded,
    measure_paired,
    measured_requests,
    pooled_levels,
    pooled_light,
    preempted_s,
    reachable,
    route_of,
)


def _refused(url: str) -> bool:
    parts = urlsplit(url)
    return not reachable(parts.hostname or "127.0.0.1", parts.port or 80)


class TestRouteOf:
    def test_numeric_segments_become_id_and_the_query_goes(self) -> None:
        assert route_of("/?page=3") == "GET /"
        assert route_of("/post/17") == "GET /post/{id}"
        assert route_of("/post/17/comments/2", "POST") == "POST /post/{id}/comments/{id}"
        assert route_of("/post/v2") == "GET /post/v2"


_SYSCALLS = """
import os, sys, threading, time
def spin():  # system time: reads of /dev/zero, the GIL released in each
    with open("/dev/zero", "rb", buffering=0) as f:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            f.read(1 << 20)
if sys.argv[1] == "thread":
    t = threading.Thread(target=spin)
    t.start()
    t.join()  # the main thread (the loop's) waits, taking no CPU
else:
    spin()
print("done", flush=True)
"""


class TestLoopCpu:
    @pytest.mark.parametrize("where", ["thread", "main"])
    def test_system_time_counts_only_on_the_main_thread(self, where: str) -> None:
        proc = subprocess.Popen([sys.executable, "-c", _SYSCALLS, where], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)  # well inside the 1.5 s of reads
            user, system, loop = cpu_s([proc.pid])
            again = loop_cpu_s([proc.pid])  # read again a moment later
        finally:
            assert proc.stdout is not None and proc.stdout.readline() == "done\n"
            proc.wait()
        assert system > 0.2  # the reads cost mostly kernel time
        assert again == pytest.approx(loop, abs=0.05)
        if where == "thread":
            assert loop < 0.5 * (user + system)  # beside the loop: not its demand
            assert loop >= user
        else:
            assert loop == pytest.approx(user + system, abs=0.02)


_BURST = """
import sys, time
for line in sys.stdin:  # each line: spin that many ms of the main thread's CPU, then say so
    end = time.thread_time() + float(line) / 1e3
    while time.thread_time() < end:
        pass
    print("spun", flush=True)
"""


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").is_file(),
                    reason="no /proc schedstat on this system: the loop's CPU comes in clock ticks there")
def test_the_loops_cpu_is_read_finer_than_a_clock_tick() -> None:
    # /proc's user and system times come in ticks of 10 ms: a burst of 3 ms would read as 0 or 10
    proc = subprocess.Popen([sys.executable, "-c", _BURST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        bursts = []
        for k in range(4):  # the first once the interpreter has started: not measured
            before = loop_cpu_s([proc.pid])
            proc.stdin.write("3\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "spun\n"
            if k:
                bursts.append(loop_cpu_s([proc.pid]) - before)
    finally:
        proc.stdin.close()
        proc.stdout.close()
        proc.wait()
    assert all(0.0029 < b < 0.008 for b in bursts), bursts


class TestHostCpu:
    def test_a_busy_process_shows_in_the_hosts_busy_time(self) -> None:
        # a process spinning for 0.8 s adds about 0.8 s of busy time to the host's, whatever else runs beside it
        proc = subprocess.Popen([sys.executable, "-c", _SPIN_ON_CORE_0, "1.5", "spin"], stdout=subprocess.PIPE,
                                text=True)
        try:
            time.sleep(0.3)
            busy0, steal0 = host_cpu_s()
            own0 = sum(cpu_s([proc.pid])[:2])
            time.sleep(0.8)
            busy1, steal1 = host_cpu_s()
            own1 = sum(cpu_s([proc.pid])[:2])
        finally:
            assert proc.stdout is not None and proc.stdout.readline() == "done\n"
            proc.wait()
        assert own1 - own0 > 0.5
        assert busy1 - busy0 >= own1 - own0 - 0.05  # the host's busy time holds the process's
        assert busy1 - busy0 <= 0.8 * (os.cpu_count() or 1) + 0.05
        assert steal1 >= steal0 >= 0.0


_SPIN_ON_CORE_0 = """
import os, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if sys.argv[2] == "sleep":
        time.sleep(0.005)
print("done", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or not hasattr(os, "sched_setaffinity"),
                    reason="needs Linux's /proc and sched_setaffinity")
class TestPreempted:
    def test_a_thread_sharing_its_core_with_a_busy_one_is_preempted(self) -> None:
        # two busy processes on one core: each runs about half the time and waits, preempted, the other half
        procs = [subprocess.Popen([sys.executable, "-c", _SPIN_ON_CORE_0, "1.5", "spin"], stdout=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        try:
            time.sleep(0.3)
            before = loop_switches([procs[0].pid])
            time.sleep(0.8)
            waited = preempted_s(before, loop_switches([procs[0].pid]))
        finally:
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline() == "done\n"
                proc.wait()
        assert 0.2 < waited <= 0.8 + 0.05

    def test_a_thread_that_sleeps_between_short_work_is_not_counted(self) -> None:
        proc = subprocess.Popen([sys.executable, "-c", _SPIN_ON_CORE_0, "1.0", "sleep"], stdout=subprocess.PIPE,
                                text=True)
        try:
            time.sleep(0.3)
            before = loop_switches([proc.pid])
            time.sleep(0.5)
            waited = preempted_s(before, loop_switches([proc.pid]))
        finally:
            assert proc.stdout is not None and proc.stdout.readline() == "done\n"
            proc.wait()
        assert 0.0 <= waited < 0.05
        assert loop_switches([proc.pid]) == (0.0, 0, 0)  # gone: nothing to read, nothing counted


class TestApplied:
    @pytest.mark.parametrize(("kwargs", "word"), [
        ({"added_ms": (("mongo", 5.0),)}, "unknown resource 'mongo'"),
        ({"added_ms": (("blob", -1.0),)}, "non-negative"),
        ({"cpu_pct": 100.0}, "cpu_pct"),
        ({"app_replicas": 1, "failed_replicas": 1}, "failed_replicas"),
        ({"payload_bytes": -5}, "payload_bytes"),
    ])
    def test_bad_values_are_named(self, kwargs: dict[str, object], word: str) -> None:
        with pytest.raises(ValueError, match=word):
            Applied(**kwargs)  # type: ignore[arg-type]

    def test_a_delay_on_a_backend_the_setup_lacks_is_an_error(self) -> None:
        with pytest.raises(GroundTruthError, match="no redis URL"), deploy(ForumSetup(), Applied(
                added_ms=(("redis", 5.0),))):
            pass


def test_location_is_applied_and_every_round_trip_pays_it() -> None:
    truth = measure(ForumSetup(seed=3), Applied(added_ms=(("blob", 30.0),)), requests=12, warmup_requests=2,
                    paths=("/post/{n}",))
    post = truth.client_ms["GET /post/{id}"]
    assert len(post) == 12 and truth.errors == 0
    # A post page fetches its blob through the blob proxy: at least one 30 ms round trip, by construction.
    assert min(post) >= 30.0
    assert truth.server_ms == {}  # not collected
    assert set(truth.resources) == {"blob"}
    # the app's own CPU per request: some user-mode time, and far less than a request's 30 ms wall time
    user_ms, system_ms = truth.app_cpu_ms
    assert 0 < user_ms < 30.0 and system_ms >= 0
    # the loop's share: all of the user time, the loop thread's part of the system time. The process's times
    # come in clock ticks (each of user and system up to one off, and a tick may fall between the reads of the
    # process and of its thread), the loop thread's own time exact (see cpu_s)
    tick_ms = 1e3 / os.sysconf("SC_CLK_TCK") / len(post)
    assert user_ms - 2 * tick_ms - 1e-6 <= truth.loop_cpu_ms <= user_ms + system_ms + 2 * tick_ms + 1e-6
    # one user, a 30 ms wait in every request: the loop sleeps in epoll_wait at least once per request
    assert truth.loop_wakeups >= 1.0 and truth.to_json()["loop_wakeups"] == truth.loop_wakeups


def test_collected_run_gives_server_latencies_inside_the_window(tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    truth = measure(ForumSetup(seed=4), requests=10, warmup_requests=3, spans=spans)
    assert spans.is_file() and truth.spans == (str(spans),)
    assert set(truth.server_ms) <= {"GET /", "GET /post/{id}"}
    assert sum(map(len, truth.server_ms.values())) == 10  # the warm-up requests are left out
    for route in truth.server_ms:
        # the server's latency of a request is within what its client saw (plus the network in between)
        assert min(truth.server_ms[route]) <= min(truth.client_ms[route])
    begin, end = truth.window_ns
    assert 0 < begin < end


def test_idle_runs_pause_between_requests_and_keep_only_their_own_requests(tmp_path: Path) -> None:
    import time

    began = time.monotonic()
    run = measure_idle(ForumSetup(seed=5), [0.0, 30.0], requests=12, rounds=2, spans=tmp_path / "wake.jsonl")
    elapsed = time.monotonic() - began
    assert {r.route for rs in run.requests.values() for r in rs} == {"GET /post/{id}"}
    got = {g: [r.latency_ms for r in rs] for g, rs in run.requests.items()}
    # each pause level's measured requests, server-side (the warm-up and the first of each run left out)
    assert sorted(got) == [0.0, 30.0] and [len(got[g]) for g in (0.0, 30.0)] == [12, 12]
    # and the client's latencies of the same requests, which hold the server side and more
    assert [len(run.client_ms[g]) for g in (0.0, 30.0)] == [12, 12]
    assert all(sorted(run.client_ms[g])[6] > sorted(got[g])[6] for g in (0.0, 30.0))
    # every recorded request: the 5 warm-ups, and in each round runs of 6 (5 measured) and of 2 (1) per level
    assert len(run.every) == 5 + 2 * 2 * (6 + 2)
    assert {r.trace_id for rs in run.requests.values() for r in rs} <= {r.trace_id for r in run.every}
    # the pause is not part of a latency (had it been, every one would be 30 ms or more; a lone request can
    # stall that long on a busy machine)
    assert all(x > 0 for xs in got.values() for x in xs)
    assert sorted(got[30.0])[len(got[30.0]) // 2] < 30.0 and sum(x < 30.0 for x in got[30.0]) >= 10
    assert elapsed >= 12 * 0.030  # but it was taken
    with pytest.raises(ValueError):
        measure_idle(ForumSetup(), [], spans=tmp_path / "none.jsonl")


@pytest.mark.postgres
def test_paired_requests_take_turns_in_one_deployment_and_only_the_scenario_pays(tmp_path: Path,
                                                                                 postgres_url: str) -> None:
    spans = tmp_path / "paired.jsonl"
    bases, truths = measure_paired(ForumSetup(postgres_url=postgres_url, seed=8),
                                   Applied(added_ms=(("postgres", 12.0),)), requests=8, blocks=2, run=3, settle=1,
                                   warmup_requests=2, paths=("/post/{n}",), spans=spans)
    assert len(bases) == len(truths) == 2
    assert all(t.spans == (str(spans),) for t in bases + truths)  # one deployment, one spans file
    # runs of 3 requests, the first of each not measured: each side has one slice per measured request, the
    # two sides' slices never overlap, and the measured ones come two of a side at a time, in an order that varies
    slices = sorted((sl, on) for on, ts in ((False, bases), (True, truths)) for t in ts for sl in t.slices_ns)
    assert len(slices) == 16
    assert all(a[0][1] <= b[0][0] for a, b in zip(slices, slices[1:]))
    sides = [on for _, on in slices]
    assert sides[0::2] == sides[1::2] and sides.count(True) == 8
    assert sides[0::4] != [sides[0]] * 4  # not always the same side first (seeded: fixed for this test)
    base = [x for t in bases for x in t.server_ms["GET /post/{id}"]]
    scenario = [x for t in truths for x in t.server_ms["GET /post/{id}"]]
    assert len(base) == len(scenario) == 8
    assert sorted(len(t.client_ms["GET /post/{id}"]) for t in bases + truths) == [4] * 4
    # the spans file holds both sides and the warm-up; each side's slices pick out its own requests
    from analyzer.spans import read_spans

    recorded = read_spans(spans).requests
    assert len(recorded) >= 2 + 16 + 8  # the warm-up, the measured requests and the first of each run
    assert sorted(r.latency_ms for r in measured_requests(recorded, bases)) == sorted(base)
    assert sorted(r.latency_ms for r in measured_requests(recorded, truths)) == sorted(scenario)
    # a post page reads its post from PostgreSQL: at least one 12 ms round trip on the scenario's side only,
    # on the connections the app opened before the delay was switched on
    assert min(scenario) >= 12.0 and sorted(base)[len(base) // 2] < 12.0
    # what the proxy added: the delay, give or take its threads' lateness, which it offsets by the oversleep it
    # measured at start (a quieter machine later releases a little early, by tenths of a millisecond)
    assert all(t.applied_delay_ms["postgres"] >= 11.5 for t in truths)
    assert all(t.applied_delay_ms == {} for t in bases)
    # the app's CPU is charged to the sides of the requests that spent it (the kernel counts in 10 ms ticks,
    # so a side's four post pages may show none)
    assert sum(sum(t.app_cpu_ms) * len(t.client_ms["GET /post/{id}"]) for t in bases + truths) > 0


def test_paired_blob_size_grows_on_the_scenario_side_only(tmp_path: Path) -> None:
    spans = tmp_path / "size.jsonl"
    bases, truths = measure_paired(ForumSetup(seed=9), Applied(payload_bytes=100_000), requests=6, blocks=1,
                                   warmup_requests=1, paths=("/post/{n}",), spans=spans)
    from analyzer.spans import read_spans

    recorded = read_spans(spans).requests

    def blob_bytes(truths: list) -> set[int]:
        return {io.response_bytes for r in measured_requests(recorded, truths) for io in r.ios
                if io.operation.endswith("/blob/{id}")}

    assert blob_bytes(bases) and max(blob_bytes(bases)) < 10_000  # today's 4 KiB blobs
    # The client span may end before the body is read whole, so a fetch counts what had arrived by then, which
    # depends on timing: the run's largest fetch, not each, reaches 64 KiB, which today's 4 KiB blobs never do.
    assert max(blob_bytes(truths)) >= 65_536
    # the service is left as it was found: a run of today's side after it sees small blobs again
    assert bases[0].errors == truths[0].errors == 0


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="pinning needs two cores")
def test_paired_neighbour_shares_the_pinned_apps_core(tmp_path: Path) -> None:
    import psutil

    seen: list[tuple[str, set[int]]] = []

    def look(text: str) -> None:
        if text.startswith("block"):  # the neighbour runs now: every process this one started, and its cores
            for child in psutil.Process().children(recursive=True):
                seen.append((" ".join(child.cmdline()), os.sched_getaffinity(child.pid)))

    measure_paired(ForumSetup(seed=10, pin=True), Applied(cpu_pct=30), requests=2, blocks=1, warmup_requests=1,
                   paths=("/post/{n}",), spans=tmp_path / "hog.jsonl", on_step=look)
    app_core = {min(os.sched_getaffinity(0))}
    apps = [cores for cmd, cores in seen if "examples.forum " in cmd + " " and "blobs" not in cmd]
    hogs = [cores for cmd, cores in seen if "spawn_main" in cmd]  # (not the semaphores' resource tracker)
    assert apps and all(cores == app_core for cores in apps)
    # one neighbour, on the app's core (not on the other cores, where the harness runs the app's dependencies)
    assert hogs == [app_core]


def test_paired_refuses_what_needs_a_deployment_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="deployments of their own"):
        measure_paired(ForumSetup(), Applied(app_replicas=2, failed_replicas=1), spans=tmp_path / "x.jsonl")


def test_every_process_is_stopped_even_when_the_block_raises() -> None:
    urls = []
    with pytest.raises(RuntimeError, match="boom"), deploy(ForumSetup(seed=5)) as d:
        urls += [d.url, d.blob_url]
        assert not _refused(d.url)
        raise RuntimeError("boom")
    assert all(_refused(u) for u in urls)


def test_failure_routes_all_load_to_the_surviving_replica() -> None:
    # 60 requests: enough CPU (about 1-2 ms each) to show in the kernel's 10 ms accounting ticks
    truth = measure(ForumSetup(seed=6), Applied(app_replicas=2, failed_replicas=1), users=2, requests=60,
                    warmup_requests=2, paths=("/post/{n}",))
    # replica 2 is stopped: had the kernel still sent connections to its socket, they would have failed
    assert truth.errors == 0 and len(truth.client_ms["GET /post/{id}"]) == 60
    assert truth.app_cpu_ms[0] > 0  # the surviving replica's CPU (the stopped one is not counted)


def test_light_and_loaded_phases_take_turns_in_one_deployment() -> None:
    lights, truths = measure_loaded(ForumSetup(seed=11), Applied(app_replicas=2, failed_replicas=1), users=3,
                                    requests=30, light_requests=8, blocks=2, warmup_requests=3,
                                    paths=("/post/{n}",), levels=(2,), level_requests=200)
    assert len(lights) == len(truths) == 2
    assert [t.users for t in lights + truths] == [1, 1, 3, 3]
    assert all(len(t.client_ms["GET /post/{id}"]) == 8 for t in lights)
    # each light phase also ran 2 users on the serving replica: its loop's CPU per request measured there
    assert [[(x.users, x.requests) for x in t.levels] for t in lights] == [[(2, 200)], [(2, 200)]]
    assert all(x.loop_cpu_ms > 0 and x.preempted_ms >= 0 and x.throughput_rps > 0 and x.host_cpu_ms > x.loop_cpu_ms
               for t in lights for x in t.levels)
    assert [x["users"] for x in lights[0].to_json()["levels"]] == [2] and truths[0].levels == ()
    assert all(len(t.client_ms["GET /post/{id}"]) == 30 and t.errors == 0 for t in truths)
    # one deployment, the phases one after the other: their windows never overlap, and each kind of phase
    # comes once per block
    windows = sorted((t.window_ns, t.users) for t in lights + truths)
    assert all(a[0][1] <= b[0][0] for a, b in zip(windows, windows[1:]))
    assert sorted(u for _, u in windows[:2]) == [1, 3] and sorted(u for _, u in windows[2:]) == [1, 3]
    with pytest.raises(ValueError, match="users >= 2"):
        measure_loaded(ForumSetup(), Applied(), users=1, requests=1, light_requests=1)
    with pytest.raises(ValueError, match="levels must be distinct user counts between 1 and 3"):
        measure_loaded(ForumSetup(), Applied(), users=3, requests=1, light_requests=1, levels=(3,))


def test_levels_pool_by_users_weighted_by_their_requests() -> None:
    def light(*levels: LoopLevel) -> GroundTruth:
        return GroundTruth(server_ms={}, client_ms={"GET /": (1.0,)}, resources={}, users=1, throughput_rps=1.0,
                           errors=0, elapsed_s=1.0, levels=levels)

    runs = [light(LoopLevel(4, 2.0, 1.0, 10, 50.0), LoopLevel(2, 3.0, 0.0, 30, 40.0, 8.0)),
            light(LoopLevel(2, 5.0, 1.0, 10, 45.0, 12.0)), light()]
    assert pooled_levels(runs) == [(2, pytest.approx((30 * 3.0 + 10 * 5.0) / 40), pytest.approx(10 / 40),
                                    pytest.approx((30 * 8.0 + 10 * 12.0) / 40)),
                                   (4, 2.0, 1.0, None)]  # a run that did not read the host: no host figure
    assert pooled_levels([light()]) == []


def test_light_runs_pool_weighted_by_their_requests() -> None:
    def light(n: int, loop_ms: float, preempted_ms: float) -> GroundTruth:
        return GroundTruth(server_ms={}, client_ms={"GET /": (1.0,) * n, "GET /x": (2.0,)}, resources={}, users=1,
                           throughput_rps=1.0, errors=0, elapsed_s=1.0, loop_cpu_ms=loop_ms,
                           loop_preempted_ms=preempted_ms, app_cpu_ms=(9.0, 1.0))

    loop_ms, preempted_ms, latencies = pooled_light([light(3, 2.0, 1.0), light(7, 4.0, 0.0)])
    assert loop_ms == pytest.approx((4 * 2.0 + 8 * 4.0) / 12) and preempted_ms == pytest.approx(4 / 12)
    assert latencies == {"GET /": [1.0] * 10, "GET /x": [2.0, 2.0]}
    # a run that did not measure its loop's CPU: the app's CPU stands for it
    assert pooled_light([light(1, 0.0, 0.0)])[0] == pytest.approx(10.0)


def test_client_side_time_is_the_mean_client_latency_less_the_server_spans() -> None:
    def run(client: tuple[float, ...], server: tuple[float, ...]) -> GroundTruth:
        return GroundTruth(server_ms={"GET /": server, "GET /x": (5.0,)}, client_ms={"GET /": client, "GET /x": (4.0,)},
                           resources={}, users=1, throughput_rps=1.0, errors=0, elapsed_s=1.0)

    got = client_side_ms([run((3.0, 5.0), (2.0, 4.0)), run((7.0,), (5.5,))])
    # pooled over the runs' requests: (3 + 5 + 7) / 3 - (2 + 4 + 5.5) / 3; never below 0
    assert got == {"GET /": pytest.approx(15 / 3 - 11.5 / 3), "GET /x": 0.0}
    assert client_side_ms([]) == {}


def test_an_app_that_cannot_start_raises_with_its_log() -> None:
    with pytest.raises(GroundTruthError, match="unrecognized arguments"):
        measure(ForumSetup(app_args=("--no-such-flag",)), requests=1)


@pytest.mark.redis
def test_redis_behind_its_proxy(redis_url: str) -> None:
    truth = measure(ForumSetup(redis_url=redis_url, seed=7), Applied(added_ms=(("redis", 15.0),)),
                    requests=6, warmup_requests=2, paths=("/?page={n}",))
    assert set(truth.resources) == {"blob", "redis"} and truth.errors == 0
    assert min(truth.client_ms["GET /"]) >= 15.0  # the cache lookup pays one round trip at least
    assert BLOB_NAME == "blob"
