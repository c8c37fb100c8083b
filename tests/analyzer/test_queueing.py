"""The closed-model data types and the TOML model file."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.errors import ModelError, ModelFileError
from analyzer.queueing import (
    ClosedModel,
    DemandAxis,
    MeasuredDemands,
    Station,
    StationKind,
    load_model,
    with_demands,
)

GOOD = """\
think_time_s = 1.0

[[station]]
name = "db-cpu"
servers = 16
visits = 2
demand_s = 0.0042

[[station]]
name = "db-disk"
service_time_s = 0.001
visits = 3

[[station]]
name = "app-cpu"
servers = 4
demands = { users = [1, 20, 105, 203], demand_s = [0.0075, 0.0048, 0.0041, 0.0039] }

[[station]]
name = "lan"
kind = "delay"
demand_s = 0.002
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "model.toml"
    path.write_text(text)
    return path


class TestLoadModel:
    def test_reads_every_field(self, tmp_path: Path) -> None:
        m = load_model(write(tmp_path, GOOD))
        assert m.think_time_s == 1.0
        assert m.names == ("db-cpu", "db-disk", "app-cpu", "lan")
        cpu, disk, app, lan = m.stations
        assert (cpu.servers, cpu.visits, cpu.demand_s) == (16, 2.0, 0.0042)
        assert cpu.service_time_s == pytest.approx(0.0021)
        assert disk.demand_s == pytest.approx(0.003)  # D = V S
        assert app.demand_s is None and app.measured is not None
        assert app.measured.axis is DemandAxis.USERS
        assert app.measured.at == (1.0, 20.0, 105.0, 203.0)
        assert lan.kind is StationKind.DELAY
        assert m.has_measured_demands()

    def test_throughput_axis(self, tmp_path: Path) -> None:
        text = '[[station]]\nname = "c"\ndemands = { throughput_per_s = [1.0, 50.0], demand_s = [0.02, 0.01] }\n'
        m = load_model(write(tmp_path, text))
        assert m.stations[0].measured.axis is DemandAxis.THROUGHPUT  # type: ignore[union-attr]

    @pytest.mark.parametrize(
        ("text", "line", "field", "problem"),
        [
            ('[[station]]\nname = "cpu"\ndemand_s = 0.1\n[[station]]\nname = "db"\ndemand_s = -0.5\n',
             6, "station[db].demand_s", "must be >= 0"),
            ('[[station]]\nname = "cpu"\nservers = 0\ndemand_s = 0.1\n', 3, "station[cpu].servers", "integer >= 1"),
            ('[[station]]\nname = "cpu"\ndemand_s = 0.1\nvisits = 0\n', 4, "station[cpu].visits", "must be > 0"),
            ('[[station]]\nname = "cpu"\ndemand_s = 0.1\nspeed = 3\n', 4, "station[cpu].speed", "unknown field"),
            ('[[station]]\nname = "cpu"\nkind = "bus"\ndemand_s = 0.1\n', 3, "station[cpu].kind", "'queue' or 'delay'"),
            ('[[station]]\nname = "cpu"\n', 2, "station[cpu]", "needs one of"),
            ('[[station]]\nname = "cpu"\ndemands = { users = [1], demand_s = [0.1] }\n', 3,
             "station[cpu].demands", "too few to interpolate"),
            ('[[station]]\nname = "cpu"\ndemands = { users = [1, 20, 10], demand_s = [0.1, 0.1, 0.1] }\n', 3,
             "station[cpu].demands", "strictly increasing"),
            ('[[station]]\nname = "cpu"\ndemands = { users = [1, 20], demand_s = [0.1, -0.1] }\n', 3,
             "station[cpu].demands.demand_s", "must be >= 0"),
            ('[[station]]\nname = "cpu"\ndemands = { users = [1, 20], demand_s = [0.1] }\n', 3,
             "station[cpu].demands", "2 values of 'users' but 1"),
            ('[[station]]\nname = "cpu"\ndemand_s = 0.1\n[[station]]\nname = "cpu"\ndemand_s = 0.2\n', 5,
             "station[cpu].name", "already defined"),
            ('think_time_s = -1\n[[station]]\nname = "cpu"\ndemand_s = 0.1\n', 1, "think_time_s", "must be >= 0"),
            ('thinktime = 1\n[[station]]\nname = "cpu"\ndemand_s = 0.1\n', 1, "thinktime", "unknown field"),
            ('[[station]]\nname = "cpu"\ndemand_s = "fast"\n', 3, "station[cpu].demand_s", "expected a number"),
        ],
    )
    def test_bad_field_is_named_with_its_line(
        self, tmp_path: Path, text: str, line: int, field: str, problem: str
    ) -> None:
        path = write(tmp_path, text)
        with pytest.raises(ModelFileError) as info:
            load_model(path)
        assert info.value.line == line
        assert info.value.field == field
        assert problem in info.value.problem
        assert str(info.value).startswith(f"{path}:{line}: field '{field}'")

    def test_no_station(self, tmp_path: Path) -> None:
        with pytest.raises(ModelFileError, match=r"at least one \[\[station\]\]"):
            load_model(write(tmp_path, "think_time_s = 1.0\n"))

    def test_not_toml(self, tmp_path: Path) -> None:
        with pytest.raises(ModelFileError, match="not valid TOML") as info:
            load_model(write(tmp_path, '[[station]]\nname = "cpu"\ndemand_s = \n'))
        assert info.value.line == 3

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ModelFileError, match="cannot read"):
            load_model(tmp_path / "absent.toml")


class TestDataclasses:
    def test_negative_demand_names_station_and_field(self) -> None:
        with pytest.raises(ModelError, match=r"station 'db': field 'demand_s' must be a non-negative"):
            Station("db", -1.0)

    def test_unknown_station(self) -> None:
        m = ClosedModel((Station("cpu", 0.1), Station("disk", 0.2)))
        assert m.station("disk").demand_s == 0.2
        with pytest.raises(ModelError, match=r"unknown station 'gpu' \(the model has: cpu, disk\)"):
            m.station("gpu")

    def test_measured_only_station_cannot_be_solved_with_constant_demands(self) -> None:
        measured = MeasuredDemands(DemandAxis.USERS, (1.0, 10.0), (0.2, 0.1))
        m = ClosedModel((Station("cpu", None, measured=measured),))
        with pytest.raises(ModelError, match="--method mvasd"):
            m.constant_demands()
        fixed = with_demands(m, [0.15])
        assert fixed.constant_demands() == (0.15,) and not fixed.has_measured_demands()

    def test_frozen(self) -> None:
        s = Station("cpu", 0.1)
        with pytest.raises(AttributeError):
            s.demand_s = 0.2  # type: ignore[misc]
