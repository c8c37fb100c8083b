"""``perfcast mva``: argument parsing, output shape and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfcast.cli import main

MODEL = """\
think_time_s = 1.0
[[station]]
name = "db-cpu"
servers = 16
demand_s = 0.032
[[station]]
name = "db-disk"
demand_s = 0.0015
[[station]]
name = "lan"
kind = "delay"
demand_s = 0.002
"""


def loadtest() -> dict[str, object]:
    # demands falling with the load; throughput consistent with them through Little's law (R from n / X - Z)
    levels = []
    for users, x, cpu, disk in [(1, 0.99, 0.0075, 0.0011), (20, 19.7, 0.0048, 0.0010), (105, 103.0, 0.0041, 0.0009),
                                (203, 197.0, 0.0039, 0.00085), (504, 480.0, 0.0036, 0.0008)]:
        levels.append({
            "users": users, "throughput_per_s": x, "response_time_s": users / x - 1.0,
            "stations": {
                "cpu": {"utilization": cpu * x / 16, "demand_s": cpu, "servers": 16, "visits": 1,
                        "busy_servers": cpu * x, "source": "host"},
                "disk": {"utilization": disk * x, "demand_s": disk, "servers": 1, "visits": 1},
            },
            # fields perfcast loadtest also writes, which mva does not need
            "completed": 1000, "errors": 0, "response_time_p90_s": 0.03, "hosts": {"web1": {"cpu_busy_servers": 1}},
        })
    return {"format": "perfcast-loadtest/1", "think_time_s": 1.0, "levels": levels}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "model.toml"
    model.write_text(MODEL)
    lt = tmp_path / "loadtest.json"
    lt.write_text(json.dumps(loadtest()))
    return model, lt


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["mva", *args])
    return result.exit_code, result.stdout, result.stderr


def test_table_names_the_bottleneck(files: tuple[Path, Path]) -> None:
    code, out, _ = run(str(files[0]), "--users", "1500", "--rows", "10")
    assert code == 0
    assert "bottleneck: db-cpu" in out
    assert "│  1500 │" in out and "│     1 │" in out  # sampled rows include the first and the last
    assert out.count("\n") < 40


def test_json_shape(files: tuple[Path, Path]) -> None:
    code, out, _ = run(str(files[0]), "--users", "50", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["users"] == list(range(1, 51))
    assert len(data["throughput_per_s"]) == len(data["response_time_s"]) == 50
    assert set(data["utilization"]) == {"db-cpu", "db-disk"}  # delay stations have no utilisation
    assert len(data["utilization"]["db-cpu"]) == 50
    assert data["bottleneck"] == "db-cpu" and data["method"] == "exact"


@pytest.mark.parametrize("method", ["exact", "schweitzer", "mvasd"])
def test_methods(files: tuple[Path, Path], method: str) -> None:
    code, out, _ = run(str(files[0]), "--users", "20", "--method", method, "--json")
    assert code == 0 and json.loads(out)["method"] == method


def test_from_loadtest_with_holdout_and_plot(files: tuple[Path, Path], tmp_path: Path) -> None:
    plot = tmp_path / "curves.png"
    code, out, _ = run("--from", str(files[1]), "--holdout", "105,504", "--plot", str(plot))
    assert code == 0, out
    assert "held-out levels, predicted from 1, 20, 203" in out
    assert "mean deviation (eq. 13): throughput" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_from_loadtest_json_carries_the_deviations(files: tuple[Path, Path]) -> None:
    code, out, _ = run("--from", str(files[1]), "--holdout", "504", "--users", "600", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["users"]) == 600 and data["method"] == "mvasd"
    assert data["holdout"]["users"] == [504] and data["holdout"]["throughput_deviation_pct"] >= 0


def test_bad_model_exits_1_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[station]]\nname = "db"\ndemand_s = -0.5\n')
    code, _, err = run(str(bad))
    assert code == 1
    assert err.strip() == f"ModelFileError: {bad}:3: field 'station[db].demand_s': must be >= 0, got -0.5"


def test_unknown_holdout_level_exits_1(files: tuple[Path, Path]) -> None:
    code, _, err = run("--from", str(files[1]), "--holdout", "300")
    assert code == 1 and "ModelError: no level with users = 300" in err


def test_usage_errors(files: tuple[Path, Path]) -> None:
    assert run()[0] == 2
    assert run(str(files[0]), "--holdout", "5")[0] == 2
    assert run(str(files[0]), "--from", str(files[1]))[0] == 2
    assert run("--from", str(files[1]), "--holdout", "1,x")[0] == 2
    assert run(str(files[0]), "--users", "0")[0] == 2


def test_demands_against_throughput(files: tuple[Path, Path]) -> None:
    code, out, _ = run("--from", str(files[1]), "--demands-vs", "throughput", "--users", "300", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["method"] == "mvasd" and len(data["demand_s"]["cpu"]) == 300
    assert data["demand_s"]["cpu"][0] == pytest.approx(0.0075)  # X(0) = 0: the first measured demand
