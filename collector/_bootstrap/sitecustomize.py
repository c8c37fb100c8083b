"""Loaded by the interpreter of a program started by ``perfcast collect``: instruments it before its code runs.

This directory is first on PYTHONPATH only for the program itself: it removes itself from PYTHONPATH so that
the program's own subprocesses run uninstrumented (as OpenTelemetry's auto-instrumentation does), and then
loads any ``sitecustomize`` that it shadowed.
"""

import importlib.util
import os
import sys


def _remove_self_from_pythonpath() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in parts if os.path.abspath(p) != here]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("PYTHONPATH", None)
    return here


def _load_shadowed_sitecustomize(here: str) -> None:
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location(
                "_perfcast_shadowed_sitecustomize", candidate
            )
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


def _start() -> None:
    here = _remove_self_from_pythonpath()
    _load_shadowed_sitecustomize(here)
    try:
        import collector
        from collector.environment import SPAN_FD, settings_from_env

        settings = settings_from_env()
        os.environ.pop(SPAN_FD, None)  # the pipe is this process's, not its children's
        if settings.span_fd is not None:
            os.set_inheritable(settings.span_fd, False)
        collector.instrument(settings=settings)
    except Exception as exc:  # noqa: BLE001 - the program must run even when the collector cannot
        print(
            f"perfcast: collector not installed: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )


_start()
