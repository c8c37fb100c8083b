"""CDF deviation metrics and sample-file reading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from analyzer.accuracy import cdf_deviation, cdf_deviations, read_samples, repeatability
from analyzer.errors import InputFileError


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_max_deviation_is_the_ks_statistic(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.lognormal(2.0, 0.5, 300 + 50 * seed)
    b = rng.lognormal(2.1, 0.6, 200)
    d = cdf_deviation(a, b)
    assert d.max == pytest.approx(stats.ks_2samp(a, b).statistic, abs=1e-12)
    assert 0.0 <= d.median <= d.max and 0.0 <= d.mean <= d.max
    assert (d.n_predicted, d.n_measured) == (a.size, b.size)


def test_ties_and_hand_checked_values() -> None:
    # F1 over {1,2,3}: 1/2, 1, 1; F2: 0, 1/2, 1 -> deviations 1/2, 1/2, 0.
    assert cdf_deviations([1, 2], [2, 3]).tolist() == [0.5, 0.5, 0.0]
    d = cdf_deviation([1, 2, 2, 4], [2, 2, 3, 4])
    assert d.max == stats.ks_2samp([1, 2, 2, 4], [2, 2, 3, 4]).statistic == 0.25


def test_identical_and_disjoint() -> None:
    x = np.arange(10.0)
    assert cdf_deviation(x, x).max == 0.0
    d = cdf_deviation(x, x + 100)
    assert d.max == 1.0 and d.median == pytest.approx(np.median(cdf_deviations(x, x + 100)))


def test_shift_grows_deviation() -> None:
    rng = np.random.default_rng(3)
    a = rng.normal(50, 5, 2000)
    small = cdf_deviation(a, a + 1).mean
    large = cdf_deviation(a, a + 5).mean
    assert small < large


def test_bad_samples() -> None:
    with pytest.raises(ValueError, match="predicted"):
        cdf_deviation([], [1.0])
    with pytest.raises(ValueError, match="measured"):
        cdf_deviation([1.0], [float("nan")])


def test_read_samples_forms(tmp_path: Path) -> None:
    lines = tmp_path / "a.txt"
    lines.write_text("# latency\n1.5\n\n2.5ms\n3\n")
    assert read_samples(lines).tolist() == [1.5, 2.5, 3.0]
    js = tmp_path / "b.json"
    js.write_text("[1, 2.5]")
    assert read_samples(js).tolist() == [1.0, 2.5]
    whatif = tmp_path / "w.json"
    whatif.write_text(json.dumps({"results": [
        {"route": "GET /", "baseline": {"samples_ms": [9.0]}, "predicted": {"samples_ms": [1.0, 2.0]}},
        {"route": "POST /x", "predicted": {"samples_ms": [7.0]}},
    ]}))
    assert read_samples(whatif, route="GET /").tolist() == [1.0, 2.0]
    with pytest.raises(InputFileError, match="'POST /x'"):
        read_samples(whatif, route="GET /nope")
    with pytest.raises(InputFileError, match="--route"):
        read_samples(whatif)


def test_read_samples_errors_name_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("1.0\n2.0\nabc\n")
    with pytest.raises(InputFileError, match=r"bad.txt:3: expected a number"):
        read_samples(bad)
    neg = tmp_path / "neg.json"
    neg.write_text("[1.0, -2]")
    with pytest.raises(InputFileError, match=r"field '\[\]\[1\]'"):
        read_samples(neg)
    broken = tmp_path / "broken.json"
    broken.write_text("[1.0,\n 2,")
    with pytest.raises(InputFileError, match="broken.json:2: not valid JSON"):
        read_samples(broken)
    with pytest.raises(InputFileError, match="cannot read"):
        read_samples(tmp_path / "missing.txt")


def test_read_samples_whatif_scenarios_and_graphs(tmp_path: Path) -> None:
    doc = {"format": "perfcast-whatif/1", "scenarios": [
        {"name": "a", "predictions": [{"route": "GET /", "scenario": "a", "predicted": {"samples_ms": [1.0]}}]},
        {"name": "b", "predictions": [{"route": "GET /", "scenario": "b", "predicted": {"samples_ms": [2.0]}}]},
    ]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputFileError, match="several scenarios"):
        read_samples(path, route="GET /")
    assert read_samples(path, route="GET /", scenario="b").tolist() == [2.0]
    with pytest.raises(InputFileError, match="no scenario 'c'"):
        read_samples(path, route="GET /", scenario="c")
    graphs = tmp_path / "g.json"
    graphs.write_text(json.dumps({"format": "perfcast-graphs/1", "graphs": [
        {"route": "GET /", "latency_ms": [3.0, 4.0]}, {"route": "GET /", "variant": 1, "latency_ms": [5.0]}]}))
    assert read_samples(graphs, route="GET /").tolist() == [3.0, 4.0, 5.0]
    with pytest.raises(InputFileError, match="'GET /'"):
        read_samples(graphs, route="GET /x")


def test_repeatability_tells_drift_from_sampling() -> None:
    rng = np.random.default_rng(3)
    same = [rng.normal(10.0, 1.0, 300) for _ in range(3)]
    steady = repeatability(same, shuffles=50, rng=rng)
    # rounds of one distribution: the observed score is what shuffling gives, and both are sampling-sized
    assert steady.rounds == 3
    assert abs(steady.ks_d - steady.sampling_ks_d) < 0.05
    assert steady.sampling_ks_d < 0.15
    drifting = repeatability([rng.normal(10.0 + 0.5 * k, 1.0, 300) for k in range(3)], shuffles=50, rng=rng)
    # half a standard deviation per round: round 0 against rounds 1 and 2 is ~0.3 apart in KS D
    assert drifting.ks_d > 0.25 > 2 * drifting.sampling_ks_d
    assert drifting.median > 2 * drifting.sampling_median


def test_repeatability_needs_two_rounds() -> None:
    with pytest.raises(ValueError, match="two rounds"):
        repeatability([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"rounds\[1\]"):
        repeatability([[1.0, 2.0], []])
