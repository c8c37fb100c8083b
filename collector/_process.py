"""The ``process`` spans: where the process's CPU went during a collection, one span per second.

Each span covers the interval since the previous one (the first starts with the collection, the last ends
with it) and carries the CPU spent in that interval, so the analyzer can take exactly the intervals of its
measured window and leave out the program's start-up and shut-down.

Request spans record the event loop's CPU inside compute segments and io calls; the rest of the process's
CPU (other threads under the GIL, the kernel's work in its syscalls) and the collector's own export thread are
only visible here. The load simulation needs the first (it contends with requests) and must leave out the
second (the prediction is for the app without the collector).
"""

from __future__ import annotations

import os
import threading
import time

from collector import _runtime
from collector import attributes as A

_EXPORT_THREAD_PREFIX = "OtelBatch"
"""The OpenTelemetry SDK's batch processors name their worker threads ``OtelBatch<kind>RecordProcessor``."""


class ProcessClock:
    """CPU counters at the previous sample; :meth:`emit` writes the ``process`` span since then."""

    def __init__(self) -> None:
        self.loop_thread = threading.main_thread().ident
        self.start_ns, self.times, self.loop_cpu_ns, self.export_ns, self.host_ns = self._read()
        self.lock = threading.Lock()

    def _read(self) -> tuple[int, os.times_result, int, int, int]:
        export = sum(_thread_cpu_ns(t.ident) for t in threading.enumerate()
                     if t.name.startswith(_EXPORT_THREAD_PREFIX))
        return time.time_ns(), os.times(), _thread_cpu_ns(self.loop_thread), export, host_cpu_ns()[0]

    def emit(self) -> None:
        """Hand the span to the export pipeline; call before the pipeline shuts down (its threads still run)."""
        if _runtime.emit is None:
            return
        with self.lock:
            now_ns, now, loop_ns, export_ns, host_ns = self._read()
            attributes: dict[str, str | int] = {
                A.KIND: "process",
                A.PROCESS_USER_NS: round((now.user - self.times.user) * 1e9),
                A.PROCESS_SYSTEM_NS: round((now.system - self.times.system) * 1e9),
                A.PROCESS_LOOP_THREAD_NS: max(loop_ns - self.loop_cpu_ns, 0),
                A.PROCESS_EXPORT_NS: max(export_ns - self.export_ns, 0),
                A.PROCESS_THREADS: threading.active_count(),
            }
            if host_ns and self.host_ns:
                attributes[A.PROCESS_HOST_BUSY_NS] = max(host_ns - self.host_ns, 0)
                attributes[A.PROCESS_HOST_CPUS] = os.cpu_count() or 1
            start_ns = self.start_ns
            self.start_ns, self.times, self.loop_cpu_ns, self.export_ns, self.host_ns = (now_ns, now, loop_ns,
                                                                                          export_ns, host_ns)
        _runtime.emit_span("process", None, start_ns, now_ns, attributes)


def host_cpu_ns() -> tuple[int, int]:
    """(busy, steal) CPU time of the whole host so far, summed over its cores, ns, from one reading of
    ``/proc/stat`` (psutil); (0, 0) when it cannot be read.

    Busy is every state but idle, iowait and steal: what this process and every other one on the machine ran,
    user and kernel (a guest's time is counted in user already). Steal is time the hypervisor ran another guest
    on a vCPU that had work.
    """
    try:
        import psutil  # type: ignore[import-untyped]

        t = psutil.cpu_times()
    except Exception:  # noqa: BLE001 - the collector must never fail the app: no reading, no attribute
        return 0, 0
    steal = getattr(t, "steal", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0) + steal
    busy = sum(t) - idle - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return max(round(busy * 1e9), 0), max(round(steal * 1e9), 0)


def _thread_cpu_ns(ident: int | None) -> int:
    """CPU time of a thread of this process (0 when the platform cannot tell)."""
    if ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except (OSError, OverflowError):
        return 0


INTERVAL_S = 1.0
"""Seconds covered by each ``process`` span."""

_clock: ProcessClock | None = None
_stop = threading.Event()
_sampler: threading.Thread | None = None


def _sample_every_interval(clock: ProcessClock) -> None:
    while not _stop.wait(INTERVAL_S):
        try:
            clock.emit()
        except Exception:  # noqa: BLE001 - inside the user's app: count, never raise
            _runtime.count_error("process span")


def start() -> None:
    """Start measuring (from ``instrument()``) when spans go to a spans file (directly or through the launcher's
    pipe): the spans are for the analyzer, which reads those files."""
    global _clock, _sampler
    if not (_runtime.settings.output or _runtime.settings.span_fd is not None):
        return
    try:
        _clock = ProcessClock()
        _stop.clear()
        _sampler = threading.Thread(target=_sample_every_interval, args=(_clock,), name="perfcast-process",
                                    daemon=True)
        _sampler.start()
    except Exception:  # noqa: BLE001 - inside the user's app: count, never raise
        _runtime.count_error("process span start")


def finish() -> None:
    """Write the last ``process`` span (from ``uninstrument()``, before the export pipeline shuts down)."""
    global _clock, _sampler
    clock, _clock = _clock, None
    sampler, _sampler = _sampler, None
    _stop.set()
    if sampler is not None:
        sampler.join(timeout=2.0)
    if clock is None:
        return
    try:
        clock.emit()
    except Exception:  # noqa: BLE001 - inside the user's app: count, never raise
        _runtime.count_error("process span")
