"""Reading OTLP JSON spans files: parsing, errors naming file/line/field, incomplete requests left out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from spanfactory import Trace, gather_request, ns, write

from analyzer.errors import SpanFileError
from analyzer.spans import parse_line, read_spans, span_to_otlp
from collector import attributes as A


def test_round_trip_keeps_every_attribute_type(tmp_path: Path) -> None:
    trace = gather_request()
    path = write(tmp_path / "s.jsonl", trace)
    got = read_spans(path)
    assert got.problems == ()
    assert len(got.spans) == len(trace.spans())
    by_id = {s.span_id: s for s in got.spans}
    for original in trace.spans():
        span = by_id[original.span_id]
        assert span.attributes == original.attributes
        assert (span.trace_id, span.kind, span.start_ns, span.end_ns) == (
            original.trace_id, original.kind, original.start_ns, original.end_ns)
    [req] = got.requests
    assert req.route == "GET /" and req.root_task == 1
    assert sorted(req.tasks) == [1, 2, 3]
    assert req.tasks[2].parent_id == 1 and req.tasks[2].steps[1].awaits == "done"
    assert [io.api for io in req.ios] == ["redis GET", "postgresql SELECT posts", "http GET /blob/{id}"]
    assert req.syncs[10].children == (2, 3) and req.syncs[10].wait == "all"
    assert req.latency_ms == pytest.approx(7.0)


def test_protobuf_json_variants_are_accepted(tmp_path: Path) -> None:
    span = gather_request().spans()[0]
    raw = span_to_otlp(span)
    raw["kind"] = "SPAN_KIND_SERVER"
    raw["startTimeUnixNano"] = int(raw["startTimeUnixNano"])  # a number instead of a string
    raw["attributes"].append({"key": "ratio", "value": {"doubleValue": "NaN"}})
    raw["attributes"].append({"key": "empty", "value": {}})
    spans, bad = parse_line(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [raw]}]}]}))
    assert bad == []
    assert spans[0].kind == "server" and spans[0].start_ns == span.start_ns
    assert spans[0].attributes["empty"] is None and spans[0].attributes["ratio"] != spans[0].attributes["ratio"]


def test_truncated_line_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    path = write(tmp_path / "s.jsonl", gather_request(), gather_request(shift=50), per_line=100)
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    first = gather_request(shift=100)
    path2 = write(tmp_path / "t.jsonl", first, per_line=100)
    # the app was killed while writing the last line
    path.write_text(lines[0] + "\n" + path2.read_text() + lines[0][: len(lines[0]) // 2])
    got = read_spans(path)
    assert len(got.requests) == 3
    [problem] = got.problems
    assert problem.startswith(f"{path}:3: ") and "truncated" in problem
    with pytest.raises(SpanFileError) as info:
        read_spans(path, strict=True)
    assert info.value.line == 3 and str(info.value).startswith(f"{path}:3:")


def test_bad_field_names_line_and_field_and_skips_only_that_span(tmp_path: Path) -> None:
    trace = gather_request()
    docs = [span_to_otlp(s) for s in trace.spans()]
    io = next(d for d in docs if d["name"] == "GET")
    io["spanId"] = "xyz"
    line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": docs}]}]})
    path = tmp_path / "s.jsonl"
    path.write_text("\n" + line + "\n")
    got = read_spans(path)
    assert len(got.spans) == len(docs) - 1
    assert any(p.startswith(f"{path}:2: field 'resourceSpans[0].scopeSpans[0].spans[") and "spanId" in p
               and "expected 16 hex digits, got 'xyz'" in p for p in got.problems), got.problems
    with pytest.raises(SpanFileError, match=r"spanId': expected 16 hex digits") as info:
        read_spans(path, strict=True)
    assert info.value.line == 2


def test_not_otlp_and_unreadable_files(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"spans": []}\n')
    with pytest.raises(SpanFileError, match="resourceSpans"):
        read_spans(path, strict=True)
    assert "OTLP JSON" in read_spans(path).problems[0]
    with pytest.raises(SpanFileError, match="cannot read"):
        read_spans(tmp_path / "missing.jsonl")


def test_malformed_perfcast_attribute_names_the_key(tmp_path: Path) -> None:
    trace = gather_request()
    docs = [span_to_otlp(s) for s in trace.spans()]
    chunk = next(d for d in docs if d["name"] == "task posts")
    for kv in chunk["attributes"]:
        if kv["key"] == A.STEPS_WALL_NS:
            kv["value"] = {"arrayValue": {"values": [{"intValue": "5"}]}}  # one value for two steps
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": docs}]}]}) + "\n")
    got = read_spans(path)
    assert got.requests == ()  # its task chunk is gone, so the request is incomplete
    assert any("step arrays differ in length" in p for p in got.problems)
    assert any("joins task 2, which was never seen" in p and trace.trace_id in p for p in got.problems)


def test_unfinished_request_is_left_out_with_its_trace_id(tmp_path: Path) -> None:
    complete = gather_request()
    unfinished = gather_request(shift=30)
    spans = [s for s in unfinished.spans() if s.perfcast_kind != "request"]
    unfinished.spans_[:] = spans
    got = read_spans(write(tmp_path / "s.jsonl", complete, unfinished))
    assert [r.trace_id for r in got.requests] == [complete.trace_id]
    [problem] = got.problems
    assert unfinished.trace_id in problem and "no request span" in problem
    with pytest.raises(SpanFileError, match=unfinished.trace_id):
        read_spans(tmp_path / "s.jsonl", strict=True)


def test_missing_sync_span_and_missing_root_task(tmp_path: Path) -> None:
    no_sync = gather_request()
    no_sync.spans_[:] = [s for s in no_sync.spans() if s.perfcast_kind != "sync"]
    no_root = gather_request(shift=30)
    no_root.spans_[:] = [s for s in no_root.spans()
                         if not (s.perfcast_kind == "task" and s.attributes[A.TASK_ID] == 1)]
    got = read_spans(write(tmp_path / "s.jsonl", no_sync, no_root))
    assert got.requests == ()
    text = "\n".join(got.problems)
    assert f"trace {no_sync.trace_id}" in text and "sync point 10" in text and "never seen" in text
    assert f"trace {no_root.trace_id}" in text and "task 1 was never seen" in text


def test_chunks_are_concatenated_in_step_order(tmp_path: Path) -> None:
    t = Trace("GET /a")
    t.request(0, 10, 1)
    # written out of order, on different lines; the second chunk also repeats step 2
    t.task(1, [(5, 1, "sleep:1000000"), (7, 1, "done")], first=2)
    t.task(1, [(0, 1, "sleep:1000000"), (2, 1, "future"), (5, 1, "sleep:1000000")], first=0)
    got = read_spans(write(tmp_path / "s.jsonl", t, per_line=1))
    [req] = got.requests
    assert [s.index for s in req.tasks[1].steps] == [0, 1, 2, 3]
    assert req.tasks[1].outcome == "ok"
    # a lost chunk in the middle makes the request incomplete
    t2 = Trace("GET /a")
    t2.request(0, 10, 1)
    t2.task(1, [(0, 1, "future")], first=0)
    t2.task(1, [(7, 1, "done")], first=3)
    got = read_spans(write(tmp_path / "u.jsonl", t2))
    assert got.requests == () and "steps 1..2 of task 1 are missing" in got.problems[0]


def test_two_requests_in_one_trace_get_their_own_tasks(tmp_path: Path) -> None:
    outer = gather_request("GET /")
    inner = Trace("GET /blob/{id}", trace_id=outer.trace_id)
    inner.request(2.7, 3.9, 50).task(50, [(2.8, 0.5, "done")], parent=-1)
    got = read_spans(write(tmp_path / "s.jsonl", outer, inner))
    assert sorted((r.route, sorted(r.tasks)) for r in got.requests) == [("GET /", [1, 2, 3]),
                                                                         ("GET /blob/{id}", [50])]
    assert all(r.trace_id == outer.trace_id for r in got.requests)
    assert got.requests[0].start_ns == ns(-0.1)


def test_io_span_naming_a_task_that_was_not_running_is_reattributed(tmp_path: Path) -> None:
    trace = gather_request()
    sql = next(s for s in trace.spans() if s.name == "SELECT posts")
    wrong = dataclasses.replace(sql, attributes={**sql.attributes, A.TASK_ID: 3, A.TASK_STEP: 5})
    trace.spans_[trace.spans_.index(sql)] = wrong
    got = read_spans(write(tmp_path / "s.jsonl", trace))
    [req] = got.requests
    [io] = [io for io in req.ios if io.operation == "SELECT posts"]
    assert (io.task_id, io.task_step) == (2, 0)
    [problem] = got.problems
    assert f"io span {sql.span_id}" in problem and "attributed to task 2 step 0" in problem


def _good_and_bad(key: str, good: Any, bad: Any) -> tuple[Trace, Trace]:
    """Two gather requests (the second 30 ms later) whose request spans carry ``key``: ``good(span)`` on the first,
    ``bad(span)`` on the second."""
    traces = gather_request(), gather_request(shift=30)
    for trace, value in zip(traces, (good, bad), strict=True):
        span = trace.spans_[0]
        trace.spans_[0] = dataclasses.replace(span, attributes={**span.attributes, key: value(span)})
    return traces


def test_the_loops_sleeps_are_read_and_a_bad_list_is_named(tmp_path: Path) -> None:
    good, bad = _good_and_bad(A.LOOP_IDLE_NS, lambda _: (ns(1.0), ns(1.5), ns(2.0), ns(2.2)),
                              lambda _: (ns(31.0), ns(31.5), ns(32.0)))
    got = read_spans(write(tmp_path / "s.jsonl", good, bad))
    first, second = got.requests
    assert first.loop_idle == ((ns(1.0), ns(1.5)), (ns(2.0), ns(2.2)))
    assert second.loop_idle is None  # kept, without them
    [problem] = got.problems
    assert A.LOOP_IDLE_NS in problem and "3 values" in problem and "s.jsonl:2:" in problem


def test_the_loops_wake_up_before_a_request_is_read_and_one_after_its_start_is_named(tmp_path: Path) -> None:
    good, bad = _good_and_bad(A.LOOP_WOKE_NS, lambda span: span.start_ns - ns(0.4), lambda span: span.start_ns + 1)
    got = read_spans(write(tmp_path / "s.jsonl", good, bad))
    first, second = got.requests
    assert first.loop_woke_ns == first.start_ns - ns(0.4)
    assert second.loop_woke_ns is None  # kept, without it
    [problem] = got.problems
    assert A.LOOP_WOKE_NS in problem and "after the request started" in problem and "s.jsonl:2:" in problem
