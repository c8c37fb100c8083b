"""The app behaves exactly as without the collector: results, exceptions, cancellation, contextvars, names."""

import asyncio
import contextvars

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import collector
from collector import _tasks

request_id: contextvars.ContextVar[str] = contextvars.ContextVar(
    "request_id", default="-"
)


async def scenario() -> list[object]:
    seen: list[object] = []
    base = int(asyncio.current_task().get_name().removeprefix("Task-"))

    def name() -> object:
        # default names count tasks process-wide: compare them relative to this task's, so that an extra
        # task made by the collector would show up
        own = asyncio.current_task().get_name()
        return int(own.removeprefix("Task-")) - base if own.startswith("Task-") else own

    async def child(i: int) -> int:
        await asyncio.sleep(0.001 * i)
        seen.append((i, request_id.get(), name()))
        return i * i

    async def fail() -> None:
        await asyncio.sleep(0)
        raise KeyError("missing")

    async def forever() -> None:
        await asyncio.sleep(10)

    request_id.set("r1")
    seen.append(await asyncio.gather(child(1), child(2)))
    seen.append(
        [
            repr(r)
            for r in await asyncio.gather(fail(), child(1), return_exceptions=True)
        ]
    )
    try:
        await asyncio.gather(fail(), asyncio.sleep(0.003))
    except KeyError as exc:
        seen.append(("raised", type(exc).__name__, exc.args))
    t = asyncio.create_task(forever(), name="sleeper")
    await asyncio.sleep(0)
    t.cancel("stop")
    try:
        await t
    except asyncio.CancelledError as exc:
        seen.append(
            (
                "cancelled",
                exc.args,
                t.get_name(),
                t.cancelled(),
                t.get_coro().__qualname__,
            )
        )
    try:
        await asyncio.wait_for(forever(), 0.001)
    except TimeoutError as exc:
        seen.append(("timeout", type(exc).__name__))
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fail())
            tg.create_task(child(1))
    except* KeyError as group:
        seen.append(("group", [type(e).__name__ for e in group.exceptions]))
    seen.append(await asyncio.shield(child(2)))
    pair = [
        asyncio.create_task(child(2)),
        asyncio.create_task(child(1)),
    ]  # (coroutines: set order)
    seen.append([await f for f in asyncio.as_completed(pair)])
    seen.append(request_id.get())
    return seen


def traced_run() -> list[object]:
    async def main() -> list[object]:
        with collector._runtime.tracer.start_as_current_span("request"):
            return await scenario()

    return asyncio.run(main())


def test_same_behaviour_with_and_without_the_collector():
    without = asyncio.run(scenario())
    collector.instrument(output=None, exporter=InMemorySpanExporter(), quiet=True)
    try:
        with_collector = traced_run()
    finally:
        summary = collector.uninstrument()
    assert with_collector == without
    assert summary.internal_errors == 0


def test_internal_error_is_counted_not_raised(monkeypatch):
    def broken(rec, waiter):
        raise RuntimeError("collector bug")

    monkeypatch.setattr(_tasks, "_awaited", broken)
    collector.instrument(output=None, exporter=InMemorySpanExporter(), quiet=True)
    try:
        result = traced_run()
    finally:
        summary = collector.uninstrument()
    assert result == asyncio.run(scenario())
    assert summary.internal_errors > 0


def test_instrument_twice_is_an_error():
    collector.instrument(output=None, quiet=True)
    try:
        with pytest.raises(collector.CollectorError, match="already"):
            collector.instrument(output=None, quiet=True)
    finally:
        collector.uninstrument()


def _patch_points() -> tuple[object, ...]:
    """Everything the collector patches, as asyncio, time and socket hold it now."""
    import asyncio.base_events
    import asyncio.events
    import socket
    import time

    return (
        asyncio.gather,
        asyncio.wait,
        asyncio.wait_for,
        asyncio.shield,
        asyncio.events.Handle._run,
        asyncio.base_events.BaseEventLoop.__dict__["create_task"],
        asyncio.base_events.BaseEventLoop.__dict__["call_later"],
        asyncio.base_events.BaseEventLoop.__dict__["create_connection"],
        asyncio.TaskGroup.__dict__["__aexit__"],
        asyncio.Timeout.__dict__["__aenter__"],
        time.sleep,
        socket.socket.recv,
    )


def test_uninstrument_restores_asyncio():
    before = _patch_points()
    collector.instrument(output=None, quiet=True)
    assert asyncio.gather is not before[0]
    collector.uninstrument()
    after = _patch_points()
    assert all(a is b for a, b in zip(before, after, strict=True))
