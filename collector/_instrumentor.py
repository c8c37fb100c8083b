"""``AsyncioCausalityInstrumentor``: installs and removes all of the collector's hooks."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from collector import _idle, _io, _sync, _tasks


class AsyncioCausalityInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Task steps and spawns, sync points, I/O and blocking calls (``tracer_provider`` is required)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return []

    def _instrument(self, **kwargs: Any) -> None:
        # hooked=False: the per-step and transport hooks are prepared but left out until a sampling window
        hooked = kwargs.get("hooked", True)
        _tasks.install(hooked)
        _sync.install()
        _io.install(kwargs["tracer_provider"], hooked)
        _idle.install(hooked)

    def _uninstrument(self, **kwargs: Any) -> None:
        _tasks.uninstall()
        _sync.uninstall()
        _io.uninstall()
        _idle.uninstall()
