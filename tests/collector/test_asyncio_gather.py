import asyncio

from collector import _tasks
from collector import attributes as A


async def work(delay: float) -> float:
    await asyncio.sleep(delay)
    return delay


async def test_gather_joins_all_children_in_argument_order(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        result = await asyncio.gather(work(0.02), work(0.01))
    assert result == [0.02, 0.01]
    (sync,) = collected.sync("gather")
    a = sync.attributes
    assert a[A.SYNC_WAIT] == "all" and a[A.SYNC_K] == 2
    children = list(a[A.SYNC_CHILDREN])
    assert sorted(a[A.SYNC_DONE]) == sorted(children)
    first, second = (collected.task(c) for c in children)
    assert first[A.STEPS_AWAITS] == ["sleep:20000000", "done"]
    assert second[A.STEPS_AWAITS] == ["sleep:10000000", "done"]
    assert first[A.TASK_PARENT_ID] == me and first[A.TASK_SPAWN_STEP] == a[A.TASK_STEP]
    parent = collected.task(me)
    step = a[A.TASK_STEP]
    assert (
        parent[A.STEPS_AWAITS][step - parent[A.STEPS_FIRST]] == f"sync:{a[A.SYNC_ID]}"
    )
    assert a[A.SYNC_RESUME_STEP] == step + 1


async def test_gather_with_an_exception_still_reports_the_children(collected):
    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    with collected.tracer.start_as_current_span("request"):
        out = await asyncio.gather(boom(), work(0.001), return_exceptions=True)
    assert isinstance(out[0], ValueError)
    (sync,) = collected.sync("gather")
    outcomes = [
        collected.task(c)[A.TASK_OUTCOME] for c in sync.attributes[A.SYNC_CHILDREN]
    ]
    assert outcomes == ["error", "ok"]
