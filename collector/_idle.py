"""When the event loop slept: its blocking ``select()`` calls, kept per loop and written on each request span.

A step of a task that could have run but did not was waiting for the loop. Task steps alone cannot tell a loop
busy with something else (the read callbacks of other sockets, where client libraries parse answers) from an
idle one: both leave a gap between steps. A ``select()`` that blocked can: the loop had nothing to do, and any
answer that had come would have woken it. The analyzer bounds how long an answer waited for the loop by the
last such sleep before the call returned (:mod:`analyzer.build`).

The hook wraps the selector class the loops use (``selectors.DefaultSelector``); only calls that may block (a
timeout other than 0) on a thread running an asyncio loop are timed, each after a poll (timeout 0) that found
nothing ready, and only sleeps of at least ``MIN_IDLE_NS`` are kept. A ``select()`` that returns at once found
work waiting, which says nothing about when it came; timed alone, such a call took 20-30 us on a busy virtual
machine (the system call and the GIL taken back from another thread) and read as a sleep: in the example's
index page, a query's answer that waited 5 ms in its socket while the loop started ten blob fetches seemed to
have come just then (``docs/accuracy.md``, runs 67-70).
"""

from __future__ import annotations

import asyncio
import collections
import selectors
import time
from typing import Any

from collector import _runtime

MIN_IDLE_NS = 20_000
"""A ``select()`` that slept (nothing was ready when it was called) for less than this is not counted as a sleep."""

_KEPT = 4096
"""Sleeps kept per loop: far more than one request lasts, at any rate the loop wakes up."""

_get_running_loop = asyncio.events._get_running_loop
_time_ns = time.time_ns
_selector_class: Any = selectors.DefaultSelector
_orig_select: Any = None
_own_select: Any = None
"""The class's own ``select`` attribute before the hook (None: it inherited one)."""
_hooked = False
_generation = 0
"""Counts the times the hook was put in place: a wake-up timed before the request sampler last took the hook out
(``_perfcast_woke`` is kept per selector) is stale."""


def _select(self: Any, timeout: float | None = None) -> Any:
    if timeout == 0 or _get_running_loop() is None:
        return _orig_select(self, timeout)
    t0 = _time_ns()
    slept = False
    try:
        # Polled first: work already waiting means the loop never slept, however long the call took (a select()
        # that returned at once took 20-30 us on a busy virtual machine, the GIL taken back included).
        ready = _orig_select(self, 0)
        if ready:
            return ready
        slept = True
        t = _time_ns()
        if timeout is not None:
            timeout = max(timeout - (t - t0) / 1e9, 0.0)  # the timer the loop waits for stays on time
        t0 = t
        return _orig_select(self, timeout)
    finally:
        t1 = _time_ns()
        try:
            self._perfcast_woke = (_generation, t1)
            if slept and t1 - t0 >= MIN_IDLE_NS:
                sleeps = self.__dict__.get("_perfcast_idle")
                if sleeps is None:
                    sleeps = self._perfcast_idle = collections.deque(maxlen=_KEPT)
                sleeps.append((t0, t1))
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("select")


def install(hooked: bool = True) -> None:
    """Prepare the ``select()`` hook; with ``hooked``, put it in place."""
    global _orig_select, _own_select
    if _orig_select is None:
        _orig_select = _selector_class.select
        _own_select = _selector_class.__dict__.get("select")
    if hooked:
        hook()


def hook() -> None:
    """Put the hook in place (a class attribute of the selector, swapped by the request sampler too)."""
    global _hooked, _generation
    if _orig_select is None or _hooked:
        return
    _generation += 1
    _selector_class.select = _select
    _hooked = True


def unhook() -> None:
    """Take the hook out: the selector class gets its own ``select`` back."""
    global _hooked
    if not _hooked:
        return
    if _own_select is None:
        del _selector_class.select
    else:
        _selector_class.select = _own_select
    _hooked = False


def uninstall() -> None:
    """Undo ``install()``."""
    global _orig_select
    unhook()
    _orig_select = None


def _timed_selector() -> Any:
    """The running loop's selector when the hook times it; None otherwise (no hook, no loop, a selector of a
    class the hook does not wrap)."""
    if not _hooked:
        return None
    loop = _get_running_loop()
    selector = getattr(loop, "_selector", None) if loop is not None else None
    if selector is None or type(selector).select is not _select:
        return None
    return selector


def last_woke() -> int | None:
    """When the running loop's last ``select()`` that could block returned (Unix ns), however short it blocked:
    the loop's work since then, up to now, is one turn of it, woken by what that call found. Asked as a request's
    span starts, it dates the loop's reading and parsing of the request. None when not known."""
    selector = _timed_selector()
    woke = selector.__dict__.get("_perfcast_woke") if selector is not None else None
    return woke[1] if woke is not None and woke[0] == _generation else None


def sleeps_between(start_ns: int, end_ns: int) -> list[int] | None:
    """The running loop's sleeps that overlap ``[start_ns, end_ns]`` (Unix ns), flattened as ``[start, end, ...]``
    in time order and clipped to the interval; None when the loop's sleeps are not known (no hook, no loop, or
    more sleeps since ``start_ns`` than are kept)."""
    selector = _timed_selector()
    if selector is None:
        return None
    sleeps = selector.__dict__.get("_perfcast_idle")
    if not sleeps:
        return []
    if len(sleeps) == sleeps.maxlen and sleeps[0][1] > start_ns:
        return None  # sleeps of the request's start were dropped: an incomplete list would read as busy
    out: list[tuple[int, int]] = []
    for a, b in reversed(sleeps):
        if b <= start_ns:
            break
        if a < end_ns:
            out.append((max(a, start_ns), min(b, end_ns)))
    return [t for pair in reversed(out) for t in pair]
