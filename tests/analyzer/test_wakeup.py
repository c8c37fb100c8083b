"""Wake-up profiles and what the simulation charges for the loop's idle gaps, on graphs worked out by hand."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest

from analyzer.graph import Node, NodeKind
from analyzer.predict import predict
from analyzer.profiles import ProfileKey, ProfileStore
from analyzer.spans import IoCall, Request
from analyzer.wakeup import (
    SERVICE_WAKE_API,
    WAKE_API,
    WAKE_DECAY_API,
    WakeProfile,
    add_wake_profile,
    add_wake_profiles,
    fit_decay,
    monotone_extra,
    service_profile_for,
    service_wake_profiles,
    wake_profile,
)
from tests.analyzer.test_predict import compute, graph, io, rng


def wake_store(path: Path, at: dict[float, float]) -> ProfileStore:
    """Wake-up profiles: 1 ms back to back, ``1 + at[g]`` ms after a pause of g ms (every sample alike)."""
    s = ProfileStore(path)
    for gap, extra in {0.0: 0.0, **at}.items():
        s.add(ProfileKey.make(WAKE_API, "http://app", {}, "idle_ms", gap), np.full(50, 1.0 + extra))
    return s


def test_profile_reads_the_shift_of_each_gap_and_the_span_of_work(tmp_path: Path) -> None:
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        p = wake_profile(s)
    assert p is not None
    assert p.idle_ms.tolist() == [0.0, 10.0] and p.span_ms == pytest.approx(1.0)
    assert p.decay_ms == 0.0 and p.tau_ms == pytest.approx(0.5)  # no step data: half the work, an even spread's
    np.testing.assert_allclose([p.at(g, 0.3) for g in (0.0, 5.0, 10.0, 50.0)], [0.0, 0.3, 0.6, 0.6])
    with ProfileStore(tmp_path / "one.db") as s:  # no reference at 0 ms: no profile
        s.add(ProfileKey.make(WAKE_API, "http://app", {}, "idle_ms", 10.0), [1.0, 2.0])
        assert wake_profile(s) is None


def test_add_wake_profile_stores_each_gap_and_refuses_incomplete_data(tmp_path: Path) -> None:
    with ProfileStore(tmp_path / "p.db") as s:
        add_wake_profile(s, "forum GET /post/{id}", {0.0: [1.0] * 20, 10.0: [1.8] * 20}, note="test")
        assert sorted((k.api, k.resource, k.param, k.value) for k in s.keys()) == [
            (WAKE_API, "forum GET /post/{id}", "idle_ms", 0.0), (WAKE_API, "forum GET /post/{id}", "idle_ms", 10.0)]
        p = wake_profile(s)
        assert p is not None and p.at(10.0, 0.5) == pytest.approx(0.8)
        with pytest.raises(ValueError, match="the gap 0"):
            add_wake_profile(s, "x", {10.0: [1.0]})
        with pytest.raises(ValueError, match="no latency measured 20 ms apart"):
            add_wake_profile(s, "x", {0.0: [1.0], 20.0: []})
        assert {k.resource for k in s.keys()} == {"forum GET /post/{id}"}  # nothing of "x" half stored


def test_extra_interpolates_each_quantile_between_measured_gaps() -> None:
    levels = np.array([0.0, 5.0, 20.0])
    extra = np.vstack([np.zeros(200), np.linspace(0, 1, 200), np.linspace(1, 2, 200)])
    p = WakeProfile(levels, extra, "")
    gaps = np.random.default_rng(1).uniform(-5, 40, 500)
    us = np.random.default_rng(2).random(500)
    # numpy's own interpolation of the quantile's column; flat above the largest gap, nothing at or below 0
    expected = [np.interp(g, levels, extra[:, int(u * 200)]) if g > 0 else 0.0 for g, u in zip(gaps, us, strict=True)]
    np.testing.assert_allclose([p.at(g, u) for g, u in zip(gaps, us, strict=True)], expected)


TAU = 0.5
"""The decay length of :func:`wake_store`'s profiles: half their 1 ms of work (no decay fitted)."""


def paid(work: float) -> float:
    """The share of what a gap owes that ``work`` ms of loop work after it pays at :data:`TAU`."""
    return 1.0 - math.exp(-work / TAU)


def chain() -> object:
    """io a (1 ms, one Redis round trip) -> c (0.2 ms) -> d (1.5 ms) -> end."""
    return graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4), compute("d", [1.5] * 4, [1.5] * 4)],
                 [("start", "a"), ("a", "c"), ("c", "d"), ("d", "end")])


def test_a_longer_wait_is_charged_the_extra_of_its_gap_beyond_the_recorded_gap(tmp_path: Path) -> None:
    # Recorded, the loop idles 1 ms (the call) before c; with +10 ms, 11 ms. The profile: +0.06 ms per ms of
    # gap up to 10 ms, +0.6 above, what is still owed falling by e every 0.5 ms of work: c and d (1.7 ms of
    # work) pay paid(1.7) of it. The rest is owed into the next request, whose gap is priced with the idle
    # behind it in that share: as recorded 1 + 1 * L + ... = 1 / (1 - L) ms with L = 1 - paid(1.7) (the first
    # request 1 ms, at 0.06 ms less than the others' 0.06 / (1 - L)); under the scenario 0.6 whatever.
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        (p,) = predict([chain()], "location:redis=+10ms", s, samples=200, rng=rng())
        (plain,) = predict([chain()], "location:redis=+10ms", None, samples=200, rng=rng())
    np.testing.assert_allclose(plain.predicted.samples_ms, 12.7, atol=1e-9)
    x = p.predicted.samples_ms
    assert np.median(x) == pytest.approx(12.7 + 0.6 * paid(1.7) - 0.06, abs=1e-6)
    assert x.max() <= 12.7 + 0.6 * paid(1.7) - 0.06 * paid(1.7) + 1e-9
    assert any("wake-up" in n for n in p.notes)


@pytest.mark.parametrize("kind", [NodeKind.SYNC, NodeKind.WAIT])
def test_the_loop_does_not_wake_up_again_after_a_sync_point(tmp_path: Path, kind: NodeKind) -> None:
    # chain() with 0.05 ms between c and d: a sync point (c's task ends, its parent's d runs from the ready
    # queue: the loop does not sleep between them) or a wait on another task (which an answer ends: a wake-up).
    # After the sync point d goes on paying what the 11 ms gap still owes, as if c and d were one piece of
    # work: as chain(), 0.05 ms later. After the wait the loop wakes again and d's gap is priced with the idle
    # behind it, which costs more
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4), Node("s", kind, (0.05,) * 4),
                        compute("d", [1.5] * 4, [1.5] * 4)],
              [("start", "a"), ("a", "c"), ("c", "s"), ("s", "d"), ("d", "end")])
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    one_piece = 12.75 + 0.6 * paid(1.7) - 0.06
    if kind is NodeKind.SYNC:
        assert np.median(p.predicted.samples_ms) == pytest.approx(one_piece, abs=1e-6)
    else:
        assert np.median(p.predicted.samples_ms) > one_piece + 0.01


def test_short_work_after_a_gap_pays_its_share_only(tmp_path: Path) -> None:
    # a -> c (0.2 ms) -> end: c pays paid(0.2) = 33% of what its gap owes. One user's requests follow each other
    # on the loop, so the share L = 1 - paid(0.2) c leaves owed is priced into the next request's gap: as
    # recorded, gaps of 1 ms add up to 1 / (1 - L) ms of idle, 0.06 / (1 - L) owed, of which c pays 0.06;
    # under the scenario, 11 ms and more (0.6 owed). The first requests, before the recorded idle has added up,
    # are charged up to paid(0.2) * (0.6 - 0.06).
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4)],
              [("start", "a"), ("a", "c"), ("c", "end")])
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    x = p.predicted.samples_ms
    assert np.median(x) == pytest.approx(11.2 + 0.6 * paid(0.2) - 0.06, abs=1e-6)
    assert x.min() >= 11.2 + 0.6 * paid(0.2) - 0.06 - 1e-6
    assert x.max() <= 11.2 + paid(0.2) * (0.6 - 0.06) + 1e-9


def test_scenarios_that_change_no_wait_are_not_charged(tmp_path: Path) -> None:
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        (p,) = predict([chain()], "load:1", s, samples=200, rng=rng())
    np.testing.assert_allclose(p.predicted.samples_ms, 2.7, atol=1e-9)
    assert not any("wake-up" in n for n in p.notes)


def test_a_short_gap_does_not_warm_a_loop_still_cold_from_a_long_one(tmp_path: Path) -> None:
    # a (Redis, +10 ms) -> c (0.2) -> b (PostgreSQL 0.5 ms, unchanged) -> d (1.5). Under the scenario c pays
    # paid(0.2) of the 11 ms gap's 0.6; the 0.5 ms gap before d is priced with the share L = 1 - paid(0.2) of
    # that gap's extra still owed: 0.5 + 11.41 * L = 8.145 ms idle (11.41: the 11 ms gap with the idle behind
    # d's leftover, 1 - paid(1.5) of it: 11 + (0.5 + 11.41 L)(1 - paid(1.5))), 0.4887 ms, of which d pays
    # paid(1.5). As recorded (1.0603 ms of idle before c, 0.5 + 1.0603 L before d): c 0.02097, d 0.06903.
    # A gap that alone would owe 0.03 ms does not wipe out the cold spell before it.
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4),
                        io("b", [0.5] * 4, system="postgresql", api="postgresql SELECT"),
                        compute("d", [1.5] * 4, [1.5] * 4)],
              [("start", "a"), ("a", "c"), ("c", "b"), ("b", "d"), ("d", "end")])
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    assert np.median(p.predicted.samples_ms) == pytest.approx(
        13.2 + (0.6 * paid(0.2) - 0.020973) + (0.48872 * paid(1.5) - 0.069027), abs=2e-5)


def test_idle_spells_a_little_work_apart_add_up(tmp_path: Path) -> None:
    # a (Redis) -> c (0.2) -> b (Redis) -> d (1.5), both calls +10 ms; the profile: +0.2 ms after 10 ms idle,
    # +0.7 after 20. Under the scenario c's gap is 11.946 ms (with the idle behind d's leftover, as in the test
    # above), at() = 0.2973, of which c pays paid(0.2); b's 11 ms gap comes with L = 1 - paid(0.2) of it still
    # owed: 11 + 11.946 L = 19.008 ms idle, 0.6504 ms, of which d pays paid(1.5). As recorded (1 ms gaps:
    # 1.0860 and 1.7280 ms of idle): c 0.007161, d 0.032839. Priced apart, the two gaps would add 0.22 each.
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4), io("b", [1.0] * 4),
                        compute("d", [1.5] * 4, [1.5] * 4)],
              [("start", "a"), ("a", "c"), ("c", "b"), ("b", "d"), ("d", "end")])
    with wake_store(tmp_path / "p.db", {10.0: 0.2, 20.0: 0.7}) as s:
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    assert np.median(p.predicted.samples_ms) == pytest.approx(
        23.7 + (0.297313 * paid(0.2) - 0.007161) + (0.650391 * paid(1.5) - 0.032839), abs=2e-5)


def test_the_extra_decays_over_the_work_it_was_measured_on(tmp_path: Path) -> None:
    # The profile times this very route (its resource ends with "GET /"), whose recorded loop work is c's 0.2 ms:
    # what is owed still decays over half the 1 ms the profile measured it on, so c pays paid(0.2) of it, as for
    # a profile of anything else (test_short_work_after_a_gap_pays_its_share_only); spread over the route's
    # 0.2 ms, c would pay it all (0.6 - 0.06 beyond the recording)
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4)],
              [("start", "a"), ("a", "c"), ("c", "end")])
    with ProfileStore(tmp_path / "p.db") as s:
        for gap, extra in {0.0: 0.0, 10.0: 0.6}.items():
            s.add(ProfileKey.make(WAKE_API, "http://app GET /", {}, "idle_ms", gap), np.full(50, 1.0 + extra))
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    assert np.median(p.predicted.samples_ms) == pytest.approx(11.2 + 0.6 * paid(0.2) - 0.06, abs=1e-6)
    assert any("falling by e every 0.5 ms of it (half the work the profile's extra was measured on" in n
               for n in p.notes)


def _request(trace: str, start: float, end: float, calls: list[tuple[float, float, str]]) -> Request:
    """A post page from ``start`` to ``end`` ms with io calls (start ms, end ms, resource)."""
    ios = tuple(IoCall(1, i, int(a * 1e6), int(b * 1e6), urlsplit(res).scheme or "http", "GET", res, 1, 0, 0)
                for i, (a, b, res) in enumerate(calls))
    return Request(trace, "GET /post/{id}", int(start * 1e6), int(end * 1e6), 1, {}, {}, ios)


PG_URL = "postgresql://127.0.0.1:5432/test"


def test_add_wake_profiles_keeps_the_loop_and_each_service_apart(tmp_path: Path) -> None:
    # Each request: a first query, a second right after it (the same service, never idle long), a blob fetch.
    # Back to back (r0 a warm-up, r1 and r2 measured), then two after 20 ms pauses, whose calls take longer.
    def page(trace: str, t: float, slow: float, redis: bool = False) -> Request:
        calls = [(t + 0.1, t + 0.6 + slow, PG_URL), (t + 0.7 + slow, t + 0.9 + slow, PG_URL),
                 (t + 1.0 + slow, t + 1.5 + 2 * slow, "blob")]
        if redis:
            calls.append((t + 1.6 + 2 * slow, t + 1.7 + 2 * slow, "redis://127.0.0.1:6379/0"))
        return _request(trace, t, t + 2.0 + 2 * slow, calls)

    r0, r1, r2 = page("r0", 0.0, 0.0, True), page("r1", 2.0, 0.0, True), page("r2", 4.0, 0.0, True)
    r3, r4 = page("r3", 26.0, 0.2), page("r4", 48.2, 0.2)
    with ProfileStore(tmp_path / "p.db") as s:
        lines = add_wake_profiles(s, "forum GET /post/{id}", {0.0: [r1, r2], 20.0: [r3, r4]}, [r0, r1, r2, r3, r4])
        # the loop: the latency less the time a call was in flight (2.0 - 1.2 - 0.1 redis; 2.4 - 1.6)
        loop = wake_profile(s)
        assert loop is not None and loop.idle_ms.tolist() == [0.0, 20.0]
        assert loop.at(20.0, 0.5) == pytest.approx(0.8 - 0.7, abs=1e-5)  # times are whole ns
        services = service_wake_profiles(s)
        # idle before each first call: from the start of the service's call before it (r2's second query at 4.7,
        # r3's first at 26.1: 21.4 ms; back to back 2.1 - 0.7 = 1.4 ms; the blob 3.0 - 1.0 and 27.2 - 5.0 ms)
        assert sorted(services) == ["blob", PG_URL]
        assert services[PG_URL].idle_ms.tolist() == [1.4, 21.4] and services["blob"].idle_ms.tolist() == [2.0, 22.2]
        assert services[PG_URL].at(21.4, 0.5) == pytest.approx(0.2, abs=1e-5) and services[PG_URL].at(1.0, 0.5) == 0.0
        assert services["blob"].at(12.1, 0.5) == pytest.approx(0.1, abs=1e-5)  # half-way: half of the 0.2 ms
        # Redis was only called back to back: one level, no profile, and the reason is given
        assert any(line.startswith("service redis://127.0.0.1:6379/0: no profile") for line in lines)
        assert {k.api for k in s.keys()} == {WAKE_API, SERVICE_WAKE_API}


def test_the_loops_profile_holds_its_reading_of_the_request_where_every_request_recorded_it(tmp_path: Path) -> None:
    # Loop work off the io calls: 1.0 ms back to back, 1.1 after 20 ms. The loop woke 0.3 ms before the span back
    # to back and 0.6 ms before it after a pause: the parsing of the request ran colder too.
    def page(trace: str, t: float, slow: float, before: float | None) -> Request:
        r = _request(trace, t, t + 2.0 + slow, [(t + 0.5, t + 1.5, PG_URL)])
        return replace(r, loop_woke_ns=None if before is None else r.start_ns - int(before * 1e6))

    back = [page("r1", 2.0, 0.0, 0.3), page("r2", 4.0, 0.0, 0.3)]
    paused = [page("r3", 26.0, 0.1, 0.6), page("r4", 48.0, 0.1, 0.6)]
    with ProfileStore(tmp_path / "p.db") as s:
        lines = add_wake_profiles(s, "forum GET /post/{id}", {0.0: back, 20.0: paused}, back + paused)
        loop = wake_profile(s)
        assert loop is not None and loop.at(20.0, 0.5) == pytest.approx(0.1 + 0.3, abs=1e-5)
        assert loop.span_ms == pytest.approx(1.3, abs=1e-5)  # the work the extra was measured on, parsing included
        assert "with its reading of the request" in lines[0]
    # one request without it: none counts it, or the levels would compare different work
    paused[1] = replace(paused[1], loop_woke_ns=None)
    with ProfileStore(tmp_path / "q.db") as s:
        add_wake_profiles(s, "forum GET /post/{id}", {0.0: back, 20.0: paused}, back + paused)
        loop = wake_profile(s)
        assert loop is not None and loop.at(20.0, 0.5) == pytest.approx(0.1, abs=1e-5)


def test_the_decay_is_fitted_to_the_steps_of_the_profiled_requests(tmp_path: Path) -> None:
    # Pieces of loop work (the reading of the request, then between and after the calls): 0.4, 0.3, 0.5 ms back
    # to back; after 20 ms pauses 0.7, 0.33, 0.51: the first piece took 0.3 of the 0.34 ms extra. An even spread
    # over the 1.2 ms would give it a third; decaying by e every tau ms, 0.3 / 0.34 needs tau well under 0.4.
    def page(trace: str, t: float, pieces: tuple[float, float, float]) -> Request:
        a, b, c = pieces
        r = _request(trace, t, t + b + c + 2.0, [(t + b, t + b + 1.0, PG_URL), (t + b + 1.0, t + b + 2.0, "blob")])
        return replace(r, loop_woke_ns=r.start_ns - int(a * 1e6))

    back = [page(f"b{i}", 10.0 * i, (0.4, 0.3, 0.5)) for i in range(4)]
    paused = [page(f"p{i}", 100.0 + 30.0 * i, (0.7, 0.33, 0.51)) for i in range(4)]
    with ProfileStore(tmp_path / "p.db") as s:
        lines = add_wake_profiles(s, "forum GET /post/{id}", {0.0: back, 20.0: paused}, back + paused)
        loop = wake_profile(s)
        keys = [k for k in s.keys() if k.api == WAKE_DECAY_API]
    assert len(keys) == 1 and keys[0].resource == "forum GET /post/{id}"
    assert loop is not None and 0.05 < loop.decay_ms < 0.3 and loop.tau_ms == loop.decay_ms
    assert "falls by e every" in lines[0] and "decaying by e every" in loop.how
    # the fit reproduces the shares: the first piece's, from the model, within a few % of the measured 0.3 / 0.34
    first = 1 - math.exp(-0.4 / loop.decay_ms)
    rest = math.exp(-0.4 / loop.decay_ms) - math.exp(-1.2 / loop.decay_ms)
    assert first / (first + rest) == pytest.approx(0.3 / 0.34, abs=0.03)
    # nothing to fit: one piece of work, or no pause that slows it
    assert fit_decay({0.0: [[1.0]] * 3, 20.0: [[1.4]] * 3}) is None
    assert fit_decay({0.0: [[0.4, 0.5]] * 3, 20.0: [[0.4, 0.5]] * 3}) is None
    assert fit_decay({20.0: [[0.7, 0.5]] * 3}) is None


def test_a_fitted_decay_puts_the_extra_on_the_first_work_after_the_gap(tmp_path: Path) -> None:
    # test_short_work_after_a_gap_pays_its_share_only with the profile's decay fitted at 0.1 ms: c's 0.2 ms pays
    # 1 - exp(-2) of what its gap owes, where half the profile's 1 ms (0.5) had it pay paid(0.2).
    g = graph("GET /", [io("a", [1.0] * 4), compute("c", [0.2] * 4, [0.2] * 4)],
              [("start", "a"), ("a", "c"), ("c", "end")])
    with wake_store(tmp_path / "p.db", {10.0: 0.6}) as s:
        s.add(ProfileKey.make(WAKE_DECAY_API, "http://app"), [0.1])
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
    share = 1 - math.exp(-2.0)
    assert np.median(p.predicted.samples_ms) == pytest.approx(11.2 + 0.6 * share - 0.06, abs=1e-6)
    assert share > paid(0.2)
    assert any("falling by e every 0.1 ms of it (fitted to the profiled requests' steps)" in n for n in p.notes)


def service_store(path: Path, resource: str, levels: dict[float, float]) -> ProfileStore:
    """A store with a service wake-up profile of ``resource``: idle level (ms) -> its calls' latency (ms)."""
    s = ProfileStore(path)
    for idle, ms in levels.items():
        s.add(ProfileKey.make(SERVICE_WAKE_API, resource, {}, "idle_ms", idle), np.full(50, ms))
    return s


def test_a_service_idle_longer_under_the_scenario_answers_later(tmp_path: Path) -> None:
    # a (Redis 1 ms) -> b (PostgreSQL 0.5 ms), one user back to back. Recorded, PostgreSQL idles 1.5 ms between
    # the starts of its calls (at(1.5) = 0.01 ms, in the recorded durations); with Redis +10 ms, 11.5 ms plus b's
    # own extra: e = at(11.5 + e) - 0.01 with at(x) = 0.02 (x - 1), so e = 0.2 / 0.98. No loop profile.
    g = graph("GET /", [io("a", [1.0] * 4), io("b", [0.5] * 4, system="postgresql", api="postgresql SELECT")],
              [("start", "a"), ("a", "b"), ("b", "end")])
    pg = g.node("b").resource
    with service_store(tmp_path / "p.db", pg, {1.0: 0.5, 21.0: 0.9}) as s:
        (p,) = predict([g], "location:redis=+10ms", s, samples=200, rng=rng())
        (plain,) = predict([g], "location:redis=+10ms", None, samples=200, rng=rng())
    np.testing.assert_allclose(plain.predicted.samples_ms, 11.5, atol=1e-9)
    assert np.median(p.predicted.samples_ms) == pytest.approx(11.5 + 0.2 / 0.98, abs=1e-6)
    assert any(n.startswith("service wake-up: what " + pg) for n in p.notes)
    # a proxy on another port is the same service
    other = pg.replace(urlsplit(pg).netloc, "127.0.0.1:1")
    assert service_profile_for(other, {pg: WakeProfile(np.array([1.0, 21.0]), np.zeros((2, 200)), "")}) is not None


def test_under_load_a_busy_service_does_not_pay_the_wake_ups_recorded_at_one_user(tmp_path: Path) -> None:
    # One PostgreSQL call of 4 ms per request. Recorded at one user back to back, each call starts 4 ms after the
    # one before, so 0.4 ms of it was the service's wake-up (levels 1 and 2 ms: 0 and 0.4 ms of extra, 0.4 beyond).
    # Two users: from the second call on, each starts while the other user's is in flight (idle 0): 3.6 ms.
    g = graph("GET /", [io("b", [4.0] * 4, system="postgresql", api="postgresql SELECT")],
              [("start", "b"), ("b", "end")])
    pg = g.node("b").resource
    with service_store(tmp_path / "p.db", pg, {1.0: 0.5, 2.0: 0.9}) as s:
        (busy,) = predict([g], "load:2", s, samples=200, rng=rng())
        (one,) = predict([g], "load:1", s, samples=200, rng=rng())
        (plain,) = predict([g], "load:2", None, samples=200, rng=rng())
    np.testing.assert_allclose(busy.predicted.samples_ms, 3.6, atol=1e-9)
    np.testing.assert_allclose(one.predicted.samples_ms, 4.0, atol=1e-9)  # as recorded: nothing to take back
    np.testing.assert_allclose(plain.predicted.samples_ms, 4.0, atol=1e-9)
    assert any("service wake-ups charged on" in n and "-0.400 ms each" in n for n in busy.notes)


def test_a_pause_is_never_a_credit_nor_a_longer_one_cheaper(tmp_path: Path) -> None:
    # A noisy profile: 5 ms measured 0.3 ms faster than back to back, 20 ms cheaper than 10. Read as measured,
    # a location change lengthening a 1 ms gap to 5 ms would take 0.3 ms off the work after it.
    with wake_store(tmp_path / "p.db", {5.0: -0.3, 10.0: 0.6, 20.0: 0.4}) as s:
        p = wake_profile(s)
    assert p is not None
    assert [p.at(g, 0.5) for g in (5.0, 7.5)] == [0.0, pytest.approx(0.25)]
    assert p.at(10.0, 0.5) == pytest.approx(0.5) and p.at(20.0, 0.5) == pytest.approx(0.5)
    assert (p.extra_ms >= 0).all() and (np.diff(p.extra_ms, axis=0) >= -1e-12).all()


@pytest.mark.parametrize("levels", [1, 2, 3, 7, 12])
def test_monotone_extra_is_each_columns_isotonic_fit_held_at_or_above_0(levels: int) -> None:
    from scipy.optimize import isotonic_regression

    x = np.random.default_rng(levels).normal(0.0, 0.3, (levels, 200))
    x[0] = 0.0
    expected = np.zeros_like(x)
    for col in range(x.shape[1]):
        if levels > 1:
            expected[1:, col] = np.maximum(isotonic_regression(x[1:, col]).x, 0.0)
    np.testing.assert_allclose(monotone_extra(x), expected, atol=1e-12)
