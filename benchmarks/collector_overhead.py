"""Throughput cost of tracing: the forum app at saturation, plain, under perfcast, under the contrib asyncio
instrumentation.

Configurations, measured in one run: every configuration's app is started once and the apps are loaded in
turn, one slice of ``--duration`` seconds each per round (A B C, B C A, ...), so that the slow drifts of a shared
machine hit them alike; medians quoted, and the median over rounds of each configuration's ratio to ``plain`` in
the same round (``paired``). ``--restart`` starts each app afresh in every round instead:

- ``plain``: ``python -m examples.forum ...``
- ``plain-control``: a second plain app, measured like the others: its ratio to ``plain`` is the noise floor
  of the run (the two differ only by chance and by their place in the rotation)
- ``perfcast``: ``python -m collector -o SPANS -- python -m examples.forum ...``
- ``perfcast-sampled``: the same with ``--sample S --sample-window W`` (request sampling in windows:
  ``collector._sampling``); S and W from ``--sample`` and ``--sample-window``
- ``otel-asyncio``: the app under ``opentelemetry-instrumentation-asyncio`` through a small bootstrap (this
  file with ``--run-under-otel-asyncio``): a ``TracerProvider`` whose ``BatchSpanProcessor`` writes each span as
  a JSON line to a file, ``AsyncioInstrumentor().instrument()``, then the app's module run as ``__main__``.
  By default that instrumentation makes spans only for the coroutines named in
  ``OTEL_PYTHON_ASYNCIO_COROUTINE_NAMES_TO_TRACE``; we name the app's awaited coroutines (the blob, SQL,
  replica and ad calls), so it traces the same fan-outs perfcast does.

Each app is started and waited for (its ``listening on`` line) and warmed up; each measurement loads it with
``--users`` closed-loop users for ``--duration`` seconds from another process (``wrk`` when it is on PATH, else
the aiohttp load client ``python -m examples.forum.load``); at the end the apps are stopped with SIGINT (so
exporters flush). The app's CPU time per request over the measured window is reported too: it is less sensitive
than throughput to other work on the machine. Nothing is pinned: the apps, their dependencies and the client all
share this machine's cores; an app that is not being loaded is idle.

With ``--baseline-collector DIR`` a fourth configuration, ``perfcast-base``, runs the app under the collector
package found in DIR (an older version) in the same interleaved rounds, so that a change to the collector is
measured against what it replaces under the same machine conditions.

Usage::

    python benchmarks/collector_overhead.py                       # 12 rounds x 5 s, all apps up, in turn
    python benchmarks/collector_overhead.py --rounds 2 --duration 3 --warmup 1   # quick look
    mkdir /tmp/base && git archive HEAD collector | tar -x -C /tmp/base
    python benchmarks/collector_overhead.py --configs perfcast --baseline-collector /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from importlib.util import find_spec
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from examples.forum.load import run_load_subprocess
from replayer.groundtruth import reachable

REDIS_URL = os.environ.get("PERFCAST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("PERFCAST_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
CONFIGS = ("plain", "plain-control", "perfcast", "perfcast-sampled", "otel-asyncio")
SAMPLED = "perfcast-sampled"
"""The collector with request sampling: ``--sample S --sample-window W`` (this script's --sample, --sample-window)."""
_sample: tuple[float, float] = (0.01, 0.2)
BASELINE = "perfcast-base"
"""With ``--baseline-collector DIR``: the collector package found in DIR (an older version, e.g. from
``git archive HEAD collector | tar -x -C DIR``), measured in the same run as the working tree's."""
_baseline_dir: str | None = None
# The coroutines the forum awaits through create_task / gather / wait / wait_for / TaskGroup.
OTEL_ASYNCIO_COROUTINES = "_fetch_blob,_recommend,_fetch_ad,_record_view,top_users,tag_counts,comment_count"
_REQUEST_KIND = b'{"key":"perfcast.kind","value":{"stringValue":"request"}}'
_LISTENING = re.compile(r"listening on (http://\S+)")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One configuration measured once."""

    config: str
    round: int
    throughput_rps: float
    requests: int
    errors: int
    p50_ms: float
    app_cpu_ms_per_request: float
    """CPU time (user + system) of the app's process tree over the measured window, per request."""
    app_cpu_share: float
    """That CPU time over the window's length: 1.0 is one core busy all the time (saturated event loop)."""
    spans_lines: int
    """Lines in the spans file after the app stopped (0 for ``plain``)."""
    load_average: float
    """The machine's 1-minute load average when the measurement ended (other work on the machine)."""
    recorded_requests: int = 0
    """Request spans in the spans file (warm-up included): all requests, or those of the sampling windows."""


# --- starting and stopping the app -------------------------------------------------------------------------


def _app_command(config: str, app_args: Sequence[str], spans: Path) -> list[str]:
    app = [sys.executable, "-m", "examples.forum", *app_args]
    if config in ("plain", "plain-control"):
        return app
    if config == "perfcast":
        return [sys.executable, "-m", "collector", "-o", str(spans), "--", *app]
    if config == SAMPLED:
        return [sys.executable, "-m", "collector", "-o", str(spans), "--sample", str(_sample[0]),
                "--sample-window", str(_sample[1]), "--", *app]
    if config == BASELINE and _baseline_dir is not None:
        # DIR first on sys.path: the launcher and (through the PYTHONPATH it sets) the app import that collector
        run = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('collector', run_name='__main__')"
        return [sys.executable, "-c", run, _baseline_dir, "-o", str(spans), "--", *app]
    if config == "otel-asyncio":
        return [sys.executable, str(Path(__file__).resolve()), "--run-under-otel-asyncio", str(spans),
                "examples.forum", *app_args]
    raise ValueError(f"unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")


class _Process:
    """A server started in its own session (so SIGINT reaches the whole tree), waited for until it listens."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 60.0) -> None:
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the process; closed in stop()
        self._stderr_tail = ""
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=env, start_new_session=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.proc.stdout.readline()
            if match := _LISTENING.search(line):
                self.url = match.group(1)
                return
            if not line or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{' '.join(argv)} did not start: {self.error_text()}")

    def error_text(self) -> str:
        """The end of the process's stderr (kept after :meth:`stop`)."""
        if not self.stderr.closed:
            self.stderr.seek(0)
            self._stderr_tail = self.stderr.read()[-2000:]
        return self._stderr_tail

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its children (0 for ones that have ended)."""
        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
        return total

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.error_text()
        self.stderr.close()
        return self.proc.returncode


# --- the load ------------------------------------------------------------------------------------------------

_WRK_SCRIPT = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/?page=" .. math.random(1, %d))
end
"""


def parse_wrk(out: str) -> tuple[int, int, float, float]:
    """(successful requests, failed requests, seconds, p50 ms) from ``wrk --latency`` output."""
    total = re.search(r"(\d+) requests in ([\d.]+)(ms|s|m)", out)
    if total is None:
        raise ValueError(f"not wrk output: {out[:200]!r}")
    seconds = float(total.group(2)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[total.group(3)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    bad_status = int(non2xx.group(1)) if non2xx else 0
    failed = sum(int(n) for n in socket_errors.groups()) if socket_errors else 0
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p50_ms = float(p50.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[p50.group(2)] if p50 else float("nan")
    return int(total.group(1)) - bad_status, bad_status + failed, seconds, p50_ms


def _load(url: str, client: str, users: int, duration_s: float, pages: int) -> tuple[int, int, float, float]:
    """(successful requests, errors, measured seconds, p50 ms) of one closed-loop run."""
    if client == "wrk":
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(_WRK_SCRIPT % pages)
        try:
            out = subprocess.run(
                ["wrk", "-t1", f"-c{users}", f"-d{max(1, round(duration_s))}s", "--timeout", "30s", "--latency",
                 "-s", script.name, url],
                capture_output=True, text=True, check=True, timeout=duration_s + 60,
            ).stdout
        finally:
            os.unlink(script.name)
        return parse_wrk(out)
    result = run_load_subprocess(url, users=users, duration_s=duration_s, paths=["/?page={n}"], n_max=pages)
    return len(result.latencies_ms), result.errors, result.elapsed_s, result.percentile_ms(50)


def measure(config: str, rnd: int, app_args: Sequence[str], args: argparse.Namespace, workdir: Path) -> Measurement:
    """Start the app in ``config``, load it, stop it; one :class:`Measurement`."""
    spans = workdir / f"{config}-{rnd}.jsonl"
    app = _Process(_app_command(config, app_args, spans), env=_env(config))
    try:
        if args.warmup > 0:
            _load(app.url, args.client, args.users, args.warmup, args.pages)
        cpu0 = app.cpu_s()
        ok, errors, seconds, p50 = _load(app.url, args.client, args.users, args.duration, args.pages)
        cpu = app.cpu_s() - cpu0
    finally:
        code = app.stop()
    if code not in (0, -signal.SIGINT, 130):
        raise RuntimeError(f"{config}: the app exited with {code}: {app.error_text()}")
    lines, recorded = _spans_counts(spans)
    return _measurement(config, rnd, ok, errors, seconds, p50, cpu, lines, recorded)


def _measurement(config: str, rnd: int, ok: int, errors: int, seconds: float, p50: float, cpu: float,
                 lines: int = 0, recorded: int = 0) -> Measurement:
    """A :class:`Measurement` from a load run's counts and the app's CPU seconds over it."""
    return Measurement(config, rnd, ok / seconds if seconds else 0.0, ok, errors, p50,
                       1000 * cpu / ok if ok else float("nan"), cpu / seconds if seconds else float("nan"),
                       lines, os.getloadavg()[0], recorded)


def _env(config: str) -> dict[str, str]:
    env = {**os.environ, "PERFCAST_QUIET": "1"}
    if config == "otel-asyncio":
        env["OTEL_PYTHON_ASYNCIO_COROUTINE_NAMES_TO_TRACE"] = OTEL_ASYNCIO_COROUTINES
    return env


def _spans_counts(spans: Path) -> tuple[int, int]:
    """(lines, request spans) of a spans file, which is then deleted."""
    lines = recorded = 0
    if spans.exists():
        with spans.open("rb") as f:
            for line in f:
                lines += 1
                recorded += line.count(_REQUEST_KIND)
        spans.unlink()
    return lines, recorded


def measure_sliced(configs: Sequence[str], app_args: Sequence[str], args: argparse.Namespace,
                   workdir: Path) -> list[Measurement]:
    """All configurations up at once, loaded in turn for ``--duration`` seconds each, ``--rounds`` times.

    On a shared machine whose speed drifts over minutes, short slices taken in turn from servers that stay up
    compare the configurations under the same conditions; the order rotates each round. Each slice is one
    :class:`Measurement` (its CPU is the app's over the slice); the spans counts go on each configuration's
    last slice.
    """
    apps: dict[str, _Process] = {}
    results: list[Measurement] = []
    try:
        for config in configs:
            apps[config] = _Process(_app_command(config, app_args, workdir / f"{config}.jsonl"), env=_env(config))
        for config in configs:
            if args.warmup > 0:
                _load(apps[config].url, args.client, args.users, args.warmup, args.pages)
        for rnd in range(1, args.rounds + 1):
            shift = (rnd - 1) % len(configs)
            for config in [*configs[shift:], *configs[:shift]]:
                app = apps[config]
                cpu0 = app.cpu_s()
                ok, errors, seconds, p50 = _load(app.url, args.client, args.users, args.duration, args.pages)
                cpu = app.cpu_s() - cpu0
                m = _measurement(config, rnd, ok, errors, seconds, p50, cpu)
                results.append(m)
                _print_measurement(m)
    finally:
        for config, app in apps.items():
            code = app.stop()
            if code not in (0, -signal.SIGINT, 130):
                raise RuntimeError(f"{config}: the app exited with {code}: {app.error_text()}")
    for config in configs:
        lines, recorded = _spans_counts(workdir / f"{config}.jsonl")
        last = max(i for i, m in enumerate(results) if m.config == config)
        results[last] = replace(results[last], spans_lines=lines, recorded_requests=recorded)
    return results


def _print_measurement(m: Measurement) -> None:
    print(f"  round {m.round} {m.config:<16} {m.throughput_rps:8.1f} req/s  p50 {m.p50_ms:7.1f} ms  "
          f"cpu {m.app_cpu_ms_per_request:6.2f} ms/req ({m.app_cpu_share:.2f} core)  errors {m.errors}  "
          f"load {m.load_average:.1f}", flush=True)


# --- dependencies --------------------------------------------------------------------------------------------


def _start_dependencies(backend: str) -> tuple[list[str], list[_Process], str]:
    """App arguments for the chosen backend, the processes started for it, and a description."""
    if backend == "auto":
        backend = "services" if reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432) else "embedded"
    if backend == "embedded":
        return [], [], "embedded (SQLite file, blob/cache/ad/replica services on a thread of the app)"
    blobs = [_Process([sys.executable, "-m", "examples.forum.blobs", "--port", "0"]) for _ in range(3)]
    args = ["--redis", REDIS_URL, "--postgres", POSTGRES_URL, "--blob-url", blobs[0].url,
            "--replica-url", blobs[1].url, "--replica-url", blobs[2].url]
    return args, blobs, "services (Redis, PostgreSQL, 3 blob-service processes: blobs+ads, replica A, replica B)"


# --- the contrib asyncio bootstrap ----------------------------------------------------------------------------


def run_under_otel_asyncio(spans_path: str, module: str, argv: Sequence[str]) -> None:
    """Run ``python -m module argv`` with opentelemetry-instrumentation-asyncio, spans as JSON lines."""
    import runpy
    from collections.abc import Sequence as Seq

    from opentelemetry import trace
    from opentelemetry.instrumentation.asyncio import AsyncioInstrumentor
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class JsonLinesExporter(SpanExporter):
        """One compact JSON object per span (the SDK's own ``to_json``)."""

        def __init__(self, path: str) -> None:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in shutdown()

        def export(self, spans: Seq[ReadableSpan]) -> SpanExportResult:
            self._file.write("".join(span.to_json(indent=None) + "\n" for span in spans))
            self._file.flush()
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            self._file.close()

    provider = TracerProvider()  # shuts down (and flushes) at exit
    provider.add_span_processor(BatchSpanProcessor(JsonLinesExporter(spans_path)))
    trace.set_tracer_provider(provider)
    AsyncioInstrumentor().instrument(tracer_provider=provider)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# --- report --------------------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: Sequence[Measurement], configs: Sequence[str]) -> dict[str, dict[str, float]]:
    """Print per-round figures, medians and ratios to ``plain``; return the summary."""
    print(f"\n{'config':<17}{'round':>6}{'req/s':>10}{'p50 ms':>10}{'cpu ms/req':>12}{'app cpu':>9}{'errors':>8}"
          f"{'spans':>10}{'recorded':>10}{'load avg':>10}")
    for m in results:
        print(f"{m.config:<17}{m.round:>6}{m.throughput_rps:>10.1f}{m.p50_ms:>10.1f}"
              f"{m.app_cpu_ms_per_request:>12.2f}{m.app_cpu_share:>9.2f}{m.errors:>8}{m.spans_lines:>10}"
              f"{m.recorded_requests:>10}"
              f"{m.load_average:>10.2f}")
    summary: dict[str, dict[str, float]] = {}
    base = [m for m in results if m.config == "plain"]
    print(f"\n{'config':<17}{'median req/s':>14}{'ratio':>8}{'paired ratio':>14}{'median cpu ms/req':>19}{'ratio':>8}")
    for config in configs:
        mine = [m for m in results if m.config == config]
        rps = _median([m.throughput_rps for m in mine])
        cpu = _median([m.app_cpu_ms_per_request for m in mine])
        base_rps = _median([m.throughput_rps for m in base])
        base_cpu = _median([m.app_cpu_ms_per_request for m in base])
        # Paired: this config against plain in the same round, which cancels slow drifts of the machine.
        paired = _median([m.throughput_rps / b.throughput_rps for m in mine for b in base
                           if b.round == m.round and b.throughput_rps > 0])
        summary[config] = {"median_rps": rps, "ratio_to_plain": rps / base_rps if base_rps else float("nan"),
                           "paired_ratio_to_plain": paired, "median_cpu_ms_per_request": cpu,
                           "cpu_ratio_to_plain": cpu / base_cpu if base_cpu else float("nan")}
        s = summary[config]
        print(f"{config:<17}{rps:>14.1f}{s['ratio_to_plain']:>8.3f}{paired:>14.3f}{cpu:>19.2f}"
              f"{s['cpu_ratio_to_plain']:>8.3f}")
    share = _median([m.app_cpu_share for m in base])
    if share < 0.8:
        print(f"note: the plain app used only {share:.2f} of a core (machine load average "
              f"{_median([m.load_average for m in results]):.1f}): other processes limited its throughput, so the\n"
              f"  CPU-per-request ratios measure the instrumentation's cost better than the throughput ratios")
    for config in configs:
        if config != "plain":
            loss = 100 * (1 - summary[config]["ratio_to_plain"])
            print(f"{config}/plain throughput ratio: {summary[config]['ratio_to_plain']:.3f} "
                  f"({loss:.1f}% loss; paired {summary[config]['paired_ratio_to_plain']:.3f})")
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--run-under-otel-asyncio"]:
        run_under_otel_asyncio(argv[1], argv[2], argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per configuration and round")
    p.add_argument("--restart", action="store_true",
                   help="start each configuration's app afresh in every round (default: all stay up, loaded in "
                        "turn)")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds of load first")
    p.add_argument("--users", type=int, default=32, help="closed-loop users (enough to saturate the app)")
    p.add_argument("--pages", type=int, default=20, help="index pages requested at random (/?page=1..N)")
    p.add_argument("--backend", choices=("auto", "services", "embedded"), default="auto",
                   help="services: Redis, PostgreSQL and blob-service processes; embedded: the app's defaults")
    p.add_argument("--client", choices=("auto", "wrk", "aiohttp"), default="auto")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    p.add_argument("--app-arg", action="append", default=[], help="extra argument for the app (repeatable)")
    p.add_argument("--json", type=Path, help="also write all measurements and the summary here")
    p.add_argument("--baseline-collector", type=Path, metavar="DIR",
                   help=f"also measure the collector package in DIR as configuration {BASELINE!r}")
    p.add_argument("--sample", type=float, default=0.01,
                   help=f"the {SAMPLED!r} configuration's share of time recorded (default %(default)s)")
    p.add_argument("--sample-window", type=float, default=0.2,
                   help=f"the {SAMPLED!r} configuration's window length, seconds (default %(default)s)")
    args = p.parse_args(argv)
    global _sample
    _sample = (args.sample, args.sample_window)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.baseline_collector is not None:
        global _baseline_dir
        if not (args.baseline_collector / "collector" / "__main__.py").is_file():
            p.error(f"--baseline-collector: no collector/__main__.py in {args.baseline_collector}")
        _baseline_dir = str(args.baseline_collector.resolve())
        if BASELINE not in configs:
            configs.insert(configs.index("perfcast") if "perfcast" in configs else len(configs), BASELINE)
    for config in configs:
        if config not in (*CONFIGS, BASELINE) or (config == BASELINE and _baseline_dir is None):
            p.error(f"--configs: unknown configuration {config!r}; choose from {', '.join(CONFIGS)}")
    if "plain" not in configs:
        configs.insert(0, "plain")
    if "perfcast" in configs and find_spec("collector.__main__") is None:
        print("perfcast collector not runnable yet (no collector/__main__.py): skipping that configuration")
        configs.remove("perfcast")
    if args.client == "auto":
        args.client = "wrk" if shutil.which("wrk") else "aiohttp"

    app_args, deps, backend = _start_dependencies(args.backend)
    app_args = ["--port", "0", *app_args, *args.app_arg]
    print(f"machine: {psutil.cpu_count()} logical CPUs ({platform.processor() or platform.machine()}), "
          f"load average {os.getloadavg()[0]:.2f}; Python {platform.python_version()}; nothing pinned:\n"
          f"  the app, its dependencies and the load client share these CPUs")
    print(f"backend: {backend}\nclient: {args.client}, {args.users} closed-loop users, {args.duration:g} s "
          f"measured after {args.warmup:g} s warm-up, pages 1..{args.pages}\n"
          f"configs: {', '.join(configs)}, {'restarted' if args.restart else 'all up, loaded in turn'}, "
          f"{args.rounds} rounds")
    results: list[Measurement] = []
    try:
        with tempfile.TemporaryDirectory(prefix="perfcast-overhead-") as tmp:
            if not args.restart:
                results = measure_sliced(configs, app_args, args, Path(tmp))
            for rnd in range(1, args.rounds + 1 if args.restart else 1):
                for config in configs:
                    m = measure(config, rnd, app_args, args, Path(tmp))
                    results.append(m)
                    _print_measurement(m)
    finally:
        for dep in deps:
            dep.stop()
    summary = report(results, configs)
    if args.json:
        args.json.write_text(json.dumps({"measurements": [asdict(m) for m in results], "summary": summary,
                                         "backend": backend, "client": args.client, "users": args.users,
                                         "duration_s": args.duration, "rounds": args.rounds}, indent=2))


if __name__ == "__main__":
    main()
