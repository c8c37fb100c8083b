"""MVASD: spline-interpolated demands, the load-test file, and eq. 13's hold-out deviations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analyzer.errors import ModelError, ModelFileError
from analyzer.mva import exact_throughput_at, solve_exact
from analyzer.mvasd import (
    LoadTest,
    holdout_deviation,
    interpolate_demands,
    model_from_loadtest,
    percent_deviation,
    read_loadtest,
    solve_mvasd,
)
from analyzer.queueing import (
    ClosedModel,
    DemandAxis,
    MeasuredDemands,
    Station,
    with_demands,
)

LEVELS = [1, 20, 105, 203, 504, 1001]
THINK = 1.0
SERVERS = {"db-cpu": 16, "db-disk": 1, "app-cpu": 4}


def true_demands(n: float) -> dict[str, float]:
    """Demands that fall with the load, as the MVASD paper measured them (caching, batching)."""
    return {
        "db-cpu": 0.0035 + 0.004 / (1 + n / 30),
        "db-disk": 0.00066 + 0.0003 / (1 + n / 80),
        "app-cpu": 0.0028 + 0.001 / (1 + n / 200),
    }


def synthetic_loadtest(levels: list[int] = LEVELS) -> dict[str, Any]:
    """What a load test of a product-form system with those demands would measure at each level."""
    out = []
    for n in levels:
        d = true_demands(n)
        x = exact_throughput_at(np.array(list(d.values())), np.array(list(SERVERS.values())), THINK, n)
        out.append({
            "users": n,
            "throughput_per_s": x,
            "response_time_s": n / x - THINK,
            "response_time_p50_s": n / x - THINK,
            "stations": {
                name: {"utilization": d[name] * x / c, "demand_s": d[name], "servers": c, "visits": 1.0}
                for name, c in SERVERS.items()
            },
        })
    return {"format": "perfcast-loadtest/1", "think_time_s": THINK, "levels": out}


class TestInterpolation:
    def test_not_a_knot_reproduces_a_cubic(self) -> None:
        # four points of a cubic: the not-a-knot spline is that cubic itself
        xs = np.array([1.0, 20.0, 105.0, 203.0])
        cubic = lambda x: 0.01 - 1e-4 * x + 8e-7 * x**2 - 2e-9 * x**3
        m = MeasuredDemands(DemandAxis.USERS, tuple(xs), tuple(cubic(xs)))
        grid = np.linspace(1, 203, 50)
        np.testing.assert_allclose(interpolate_demands(m, grid), cubic(grid), rtol=1e-9)

    def test_held_constant_outside_and_within_the_measured_range(self) -> None:
        m = MeasuredDemands(DemandAxis.USERS, (1.0, 10.0, 20.0, 30.0), (0.01, 0.0001, 0.012, 0.0001))
        out = interpolate_demands(m, [0.0, 1.0, 30.0, 1000.0])
        np.testing.assert_allclose(out, [0.01, 0.01, 0.0001, 0.0001])
        grid = interpolate_demands(m, np.linspace(0, 40, 400))
        assert grid.min() >= 0.0001 and grid.max() <= 0.012
        # three uneven points: the parabola would go negative near 100 users; the demand stays in range
        few = MeasuredDemands(DemandAxis.USERS, (1.0, 20.0, 203.0), (0.0075, 0.0048, 0.0039))
        assert interpolate_demands(few, [100.0])[0] == pytest.approx(0.0039)

    def test_two_points_is_a_line(self) -> None:
        m = MeasuredDemands(DemandAxis.USERS, (10.0, 20.0), (0.2, 0.1))
        assert interpolate_demands(m, [15.0])[0] == pytest.approx(0.15)

    def test_too_few_points(self) -> None:
        with pytest.raises(ModelError, match="too few to interpolate"):
            MeasuredDemands(DemandAxis.USERS, (1.0,), (0.2,))


class TestSolveMvasd:
    def test_constant_demands_give_exact_mva(self) -> None:
        m = ClosedModel((Station("cpu", 0.032, 16), Station("disk", 0.0015)), 1.0)
        np.testing.assert_allclose(solve_mvasd(m, 1500).throughput_per_s, solve_exact(m, 1500).throughput_per_s, rtol=1e-12)

    def test_flat_measurements_give_exact_mva(self) -> None:
        flat = MeasuredDemands(DemandAxis.USERS, (1.0, 50.0, 300.0), (0.032, 0.032, 0.032))
        m = ClosedModel((Station("cpu", None, 16, measured=flat), Station("disk", 0.0015)), 1.0)
        exact = solve_exact(with_demands(m, [0.032, 0.0015]), 800)
        np.testing.assert_allclose(solve_mvasd(m, 800).throughput_per_s, exact.throughput_per_s, rtol=1e-12)

    def test_at_each_level_it_is_the_exact_network_with_that_levels_demands(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        model = model_from_loadtest(lt)
        result = solve_mvasd(model, 1500)
        for level in lt.levels:
            assert result.throughput_per_s[level.users - 1] == pytest.approx(level.throughput_per_s, rel=1e-10)
            for name, s in level.stations.items():
                assert result.utilization[name][level.users - 1] == pytest.approx(s.utilization, rel=1e-10)
                assert result.demand_s[name][level.users - 1] == pytest.approx(s.demand_s, rel=1e-12)
        assert np.all(result.demand_s["db-cpu"][1000:] == result.demand_s["db-cpu"][1000])  # held beyond 1001
        final = true_demands(1001)
        expected = max(SERVERS, key=lambda k: final[k] / SERVERS[k])  # the largest demand per server
        assert result.bottleneck == expected
        json_form = result.to_json()
        assert len(json_form["users"]) == len(json_form["throughput_per_s"]) == len(json_form["utilization"]["db-cpu"]) == 1500
        assert json_form["bottleneck"] == expected

    def test_one_user_sees_the_demands_measured_at_one_user(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        r = solve_mvasd(model_from_loadtest(lt), 1)
        assert r.throughput_per_s[0] == pytest.approx(1 / (THINK + sum(true_demands(1).values())), rel=1e-12)

    def test_demands_against_throughput(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        by_users = solve_mvasd(model_from_loadtest(lt), 1200)
        by_x = solve_mvasd(model_from_loadtest(lt, axis=DemandAxis.THROUGHPUT), 1200)
        # the demand used at n comes from X(n - 1); it should track the users-based one closely
        assert percent_deviation(by_x.throughput_per_s, by_users.throughput_per_s) < 1.0
        assert by_x.demand_s["db-cpu"][0] == pytest.approx(lt.levels[0].stations["db-cpu"].demand_s)


class TestHoldout:
    def test_predicts_held_out_levels_closely(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        h = holdout_deviation(lt, [504, 1001])
        assert h.users == (504, 1001) and h.fitted_users == (1, 20, 105, 203)
        assert h.throughput_deviation_pct < 3.0 and h.cycle_time_deviation_pct < 9.0  # the paper's figures
        # and it beats exact MVA fed with the demands of one low level (the paper's "MVA i" of Tables IV, V)
        at_20 = [lt.level(20).stations[k].demand_s for k in SERVERS]
        mva_20 = solve_exact(with_demands(model_from_loadtest(lt), at_20), 1001)
        plain = percent_deviation(mva_20.throughput_per_s[[503, 1000]], h.measured_throughput_per_s)
        assert h.throughput_deviation_pct < plain / 5

    def test_interpolated_level(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        h = holdout_deviation(lt, [105])
        assert h.throughput_deviation_pct < 0.5
        assert h.cycle_time_deviation_pct < 1.0
        # R alone is far more sensitive: a spline from 20 to 203 users misses a 1/(1 + n/30) shape
        assert h.response_time_deviation_pct > h.cycle_time_deviation_pct
        np.testing.assert_allclose(h.measured_throughput_per_s, [lt.level(105).throughput_per_s])

    def test_unknown_level(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest())
        with pytest.raises(ModelError, match=r"no level with users = 500 \(measured: 1, 20, 105, 203, 504, 1001\)"):
            holdout_deviation(lt, [500])

    def test_too_few_left_to_fit(self) -> None:
        lt = LoadTest.from_json(synthetic_loadtest([1, 20, 105]))
        with pytest.raises(ModelError, match="too few to interpolate"):
            holdout_deviation(lt, [20, 105])

    def test_eq_13(self) -> None:
        assert percent_deviation([102.0, 45.0], [100.0, 50.0]) == pytest.approx((2 + 10) / 2)
        with pytest.raises(ModelError):
            percent_deviation([1.0], [1.0, 2.0])


class TestLoadTestFile:
    def test_round_trip_from_disk(self, tmp_path: Path) -> None:
        path = tmp_path / "loadtest.json"
        path.write_text(json.dumps(synthetic_loadtest()))
        lt = read_loadtest(path)
        assert lt.users == tuple(LEVELS) and lt.think_time_s == THINK
        assert lt.level(105).stations["db-cpu"].servers == 16

    def test_demand_from_the_service_demand_law_when_absent(self) -> None:
        data = synthetic_loadtest([1, 20])
        for level in data["levels"]:
            del level["stations"]["db-cpu"]["demand_s"]
        lt = LoadTest.from_json(data)
        assert lt.level(20).stations["db-cpu"].demand_s == pytest.approx(true_demands(20)["db-cpu"], rel=1e-12)

    @pytest.mark.parametrize(
        ("mutate", "field", "problem"),
        [
            (lambda d: d["levels"][2]["stations"]["db-disk"].update(utilization=1.2),
             "levels[2].stations.db-disk.utilization", "over 100%"),
            (lambda d: d["levels"][1]["stations"].update(gpu={"utilization": 0.1}),
             "levels[1].stations", "unknown station 'gpu'"),
            (lambda d: d["levels"][1]["stations"].pop("db-cpu"), "levels[1].stations", "station 'db-cpu' is missing"),
            (lambda d: d.update(format="perfcast-loadtest/9"), "format", "perfcast-loadtest/1"),
            (lambda d: d["levels"][0].update(users=0), "levels[0].users", "integer >= 1"),
            (lambda d: d["levels"][3].update(throughput_per_s=0), "levels[3].throughput_per_s", "must be > 0"),
            (lambda d: d["levels"][0]["stations"]["db-cpu"].update(demand_s=-1), "levels[0].stations.db-cpu.demand_s",
             "non-negative"),
            (lambda d: d["levels"][4].update(users=20), "levels", "two levels with users = 20"),
        ],
    )
    def test_bad_field_is_named(self, tmp_path: Path, mutate: Any, field: str, problem: str) -> None:
        data = synthetic_loadtest()
        mutate(data)
        path = tmp_path / "lt.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ModelFileError) as info:
            read_loadtest(path)
        assert info.value.field == field
        assert problem in info.value.problem
        assert str(path) in str(info.value)

    def test_not_json(self, tmp_path: Path) -> None:
        path = tmp_path / "lt.json"
        path.write_text('{\n  "format": \n')
        with pytest.raises(ModelFileError, match="not valid JSON") as info:
            read_loadtest(path)
        assert info.value.line == 3
