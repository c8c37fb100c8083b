"""I/O calls and blocking calls: the contrib instrumentations, perfcast's measurements on their spans,
the aiosqlite wrapper, and ``blocking`` spans for blocking calls made on the event loop thread.

Round trips and bytes are measured, not assumed: while an I/O span of a task is open, writes on a selector
socket transport made by that task tag the transport with the span's state; the transport's next read then
closes one write-then-read turnaround. A TCP connection opened during the call adds one round trip.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.selector_events
import functools
import inspect
import os
import re
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import wrapt
from opentelemetry import trace

from collector import _runtime, _tasks
from collector import attributes as A

_get_running_loop = asyncio.events._get_running_loop
_time_ns = time.time_ns
_Transport = asyncio.selector_events._SelectorSocketTransport


@dataclass(slots=True, eq=False)
class IoState:
    """Measurements of one open I/O span."""

    system: str
    rec: Any
    round_trips: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    measured_response: bool = False
    wrote: bool = False
    open: bool = True
    answer_ns: int = 0
    """When the loop finished the last read callback of the call's socket (Unix ns; 0: none)."""
    read_ns: int = 0
    """Time spent in those read callbacks, ns."""


class _Reading(threading.local):
    state: IoState | None = None
    """The I/O state a transport is reading for on this thread (the socket wrappers add received bytes)."""


_reading = _Reading()


# --- transports: round trips and bytes ---------------------------------------------------------------------

_orig: dict[str, Any] = {}


def _open_state(rec: Any) -> IoState | None:
    stack = rec.io_stack
    while stack and not stack[-1].open:
        stack.pop()
    return stack[-1] if stack else None


def _write(self: Any, data: Any) -> None:
    rec = _tasks.current()
    if rec is not None and rec.io_stack:
        try:
            st = _open_state(rec)
            if st is None:
                return _orig["write"](self, data)
            st.request_bytes += len(data)
            st.wrote = True
            self._perfcast_io = st
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("transport write")
    return _orig["write"](self, data)


def _writelines(self: Any, list_of_data: Any) -> None:
    rec = _tasks.current()
    if rec is not None and rec.io_stack:
        list_of_data = list(list_of_data)
        try:
            st = _open_state(rec)
            if st is None:
                return _orig["writelines"](self, list_of_data)
            st.request_bytes += sum(len(d) for d in list_of_data)
            st.wrote = True
            self._perfcast_io = st
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("transport writelines")
    return _orig["writelines"](self, list_of_data)


def _reader(name: str) -> Any:
    def read(self: Any) -> None:
        st = self._perfcast_io
        if st is None or not st.open:
            return _orig[name](self)
        if st.wrote:
            st.round_trips += 1
            st.wrote = False
        _reading.state = st
        t0 = _time_ns()
        try:
            return _orig[name](self)
        finally:
            _reading.state = None
            st.answer_ns = _time_ns()
            st.read_ns += st.answer_ns - t0

    return read


async def _create_connection(
    wrapped: Any, instance: Any, args: Any, kwargs: Any
) -> Any:
    rec = _tasks.current()
    st = _open_state(rec) if rec is not None else None
    if st is not None:
        st.round_trips += 1  # the TCP handshake
    return await wrapped(*args, **kwargs)


# --- blocking calls on the loop thread ----------------------------------------------------------------------


def _blocking(call: str, fn: Any, *args: Any) -> Any:
    tracer = _runtime.tracer
    try:
        tracing = (
            tracer is not None and trace.get_current_span().get_span_context().trace_flags.sampled
        )
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("blocking")
        tracing = False
    if not tracing:
        return fn(*args)
    assert tracer is not None
    span = tracer.start_span(
        call, attributes={A.KIND: "blocking", A.BLOCKING_CALL: call}
    )
    try:
        return fn(*args)
    finally:
        span.end()


def _time_sleep(seconds: float) -> None:
    if _get_running_loop() is None:
        return _orig["sleep"](seconds)
    return _blocking("time.sleep", _orig["sleep"], seconds)


def _socket_method(name: str) -> Any:
    original = getattr(socket.socket, name)
    _orig["socket." + name] = original
    counts_bytes = name in ("recv", "recv_into")

    def method(self: Any, *args: Any) -> Any:
        st = _reading.state
        if st is not None:
            result = original(self, *args)
            if counts_bytes:
                st.response_bytes += result if isinstance(result, int) else len(result)
                st.measured_response = True
            return result
        if self.timeout == 0.0 or _get_running_loop() is None:
            return original(self, *args)
        return _blocking("socket." + name, original, self, *args)

    method.__name__ = name
    return method


_SOCKET_METHODS = ("connect", "send", "sendall", "recv", "recv_into")


# --- aiosqlite (no contrib instrumentation exists) ----------------------------------------------------------

_sqlite_paths: dict[int, str] = {}


def _aiosqlite_resource(conn: Any) -> str:
    path = _sqlite_paths.get(id(conn))
    if path is None:
        database = inspect.getclosurevars(conn._connector).nonlocals.get("database", "")
        if isinstance(database, bytes):
            database = database.decode()
        database = str(database)
        path = database if database == ":memory:" else os.path.abspath(database)
        _sqlite_paths[id(conn)] = path
    return f"sqlite:///{path}" if path != ":memory:" else "sqlite://:memory:"


async def _aiosqlite_execute(
    wrapped: Any, instance: Any, args: Any, kwargs: Any
) -> Any:
    tracer = _runtime.tracer
    if tracer is None or not trace.get_current_span().get_span_context().trace_flags.sampled:
        return await wrapped(*args, **kwargs)
    try:
        fn = args[0]
        sql = args[1] if len(args) > 1 and isinstance(args[1], str) else None
        operation = (
            sql_operation(sql)
            if sql
            else getattr(fn, "__name__", "call").lstrip("_").upper()
        )
        attrs = {
            A.KIND: "io",
            A.IO_SYSTEM: "sqlite",
            A.IO_RESOURCE: _aiosqlite_resource(instance),
            A.IO_OPERATION: operation,
            A.IO_ROUND_TRIPS: 0,
            "db.system": "sqlite",
        }
        if sql:
            attrs["db.statement"] = sql
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("aiosqlite")
        return await wrapped(*args, **kwargs)
    with tracer.start_as_current_span(
        f"aiosqlite {operation}",
        kind=trace.SpanKind.CLIENT,
        attributes=attrs,
        record_exception=False,
    ):
        return await wrapped(*args, **kwargs)


def _sqlite3_connect(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    # aiosqlite's worker thread gets plain connections: its calls are traced by the aiosqlite wrapper.
    if getattr(threading.current_thread(), "_target", None) is _aiosqlite_worker:
        return _orig["sqlite3.connect"](*args, **kwargs)
    return wrapped(*args, **kwargs)


_aiosqlite_worker: Any = None


# --- attributes of I/O spans ------------------------------------------------------------------------------

_SQL_TABLE = re.compile(
    r"^\s*(?:(?P<verb>select|delete)\b.*?\bfrom\s+(?P<t1>[\w.\"]+)"
    r"|(?P<verb2>insert|replace)\b.*?\binto\s+(?P<t2>[\w.\"]+)"
    r"|(?P<verb3>update)\s+(?:or\s+\w+\s+)?(?P<t3>[\w.\"]+))",
    re.IGNORECASE | re.DOTALL,
)
_ID_SEGMENT = re.compile(r"^(?:\d+|[0-9a-fA-F]{8,}|[0-9a-fA-F-]{36})$")


@functools.lru_cache(maxsize=4096)
def sql_operation(sql: str) -> str:
    """SQL verb and first table: ``SELECT posts``; the verb alone when no table is found.

    >>> sql_operation("select * from posts where id = $1")
    'SELECT posts'
    >>> sql_operation("INSERT INTO views(post) VALUES (?)")
    'INSERT views'
    """
    text = re.sub(r"^\s*(?:/\*.*?\*/\s*)+", "", sql, flags=re.DOTALL)
    m = _SQL_TABLE.match(text)
    if m:
        verb = m.group("verb") or m.group("verb2") or m.group("verb3")
        table = m.group("t1") or m.group("t2") or m.group("t3")
        return f"{verb.upper()} {table.strip(chr(34))}"
    words = text.split(None, 1)
    return words[0].upper() if words else "SQL"


@functools.lru_cache(maxsize=4096)
def path_template(path: str) -> str:
    """An HTTP path with id-like segments (numbers, hex, uuids) replaced by ``{id}``.

    >>> path_template("/blob/42/meta")
    '/blob/{id}/meta'
    """
    return (
        "/".join("{id}" if _ID_SEGMENT.match(seg) else seg for seg in path.split("/"))
        or "/"
    )


def _first(attrs: Any, *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None:
            return value
    return None


def io_attributes(system: str, name: str, attrs: Any) -> dict[str, Any]:
    """``perfcast.io.system/resource/operation`` from a contrib span's name and standard attributes."""
    out: dict[str, Any] = {A.IO_SYSTEM: system}
    host = _first(attrs, "server.address", "net.peer.name")
    port = _first(attrs, "server.port", "net.peer.port")
    hostport = f"{host}:{port}" if port is not None else f"{host}"
    if system == "redis":
        db = _first(attrs, "db.redis.database_index", "db.namespace")
        out[A.IO_RESOURCE] = f"redis://{hostport}/{db if db is not None else 0}"
        if attrs.get("db.redis.pipeline_length") is not None:
            out[A.IO_OPERATION] = "PIPELINE " + ",".join(name.split())
        else:
            out[A.IO_OPERATION] = name
    elif system == "postgresql":
        db = _first(attrs, "db.name", "db.namespace") or ""
        out[A.IO_RESOURCE] = f"postgresql://{hostport}/{db}"
        statement = _first(attrs, "db.statement", "db.query.text")
        out[A.IO_OPERATION] = sql_operation(statement) if statement else name
    elif system == "http":
        url = urlsplit(str(_first(attrs, "url.full", "http.url") or ""))
        netloc = url.hostname or ""
        if url.port is not None:
            netloc = f"{netloc}:{url.port}"
        out[A.IO_RESOURCE] = f"{url.scheme or 'http'}://{netloc}"
        method = _first(attrs, "http.request.method", "http.method") or name.split()[0]
        out[A.IO_OPERATION] = f"{method} {path_template(url.path or '/')}"
    elif system == "sqlite":
        db = str(_first(attrs, "db.name", "db.namespace") or "")
        path = db if db in ("", ":memory:") else os.path.abspath(db)
        out[A.IO_RESOURCE] = (
            f"sqlite:///{path}" if path not in ("", ":memory:") else "sqlite://:memory:"
        )
        statement = _first(attrs, "db.statement", "db.query.text")
        out[A.IO_OPERATION] = sql_operation(statement) if statement else name
    names = _runtime.settings.resource_names
    if names and out.get(A.IO_RESOURCE) in names:
        out[A.IO_RESOURCE_NAME] = names[out[A.IO_RESOURCE]]
    return out


# --- aiohttp client sessions: the contrib's trace config only while hooked ---------------------------------

# Once a session has a trace config, aiohttp builds and sends every one of its tracing signals on every
# request (about 3% of the example app's CPU, with the contrib's callbacks returning at their first check).
# Outside sampling windows the contrib's configs are taken off the sessions, as its own
# ``_uninstrument_session`` does, and put back when a window opens.
_sessions: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _contrib_configs(session: Any) -> list[Any]:
    return [tc for tc in session._trace_configs if hasattr(tc, "_is_instrumented_by_opentelemetry")]


def _session_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    wrapped(*args, **kwargs)
    try:
        configs = _contrib_configs(instance)
        if configs:
            _sessions[instance] = configs
            if not _hooked:
                _set_session_tracing(instance, configs, False)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("client session")


def _set_session_tracing(session: Any, configs: list[Any], on: bool) -> None:
    others = [tc for tc in session._trace_configs if not any(tc is c for c in configs)]
    session._trace_configs = others + configs if on else others


def _set_all_sessions_tracing(on: bool) -> None:
    for session, configs in list(_sessions.items()):
        try:
            _set_session_tracing(session, configs, on)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("client session")


# --- install / uninstall -------------------------------------------------------------------------------------

_instrumentors: list[Any] = []


def _contrib(tracer_provider: Any) -> None:
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.aiohttp_server import AioHttpServerInstrumentor

    candidates: list[Any] = [AioHttpServerInstrumentor(), AioHttpClientInstrumentor()]
    try:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        candidates.append(RedisInstrumentor())
    except ImportError:
        pass
    try:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        candidates.append(AsyncPGInstrumentor())
    except ImportError:
        pass
    from opentelemetry.instrumentation.sqlite3 import SQLite3Instrumentor

    candidates.append(SQLite3Instrumentor())
    for instrumentor in candidates:
        if instrumentor.is_instrumented_by_opentelemetry:
            continue
        try:
            instrumentor.instrument(
                tracer_provider=tracer_provider, skip_dep_check=False
            )
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error(f"instrument {type(instrumentor).__name__}")
            continue
        if instrumentor.is_instrumented_by_opentelemetry:
            _instrumentors.append(instrumentor)


_hooks: dict[tuple[Any, str], tuple[Any, Any]] = {}
"""(owner, attribute) -> (original, replacement) for the hooks ``hook()`` / ``unhook()`` swap."""
_hooked = False


def install(tracer_provider: Any, hooked: bool = True) -> None:
    """Instrument the I/O clients, ``time.sleep`` and aiosqlite; prepare the transport and socket hooks and,
    with ``hooked``, put them in place (else ``hook()`` does, later)."""
    global _aiosqlite_worker
    if _orig:
        return
    _contrib(tracer_provider)
    _orig["write"] = _Transport.__dict__["write"]
    _hooks[(_Transport, "write")] = (_orig["write"], _write)
    if "writelines" in _Transport.__dict__:
        _orig["writelines"] = _Transport.__dict__["writelines"]
        _hooks[(_Transport, "writelines")] = (_orig["writelines"], _writelines)
    for name in ("_read_ready__data_received", "_read_ready__get_buffer"):
        _orig[name] = _Transport.__dict__[name]
        _hooks[(_Transport, name)] = (_orig[name], _reader(name))
    _Transport._perfcast_io = None
    create_connection = asyncio.base_events.BaseEventLoop.__dict__["create_connection"]
    _hooks[(asyncio.base_events.BaseEventLoop, "create_connection")] = (
        create_connection,
        wrapt.FunctionWrapper(create_connection, _create_connection),
    )
    for name in _SOCKET_METHODS:
        # socket.socket inherits these from _socket.socket: "no own attribute" is the original state
        _hooks[(socket.socket, name)] = (None, _socket_method(name))
    _orig["sleep"] = time.sleep
    time.sleep = _time_sleep
    try:
        import aiohttp

        _orig["ClientSession.__init__"] = aiohttp.ClientSession.__dict__["__init__"]
        aiohttp.ClientSession.__init__ = wrapt.FunctionWrapper(_orig["ClientSession.__init__"], _session_init)
    except ImportError:
        pass
    try:
        import aiosqlite.core

        _aiosqlite_worker = aiosqlite.core._connection_worker_thread
        wrapt.wrap_function_wrapper(
            aiosqlite.core, "Connection._execute", _aiosqlite_execute
        )
    except ImportError:
        pass
    import sqlite3

    connect = sqlite3.connect
    if hasattr(connect, "__wrapped__"):
        _orig["sqlite3.connect"] = connect.__wrapped__
        _orig["sqlite3.connect.traced"] = connect
        sqlite3.connect = wrapt.FunctionWrapper(connect, _sqlite3_connect)
    if hooked:
        hook()


def hook() -> None:
    """Put the transport, connection and socket hooks in place (round trips, bytes, blocking sockets).

    Like the step hooks, these are class attributes applications do not bind by name: the request sampler
    swaps them with the step hooks.
    """
    global _hooked
    if _hooked or not _hooks:
        return
    for (owner, name), (_original, replacement) in _hooks.items():
        setattr(owner, name, replacement)
    _hooked = True
    _set_all_sessions_tracing(True)


def unhook() -> None:
    """Take the transport, connection and socket hooks out."""
    global _hooked
    if not _hooked:
        return
    for (owner, name), (original, _replacement) in _hooks.items():
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _hooked = False
    _set_all_sessions_tracing(False)


def _unwrap(owner: Any, name: str) -> None:
    value = (
        owner.__dict__.get(name)
        if isinstance(owner, type)
        else getattr(owner, name, None)
    )
    if isinstance(value, wrapt.FunctionWrapper):
        setattr(owner, name, value.__wrapped__)


def uninstall() -> None:
    """Undo ``install()``."""
    if not _orig:
        return
    import sqlite3

    if "sqlite3.connect.traced" in _orig:
        sqlite3.connect = _orig.pop("sqlite3.connect.traced")
    unhook()
    if "ClientSession.__init__" in _orig:
        import aiohttp

        _set_all_sessions_tracing(True)  # as they were made: the contrib's own uninstrument leaves them so
        aiohttp.ClientSession.__init__ = _orig.pop("ClientSession.__init__")
    _sessions.clear()
    while _instrumentors:
        try:
            _instrumentors.pop().uninstrument()
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("uninstrument")
    _hooks.clear()
    del _Transport._perfcast_io
    time.sleep = _orig["sleep"]
    try:
        import aiosqlite.core

        _unwrap(aiosqlite.core.Connection, "_execute")
    except ImportError:
        pass
    _orig.clear()
    _sqlite_paths.clear()
