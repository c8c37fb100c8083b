"""The operational laws on hand-checkable numbers, and their error cases."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import analyzer.demands
from analyzer.demands import (
    littles_law_deviation,
    littles_law_users,
    service_demand,
    station_demand,
    station_throughput,
    utilization,
)
from analyzer.errors import ModelError


def test_doctests() -> None:
    result = doctest.testmod(analyzer.demands)
    assert result.attempted > 0
    assert result.failed == 0


class TestLaws:
    def test_utilization_law(self) -> None:
        # 50 requests/s, 8 ms each: 0.4 of a server busy
        assert utilization(50.0, 0.008) == pytest.approx(0.4)

    def test_forced_flow_law(self) -> None:
        # 7 pages per session, 2.5 sessions/s: 17.5 page visits/s
        assert station_throughput(7, 2.5) == pytest.approx(17.5)

    def test_service_demand_law_multi_server(self) -> None:
        # a 16-core CPU 25% busy = 4 busy cores; at 200 requests/s each request needs 20 ms of CPU
        assert service_demand(16 * 0.25, 200.0) == pytest.approx(0.02)

    def test_demand_law_agrees_with_utilization_and_forced_flow(self) -> None:
        x, visits, s = 12.0, 3.0, 0.004
        u = utilization(station_throughput(visits, x), s)
        assert service_demand(u, x) == pytest.approx(visits * s)

    def test_littles_law(self) -> None:
        assert littles_law_users(4.0, 0.5, 2.0) == pytest.approx(10.0)
        assert littles_law_deviation(10, 4.0, 0.5, 2.0) == pytest.approx(0.0)
        assert littles_law_deviation(10, 3.6, 0.5, 2.0) == pytest.approx(-0.1)

    def test_vectorised_over_levels(self) -> None:
        busy = np.array([0.1, 0.9, 1.8])
        x = np.array([10.0, 60.0, 100.0])
        demands = service_demand(busy, x)
        assert isinstance(demands, np.ndarray)
        np.testing.assert_allclose(demands, [0.01, 0.015, 0.018])


class TestStationDemand:
    def test_fields(self) -> None:
        d = station_demand("app-cpu", busy_servers=1.5, servers=2, throughput_per_s=50.0, visits=2.0, source="process")
        assert d.utilization == pytest.approx(0.75)
        assert d.demand_s == pytest.approx(0.03)
        assert d.to_json() == {
            "utilization": pytest.approx(0.75),
            "busy_servers": 1.5,
            "demand_s": pytest.approx(0.03),
            "servers": 2,
            "visits": 2.0,
            "source": "process",
        }

    def test_counter_jitter_just_over_full_is_clipped(self) -> None:
        d = station_demand("h-cpu", busy_servers=2.02, servers=2, throughput_per_s=100.0)
        assert d.utilization == 1.0
        assert d.demand_s == pytest.approx(0.02)

    def test_utilization_over_100_percent_names_the_field(self) -> None:
        with pytest.raises(ModelError, match=r"station 'h-cpu': field 'utilization': 150.0% is over 100%"):
            station_demand("h-cpu", busy_servers=3.0, servers=2, throughput_per_s=10.0)

    def test_negative_busy_names_the_field(self) -> None:
        with pytest.raises(ModelError, match=r"station 'h-disk': field 'busy_servers': must be non-negative"):
            station_demand("h-disk", busy_servers=-0.1, servers=1, throughput_per_s=10.0)

    def test_zero_throughput_names_the_field(self) -> None:
        with pytest.raises(ModelError, match=r"station 'h-cpu': field 'throughput_per_s': must be positive"):
            station_demand("h-cpu", busy_servers=0.5, servers=2, throughput_per_s=0.0)

    @pytest.mark.parametrize("servers", [0, -1, 1.5])
    def test_bad_servers(self, servers: object) -> None:
        with pytest.raises(ModelError, match=r"field 'servers': must be a positive integer"):
            station_demand("h-cpu", busy_servers=0.5, servers=servers, throughput_per_s=1.0)  # type: ignore[arg-type]

    def test_non_numeric_and_non_finite(self) -> None:
        with pytest.raises(ModelError, match=r"field 'throughput_per_s': expected a number"):
            service_demand(0.5, "fast")  # type: ignore[arg-type]
        with pytest.raises(ModelError, match=r"field 'busy_servers': expected finite numbers"):
            service_demand(float("nan"), 1.0)

    def test_negative_inputs_to_the_laws(self) -> None:
        with pytest.raises(ModelError, match="field 'service_time_s'"):
            utilization(1.0, -0.1)
        with pytest.raises(ModelError, match="field 'visits'"):
            station_throughput(-1, 1.0)
        with pytest.raises(ModelError, match="field 'think_time_s'"):
            littles_law_users(1.0, 0.1, -1.0)
        with pytest.raises(ModelError, match="field 'users'"):
            littles_law_deviation(0, 1.0, 0.1, 1.0)
