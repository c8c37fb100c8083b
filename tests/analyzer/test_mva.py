"""Exact multi-server MVA and Schweitzer's approximation, against closed forms, mpmath and a simulation."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

try:  # tests/analyzer is on sys.path while the test directories are not packages
    from _des import simulate
except ImportError:  # pragma: no cover
    from tests.analyzer._des import simulate

from analyzer.errors import ModelError
from analyzer.mva import exact_throughput_at, solve_exact, solve_schweitzer
from analyzer.queueing import ClosedModel, Station, StationKind


def model(demands: list[float], servers: list[int] | None = None, think: float = 0.0) -> ClosedModel:
    servers = servers or [1] * len(demands)
    return ClosedModel(tuple(Station(f"s{k}", d, c) for k, (d, c) in enumerate(zip(demands, servers))), think)


def textbook_mva(demands: list[Fraction], think: Fraction, users: int) -> list[tuple[Fraction, list[Fraction]]]:
    """Exact single-server MVA as Lazowska et al. (QSP, section 6.3) state it, in exact rational arithmetic."""
    q = [Fraction(0)] * len(demands)
    out = []
    for n in range(1, users + 1):
        r = [d * (1 + qk) for d, qk in zip(demands, q)]
        x = n / (think + sum(r))
        q = [x * rk for rk in r]
        out.append((x, q))
    return out


class TestSingleServer:
    def test_reproduces_the_textbook_recursion_exactly(self) -> None:
        demands = [Fraction(3, 10), Fraction(1, 5), Fraction(1, 4)]  # a CPU and two disks, seconds
        think = Fraction(2)
        expected = textbook_mva(demands, think, 25)
        result = solve_exact(model([float(d) for d in demands], think=float(think)), 25)
        for n, (x, q) in enumerate(expected):
            assert result.throughput_per_s[n] == pytest.approx(float(x), rel=1e-13)
            for k in range(3):
                assert result.queue_length[f"s{k}"][n] == pytest.approx(float(q[k]), rel=1e-12)

    # R. Jain, The Art of Computer Systems Performance Analysis (Wiley, 1991), Example 34.2 and Table 34.1:
    # a timesharing system, CPU S = 0.125 s x 16 visits, disk A 0.3 s x 10, disk B 0.2 s x 5, think time 4 s.
    # Rows: users, response time (s), throughput (/s), queue lengths CPU, A, B, as printed (three decimals).
    JAIN_TABLE_34_1 = [
        (1, 6.000, 0.100, 0.200, 0.300, 0.100),
        (2, 7.400, 0.175, 0.421, 0.684, 0.193),
        (3, 9.088, 0.229, 0.651, 1.158, 0.273),
        (4, 11.051, 0.266, 0.878, 1.721, 0.338),
        (5, 13.256, 0.290, 1.088, 2.365, 0.388),
        (17, 47.045, 0.333, 1.974, 13.195, 0.499),
        (18, 50.032, 0.333, 1.981, 14.187, 0.499),
        (19, 53.022, 0.333, 1.987, 15.181, 0.500),
        (20, 56.016, 0.333, 1.991, 16.177, 0.500),
    ]

    def test_reproduces_a_published_worked_example(self) -> None:
        stations = (Station("cpu", 0.125 * 16), Station("disk_a", 0.3 * 10), Station("disk_b", 0.2 * 5))
        result = solve_exact(ClosedModel(stations, 4.0), 20)
        for n, r, x, q_cpu, q_a, q_b in self.JAIN_TABLE_34_1:
            assert round(result.response_time_s[n - 1], 3) == pytest.approx(r, abs=1e-9)
            assert round(result.throughput_per_s[n - 1], 3) == pytest.approx(x, abs=1e-9)
            for name, q in (("cpu", q_cpu), ("disk_a", q_a), ("disk_b", q_b)):
                assert round(result.queue_length[name][n - 1], 3) == pytest.approx(q, abs=1e-9)

    def test_one_user_sees_no_queue(self) -> None:
        r = solve_exact(model([0.3, 0.2, 0.25], think=2.0), 1)
        assert r.throughput_per_s[0] == pytest.approx(1 / 2.75, rel=1e-14)
        assert r.response_time_s[0] == pytest.approx(0.75, rel=1e-13)
        assert r.residence_time_s["s1"][0] == pytest.approx(0.2, rel=1e-13)

    def test_balanced_network_closed_form(self) -> None:
        # K equal single servers, no think time: X(N) = N / (D (K + N - 1)) (QSP, section 5.4)
        k_count, d = 5, 0.1
        r = solve_exact(model([d] * k_count), 200)
        n = np.arange(1, 201)
        np.testing.assert_allclose(r.throughput_per_s, n / (d * (k_count + n - 1)), rtol=1e-12)

    def test_machine_repairman_closed_form(self) -> None:
        # one server behind N thinking users: p0 = 1 / sum_j N!/(N-j)! (D/Z)^j, X = (1 - p0) / D
        d, z = 0.05, 1.0
        r = solve_exact(model([d], think=z), 60)
        for n in (1, 7, 20, 21, 60):
            p0 = 1 / math.fsum(math.perm(n, j) * (d / z) ** j for j in range(n + 1))
            assert r.throughput_per_s[n - 1] == pytest.approx((1 - p0) / d, rel=1e-12)


def finite_source_mmc(d: float, c: int, z: float, n: int) -> tuple[float, float]:
    """Throughput and mean number at a c-server station behind n users thinking z: the Engset-type closed form.

    p(j) is proportional to n! / (n - j)! (d / z)^j / prod_{i<=j} min(i, c), computed in mpmath.
    """
    mpmath.mp.dps = 50
    weights = []
    term = mpmath.mpf(1)
    for j in range(n + 1):
        if j:
            term *= (n - j + 1) * mpmath.mpf(d) / z / min(j, c)
        weights.append(term)
    total = mpmath.fsum(weights)
    x = mpmath.fsum(w * min(j, c) for j, w in enumerate(weights)) / total / d
    q = mpmath.fsum(w * j for j, w in enumerate(weights)) / total
    return float(x), float(q)


class TestMultiServer:
    @pytest.mark.parametrize(("c", "users"), [(2, 40), (16, 1500), (16, 200), (64, 300), (1024, 1500)])
    def test_single_station_is_the_finite_source_mmc_queue(self, c: int, users: int) -> None:
        d, z = 0.02, 1.0
        r = solve_exact(ClosedModel((Station("cpu", d, c),), z), users)
        for n in sorted({1, c, users // 3, users // 2, users}):
            x, q = finite_source_mmc(d, c, z, n)
            assert r.throughput_per_s[n - 1] == pytest.approx(x, rel=1e-11)
            assert r.queue_length["cpu"][n - 1] == pytest.approx(q, rel=1e-10)

    def test_many_busy_servers_beyond_float64_range(self) -> None:
        # four 256-server stations: their scaled constants pass 1e308 and are computed in extended precision
        demands, servers, z, users = [2.56, 2.56, 2.56, 2.56], [256] * 4, 1.0, 300
        ref_x, ref_q0 = reference_convolution(demands, servers, z, users)
        r = solve_exact(model(demands, servers, think=z), users)
        np.testing.assert_allclose(r.throughput_per_s, ref_x, rtol=1e-12)
        np.testing.assert_allclose(r.queue_length["s0"], ref_q0, rtol=1e-11)
        one = exact_throughput_at(np.array(demands), np.array(servers), z, users)
        assert one == pytest.approx(ref_x[-1], rel=1e-12)

    def test_one_server_is_the_single_server_station(self) -> None:
        demands = [Fraction(3, 10), Fraction(1, 5)]
        expected = textbook_mva(demands, Fraction(1), 30)
        r = solve_exact(model([0.3, 0.2], [1, 1], think=1.0), 30)
        assert [float(x) for x, _ in expected] == pytest.approx(r.throughput_per_s.tolist(), rel=1e-13)

    def test_no_think_time_saturates_at_min_of_n_and_c(self) -> None:
        r = solve_exact(ClosedModel((Station("cpu", 0.5, 4),)), 10)
        np.testing.assert_allclose(r.throughput_per_s, np.minimum(np.arange(1, 11), 4) / 0.5, rtol=1e-13)

    def test_stays_exact_at_1500_users_with_busy_16_server_stations(self) -> None:
        # Three 16-server stations 30%-100% busy: the float64 marginal-probability recursion goes negative
        # by a few hundred users here. The reference is that recursion in 600-digit arithmetic (it loses
        # about 350 digits by n = 1,500): agreement to 1e-12 shows both are right.
        demands, servers, z, users = [0.032, 0.025, 0.0096, 0.0015], [16, 16, 16, 1], 1.0, 1500
        ref_x, ref_q = reference_ld_mva(demands, servers, z, users, dps=600)
        r = solve_exact(model(demands, servers, think=z), users)
        np.testing.assert_allclose(r.throughput_per_s, ref_x, rtol=1e-12)
        for k in range(4):
            np.testing.assert_allclose(r.queue_length[f"s{k}"], ref_q[:, k], rtol=1e-11)
        assert r.utilization["s1"][449] == pytest.approx(0.65, abs=0.05)  # busy, not saturated, at n = 450
        assert r.bottleneck == "s0"

    @pytest.mark.parametrize(
        ("stations", "think", "users", "batch_time_s"),
        [
            (
                (Station("cpu", 0.04, 4), Station("disk", 0.02, 1), Station("net", 0.01, kind=StationKind.DELAY),
                 Station("db", 0.06, 3)),
                0.5, 30, 60.0,
            ),
            # a 16-core CPU 70-80% busy next to a disk: the regime of the MVASD paper's servers
            ((Station("cpu", 0.3, 16), Station("disk", 0.012, 1)), 1.0, 60, 40.0),
        ],
    )
    def test_agrees_with_a_simulation_of_the_network(
        self, stations: tuple[Station, ...], think: float, users: int, batch_time_s: float
    ) -> None:
        m = ClosedModel(stations, think_time_s=think)
        r = solve_exact(m, users)
        sim = simulate(
            [s.demand_s or 0.0 for s in stations], [s.servers for s in stations],
            [s.kind is StationKind.DELAY for s in stations], think, users,
            batch_time_s=batch_time_s, batches=20, warmup_s=20.0, seed=7,
        )
        assert sim.throughput_per_s.covers(r.throughput_per_s[-1])
        for k, s in enumerate(stations):
            assert sim.queue_length[k].covers(r.queue_length[s.name][-1]), s.name
            if s.kind is StationKind.QUEUE:
                assert sim.busy_servers[k].covers(r.utilization[s.name][-1] * s.servers), s.name
        # the simulation is precise enough for this to mean something
        assert sim.throughput_per_s.half_width < 0.02 * sim.throughput_per_s.mean


def reference_ld_mva(
    demands: list[float], servers: list[int], z: float, users: int, dps: int
) -> tuple[np.ndarray, np.ndarray]:
    """Load-dependent MVA with marginal probabilities (Reiser and Lavenberg), in mpmath at ``dps`` digits.

    R_k = D/c (1 + Q_k + sum_{j<c} (c - 1 - j) p_k(j)); new p_k(j) = D X / j p_k(j - 1) from the previous
    population's; c p_k(0) = c - D X - sum_{0<j<c} (c - j) p_k(j) (utilisation law).
    """
    mpmath.mp.dps = dps
    d = [mpmath.mpf(v) for v in demands]
    zz = mpmath.mpf(z)
    p = [[mpmath.mpf(1)] + [mpmath.mpf(0)] * (c - 1) for c in servers]
    q = [mpmath.mpf(0)] * len(d)
    xs, qs = [], []
    for n in range(1, users + 1):
        r = [d[k] / c * (1 + q[k] + sum((c - 1 - j) * p[k][j] for j in range(c))) for k, c in enumerate(servers)]
        x = n / (zz + sum(r))
        for k, c in enumerate(servers):
            new = [mpmath.mpf(0)] * c
            for j in range(1, c):
                new[j] = d[k] * x / j * p[k][j - 1]
            new[0] = (c - d[k] * x - sum((c - j) * new[j] for j in range(1, c))) / c
            p[k] = new
            q[k] = x * r[k]
        xs.append(float(x))
        qs.append([float(v) for v in q])
    return np.array(xs), np.array(qs)


def reference_convolution(
    demands: list[float], servers: list[int], z: float, users: int
) -> tuple[np.ndarray, np.ndarray]:
    """Buzen's convolution written out in mpmath (no cancellation: 40 digits are plenty), X(n) and Q_0(n)."""
    mpmath.mp.dps = 40

    def factor(d: float, c: int) -> list[mpmath.mpf]:
        f = [mpmath.mpf(1)]
        for j in range(1, users + 1):
            f.append(f[-1] * mpmath.mpf(d) / min(j, c))
        return f

    def conv(a: list[mpmath.mpf], b: list[mpmath.mpf]) -> list[mpmath.mpf]:
        return [mpmath.fsum(a[i] * b[n - i] for i in range(n + 1)) for n in range(users + 1)]

    think = [mpmath.mpf(z) ** m / mpmath.factorial(m) for m in range(users + 1)]
    rest = think
    for d, c in zip(demands[1:], servers[1:]):
        rest = conv(rest, factor(d, c))
    f0 = factor(demands[0], servers[0])
    g = conv(rest, f0)
    q0 = conv(rest, [j * v for j, v in enumerate(f0)])
    x = [float(g[n - 1] / g[n]) for n in range(1, users + 1)]
    return np.array(x), np.array([float(q0[n] / g[n]) for n in range(1, users + 1)])


class TestInvariants:
    @pytest.fixture
    def result(self):  # type: ignore[no-untyped-def]
        demands = [0.032, 0.025, 0.0096, 0.02, 0.015, 0.01, 0.0015, 0.001, 0.0008, 0.0005, 0.003, 0.004]
        servers = [16, 16, 16, 16, 16, 16, 1, 1, 1, 1, 4, 8]
        return solve_exact(model(demands, servers, think=1.0), 1500), demands, servers

    def test_littles_law_and_bounds(self, result) -> None:  # type: ignore[no-untyped-def]
        r, demands, servers = result
        n = np.arange(1, 1501)
        total = sum(r.queue_length.values()) + r.throughput_per_s * 1.0
        np.testing.assert_allclose(total, n, rtol=1e-11)
        bound = np.minimum(n / (1.0 + sum(demands)), min(c / d for d, c in zip(demands, servers)))
        assert np.all(r.throughput_per_s <= bound * (1 + 1e-12))
        assert np.all(np.diff(r.throughput_per_s) >= -1e-9)
        assert all(np.all((u >= 0) & (u <= 1 + 1e-12)) for u in r.utilization.values())
        np.testing.assert_allclose(sum(r.residence_time_s.values()), r.response_time_s, rtol=1e-10)

    def test_single_population_shortcut_matches(self, result) -> None:  # type: ignore[no-untyped-def]
        r, demands, servers = result
        for n in (1, 2, 499, 1500):
            assert exact_throughput_at(np.array(demands), np.array(servers), 1.0, n) == pytest.approx(
                r.throughput_per_s[n - 1], rel=1e-12
            )


class TestDegenerate:
    def test_zero_demand_station_is_idle_and_changes_nothing(self) -> None:
        with_zero = solve_exact(model([0.3, 0.0, 0.2], [1, 4, 2], think=1.0), 50)
        without = solve_exact(model([0.3, 0.2], [1, 2], think=1.0), 50)
        np.testing.assert_allclose(with_zero.throughput_per_s, without.throughput_per_s, rtol=1e-14)
        assert not with_zero.queue_length["s1"].any() and not with_zero.utilization["s1"].any()

    def test_only_think_time(self) -> None:
        r = solve_exact(model([0.0], think=2.0), 5)
        np.testing.assert_allclose(r.throughput_per_s, np.arange(1, 6) / 2.0)
        assert not r.response_time_s.any()

    def test_nothing_to_wait_for_is_an_error(self) -> None:
        with pytest.raises(ModelError, match="unbounded"):
            solve_exact(model([0.0, 0.0]), 3)

    @pytest.mark.parametrize("users", [0, -1, 2.5])
    def test_bad_population(self, users) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(ModelError, match="users"):
            solve_exact(model([0.1]), users)

    def test_delay_station_adds_its_demand(self) -> None:
        m = ClosedModel((Station("cpu", 0.1, 2), Station("lan", 0.05, kind=StationKind.DELAY)), 1.0)
        plain = solve_exact(ClosedModel((Station("cpu", 0.1, 2),), 1.05), 40)
        r = solve_exact(m, 40)
        np.testing.assert_allclose(r.throughput_per_s, plain.throughput_per_s, rtol=1e-13)
        np.testing.assert_allclose(r.residence_time_s["lan"], 0.05, rtol=1e-13)
        assert "lan" not in r.utilization


class TestSchweitzer:
    def test_close_to_exact_for_single_servers(self) -> None:
        m = model([0.3, 0.2, 0.25], think=2.0)
        exact, approx = solve_exact(m, 100), solve_schweitzer(m, 100)
        assert approx.throughput_per_s[0] == pytest.approx(exact.throughput_per_s[0], rel=1e-9)
        deviation = np.abs(approx.throughput_per_s / exact.throughput_per_s - 1)
        assert deviation.max() < 0.05  # its known worst case is near the knee
        assert deviation[-1] < 0.01  # and it converges to the same bound

    def test_close_to_exact_with_multi_server_stations(self) -> None:
        m = model([0.032, 0.025, 0.0015], [16, 16, 1], think=1.0)
        exact, approx = solve_exact(m, 1500), solve_schweitzer(m, 1500)
        deviation = np.abs(approx.throughput_per_s / exact.throughput_per_s - 1)
        # Seidmann's multi-server replacement is cruder than Schweitzer's own step: worst near the knee
        assert deviation.max() < 0.15
        assert deviation[-1] < 0.02
        assert approx.bottleneck == exact.bottleneck == "s0"
        n = np.arange(1, 1501)
        np.testing.assert_allclose(sum(approx.queue_length.values()) + approx.throughput_per_s, n, rtol=1e-8)
