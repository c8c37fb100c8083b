"""Synchronisation points: gather, wait, as_completed, wait_for, timeout, shield and TaskGroup.

Each call made inside a traced task becomes a ``sync`` span saying which tasks it joined and with what
semantics (all / any / k-th), and the awaiting task's steps say ``sync:<id>`` while it waits there.
The wrappers (wrapt) return exactly what the wrapped call returns and let every exception through untouched.
"""

from __future__ import annotations

import asyncio
import asyncio.taskgroups
import asyncio.tasks
import asyncio.timeouts
import itertools
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import trace

from collector import _runtime, _tasks
from collector import attributes as A
from collector._tasks import TaskRecord, task_id

_ids = itertools.count(1)
_INLINE_WAIT_FOR = sys.version_info >= (3, 12)
"""3.12+: wait_for runs its coroutine inline, under asyncio.timeout, instead of in a new task."""
_open: dict[int, SyncState] = {}
"""id(Timeout or TaskGroup object) -> its open sync state."""


@dataclass(slots=True, eq=False)
class SyncState:
    """One synchronisation point while it is open."""

    id: int
    op: str
    parent: Any
    """SpanContext of the span current where the call was made."""
    start_ns: int
    owner: TaskRecord | None
    tag: str
    owner_step: int = -1
    children: list[Any] = field(default_factory=list)
    wait: str = "all"
    k: int | None = None
    timeout_ns: int | None = None
    body_first_step: int | None = None
    waiter: TaskRecord | None = None
    future_key: int | None = None
    done_ids: list[int] | None = None
    completed_ns: int | None = None
    ended: bool = False

    def child_ids(self) -> list[int]:
        return [task_id(c) for c in self.children]

    def on_future_done(self, _future: Any) -> None:
        """Done callback of a gather/shield future: note what finished; end now unless a task waits on it."""
        try:
            self.completed_ns = time.time_ns()
            self.done_ids = [task_id(c) for c in self.children if c.done()]
            if self.waiter is None:
                _tasks.SYNC_FUTURES.pop(self.future_key or 0, None)
                self.finish(None)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("sync done")

    def resume(self, rec: TaskRecord) -> None:
        """The waiting task's next step is starting: that is the resume step."""
        rec.wait_sync = None
        _tasks.SYNC_FUTURES.pop(self.future_key or 0, None)
        self.finish(rec.n)

    def finish(self, resume_step: int | None, timed_out: bool = False) -> None:
        if self.ended:
            return
        self.ended = True
        children = self.child_ids()
        done = self.done_ids
        if done is None:
            done = [task_id(c) for c in self.children if _is_done(c)]
        attrs: dict[str, Any] = {
            A.KIND: "sync",
            A.SYNC_ID: self.id,
            A.SYNC_OP: self.op,
            A.SYNC_WAIT: self.wait,
            A.SYNC_K: self.k if self.k is not None else len(children),
            A.SYNC_CHILDREN: children,
            A.SYNC_DONE: done,
            A.SYNC_TIMED_OUT: timed_out,
        }
        if self.timeout_ns is not None:
            attrs[A.SYNC_TIMEOUT_NS] = self.timeout_ns
        if resume_step is not None:
            attrs[A.SYNC_RESUME_STEP] = resume_step
        if self.body_first_step is not None:
            attrs[A.SYNC_BODY_FIRST_STEP] = self.body_first_step
        if self.owner is not None:
            attrs[A.TASK_ID] = self.owner.id
            attrs[A.TASK_STEP] = self.owner_step
        end = self.completed_ns
        if end is None:
            # Ended from inside the awaiting task's resume step: the point had completed by that step's start.
            owner = self.owner
            running = (
                owner is not None and resume_step is not None and resume_step == owner.n
            )
            end = (
                owner.step_start_ns if running and owner is not None else time.time_ns()
            )
        _runtime.emit_span(
            f"sync {self.op}",
            self.parent,
            self.start_ns,
            max(end, self.start_ns),
            attrs,
        )


def _is_done(obj: Any) -> bool:
    return bool(getattr(obj, "done", lambda: False)())


def _raised(obj: Any) -> bool:
    # Reads the stored exception without calling exception(), which would mark it as retrieved.
    return bool(
        obj.done()
        and not obj.cancelled()
        and getattr(obj, "_exception", None) is not None
    )


def _in_io(rec: TaskRecord) -> bool:
    """Whether an I/O span of the task (or of the call it works for) is open: a client library's own sync
    points inside its call are not written, the graph folds everything inside an I/O call into its node."""
    stack = rec.io_stack
    while stack and not stack[-1].open:
        stack.pop()  # an I/O call inherited from the parent task has ended
    return bool(stack)


def _traced_task() -> TaskRecord | None:
    """The running task's record when its sync points are written (in a task step, outside I/O calls)."""
    rec = _tasks.current()
    if rec is None or (rec.io_stack and _in_io(rec)):
        return None
    return rec


def _begin(op: str) -> SyncState | None:
    """A new sync point in the running task, or None when not tracing (outside a task or a trace, or inside
    an I/O call)."""
    rec = _traced_task()
    if rec is None or _runtime.emit is None:
        return None
    parent = trace.get_current_span().get_span_context()
    if not (parent.is_valid and parent.trace_flags.sampled):
        return None
    sid = next(_ids)
    return SyncState(
        id=sid,
        op=op,
        parent=parent,
        start_ns=time.time_ns(),
        owner=rec,
        tag=f"sync:{sid}",
        owner_step=rec.n,
    )


def _safe_begin(op: str) -> SyncState | None:
    try:
        return _begin(op)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error(f"sync {op}")
        return None


def _match(fs: list[Any], created: list[Any]) -> list[Any]:
    """Children in argument order: futures as given, coroutines as the task made of them."""
    by_coro = {id(t.get_coro()): t for t in created if hasattr(t, "get_coro")}
    return [f if asyncio.isfuture(f) else by_coro.get(id(f), f) for f in fs]


def _named(coro: Any, like: Any) -> Any:
    """Give a wrapper coroutine the name of the one it stands for (a task made of it shows the same name)."""
    try:
        coro.__name__ = like.__name__
        coro.__qualname__ = like.__qualname__
    except (AttributeError, TypeError):
        pass
    return coro


def _seconds_to_ns(timeout: float | None) -> int | None:
    return None if timeout is None else max(0, int(timeout * 1e9))


# --- future-returning points: gather, shield ---------------------------------------------------------------


def _watch_future(st: SyncState, outer: Any) -> None:
    st.future_key = id(outer)
    _tasks.SYNC_FUTURES[id(outer)] = st
    outer.add_done_callback(st.on_future_done)


def _gather(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    st = _safe_begin("gather")
    if st is None:
        return wrapped(*args, **kwargs)
    try:
        outer = wrapped(*args, **kwargs)
    except BaseException:
        st.finish(None)
        raise
    try:
        st.children = list(getattr(outer, "_children", None) or [])
        _watch_future(st, outer)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("gather")
    return outer


def _shield(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    st = _safe_begin("shield")
    if st is None:
        return wrapped(*args, **kwargs)
    rec = st.owner
    assert rec is not None
    prev, rec.capture = rec.capture, []
    try:
        outer = wrapped(*args, **kwargs)
    except BaseException:
        st.finish(None)
        raise
    finally:
        created, rec.capture = rec.capture, prev
    try:
        arg = args[0] if args else kwargs.get("arg")
        st.children = [
            arg if asyncio.isfuture(arg) else (created[0] if created else arg)
        ]
        _watch_future(st, outer)
    except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
        _runtime.count_error("shield")
    return outer


# --- coroutine points: wait, wait_for, as_completed items ------------------------------------------------


def _traced_set(args: Any, kwargs: Any) -> Any:
    """The iterable of awaitables given to wait / as_completed, or None when the call is not traced (no traced
    task, or an argument asyncio itself will reject: a lone future or coroutine)."""
    fs = args[0] if args else kwargs.get("fs")
    if _traced_task() is None or fs is None or asyncio.isfuture(fs) or asyncio.iscoroutine(fs):
        return None
    return fs


def _wait(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    fs = _traced_set(args, kwargs)
    if fs is None:
        return wrapped(*args, **kwargs)
    return _named(
        _wait_traced(
            wrapped,
            list(fs),
            *args[1:],
            **{k: v for k, v in kwargs.items() if k != "fs"},
        ),
        wrapped,
    )


async def _wait_traced(wrapped: Any, fs: list[Any], *args: Any, **kwargs: Any) -> Any:
    st = _safe_begin("wait")
    if st is None:
        return await wrapped(fs, *args, **kwargs)
    rec = st.owner
    assert rec is not None
    return_when = kwargs.get("return_when", asyncio.ALL_COMPLETED)
    timeout = kwargs.get("timeout")
    st.timeout_ns = _seconds_to_ns(timeout)
    if return_when == asyncio.FIRST_COMPLETED:
        st.wait, st.k = "any", 1
    prev_tag, prev_cap = rec.await_tag, rec.capture
    rec.await_tag, rec.capture = st.tag, []
    result = None
    try:
        result = await wrapped(fs, *args, **kwargs)
        return result
    finally:
        created = rec.capture or []
        rec.await_tag, rec.capture = prev_tag, prev_cap
        try:
            st.children = _match(fs, created)
            timed_out = False
            if result is not None:
                done, pending = result
                failed = any(_raised(f) for f in done)
                if return_when == asyncio.FIRST_EXCEPTION and failed and pending:
                    st.wait, st.k = "any", 1
                if timeout is not None:
                    if return_when == asyncio.FIRST_COMPLETED:
                        timed_out = not done
                    elif return_when == asyncio.FIRST_EXCEPTION:
                        timed_out = bool(pending) and not failed
                    else:
                        timed_out = bool(pending)
            st.finish(rec.n, timed_out)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("wait")


def _wait_for(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    if _traced_task() is None:
        return wrapped(*args, **kwargs)
    return _named(_wait_for_traced(wrapped, args, kwargs), wrapped)


async def _wait_for_traced(wrapped: Any, args: Any, kwargs: Any) -> Any:
    st = _safe_begin("wait_for")
    if st is None:
        return await wrapped(*args, **kwargs)
    rec = st.owner
    assert rec is not None
    aw = args[0] if args else kwargs.get("fut")
    timeout = args[1] if len(args) > 1 else kwargs.get("timeout")
    st.timeout_ns = _seconds_to_ns(timeout)
    st.wait, st.k = "any", 1
    prev_tag, prev_cap = rec.await_tag, rec.capture
    rec.capture = []
    if _INLINE_WAIT_FOR:
        st.body_first_step = rec.n
        _INLINE_OWNERS.add(rec.id)
    else:
        rec.await_tag = st.tag
    timed_out = False
    try:
        return await wrapped(*args, **kwargs)
    except TimeoutError:
        timed_out = True
        raise
    finally:
        created = rec.capture or []
        rec.await_tag, rec.capture = prev_tag, prev_cap
        _INLINE_OWNERS.discard(rec.id)
        try:
            if asyncio.isfuture(aw):
                st.children = [aw]
            elif created and not _INLINE_WAIT_FOR:
                st.children = [created[0]]
            else:
                st.children = [None]
            child = st.children[0]
            if timed_out and asyncio.isfuture(child):
                timed_out = child.cancelled()
            st.finish(rec.n, timed_out)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("wait_for")


_INLINE_OWNERS: set[int] = set()
"""Tasks inside an inline (3.12+) wait_for: its internal asyncio.timeout is not a sync point of its own."""


def _as_completed(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    fs = _traced_set(args, kwargs)
    if fs is None:
        return wrapped(*args, **kwargs)
    fs_list = list(fs)
    rest = {k: v for k, v in kwargs.items() if k != "fs"}
    return _as_completed_items(
        wrapped(fs_list, *args[1:], **rest),
        fs_list,
        _seconds_to_ns(rest.get("timeout")),
    )


def _as_completed_items(
    gen: Any, fs: list[Any], timeout_ns: int | None
) -> Iterator[Any]:
    rec = _tasks.current()
    prev = rec.capture if rec is not None else None
    if rec is not None:
        rec.capture = []
    try:
        first = next(gen, _END)  # as_completed makes its tasks on the first next()
    finally:
        created = (rec.capture or []) if rec is not None else []
        if rec is not None:
            rec.capture = prev
    children = _match(fs, created)
    rank = 0
    item = first
    while item is not _END:
        rank += 1
        yield _named(_as_completed_one(item, children, rank, timeout_ns), item)
        item = next(gen, _END)


_END = object()


async def _as_completed_one(
    item: Any, children: list[Any], rank: int, timeout_ns: int | None
) -> Any:
    st = _safe_begin("as_completed")
    if st is None:
        return await item
    rec = st.owner
    assert rec is not None
    st.children, st.wait, st.k, st.timeout_ns = children, "any", rank, timeout_ns
    prev_tag, rec.await_tag = rec.await_tag, st.tag
    timed_out = False
    try:
        return await item
    except TimeoutError:
        timed_out = timeout_ns is not None
        raise
    finally:
        rec.await_tag = prev_tag
        try:
            st.finish(rec.n, timed_out)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("as_completed")


# --- context managers: timeout, TaskGroup ------------------------------------------------------------------


def _timeout_enter(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    rec = _traced_task()
    if rec is not None and rec.id not in _INLINE_OWNERS:
        st = _safe_begin("timeout")
        if st is not None:
            try:
                st.wait, st.k, st.children = "any", 1, []
                st.body_first_step = rec.n
                when = instance.when()
                if when is not None:
                    st.timeout_ns = max(
                        0, int((when - asyncio.get_running_loop().time()) * 1e9)
                    )
                _open[id(instance)] = st
            except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
                _runtime.count_error("timeout enter")
    return wrapped(*args, **kwargs)


def _timeout_exit(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    st = _open.pop(id(instance), None)
    if st is None:
        return wrapped(*args, **kwargs)
    if st.timeout_ns is None and instance.when() is None:
        # No deadline at enter nor now (asyncpg's timeout(None) around each connection reset): it never
        # fired and cannot fire any more, it raced nothing and the graph has nothing to show for it.
        st.ended = True
        return wrapped(*args, **kwargs)
    return _named(_timeout_exit_traced(wrapped, instance, args, kwargs, st), wrapped)


async def _timeout_exit_traced(
    wrapped: Any, instance: Any, args: Any, kwargs: Any, st: SyncState
) -> Any:
    try:
        return await wrapped(*args, **kwargs)
    finally:
        try:
            rec = _tasks.current() or st.owner
            st.finish(rec.n if rec is not None else None, bool(instance.expired()))
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("timeout exit")


def _group_enter(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    st = _safe_begin("taskgroup")
    if st is not None and st.owner is not None:
        st.body_first_step = st.owner.n
        _open[id(instance)] = st
    return wrapped(*args, **kwargs)


def _group_create_task(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    task = wrapped(*args, **kwargs)
    st = _open.get(id(instance))
    if st is not None:
        st.children.append(task)
    return task


def _group_exit(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    st = _open.pop(id(instance), None)
    if st is None:
        return wrapped(*args, **kwargs)
    return _named(_group_exit_traced(wrapped, args, kwargs, st), wrapped)


async def _group_exit_traced(
    wrapped: Any, args: Any, kwargs: Any, st: SyncState
) -> Any:
    rec = _tasks.current() or st.owner
    prev_tag = None
    if rec is not None:
        prev_tag, rec.await_tag = rec.await_tag, st.tag
    try:
        return await wrapped(*args, **kwargs)
    finally:
        if rec is not None:
            rec.await_tag = prev_tag
        try:
            st.finish(rec.n if rec is not None else None)
        except Exception:  # noqa: BLE001 - counted and reported, never raised into the app
            _runtime.count_error("taskgroup exit")


# --- install / uninstall -------------------------------------------------------------------------------------

_FUNCTIONS: dict[str, Any] = {
    "gather": _gather,
    "shield": _shield,
    "wait": _wait,
    "wait_for": _wait_for,
}
_METHODS: list[tuple[Any, str, Any]] = [
    (asyncio.timeouts.Timeout, "__aenter__", _timeout_enter),
    (asyncio.timeouts.Timeout, "__aexit__", _timeout_exit),
    (asyncio.taskgroups.TaskGroup, "__aenter__", _group_enter),
    (asyncio.taskgroups.TaskGroup, "__aexit__", _group_exit),
    (asyncio.taskgroups.TaskGroup, "create_task", _group_create_task),
]
if sys.version_info < (3, 13):
    # 3.13's as_completed returns an iterator object (also async-iterable): not wrapped, its awaits are `future`.
    _FUNCTIONS["as_completed"] = _as_completed

_saved: list[tuple[Any, str, Any]] = []


def install() -> None:
    """Wrap the sync points in ``asyncio.tasks`` (and their re-exports on ``asyncio``) and the context managers."""
    if _saved:
        return
    for name, wrapper in _FUNCTIONS.items():
        original = getattr(asyncio.tasks, name)
        proxy = wrapt.FunctionWrapper(original, wrapper)
        for module in (asyncio.tasks, asyncio):
            if getattr(module, name, None) is original:
                _saved.append((module, name, original))
                setattr(module, name, proxy)
    for cls, name, wrapper in _METHODS:
        original = cls.__dict__[name]
        _saved.append((cls, name, original))
        setattr(cls, name, wrapt.FunctionWrapper(original, wrapper))


def uninstall() -> None:
    """Restore everything ``install()`` replaced."""
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)
    forget()


def forget() -> None:
    """Drop the state of open sync points (the request sampler closes a window: the task records they refer
    to are forgotten too)."""
    _open.clear()
    _INLINE_OWNERS.clear()
