"""The loop's sleeps: timed from its blocking select() calls, kept per loop, handed out per request window."""

import asyncio
import selectors
import socket
import time

import collector
from collector import _idle


async def test_sleeps_cover_the_loops_pauses_and_not_its_work(collected) -> None:
    t0 = time.time_ns()
    marks = []
    for _ in range(3):
        t = time.perf_counter()
        while time.perf_counter() - t < 0.003:  # busy: no select() in here
            pass
        marks.append(time.time_ns())
        await asyncio.sleep(0.005)
        marks.append(time.time_ns())
    flat = _idle.sleeps_between(t0, time.time_ns())
    assert flat is not None and len(flat) % 2 == 0
    sleeps = list(zip(flat[::2], flat[1::2], strict=True))
    for busy_end, woke in zip(marks[::2], marks[1::2], strict=True):
        slept = sum(min(b, woke) - max(a, busy_end) for a, b in sleeps if b > busy_end and a < woke)
        assert slept > 0.6 * (woke - busy_end)
        assert not any(busy_end - 2_500_000 < b <= busy_end for _, b in sleeps)


async def test_the_loops_last_wake_up_is_when_its_last_select_returned(collected) -> None:
    await asyncio.sleep(0.005)
    resumed = time.time_ns()  # the loop woke from that sleep just before this step resumed
    t = time.perf_counter()
    while time.perf_counter() - t < 0.003:  # busy: no select() in here
        pass
    woke = _idle.last_woke()
    assert woke is not None and woke <= resumed and resumed - woke < 2_000_000
    assert time.time_ns() - woke >= 3_000_000  # the busy 3 ms lie after it
    await asyncio.sleep(0)  # a turn of the loop: its select() does not block (ready work), and is not a wake-up
    assert _idle.last_woke() == woke
    _idle.unhook()  # the request sampler takes the hook out between its windows: a wake-up from before is stale
    _idle.hook()
    assert _idle.last_woke() is None


async def test_a_select_that_finds_an_answer_waiting_is_not_a_sleep(collected, monkeypatch) -> None:
    # On a busy machine a select() that returns at once can take tens of us (the GIL taken back): made slow here
    real = _idle._orig_select

    def slow(self, timeout=None):
        got = real(self, timeout)
        time.sleep(0.0001)
        return got

    monkeypatch.setattr(_idle, "_orig_select", slow)
    loop = asyncio.get_running_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    got: asyncio.Future[int] = loop.create_future()
    loop.add_reader(a, lambda: got.done() or got.set_result(time.time_ns()))
    try:
        await asyncio.sleep(0.003)  # nothing to read: the loop sleeps, and that is kept
        sent = time.time_ns()
        b.send(b"x")  # the answer is in before the loop selects again
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        read = await got
        assert _idle.sleeps_between(sent, read) == []
        flat = _idle.sleeps_between(sent - 3_000_000, sent)
        assert flat and flat[-1] - flat[0] > 1_000_000
    finally:
        loop.remove_reader(a)
        a.close()
        b.close()


async def test_the_poll_before_a_sleep_does_not_delay_the_loops_timer(collected, monkeypatch) -> None:
    real = _idle._orig_select
    waits: list[float] = []

    def slow_poll(self, timeout=None):
        if timeout == 0:
            time.sleep(0.005)
        else:
            waits.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(_idle, "_orig_select", slow_poll)
    await asyncio.sleep(0.02)
    # the loop asked to wait about 20 ms for its timer; after the 5 ms poll the hook waits only the rest
    assert waits and 0.010 < max(waits) < 0.0165


async def test_a_window_whose_start_was_dropped_is_unknown(collected, monkeypatch) -> None:
    monkeypatch.setattr(_idle, "_KEPT", 3)
    t0 = time.time_ns()
    for _ in range(5):
        await asyncio.sleep(0.002)
    assert _idle.sleeps_between(t0, time.time_ns()) is None
    recent = time.time_ns()
    await asyncio.sleep(0.002)
    assert _idle.sleeps_between(recent, time.time_ns()) is not None


def test_the_selector_gets_its_own_select_back() -> None:
    own = selectors.DefaultSelector.__dict__.get("select")
    collector.instrument(output=None, quiet=True)
    try:
        assert selectors.DefaultSelector.__dict__.get("select") is _idle._select
    finally:
        collector.uninstrument()
    assert selectors.DefaultSelector.__dict__.get("select") is own
    assert _idle.sleeps_between(0, time.time_ns()) is None


def test_select_outside_a_loop_is_passed_through(collected) -> None:
    sel = selectors.DefaultSelector()
    try:
        assert sel.select(0.005) == []  # blocked 5 ms, on a thread with no running loop: not recorded
        assert "_perfcast_idle" not in sel.__dict__
    finally:
        sel.close()
