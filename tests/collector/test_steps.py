import asyncio
import time

from collector import _tasks
from collector import attributes as A


def busy(ms: float) -> None:
    """Burn ``ms`` of this thread's CPU time (not wall time, which depends on the machine's load)."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        pass


async def test_compute_steps_have_wall_at_least_cpu(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        busy(5)
        await asyncio.sleep(0.002)
        busy(5)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    steps = collected.task(me)
    walls, cpus = steps[A.STEPS_WALL_NS], steps[A.STEPS_CPU_NS]
    assert all(w >= c >= 0 for w, c in zip(walls, cpus))
    assert (
        cpus[0] >= 5_000_000 and cpus[1] >= 5_000_000
    )  # each busy step burnt 5 ms of CPU
    assert cpus[2] < cpus[0]  # the step after sleep(0) has no busy loop
    assert steps[A.STEPS_AWAITS][:3] == ["sleep:2000000", "sleep:0", "sleep:0"]
    starts = steps[A.STEPS_START_NS]
    assert starts == sorted(starts) and starts[1] >= starts[0] + walls[0]


async def test_a_step_off_the_cpu_is_measured_by_the_cpu_clock(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        await asyncio.sleep(0)
        # the loop thread sleeps: 30 ms of wall time, almost no CPU time
        time.sleep(0.03)  # noqa: ASYNC251 - on purpose
        await asyncio.sleep(0)
    steps = collected.task(me)
    walls, cpus = steps[A.STEPS_WALL_NS], steps[A.STEPS_CPU_NS]
    assert walls[1] >= 30_000_000 and cpus[1] < walls[1] - 20_000_000


async def test_short_steps_count_their_wall_time_as_cpu(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        for _ in range(50):
            await asyncio.sleep(0)
    steps = collected.task(me)
    short = [
        (w, c)
        for w, c in zip(steps[A.STEPS_WALL_NS], steps[A.STEPS_CPU_NS], strict=True)
        if w < _tasks._SHORT_STEP_NS
    ]
    assert short and all(c == w for w, c in short)


async def test_untraced_steps_are_not_recorded(collected):
    await asyncio.sleep(0)
    collected.stop()
    assert collected.summary.untraced_steps >= 1
    assert collected.of_kind("task") == []


def test_chunks_cut_at_the_size_limit():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    import collector

    exporter = InMemorySpanExporter()
    provider = collector.instrument(
        output=None, exporter=exporter, quiet=True, chunk_steps=4
    )

    async def main() -> int:
        with provider.get_tracer("t").start_as_current_span("request"):
            me = _tasks.current().id
            for _ in range(10):
                await asyncio.sleep(0)
        return me

    try:
        me = asyncio.run(main())
    finally:
        collector.uninstrument()
    chunks = [
        s
        for s in exporter.get_finished_spans()
        if s.attributes.get(A.KIND) == "task" and s.attributes[A.TASK_ID] == me
    ]
    firsts = sorted(c.attributes[A.STEPS_FIRST] for c in chunks)
    assert firsts == [0, 4, 8]
    assert [
        c.attributes[A.TASK_OUTCOME]
        for c in sorted(chunks, key=lambda c: c.attributes[A.STEPS_FIRST])
    ] == ["running", "running", "ok"]


async def test_direct_await_of_a_task(collected):
    async def child() -> int:
        await asyncio.sleep(0.001)
        return 7

    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        t = asyncio.create_task(child())
        child_id = _tasks.task_id(t)
        assert await t == 7
    assert f"task:{child_id}" in collected.task(me)[A.STEPS_AWAITS]


async def test_a_request_handled_in_one_step_is_recorded(collected):
    async def handler() -> int:
        with collected.tracer.start_as_current_span("request"):
            return 1  # the span opens and closes inside the task's only step

    task = asyncio.create_task(handler())
    child = _tasks.task_id(task)
    assert await task == 1
    steps = collected.task(child)
    assert steps[A.STEPS_AWAITS] == ["done"]
    (request,) = [s for s in collected.stop() if s.name == "request"]
    (chunk,) = [
        s for s in collected.of_kind("task") if s.attributes[A.TASK_ID] == child
    ]
    assert chunk.parent.span_id == request.context.span_id


def test_cpu_clock_can_be_turned_off():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    import collector

    exporter = InMemorySpanExporter()
    provider = collector.instrument(
        output=None, exporter=exporter, quiet=True, cpu_time=False
    )

    async def main() -> None:
        with provider.get_tracer("t").start_as_current_span("request"):
            await asyncio.sleep(0)

    try:
        asyncio.run(main())
    finally:
        collector.uninstrument()
    chunks = [
        s for s in exporter.get_finished_spans() if s.attributes.get(A.KIND) == "task"
    ]
    assert chunks and all(A.STEPS_CPU_NS not in c.attributes for c in chunks)
    assert all(
        len(c.attributes[A.STEPS_WALL_NS]) == len(c.attributes[A.STEPS_AWAITS])
        for c in chunks
    )


def test_event_loops_on_two_threads_keep_their_own_tasks():
    import sys
    import threading

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    import collector

    exporter = InMemorySpanExporter()
    provider = collector.instrument(output=None, exporter=exporter, quiet=True)
    tracer = provider.get_tracer("t")

    async def app(name: str) -> None:
        async def child(i: int) -> None:
            with tracer.start_as_current_span(f"{name}-work-{i}"):
                busy(1)  # long enough for the other thread to take the GIL mid-step
                await asyncio.sleep(0)

        for i in range(10):
            with tracer.start_as_current_span(f"{name}-request"):
                await asyncio.gather(child(i), child(i + 100))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        other = threading.Thread(target=asyncio.run, args=(app("b"),))
        other.start()
        asyncio.run(app("a"))
        other.join()
    finally:
        sys.setswitchinterval(interval)
        collector.uninstrument()
    spans = exporter.get_finished_spans()
    trace_of_task = {
        s.attributes[A.TASK_ID]: s.context.trace_id
        for s in spans
        if s.attributes.get(A.KIND) == "task"
    }
    work = [s for s in spans if "-work-" in s.name]
    assert len(work) == 40
    assert all(
        trace_of_task[s.attributes[A.TASK_ID]] == s.context.trace_id for s in work
    )
