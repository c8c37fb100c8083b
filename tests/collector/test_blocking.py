import socket
import sqlite3
import time

from collector import attributes as A


async def test_time_sleep_on_the_loop_is_blocking(collected):
    with collected.tracer.start_as_current_span("request"):
        time.sleep(0.001)  # noqa: ASYNC251 - the blocking call under test
    (span,) = collected.of_kind("blocking")
    assert span.attributes[A.BLOCKING_CALL] == "time.sleep"
    assert A.TASK_ID in span.attributes


async def test_blocking_socket_and_sqlite3(collected, tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    db = sqlite3.connect(tmp_path / "x.db")
    with collected.tracer.start_as_current_span("request"):
        client = socket.create_connection(server.getsockname())
        client.sendall(b"ping")
        db.cursor().execute(
            "SELECT 1"
        )  # (Connection.execute is a C shortcut the contrib does not trace)
    client.close()
    server.close()
    db.close()
    calls = {s.attributes[A.BLOCKING_CALL] for s in collected.of_kind("blocking")}
    assert {"socket.connect", "socket.sendall", "sqlite3.execute"} <= calls
