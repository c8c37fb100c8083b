import asyncio
import os
import time

import aiosqlite
import asyncpg
import redis.asyncio as aioredis
from aiohttp import ClientSession, web

from collector import attributes as A


def io_spans(collected, system):
    return [s for s in collected.of_kind("io") if s.attributes[A.IO_SYSTEM] == system]


async def serve(path, handler):
    """A real aiohttp server on a free port with one GET route: (runner, port)."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_redis_commands_and_pipeline(collected, redis_url):
    client = aioredis.from_url(redis_url)
    with collected.tracer.start_as_current_span("request"):
        await client.ping()  # opens the connection
        for i in range(10):
            await client.get(f"perfcast:test:{i}")
        async with client.pipeline(transaction=False) as pipe:
            for i in range(10):
                pipe.get(f"perfcast:test:{i}")
            await pipe.execute()
    await client.aclose()
    spans = io_spans(collected, "redis")
    gets = [s for s in spans if s.attributes[A.IO_OPERATION] == "GET"]
    assert len(gets) == 10 and all(s.attributes[A.IO_ROUND_TRIPS] == 1 for s in gets)
    assert all(
        s.attributes[A.IO_REQUEST_BYTES] > 0 and s.attributes[A.IO_RESPONSE_BYTES] > 0
        for s in gets
    )
    (pipeline,) = [
        s for s in spans if s.attributes[A.IO_OPERATION].startswith("PIPELINE")
    ]
    assert pipeline.attributes[A.IO_ROUND_TRIPS] == 1
    assert pipeline.attributes[A.IO_RESOURCE] == "redis://127.0.0.1:6379/0"
    assert all(A.TASK_ID in s.attributes for s in spans)


async def test_postgres_first_execution_takes_two_round_trips(collected, postgres_url):
    conn = await asyncpg.connect(postgres_url, statement_cache_size=0)
    with collected.tracer.start_as_current_span("request"):
        await conn.fetch("SELECT 1 AS x FROM pg_class LIMIT 1")
    await conn.close()
    (span,) = [
        s
        for s in io_spans(collected, "postgresql")
        if s.attributes[A.IO_OPERATION] == "SELECT pg_class"
    ]
    assert span.attributes[A.IO_ROUND_TRIPS] >= 2
    assert span.attributes[A.IO_RESOURCE] == "postgresql://127.0.0.1:5432/test"


async def test_http_client_against_a_real_server(collected):
    async def blob(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 1000)

    runner, port = await serve("/blob/{id}", blob)
    try:
        async with ClientSession() as session:
            with collected.tracer.start_as_current_span("request"):
                async with session.get(f"http://127.0.0.1:{port}/blob/42") as resp:
                    await resp.read()
    finally:
        await runner.cleanup()
    (span,) = io_spans(collected, "http")
    a = span.attributes
    assert a[A.IO_OPERATION] == "GET /blob/{id}"
    assert a[A.IO_RESOURCE] == f"http://127.0.0.1:{port}"
    assert a[A.IO_ROUND_TRIPS] == 2  # a new TCP connection + the request
    requests = collected.of_kind("request")
    assert [r.attributes[A.ROUTE] for r in requests] == ["GET /blob/{id}"]


async def test_aiosqlite(collected, tmp_path):
    path = tmp_path / "t.db"
    async with aiosqlite.connect(path) as db:
        await db.execute("CREATE TABLE posts (id INTEGER)")
        with collected.tracer.start_as_current_span("request"):
            async with db.execute("SELECT id FROM posts WHERE id = ?", (1,)) as cursor:
                await cursor.fetchall()
    spans = io_spans(collected, "sqlite")
    ops = [s.attributes[A.IO_OPERATION] for s in spans]
    assert "SELECT posts" in ops
    assert all(
        s.attributes[A.IO_RESOURCE] == f"sqlite:///{os.path.abspath(path)}"
        for s in spans
    )
    assert all(s.attributes[A.IO_ROUND_TRIPS] == 0 for s in spans)


async def test_io_awaits_are_tagged(collected, redis_url):
    from collector import _tasks

    client = aioredis.from_url(redis_url)
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        await client.get("perfcast:test:x")
    await client.aclose()
    assert "io" in collected.task(me)[A.STEPS_AWAITS]
    await asyncio.sleep(0)


async def test_sync_points_inside_an_io_call_are_not_written(collected, redis_url):
    from collector import _tasks

    # with a socket timeout redis-py sends through wait_for and reads under asyncio.timeout: its own
    # sync points, inside the GET span (the graph folds them into the io node)
    client = aioredis.from_url(redis_url, socket_timeout=5.0)
    with collected.tracer.start_as_current_span("request"):
        me = _tasks.current().id
        await client.get("perfcast:test:x")
        await asyncio.wait_for(asyncio.sleep(0.001), 1.0)  # outside the call: written
    await client.aclose()
    (sync,) = collected.of_kind("sync")
    assert sync.attributes[A.SYNC_OP] == "wait_for"
    (get,) = [
        s for s in io_spans(collected, "redis") if s.attributes[A.IO_OPERATION] == "GET"
    ]
    assert sync.start_time >= get.end_time
    # the helper task redis-py made inside the call is still recorded (its CPU is the call's)
    helpers = [
        s
        for s in collected.of_kind("task")
        if s.attributes[A.TASK_PARENT_ID] == me
        and get.start_time < s.attributes[A.TASK_CREATED_NS] < get.end_time
    ]
    assert helpers and all(
        set(s.attributes[A.STEPS_AWAITS]) <= {"io", "done"} for s in helpers
    )
    assert "io" in collected.task(me)[A.STEPS_AWAITS]


async def test_an_answer_is_timed_where_the_loop_read_it(collected, redis_url):
    client = aioredis.from_url(redis_url)
    with collected.tracer.start_as_current_span("request"):
        await client.ping()
        for i in range(5):
            await client.get(f"perfcast:test:{i}")
    await client.aclose()
    gets = [s for s in io_spans(collected, "redis") if s.attributes[A.IO_OPERATION] == "GET"]
    assert len(gets) == 5
    for s in gets:
        answer, read = s.attributes[A.IO_ANSWER_NS], s.attributes[A.IO_READ_NS]
        assert read > 0 and s.start_time < answer - read and answer < s.end_time


async def test_a_request_span_holds_the_loops_sleeps(collected, redis_url):
    client = aioredis.from_url(redis_url)
    await client.ping()

    async def page(request: web.Request) -> web.Response:
        await client.get("perfcast:test:0")
        t = time.perf_counter()
        while time.perf_counter() - t < 0.005:  # 5 ms on the loop: no sleep in there
            pass
        marks.append(time.time_ns())
        await asyncio.sleep(0.02)  # nothing else to do: the loop sleeps
        marks.append(time.time_ns())
        return web.Response(text="ok")

    marks: list[int] = []
    runner, port = await serve("/page", page)
    try:
        await asyncio.sleep(0.005)  # the loop sleeps before the request: a wake-up to find before its span
        async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/page") as resp:
            assert await resp.text() == "ok"
    finally:
        await runner.cleanup()
        await client.aclose()
    (request,) = collected.of_kind("request")
    flat = request.attributes[A.LOOP_IDLE_NS]
    sleeps = list(zip(flat[::2], flat[1::2], strict=True))
    assert sleeps and all(request.start_time <= a < b <= request.end_time for a, b in sleeps)
    assert all(b <= a2 for (_, b), (a2, _) in zip(sleeps, sleeps[1:]))
    # the 20 ms sleep is there, nearly whole; the busy 5 ms before it hold none
    slept = sum(min(b, marks[1]) - max(a, marks[0]) for a, b in sleeps if b > marks[0] and a < marks[1])
    assert slept > 0.8 * (marks[1] - marks[0])
    busy_from = marks[0] - 4_000_000
    assert not any(busy_from < b <= marks[0] for _, b in sleeps)
    # the loop's last wake-up before the request: the end of a sleep, before the span started
    assert request.start_time - 1_000_000_000 < request.attributes[A.LOOP_WOKE_NS] <= request.start_time
