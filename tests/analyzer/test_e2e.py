"""End-to-end prediction: the HAR page model, ClientPrediction and Algorithm 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.e2e import (
    HarFileError,
    PageModel,
    cloud_samples_from_graphs,
    fetch_times,
    percentile_ci,
    predict_e2e,
    read_har,
    route_matcher,
)
from analyzer.errors import AnalyzerError
from analyzer.graph import CausalGraph, Node, NodeKind

HAR = Path(__file__).resolve().parents[2] / "examples" / "har" / "forum.har"


@pytest.fixture
def page() -> PageModel:
    return read_har(HAR)


def _doc() -> dict:  # type: ignore[type-arg]
    return json.loads(HAR.read_text())


def test_har_dependencies(page: PageModel) -> None:
    by_path = {o.path: o for o in page.objects}
    assert page.objects[0].path == "/" and page.objects[0].parent is None
    # Found by the parser while the document streamed in: anchored at its first byte.
    css = by_path["/static/forum.css"]
    assert (css.parent, css.anchor, css.how) == (0, "first_byte", "initiator")
    # No initiator: the latest object that had finished when it started (the script).
    api = by_path["/api/posts"]
    assert page.objects[api.parent].path == "/static/forum.js" and api.how == "timing" and api.anchor == "end"
    assert api.gap_ms == pytest.approx(7.5, abs=1.0)
    # A script initiator, but it waited for the XHR that finished later than the script.
    post = by_path["/post/17"]
    assert page.objects[post.parent].path == "/api/posts" and post.how == "initiator+timing"
    assert page.onload_ms is not None


def test_client_prediction_reproduces_the_recorded_page(page: PageModel) -> None:
    recorded_end = max(o.start_ms + o.fetch_ms for o in page.objects)
    assert page.load_time(page.observed_fetch()[:, None])[0] == pytest.approx(recorded_end, abs=1e-6)


def test_slower_critical_object_moves_load_time_by_the_same_amount(page: PageModel) -> None:
    fetch = page.observed_fetch()[:, None].repeat(2, axis=1)
    api = next(i for i, o in enumerate(page.objects) if o.path == "/api/posts")
    logo = next(i for i, o in enumerate(page.objects) if o.path == "/img/logo.png")
    fetch[api, 1] += 50.0
    base, slow = page.load_time(fetch)
    assert slow - base == pytest.approx(50.0)
    # The logo is off the critical path: a small delay does not change the load time.
    fetch = page.observed_fetch()[:, None].copy()
    fetch[logo] += 5.0
    assert page.load_time(fetch)[0] == pytest.approx(base)


def test_algorithm2_with_recorded_cloud_and_rtt_gives_the_recorded_page(page: PageModel) -> None:
    doc = next(o for o in page.objects if o.path == "/")
    result = predict_e2e(page, {"GET /": np.array([doc.fetch_ms - 20.0])}, np.array([20.0]),
                         rng=np.random.default_rng(0))
    assert result.converged
    assert np.allclose(result.samples_ms, result.observed_ms)
    assert [page.objects[i].path for i, _ in result.frontend] == ["/"]


def test_algorithm2_percentile_converges_to_target(page: PageModel) -> None:
    rng = np.random.default_rng(1)
    cloud = {"GET /api/posts": rng.lognormal(np.log(40.0), 0.4, 5000),
             "GET /post/{id}": rng.lognormal(np.log(25.0), 0.3, 5000)}
    result = predict_e2e(page, cloud, rng.normal(20.0, 2.0, 500).clip(0), percentile=90, ci=0.005,
                         rng=np.random.default_rng(2))
    assert result.converged
    lo, hi = result.ci_ms
    assert lo <= result.value_ms <= hi and (hi - lo) / 2 <= 0.005 * result.value_ms
    assert result.value_ms == pytest.approx(np.percentile(result.samples_ms, 90))
    assert {r for _, r in result.frontend} == {"GET /api/posts", "GET /post/{id}"}
    # Slower cloud, slower page.
    slower = {k: v + 30.0 for k, v in cloud.items()}
    later = predict_e2e(page, slower, rng.normal(20.0, 2.0, 500).clip(0), percentile=90, ci=0.005,
                        rng=np.random.default_rng(2))
    assert later.value_ms > result.value_ms + 30.0


def test_rtt_from_har_connect_times(page: PageModel) -> None:
    result = predict_e2e(page, {"GET /": np.array([10.0])}, None, rng=np.random.default_rng(0))
    connects = sorted({o.connect_ms for o in page.objects if o.host == page.objects[0].host and o.connect_ms})
    assert connects  # the example records the TCP handshakes to the frontend
    assert result.samples_ms.min() > 0


def test_percentile_ci_covers_known_quantile() -> None:
    x = np.random.default_rng(5).uniform(0.0, 1.0, 20_000)
    value, lo, hi = percentile_ci(x, 90.0)
    assert lo < 0.9 < hi and lo <= value <= hi


def test_route_matcher() -> None:
    m = route_matcher("GET /post/{id}")
    assert m("GET", "/post/17") and m("get", "/post/abc/") and not m("POST", "/post/1")
    assert not m("GET", "/post/1/comments") and not m("GET", "/post/")
    assert route_matcher("GET /")("GET", "/") and not route_matcher("GET /")("GET", "/x")
    with pytest.raises(AnalyzerError, match="METHOD /path"):
        route_matcher("/post")


def test_no_matching_route_lists_frontend_requests(page: PageModel) -> None:
    with pytest.raises(AnalyzerError, match="GET /api/posts"):
        predict_e2e(page, {"GET /nothing": np.array([1.0])}, np.array([1.0]), rng=np.random.default_rng(0))


def test_cloud_samples_from_graphs() -> None:
    def g(variant: int, lat: list[float]) -> CausalGraph:
        return CausalGraph("GET /", [Node("start", NodeKind.START), Node("end", NodeKind.END)],
                           [("start", "end")], variant=variant, latency_ms=lat)
    assert cloud_samples_from_graphs([g(0, [1.0, 2.0]), g(1, [3.0])], ["GET /"])["GET /"].tolist() == [1, 2, 3]
    with pytest.raises(AnalyzerError, match="'GET /'"):
        cloud_samples_from_graphs([g(0, [1.0])], ["GET /x"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["log"]["entries"][2].pop("startedDateTime"), r"log.entries\[2\].startedDateTime': missing"),
        (lambda d: d["log"]["entries"][1].__setitem__("time", "slow"), r"log.entries\[1\].time': expected a number"),
        (lambda d: d["log"]["entries"][3]["request"].__setitem__("url", "/rel"), r"entries\[3\].request.url"),
        (lambda d: d["log"]["entries"][0]["timings"].__setitem__("wait", None), r"entries\[0\].timings.wait"),
        (lambda d: d["log"]["entries"][4].__setitem__("startedDateTime", "yesterday"), r"entries\[4\].+ISO 8601"),
        (lambda d: d.pop("log"), "field 'log'"),
        (lambda d: d["log"].__setitem__("entries", []), "non-empty list"),
    ],
)
def test_bad_har_names_entry_and_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc()
    mutate(doc)
    path = tmp_path / "bad.har"
    path.write_text(json.dumps(doc))
    with pytest.raises(HarFileError, match=message):
        read_har(path)


def test_har_not_json(tmp_path: Path) -> None:
    path = tmp_path / "x.har"
    path.write_text("{\n  'log': 1")
    with pytest.raises(HarFileError, match=r"x.har:2: not valid JSON"):
        read_har(path)


def test_fetch_time_distributions_from_several_recordings(page: PageModel, tmp_path: Path) -> None:
    doc = _doc()
    js = next(e for e in doc["log"]["entries"] if e["request"]["url"].endswith("/forum.js"))
    js["time"] += 30.0
    js["timings"]["receive"] += 30.0
    slow = tmp_path / "slow.har"
    slow.write_text(json.dumps(doc))
    fetch = fetch_times([page, read_har(slow)])
    js_url = next(o.url for o in page.objects if o.path == "/static/forum.js")
    assert np.allclose(np.sort(fetch[js_url] - fetch[js_url].min()), [0.0, 30.0])
    root = next(o for o in page.objects if o.path == "/")
    result = predict_e2e(page, {"GET /": np.array([root.fetch_ms])}, np.array([0.0]), fetch_ms=fetch,
                         ci=0.5, rng=np.random.default_rng(0))
    # The script is on the critical path: the load time is either the recorded one or 30 ms later.
    assert set(np.round(result.samples_ms - result.observed_ms, 6)) == {0.0, 30.0}
