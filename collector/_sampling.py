"""Request sampling in windows: record every request that starts inside a window, and nothing outside.

A recorded request costs the app several times its own CPU (a task step, an I/O call and a span each cost
microseconds in Python). Deciding per request would leave the per-step hooks in place for every request, and
they alone cost more than the 5% a production service can spare. So perfcast samples *time*: windows of
``window_s`` seconds open at random instants, on average a fraction ``fraction`` of the time. Inside a window
the step, transport and socket hooks are in place and every new request of the aiohttp server is recorded
whole; outside, the hooks are out (steps run at their plain cost) and new requests run with OpenTelemetry's
suppress-instrumentation flag set in their context, so the contrib instrumentations step aside at their first
check. A closing window stops admitting requests and keeps the hooks in until the requests it admitted, and
the tasks they spawned, have finished (at most ``max_drain_s``), so a recorded request is never cut short.

Windows open at the points of a Poisson process (the gaps are exponential): by PASTA (Wolff, "Poisson
Arrivals See Time Averages", Operations Research 30(2), 1982) they see the time-average state of the
service, so the recorded requests are an unbiased sample of the service's load conditions, which a fixed
period could alias with a periodic workload. Every request in a window is recorded, so a recorded request's
concurrent neighbours are recorded too: the recorded bursts keep the contention the load analysis needs.

Each window is written as a ``window`` span (its interval and its counts), so the analyzer can take process
CPU and request rates from the recorded intervals only.
"""

from __future__ import annotations

import contextvars
import random
import time
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult
from opentelemetry.trace import SpanKind

from collector import _idle, _io, _runtime, _sync, _tasks
from collector import attributes as A

_decided: contextvars.ContextVar[bool] = contextvars.ContextVar("perfcast_sampling_decided", default=False)
"""Set while a request runs under the decision made for it (a sub-application's middleware sees it)."""


@dataclass(slots=True)
class WindowSampler:
    """When to record: the window state machine, driven by the requests themselves (on the loop thread).

    Driving it from the requests (rather than a timer thread) keeps every hook swap on the thread that runs
    the steps, between two of them, and costs nothing while the service is idle.
    """

    fraction: float
    """Long-run fraction of time inside windows, in (0, 1)."""
    window_s: float
    """Length of a window, in seconds."""
    max_drain_s: float = 2.0
    """Longest a closed window waits, once its recorded requests have finished, for the tasks they spawned
    (fire-and-forget work) before it stops recording them (their chunks are written as ``running``)."""
    rng: random.Random = field(default_factory=random.Random)
    open_ns: int = 0
    """Unix ns at which the current window opened."""
    next_open: float = 0.0
    """``time.monotonic()`` at which the next window opens."""
    closes_at: float = 0.0
    """``time.monotonic()`` at which the current window stops admitting requests."""
    drained_at: float = 0.0
    """``time.monotonic()`` at which the closing window's last recorded request finished (0: not yet)."""
    drained_ns: int = 0
    """The same instant in Unix ns: the end of the window's span."""
    next_scan: float = 0.0
    """``time.monotonic()`` before which a draining window does not look for live recorded tasks again."""
    recording: bool = False
    """Hooks in place: a window is open or draining."""
    in_flight: int = 0
    """Recorded requests that have not finished."""
    admitted: int = 0
    """Requests recorded in the current window."""
    skipped_in_window: int = 0
    """Requests that arrived while the current window was open or draining but were not recorded."""
    windows: int = 0
    recorded: int = 0
    skipped: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ValueError(f"sample fraction must be in (0, 1), got {self.fraction}")
        if self.window_s <= 0:
            raise ValueError(f"sample window must be > 0 s, got {self.window_s}")
        self.next_open = time.monotonic() + self._gap()

    def _gap(self) -> float:
        # mean gap g with window / (window + g) = fraction
        return self.rng.expovariate(self.fraction / (self.window_s * (1.0 - self.fraction)))

    def admit(self, now: float) -> bool:
        """Whether the request arriving now is recorded (opens and closes windows as time passes)."""
        if not self.recording:
            if now >= self.next_open:
                end = self._skip_idle_windows(now)
                if now >= self.next_open:
                    self._open(now, end)
            # the step running this request started before the hooks went in: it is not recorded
            return False
        if now < self.closes_at and _tasks.current() is not None:
            return True
        self.try_close(now)
        return False

    def _skip_idle_windows(self, now: float) -> float:
        """Move past the windows scheduled while no request came (they saw an idle service and recorded
        nothing, as they should); return the end of the scheduled window that is due now.

        Opening a late window at the first request after a quiet spell instead would make windows start at
        the beginnings of bursts more often than by chance: the sample would no longer see time averages.
        """
        end = self.next_open + self.window_s
        skipped = 0
        while end <= now:
            skipped += 1
            if skipped > 10_000:  # a very long quiet spell: the process is memoryless, start afresh from now
                self.next_open = now + self._gap()
                return self.next_open + self.window_s
            self.next_open = end + self._gap()
            end = self.next_open + self.window_s
        return end

    def _open(self, now: float, closes_at: float) -> None:
        _tasks.hook()
        _io.hook()
        _idle.hook()
        self.recording = True
        self.closes_at = closes_at
        self.open_ns = time.time_ns()
        self.admitted = self.skipped_in_window = 0
        self.drained_at = self.next_scan = 0.0
        self.windows += 1

    def try_close(self, now: float) -> None:
        """Close the window once its requests and their tasks are done (or ``max_drain_s`` has passed)."""
        if not self.recording or now < self.closes_at:
            return
        if self.in_flight:
            return  # a recorded request is never cut short
        if self.drained_at == 0.0:
            self.drained_at, self.drained_ns = now, time.time_ns()
        if now < self.drained_at + self.max_drain_s:
            if now < self.next_scan:
                return
            self.next_scan = now + 0.01  # the scan walks every task record: not on each request of a busy drain
            if _tasks.traced_tasks_alive():
                return
        _tasks.unhook()
        _io.unhook()
        _idle.unhook()
        self.recording = False
        self.next_open = now + self._gap()
        _tasks.forget()
        _sync.forget()
        self._emit_window()

    def _emit_window(self) -> None:
        _runtime.emit_span(
            "sampling window",
            None,
            self.open_ns,
            self.drained_ns if self.drained_at else time.time_ns(),
            {
                A.KIND: "window",
                A.WINDOW_RECORDED: self.admitted,
                A.WINDOW_SKIPPED: self.skipped_in_window,
                A.WINDOW_FRACTION: self.fraction,
                A.WINDOW_LENGTH_NS: round(self.window_s * 1e9),
            },
        )

    def finish(self) -> None:
        """At the end of the collection: write the window that is open, if any."""
        if self.recording:
            self._emit_window()


class RequestsOnly(Sampler):
    """The OTel sampler of a sampled collection: a trace is recorded when it starts with a server span (a
    request the window admitted; the others run with instrumentation suppressed and start no span at all).

    Spans that start a trace of their own outside any request (a background job's Redis call) are dropped:
    recorded, they would be traces of nothing perfcast predicts, costing as much outside windows as inside.
    Used by ``ParentBased`` for roots and remote parents (the window decides, whatever the caller's flag
    says), so that every span inside a recorded request is recorded.
    """

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None) -> SamplingResult:
        if kind is SpanKind.SERVER:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return SamplingResult(Decision.DROP)

    def get_description(self) -> str:
        return "perfcast.RequestsOnly"


def otel_sampler() -> Sampler:
    """The sampler for the ``TracerProvider`` of a sampled collection."""
    requests_only = RequestsOnly()
    return ParentBased(root=requests_only, remote_parent_sampled=requests_only,
                       remote_parent_not_sampled=requests_only)


sampler: WindowSampler | None = None


async def _decide(request: Any, handler: Any) -> Any:
    """The aiohttp middleware placed before every other: record this request, or suppress its tracing."""
    s = sampler
    if s is None or _decided.get():
        return await handler(request)
    decided = _decided.set(True)
    try:
        try:
            sampled = s.admit(time.monotonic())
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("sampling")
            sampled = False
        if sampled:
            s.in_flight += 1
            s.admitted += 1
            s.recorded += 1
            try:
                return await handler(request)
            finally:
                s.in_flight -= 1
                try:
                    s.try_close(time.monotonic())
                except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
                    _runtime.count_error("sampling")
        s.skipped += 1
        if s.recording:
            s.skipped_in_window += 1
        token = otel_context.attach(
            otel_context.set_value(_tasks.UNSAMPLED, True, otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        )
        try:
            return await handler(request)
        finally:
            otel_context.detach(token)
    finally:
        _decided.reset(decided)


_decide.__middleware_version__ = 1  # type: ignore[attr-defined]  # aiohttp's new-style middleware mark
_saved_init: tuple[Any, Any] | None = None


def _application_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    wrapped(*args, **kwargs)
    instance.middlewares.insert(0, _decide)  # before the contrib's tracing middleware


def install(fraction: float, window_s: float, max_drain_s: float = 2.0) -> None:
    """Start sampling: the step and I/O hooks must have been installed unhooked; ``_decide`` goes first in
    the middlewares of every ``aiohttp.web.Application`` made from now on."""
    global sampler, _saved_init
    sampler = WindowSampler(fraction, window_s, max_drain_s)
    try:
        import aiohttp.web
    except ImportError:  # no aiohttp server: nothing is ever admitted
        return
    cls = aiohttp.web.Application  # the contrib instrumentation's subclass, when it is installed
    _saved_init = (cls, cls.__dict__.get("__init__"))
    cls.__init__ = wrapt.FunctionWrapper(cls.__init__, _application_init)


def uninstall() -> WindowSampler | None:
    """Stop sampling (before the contrib instrumentations are removed); return the sampler for its counts."""
    global sampler, _saved_init
    s = sampler
    if s is None:
        return None
    s.finish()
    if _saved_init is not None:
        cls, init = _saved_init
        if init is None:
            del cls.__init__
        else:
            cls.__init__ = init
    sampler = _saved_init = None
    return s
