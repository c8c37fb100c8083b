"""The profile store: persistence, selection, interpolation, errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import ProfileError
from analyzer.graph import CausalGraph, Node, NodeKind
from analyzer.profiles import (
    ProfileKey,
    ProfileStore,
    baseline_profiles,
    interpolate_quantiles,
    parse_labels,
)

REDIS = "redis://10.0.0.1:6379/0"


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    s = ProfileStore(tmp_path / "profiles.db")
    yield s
    s.close()


def test_add_appends_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    key = ProfileKey.make("redis GET", REDIS, {"tier": "C2", "location": "eu-west"})
    assert key.labels == (("location", "eu-west"), ("tier", "C2"))
    with ProfileStore(path) as s:
        s.add(key, [1.0, 2.0], round_trips=1.0)
        s.add(key, [3.0], round_trips=2.0, note="second")
    with ProfileStore(path) as s:
        assert s.keys() == [key]
        assert s.samples(key).tolist() == [1.0, 2.0, 3.0]
        assert s.round_trips(key) == pytest.approx(4.0 / 3.0)
        assert s.count(key) == 3


def test_add_is_atomic_per_call(tmp_path: Path) -> None:
    """A writer that dies between add() calls leaves every completed add readable by another connection."""
    path = tmp_path / "p.db"
    s = ProfileStore(path)
    key = ProfileKey.make("redis SET", REDIS)
    s.add(key, [5.0] * 10)
    # Another connection sees the committed batch while the first is still open (no pending transaction).
    other = sqlite3.connect(path)
    assert other.execute("SELECT SUM(count) FROM batch").fetchone()[0] == 10
    other.close()
    s.close()


def test_add_rejects_bad_samples(store: ProfileStore) -> None:
    key = ProfileKey.make("redis GET", REDIS)
    with pytest.raises(ProfileError, match="no samples"):
        store.add(key, [])
    with pytest.raises(ProfileError, match="non-negative"):
        store.add(key, [1.0, -2.0])
    with pytest.raises(ProfileError, match="sorted"):
        store.add(ProfileKey("redis GET", REDIS, (("z", "1"), ("a", "2"))), [1.0])
    assert store.keys() == []


def test_not_a_store(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not sqlite, just some text long enough " * 20)
    with pytest.raises(ProfileError, match="not a perfcast profile store"):
        ProfileStore(bad)


def test_select_workload_independent_and_resource_matching(store: ProfileStore) -> None:
    store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2"}), [2.0, 4.0])
    exact = store.select("redis GET", REDIS, {"tier": "C2"})
    assert exact.samples_ms.tolist() == [2.0, 4.0]
    assert exact.how == "workload-independent"
    by_host = store.select("redis GET", "redis://10.0.0.1:6379/3", {"tier": "C2"})
    assert "same host:port" in by_host.how
    by_system = store.select("redis GET", "redis://other:6379/0", {"tier": "C2"})
    assert "same system" in by_system.how
    with pytest.raises(ProfileError) as err:
        store.select("redis GET", REDIS, {"tier": "C6"})
    message = str(err.value)
    assert "tier=C6" in message and "tier=C2" in message and "redis GET" in message


def test_select_labels_subset_when_unambiguous(store: ProfileStore) -> None:
    store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2", "location": "eu"}), [1.0])
    assert store.select("redis GET", REDIS, {"tier": "C2"}).keys[0].label_text == "location=eu,tier=C2"
    with pytest.raises(ProfileError, match="baseline"):
        store.select("redis GET", REDIS, {})
    store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2", "location": "us"}), [1.0])
    with pytest.raises(ProfileError):
        store.select("redis GET", REDIS, {"tier": "C2"})


def test_select_parameterised_interpolates_quantiles(store: ProfileStore) -> None:
    rng = np.random.default_rng(1)
    lo = rng.normal(10.0, 1.0, 400)
    hi = rng.normal(30.0, 3.0, 400)
    api = "http GET /blob/{id}"
    store.add(ProfileKey.make(api, "http://b:80", {}, "size_bytes", 1e6), lo)
    store.add(ProfileKey.make(api, "http://b:80", {}, "size_bytes", 1e7), hi)
    store.add(ProfileKey.make(api, "http://b:80", {}), [99.0])
    sel = store.select(api, "http://b:80", {}, "size_bytes", 5.5e6)
    assert len(sel.keys) == 2 and "interpolated" in sel.how
    assert np.median(sel.samples_ms) == pytest.approx(0.5 * np.median(lo) + 0.5 * np.median(hi), rel=0.02)
    assert np.std(sel.samples_ms) == pytest.approx(0.5 * np.std(lo) + 0.5 * np.std(hi), rel=0.05)
    exact = store.select(api, "http://b:80", {}, "size_bytes", 1e7)
    assert exact.samples_ms.tolist() == hi.tolist() and "measured" in exact.how
    clamped = store.select(api, "http://b:80", {}, "size_bytes", 5e7)
    assert "clamped to 1e+07" in clamped.how
    # No workload hint: WebPerf falls back to the workload-independent profile.
    assert store.select(api, "http://b:80", {}, "size_bytes", None).samples_ms.tolist() == [99.0]
    # A parameter without a profile: workload-independent, saying why.
    assert "no concurrency profile" in store.select(api, "http://b:80", {}, "concurrency", 8).how


def test_select_size_at_concurrency_interpolates_both_ways(store: ProfileStore) -> None:
    """A payload profile measured at several concurrencies: read at the asked level, interpolated between the
    two nearest measured levels (and sizes), clamped outside them; one caller when no level is asked."""
    api, res = "http GET /blob/{id}", "http://b:80"
    base = np.linspace(1.0, 2.0, 101)
    for size, c, shift in ((1e3, 1, 0.0), (1e6, 1, 1.0), (1e3, 4, 3.0), (1e6, 4, 7.0)):
        store.add(ProfileKey.make(api, res, {}, "size_bytes", size, c), base + shift)
    one = store.select(api, res, {}, "size_bytes", 1e6)
    assert one.samples_ms.tolist() == (base + 1.0).tolist() and "concurrency" not in one.how
    four = store.select(api, res, {}, "size_bytes", 1e6, 4)
    assert four.samples_ms.tolist() == (base + 7.0).tolist() and "at concurrency 4 (measured)" in four.how
    mid = store.select(api, res, {}, "size_bytes", 1e6, 2.5)
    assert np.median(mid.samples_ms) == pytest.approx(1.5 + 4.0, abs=0.02) and "interpolated 1..4" in mid.how
    both = store.select(api, res, {}, "size_bytes", 0.5e6 + 500, 2.5)  # halfway in size and in concurrency
    assert np.median(both.samples_ms) == pytest.approx(1.5 + (0.5 + 5.0) / 2, abs=0.02)
    far = store.select(api, res, {}, "size_bytes", 1e3, 12)
    assert far.samples_ms.tolist() == (base + 3.0).tolist() and "clamped to 4" in far.how
    assert ProfileKey.make(api, res, {}, "size_bytes", 1e6, 4).describe().endswith("size_bytes=1000000, "
                                                                                   "concurrency=4)")


def test_format_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store written before profiles carried their concurrency keeps every batch: its concurrency profiles
    get their value as callers, every other profile one caller."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE profile (id INTEGER PRIMARY KEY, api TEXT NOT NULL, resource TEXT NOT NULL,
            labels TEXT NOT NULL, param TEXT NOT NULL, value REAL NOT NULL,
            UNIQUE (api, resource, labels, param, value));
        CREATE TABLE batch (id INTEGER PRIMARY KEY, profile_id INTEGER NOT NULL REFERENCES profile(id),
            created_s REAL NOT NULL, count INTEGER NOT NULL, round_trips REAL, note TEXT NOT NULL,
            samples BLOB NOT NULL);
        CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('format', 'perfcast-profiles/1');
        INSERT INTO profile VALUES (7, 'redis GET', 'redis://h:6379/0', '[]', 'concurrency', 8.0);
        INSERT INTO profile VALUES (9, 'redis GET', 'redis://h:6379/0', '[]', 'size_bytes', 100.0);
    """)
    db.execute("INSERT INTO batch VALUES (1, 7, 0, 2, 1.0, 'old', ?)", (np.array([4.0, 5.0], "<f8").tobytes(),))
    db.execute("INSERT INTO batch VALUES (2, 9, 0, 1, 1.0, 'old', ?)", (np.array([6.0], "<f8").tobytes(),))
    db.commit()
    db.close()
    with ProfileStore(path) as s:
        keys = s.keys()
        assert [(k.param, k.concurrency) for k in keys] == [("concurrency", 8), ("size_bytes", 1)]
        assert s.samples(keys[0]).tolist() == [4.0, 5.0] and s.samples(keys[1]).tolist() == [6.0]
        s.add(ProfileKey.make("redis GET", "redis://h:6379/0", {}, "size_bytes", 100.0, 8), [7.0])
    with ProfileStore(path) as s:  # upgraded once: opens as the current format, the new profile beside the old
        assert len(s.keys()) == 3
        assert s.select("redis GET", "redis://h:6379/0", {}, "size_bytes", 100.0, 8).samples_ms.tolist() == [7.0]


def test_callers_cpu_is_kept_per_batch_and_interpolated_with_the_samples(store: ProfileStore) -> None:
    api, res = "http GET /blob/{id}", "http://b:80"
    for size, c, cpu in ((1e3, 1, 0.1), (1e6, 1, 0.5), (1e3, 4, 0.3), (1e6, 4, 0.9)):
        store.add(ProfileKey.make(api, res, {}, "size_bytes", size, c), [1.0] * 3, cpu_ms=cpu)
    key = ProfileKey.make(api, res, {}, "size_bytes", 1e6, 1)
    store.add(key, [1.0], cpu_ms=1.3)  # a second batch: the mean per call over both
    assert store.cpu_ms(key) == pytest.approx((3 * 0.5 + 1.3) / 4)
    assert store.select(api, res, {}, "size_bytes", 1e3).cpu_ms == pytest.approx(0.1)
    assert store.select(api, res, {}, "size_bytes", 1e3, 2.5).cpu_ms == pytest.approx(0.2)
    assert store.select(api, res, {}, "size_bytes", 0.5e6 + 500, 4).cpu_ms == pytest.approx(0.6)
    store.add(ProfileKey.make("redis GET", res, {}), [1.0])  # not recorded: None, also where it is interpolated
    assert store.select("redis GET", res, {}).cpu_ms is None
    store.add(ProfileKey.make(api, res, {}, "size_bytes", 1e7, 1), [2.0])
    assert store.select(api, res, {}, "size_bytes", 5e6).cpu_ms is None
    with pytest.raises(ProfileError, match="field 'cpu_ms'"):
        store.add(key, [1.0], cpu_ms=-1.0)


def test_format_2_store_gains_the_callers_cpu(tmp_path: Path) -> None:
    path = tmp_path / "two.db"
    with ProfileStore(path) as s:
        s.add(ProfileKey.make("redis GET", REDIS, {}), [1.0, 2.0], round_trips=1.0)
    db = sqlite3.connect(path)  # as format 2 left it: no cpu_ms column
    db.executescript("""
        CREATE TABLE batch2 AS SELECT id, profile_id, created_s, count, round_trips, note, samples FROM batch;
        DROP TABLE batch; ALTER TABLE batch2 RENAME TO batch;
        UPDATE meta SET value = 'perfcast-profiles/2' WHERE name = 'format';
    """)
    db.close()
    with ProfileStore(path) as s:
        (key,) = s.keys()
        assert s.samples(key).tolist() == [1.0, 2.0] and s.cpu_ms(key) is None
        s.add(key, [3.0], cpu_ms=0.25)
        assert s.cpu_ms(key) == pytest.approx(0.25) and s.round_trips(key) == pytest.approx(1.0)
    assert sqlite3.connect(path).execute("SELECT value FROM meta").fetchone() == ("perfcast-profiles/3",)


def test_key_concurrency_checked() -> None:
    with pytest.raises(ProfileError, match="concurrency must be at least 1"):
        ProfileKey.make("redis GET", REDIS, {}, "size_bytes", 10.0, 0)
    assert ProfileKey.make("redis GET", REDIS, {}, "concurrency", 6).concurrency == 6


def test_select_only_parameterised_without_value(store: ProfileStore) -> None:
    store.add(ProfileKey.make("redis GET", REDIS, {}, "concurrency", 4), [1.0])
    with pytest.raises(ProfileError, match="parameterised by concurrency"):
        store.select("redis GET", REDIS, {})


def test_interpolate_quantiles_invariants() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.exponential(2.0, 300), 5.0 + rng.exponential(4.0, 200)
    assert np.allclose(np.sort(interpolate_quantiles(a, b, 0.0)), np.quantile(a, (np.arange(300) + 0.5) / 300))
    mid = interpolate_quantiles(a, b, 0.3)
    assert len(mid) == 300
    # Monotone in the weight: every quantile lies between the two inputs' quantiles.
    q = (np.arange(300) + 0.5) / 300
    assert np.all(mid >= np.minimum(np.quantile(a, q), np.quantile(b, q)) - 1e-9)
    assert np.all(mid <= np.maximum(np.quantile(a, q), np.quantile(b, q)) + 1e-9)
    with pytest.raises(ValueError):
        interpolate_quantiles(a, b, 1.5)


def test_parse_labels() -> None:
    assert parse_labels(["tier=C2", "location = eu"]) == {"tier": "C2", "location": "eu"}
    with pytest.raises(ProfileError, match="NAME=VALUE"):
        parse_labels(["tier"])


def test_unknown_param_rejected() -> None:
    with pytest.raises(ProfileError, match="unknown profile parameter"):
        ProfileKey.make("redis GET", REDIS, {}, "bytes", 3)


def test_baseline_profiles_pools_io_nodes_by_api() -> None:
    nodes = [
        Node("start", NodeKind.START, (0.0, 0.0)),
        Node("a", NodeKind.IO, (1.0, 2.0), api="redis GET", system="redis"),
        Node("b", NodeKind.IO, (3.0, 4.0), api="redis GET", system="redis"),
        Node("c", NodeKind.COMPUTE, (9.0, 9.0)),
        Node("end", NodeKind.END, (0.0, 0.0)),
    ]
    g = CausalGraph("GET /", nodes, [("start", "a"), ("a", "b"), ("b", "c"), ("c", "end")], latency_ms=[13, 15])
    base = baseline_profiles([g])
    assert list(base) == ["redis GET"]
    assert sorted(base["redis GET"].tolist()) == [1.0, 2.0, 3.0, 4.0]
