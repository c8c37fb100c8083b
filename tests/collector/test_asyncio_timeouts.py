import asyncio

import pytest

from collector import _tasks
from collector import attributes as A


async def work(delay: float) -> float:
    await asyncio.sleep(delay)
    return delay


async def test_wait_for_in_time(collected):
    with collected.tracer.start_as_current_span("request"):
        assert await asyncio.wait_for(work(0.001), 1.0) == 0.001
    (sync,) = collected.sync("wait_for")
    a = sync.attributes
    assert (a[A.SYNC_WAIT], a[A.SYNC_K], a[A.SYNC_TIMEOUT_NS], a[A.SYNC_TIMED_OUT]) == (
        "any",
        1,
        10**9,
        False,
    )
    (child,) = a[A.SYNC_CHILDREN]
    assert collected.task(child)[A.TASK_OUTCOME] == "ok"


async def test_wait_for_timing_out(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(work(1.0), 0.01)
    (sync,) = collected.sync("wait_for")
    a = sync.attributes
    assert a[A.SYNC_TIMED_OUT] is True
    (child,) = a[A.SYNC_CHILDREN]
    assert collected.task(child)[A.TASK_OUTCOME] == "cancelled"
    parent = collected.task(me)
    resumed = a[A.SYNC_RESUME_STEP] - parent[A.STEPS_FIRST]
    assert parent[A.STEPS_AWAITS][resumed - 1] == f"sync:{a[A.SYNC_ID]}"


@pytest.mark.parametrize(("delay", "timed_out"), [(0.001, False), (1.0, True)])
async def test_timeout_context_manager(collected, delay, timed_out):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        try:
            async with asyncio.timeout(0.02):
                await work(delay)
        except TimeoutError:
            assert timed_out
    (sync,) = collected.sync("timeout")
    a = sync.attributes
    assert (a[A.SYNC_WAIT], a[A.SYNC_TIMED_OUT], list(a[A.SYNC_CHILDREN])) == (
        "any",
        timed_out,
        [],
    )
    assert 0 < a[A.SYNC_TIMEOUT_NS] <= 20_000_000
    parent = collected.task(me)
    body = a[A.SYNC_BODY_FIRST_STEP] - parent[A.STEPS_FIRST]
    assert (
        parent[A.STEPS_AWAITS][body] == f"sleep:{int(delay * 1e9)}"
    )  # the inline body sleeps in the task
    assert a[A.SYNC_RESUME_STEP] == a[A.SYNC_BODY_FIRST_STEP] + 1


async def test_shield(collected):
    with collected.tracer.start_as_current_span("request"):
        assert await asyncio.shield(work(0.001)) == 0.001
    (sync,) = collected.sync("shield")
    a = sync.attributes
    assert (a[A.SYNC_WAIT], a[A.SYNC_K]) == ("all", 1)
    assert (
        list(a[A.SYNC_DONE]) == list(a[A.SYNC_CHILDREN]) and a[A.SYNC_CHILDREN][0] > 0
    )


async def test_sync_points_end_no_later_than_their_resume_step(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        await asyncio.wait_for(work(0.002), 1.0)
        await asyncio.gather(work(0.001), work(0.002))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(work(0.001))
        await asyncio.sleep(0)
    parent = collected.task(me)
    for sync in collected.of_kind("sync"):
        resume = sync.attributes[A.SYNC_RESUME_STEP] - parent[A.STEPS_FIRST]
        assert sync.end_time <= parent[A.STEPS_START_NS][resume], sync.name
        assert sync.start_time <= sync.end_time


async def test_timeout_without_a_deadline_is_not_written(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        async with asyncio.timeout(None):
            await work(0.001)
    assert collected.sync("timeout") == []
    assert collected.task(me)[A.STEPS_AWAITS][:1] == ["sleep:1000000"]


async def test_timeout_given_a_deadline_inside_is_written(collected):
    with collected.tracer.start_as_current_span("request"):
        async with asyncio.timeout(None) as scope:
            scope.reschedule(asyncio.get_running_loop().time() + 1.0)
            await work(0.001)
    (sync,) = collected.sync("timeout")
    assert sync.attributes[A.SYNC_TIMED_OUT] is False
