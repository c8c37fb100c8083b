import asyncio

import pytest

from collector import attributes as A


async def work(delay: float) -> float:
    await asyncio.sleep(delay)
    return delay


@pytest.mark.parametrize(
    ("return_when", "wait", "k", "done_count"),
    [(asyncio.ALL_COMPLETED, "all", 2, 2), (asyncio.FIRST_COMPLETED, "any", 1, 1)],
)
async def test_wait_semantics(collected, return_when, wait, k, done_count):
    with collected.tracer.start_as_current_span("request"):
        fast, slow = asyncio.create_task(work(0.005)), asyncio.create_task(work(0.05))
        _done, pending = await asyncio.wait([fast, slow], return_when=return_when)
        for p in pending:
            p.cancel()
    (sync,) = collected.sync("wait")
    a = sync.attributes
    assert (a[A.SYNC_WAIT], a[A.SYNC_K], len(a[A.SYNC_DONE])) == (wait, k, done_count)
    assert len(a[A.SYNC_CHILDREN]) == 2 and a[A.SYNC_DONE][0] == a[A.SYNC_CHILDREN][0]
    assert a[A.SYNC_TIMED_OUT] is False


async def test_wait_first_exception_becomes_any_when_a_child_raises(collected):
    async def boom() -> None:
        await asyncio.sleep(0.001)
        raise KeyError("x")

    with collected.tracer.start_as_current_span("request"):
        bad, slow = asyncio.create_task(boom()), asyncio.create_task(work(0.05))
        done, _pending = await asyncio.wait(
            [bad, slow], return_when=asyncio.FIRST_EXCEPTION
        )
        assert done == {bad}
        slow.cancel()
        bad.exception()
    (sync,) = collected.sync("wait")
    assert (sync.attributes[A.SYNC_WAIT], sync.attributes[A.SYNC_K]) == ("any", 1)


async def test_wait_timeout_is_recorded(collected):
    with collected.tracer.start_as_current_span("request"):
        slow = asyncio.create_task(work(0.2))
        await asyncio.wait([slow], timeout=0.01)
        slow.cancel()
    (sync,) = collected.sync("wait")
    assert sync.attributes[A.SYNC_TIMEOUT_NS] == 10_000_000
    assert sync.attributes[A.SYNC_TIMED_OUT] is True
    assert list(sync.attributes[A.SYNC_DONE]) == []
