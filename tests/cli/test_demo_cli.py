"""``perfcast demo``: option parsing, and a short smoke run of its library path on the real example app."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from perfcast._demo import run_demo
from perfcast.cli import main


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    for option in ("--requests", "--out", "--quick"):
        assert option in result.output


def test_too_few_requests_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["demo", "--requests", "3"])
    assert result.exit_code == 2
    assert "--requests" in result.output


def test_quick_run_predicts_and_measures_location_and_load(tmp_path: Path) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, color_system=None)
    result = run_demo(tmp_path / "demo", requests=16, quick=True, console=console)
    text = buffer.getvalue()

    assert [o.spec for o in result.outcomes] == ["location:blob=+20ms", "load:4?mix.GET /=1&mix.GET /post/{id}=1"]
    for outcome in result.outcomes:
        assert {r.route for r in outcome.rows} <= {"GET /", "GET /post/{id}"} and outcome.rows
        for row in outcome.rows:
            assert 0.0 <= row.median_deviation <= row.ks_d <= 1.0
            assert row.predicted["p50"] <= row.predicted["p99"]
    # the location scenario adds 20 ms per round trip to a post page's blob fetch, predicted and measured
    location = {r.route: r for r in result.outcomes[0].rows}
    if "GET /post/{id}" in location:
        post = location["GET /post/{id}"]
        assert post.predicted["p50"] > post.baseline["p50"] + 15
        assert post.measured["p50"] > 20

    assert result.requests == 16 and result.variants >= 1
    for path in (result.spans, result.graphs, result.predictions, result.measured, result.profiles):
        assert path is not None and path.is_file() and path.parent == tmp_path / "demo"
    # the location scenario was predicted with the app's wake-up profile, measured after pauses of 0-40 ms
    from analyzer.profiles import ProfileStore
    from analyzer.wakeup import WAKE_API
    from replayer.groundtruth import IDLE_MS

    with ProfileStore(result.profiles) as store:
        assert sorted(k.value for k in store.keys() if k.api == WAKE_API) == sorted(IDLE_MS)
    assert 1.0 in IDLE_MS and 2.0 in IDLE_MS  # a short gap's cost is measured, not interpolated up to 5 ms
    doc = json.loads(result.predictions.read_text())
    assert [s["name"] for s in doc["scenarios"]] == ["location:blob=+20ms", "load:4?mix.GET /=1&mix.GET /post/{id}=1"]
    # the load scenario takes the same profile: the wake-ups a busy loop does not pay, as the benchmark predicts it
    for scenario in doc["scenarios"]:
        assert all(any(n.startswith("wake-up: ") for n in p["notes"]) for p in scenario["predictions"]), scenario["name"]

    # under load the demo says where the requests waited, with the numbers of the prediction's own note
    (load_note,) = {n for p in doc["scenarios"][1]["predictions"] for n in p["notes"]
                    if n.startswith("queueing per request")}
    assert "ms for the loop" in load_note and " ".join(load_note.split()[:8]) in " ".join(text.split())
    for words in ("1. collect", "2. causal graphs", "self-check", "location:blob=+20ms", "wake-up profile", "load:4", "KS D",
                  "median dev", str(result.graphs), "perfcast whatif"):
        assert words in text, words
