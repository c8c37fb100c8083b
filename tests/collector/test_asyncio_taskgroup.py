import asyncio

from collector import _tasks
from collector import attributes as A


async def work(delay: float) -> float:
    await asyncio.sleep(delay)
    return delay


async def test_taskgroup_joins_children_and_body(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        async with asyncio.TaskGroup() as tg:
            a_task = tg.create_task(work(0.01))
            b_task = tg.create_task(work(0.002))
            await asyncio.sleep(0.001)  # inline body
    assert (a_task.result(), b_task.result()) == (0.01, 0.002)
    (sync,) = collected.sync("taskgroup")
    a = sync.attributes
    assert (a[A.SYNC_WAIT], a[A.SYNC_K]) == ("all", 2)
    assert sorted(a[A.SYNC_DONE]) == sorted(a[A.SYNC_CHILDREN])
    children = [collected.task(c) for c in a[A.SYNC_CHILDREN]]
    assert [c[A.TASK_PARENT_ID] for c in children] == [me, me]
    parent = collected.task(me)
    body = a[A.SYNC_BODY_FIRST_STEP] - parent[A.STEPS_FIRST]
    assert parent[A.STEPS_AWAITS][body] == "sleep:1000000"
    assert parent[A.STEPS_AWAITS][body + 1] == f"sync:{a[A.SYNC_ID]}"
    assert a[A.SYNC_RESUME_STEP] == a[A.SYNC_BODY_FIRST_STEP] + 2


async def test_as_completed_ranks(collected):
    with collected.tracer.start_as_current_span("request"):
        results = [await f for f in asyncio.as_completed([work(0.02), work(0.001)])]
    assert results == [0.001, 0.02]
    syncs = sorted(collected.sync("as_completed"), key=lambda s: s.attributes[A.SYNC_K])
    assert [s.attributes[A.SYNC_K] for s in syncs] == [1, 2]
    assert all(s.attributes[A.SYNC_WAIT] == "any" for s in syncs)
    slow, fast = syncs[0].attributes[A.SYNC_CHILDREN]
    assert list(syncs[0].attributes[A.SYNC_DONE]) == [fast]
    assert sorted(syncs[1].attributes[A.SYNC_DONE]) == sorted([slow, fast])


async def test_fire_and_forget_task_keeps_its_parent(collected):
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        step = _tasks.current().n
        background = asyncio.create_task(work(0.005))
    await background
    spans = collected.stop()
    child = collected.task(_tasks_id_of(spans, "work"))
    assert (child[A.TASK_PARENT_ID], child[A.TASK_SPAWN_STEP]) == (me, step)
    assert child[A.STEPS_AWAITS][-1] == "done"


def _tasks_id_of(spans, coro):
    (span,) = [s for s in spans if s.attributes.get(A.TASK_CORO) == coro]
    return span.attributes[A.TASK_ID]
