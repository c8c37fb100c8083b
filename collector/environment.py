"""The ``PERFCAST_*`` environment variables, their defaults, and the settings object read from them.

The launcher (``perfcast collect``) passes its options to the instrumented program through these variables;
``sitecustomize`` reads them once, in ``instrument()``, never on each call.

======================== ============================ =====================================================
variable                 default                      meaning
======================== ============================ =====================================================
PERFCAST_OUTPUT          ``spans.jsonl``              OTLP JSON-lines file; empty: no file
PERFCAST_MAX_QUEUE       ``65536``                    bounded export queue, in spans (full: spans dropped)
PERFCAST_CHUNK_STEPS     ``512``                      task steps per ``task`` chunk span
PERFCAST_RESOURCE_NAMES  (none)                       ``name=url,name=url``: names for I/O resources
PERFCAST_SERVICE_NAME    the program's name           ``service.name`` of the OTel resource
PERFCAST_QUIET           ``0``                        ``1``: no exit summary line on stderr
PERFCAST_CPU_TIME        ``1``                        ``0``: no per-step CPU time (saves 2 syscalls a step)
PERFCAST_SAMPLE          ``1``                        share of time requests are recorded (windows), (0, 1]
PERFCAST_SAMPLE_WINDOW   ``0.5``                      length of a sampling window, seconds
======================== ============================ =====================================================

The standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` turn on OTLP/HTTP export.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

OUTPUT: str = "PERFCAST_OUTPUT"
MAX_QUEUE: str = "PERFCAST_MAX_QUEUE"
CHUNK_STEPS: str = "PERFCAST_CHUNK_STEPS"
RESOURCE_NAMES: str = "PERFCAST_RESOURCE_NAMES"
SERVICE_NAME: str = "PERFCAST_SERVICE_NAME"
QUIET: str = "PERFCAST_QUIET"
CPU_TIME: str = "PERFCAST_CPU_TIME"
SAMPLE: str = "PERFCAST_SAMPLE"
SAMPLE_WINDOW: str = "PERFCAST_SAMPLE_WINDOW"
T = TypeVar("T")

SPAN_FD: str = "PERFCAST_SPAN_FD"
"""Set by the launcher: a pipe to send spans to it (it writes the file); removed for grandchildren."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Collector settings, fixed at ``instrument()`` time."""

    output: str | None = "spans.jsonl"
    """OTLP JSON-lines file, or None for no file."""
    max_queue: int = 65536
    """Capacity of the export queue, in spans."""
    chunk_steps: int = 512
    """Steps per ``task`` chunk span."""
    resource_names: Mapping[str, str] = field(default_factory=dict)
    """Resource URL -> name given to it (``perfcast.io.resource_name``)."""
    service_name: str | None = None
    """``service.name`` of the OTel resource; None: OTel's default."""
    quiet: bool = False
    """No exit summary line."""
    cpu_time: bool = True
    """Measure each step's CPU time (``perfcast.steps.cpu_ns``); off, the array is left out."""
    otlp_http: bool = False
    """Also export over OTLP/HTTP (the standard OTEL_EXPORTER_OTLP_* variables configure it)."""
    span_fd: int | None = None
    """Send spans down this pipe to the launcher instead of writing ``output`` here."""
    sample: float = 1.0
    """Long-run share of time during which new requests are recorded (``collector._sampling``); 1: all."""
    sample_window_s: float = 0.5
    """Length of a sampling window, seconds (with ``sample`` below 1)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.sample <= 1.0:
            raise ValueError(f"sample must be in (0, 1], got {self.sample}")
        if not self.sample_window_s > 0:
            raise ValueError(f"sample window must be > 0 seconds, got {self.sample_window_s}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if self.chunk_steps < 1:
            raise ValueError(f"chunk_steps must be >= 1, got {self.chunk_steps}")


def _number(env: Mapping[str, str], name: str, default: T, kind: Callable[[str], T], what: str) -> T:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected {what}, got {raw!r}") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return _number(env, name, default, int, "an integer")


def _in_range(env: Mapping[str, str], name: str, default: float, ok: Callable[[float], bool], what: str) -> float:
    """A number variable that must also pass ``ok``; the error names the variable either way."""
    value = _number(env, name, default, float, what)
    if not ok(value):
        raise ValueError(f"environment variable {name}: expected {what}, got {env.get(name, '').strip()!r}")
    return value


def parse_resource_names(raw: str) -> dict[str, str]:
    """Parse ``name=url,name=url`` into ``{url: name}``.

    >>> parse_resource_names("cache=redis://127.0.0.1:6379/0")
    {'redis://127.0.0.1:6379/0': 'cache'}
    """
    names: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"{RESOURCE_NAMES}: expected name=url, got {item!r}")
        names[url] = name
    return names


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Read the ``PERFCAST_*`` variables (``os.environ`` by default) into a ``Settings``."""
    env = os.environ if env is None else env
    return Settings(
        output=env.get(OUTPUT, "spans.jsonl") or None,
        max_queue=_int(env, MAX_QUEUE, 65536),
        chunk_steps=_int(env, CHUNK_STEPS, 512),
        resource_names=parse_resource_names(env.get(RESOURCE_NAMES, "")),
        service_name=env.get(SERVICE_NAME) or None,
        quiet=env.get(QUIET, "0") not in ("", "0"),
        cpu_time=env.get(CPU_TIME, "1") not in ("", "0"),
        otlp_http=bool(
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        ),
        span_fd=_int(env, SPAN_FD, -1) if env.get(SPAN_FD) else None,
        sample=_in_range(env, SAMPLE, 1.0, lambda x: 0.0 < x <= 1.0, "a share in (0, 1]"),
        sample_window_s=_in_range(env, SAMPLE_WINDOW, 0.5, lambda x: x > 0.0, "seconds > 0"),
    )
