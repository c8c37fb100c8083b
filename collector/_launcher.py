"""Run a program with the collector installed before its code runs; pass its exit code and signals through."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import collector
from collector import environment
from collector._pipe import SpanPipe

BOOTSTRAP = Path(__file__).with_name("_bootstrap")


def child_environment(
    output: str | None,
    base: Mapping[str, str] | None = None,
    *,
    max_queue: int | None = None,
    chunk_steps: int | None = None,
    resource_names: str | None = None,
    service_name: str | None = None,
    sample: float | None = None,
    sample_window_s: float | None = None,
) -> dict[str, str]:
    """The environment of the instrumented program: ``sitecustomize`` first on PYTHONPATH, settings in
    ``PERFCAST_*`` variables, and perfcast's own directory on the path so that ``collector`` imports."""
    env = dict(os.environ if base is None else base)
    package_root = str(Path(collector.__file__).resolve().parent.parent)
    paths = [str(BOOTSTRAP), package_root] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[environment.OUTPUT] = os.path.abspath(output) if output else ""
    for name, value in (
        (environment.MAX_QUEUE, max_queue),
        (environment.CHUNK_STEPS, chunk_steps),
        (environment.RESOURCE_NAMES, resource_names),
        (environment.SERVICE_NAME, service_name),
        (environment.SAMPLE, sample),
        (environment.SAMPLE_WINDOW, sample_window_s),
    ):
        if value is not None:
            env[name] = str(value)
    return env


def run(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``command``, forwarding SIGINT and SIGTERM to it; return its exit code (128+N for signal N).

    When ``env`` names an output file, the child sends its spans down a pipe; this process spools them and
    writes the file once the child has exited (``collector._pipe``), so that encoding them costs the app nothing.
    """
    if not command:
        raise collector.CollectorError(
            "no program to run: give it after '--', e.g. perfcast collect -- python app.py"
        )
    env = dict(env)
    output = env.get(environment.OUTPUT)
    pipe = None
    pass_fds: tuple[int, ...] = ()
    if output:
        try:
            open(
                output, "a"
            ).close()  # fail early, in the launcher, on an unwritable path
        except OSError as exc:
            raise collector.CollectorError(
                f"cannot write spans to {output}: {exc.strerror}"
            ) from None
        pipe = SpanPipe(output)
        pass_fds = pipe.child_env(env)
    try:
        process = subprocess.Popen(list(command), env=env, pass_fds=pass_fds)
    except OSError as exc:
        raise collector.CollectorError(
            f"cannot run {command[0]!r}: {exc.strerror}"
        ) from None
    finally:
        if pipe is not None:
            pipe.started()  # the child holds the write end now: EOF when it exits

    def forward(signum: int, _frame: object) -> None:
        process.send_signal(signum)

    previous = {
        sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        code = process.wait()
        if pipe is not None:
            pipe.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m collector [-o spans.jsonl] -- program args...``"""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m collector", description="Run a program with causal tracing."
    )
    parser.add_argument(
        "-o",
        "--output",
        default="spans.jsonl",
        help="OTLP JSON-lines file (default spans.jsonl)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=None, help="export queue capacity, in spans"
    )
    parser.add_argument(
        "--sample", type=float, default=None,
        help="share of time requests are recorded, in random windows (0 < S <= 1; default 1: all)",
    )
    parser.add_argument(
        "--sample-window", type=float, default=None, help="length of a sampling window, seconds (default 0.5)"
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- program and its arguments"
    )
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        env = child_environment(args.output, max_queue=args.max_queue, sample=args.sample,
                                sample_window_s=args.sample_window)
        return run(command, env)
    except collector.CollectorError as exc:
        print(f"CollectorError: {exc}", file=sys.stderr)
        return 1
