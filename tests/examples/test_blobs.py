"""The blob service: blobs of the asked size, the key-value cache with expiry, delays, and its thread mode."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from examples.forum.blobs import BlobServiceConfig, build_blob_app, start_embedded


async def _client(config: BlobServiceConfig) -> TestClient:
    client = TestClient(TestServer(build_blob_app(config)))
    await client.start_server()
    return client


async def test_blobs_have_the_asked_size_and_differ_by_id() -> None:
    client = await _client(BlobServiceConfig(payload_bytes=1000))
    try:
        default = await (await client.get("/blob/1")).read()
        other = await (await client.get("/blob/2")).read()
        small = await (await client.get("/blob/1", params={"bytes": "10"})).read()
        assert len(default) == 1000 and len(small) == 10 and default != other
        assert (await client.get("/blob/1", params={"bytes": "-3"})).status == 400
        assert (await client.get("/blob/x")).status == 400
    finally:
        await client.close()


async def test_stored_blobs_can_grow_while_the_service_runs() -> None:
    client = await _client(BlobServiceConfig(payload_bytes=1000))
    try:
        assert (await client.put("/admin/blob-bytes", data="5000")).status == 204
        assert len(await (await client.get("/blob/1", params={"bytes": "10"})).read()) == 5000
        assert len(await (await client.get("/blob/2")).read()) == 5000
        bad = await client.put("/admin/blob-bytes", data="lots")
        assert bad.status == 400 and "'lots'" in await bad.text()
        assert len(await (await client.get("/blob/1")).read()) == 5000  # a bad request changes nothing
        assert (await client.delete("/admin/blob-bytes")).status == 204
        assert len(await (await client.get("/blob/1", params={"bytes": "10"})).read()) == 10
    finally:
        await client.close()


async def test_kv_set_get_expire_and_incr() -> None:
    client = await _client(BlobServiceConfig())
    try:
        assert (await client.get("/kv", params={"key": "k"})).status == 404
        assert (await client.put("/kv", data="hello", params={"key": "k", "ttl_ms": "50"})).status == 204
        assert await (await client.get("/kv", params={"key": "k"})).text() == "hello"
        await asyncio.sleep(0.08)
        assert (await client.get("/kv", params={"key": "k"})).status == 404
        assert [await (await client.post("/kv/incr", params={"key": "n"})).text() for _ in range(3)] == ["1", "2", "3"]
        await client.put("/kv", data="text", params={"key": "s"})
        assert (await client.post("/kv/incr", params={"key": "s"})).status == 409
        missing = await client.get("/kv")
        assert missing.status == 400 and "?key=" in await missing.text()
    finally:
        await client.close()


async def test_slow_ads_and_recommendations_follow_the_config() -> None:
    client = await _client(BlobServiceConfig(delay_ms=30, ad_ms=0, ad_slow_fraction=1.0, ad_slow_ms=20))
    try:
        replies = [await (await client.get("/ad")).json() for _ in range(3)]
        assert all(reply["slow"] is True for reply in replies)
        recs = await (await client.get("/recommend", params={"user": "4"})).json()
        assert recs["user"] == "4" and len(recs["posts"]) == 5
    finally:
        await client.close()


async def test_embedded_services_run_on_their_own_loop_and_ports() -> None:
    services = await asyncio.to_thread(start_embedded, [BlobServiceConfig(payload_bytes=7)] * 2)
    try:
        assert len(set(services.urls)) == 2
        async with aiohttp.ClientSession() as session:
            for url in services.urls:
                async with session.get(f"{url}/blob/1") as resp:
                    assert len(await resp.read()) == 7
            # Independent services: a key set on one is absent from the other.
            async with session.put(f"{services.urls[0]}/kv", data="1", params={"key": "here"}) as resp:
                assert resp.status == 204
            async with session.get(f"{services.urls[1]}/kv", params={"key": "here"}) as resp:
                assert resp.status == 404
    finally:
        await asyncio.to_thread(services.stop)
    await asyncio.to_thread(services.stop)  # idempotent


async def test_seeded_slow_ads_do_not_depend_on_the_recommendations_drawn_before() -> None:
    config = BlobServiceConfig(ad_ms=0, ad_slow_fraction=0.5, ad_slow_ms=0, replica_jitter_ms=0.1, seed=7)
    sequences = []
    for recommends in (0, 3):
        client = await _client(config)
        try:
            flags = []
            for _ in range(12):
                for _ in range(recommends):  # other calls draw from the service's random stream in between
                    await (await client.get("/recommend", params={"user": "1"})).json()
                flags.append((await (await client.get("/ad")).json())["slow"])
            sequences.append(flags)
        finally:
            await client.close()
    assert sequences[0] == sequences[1] and 0 < sum(sequences[0]) < 12
