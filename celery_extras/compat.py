"""Every private Celery and kombu attribute celery-extras uses, in this one module.

celery-extras reaches into a few internals of the worker (its state module, the
prefetch window, the timer entry of a waiting request, the pool's poller...).
Each is listed in :data:`PRIVATE` with the shape relied on and what happens
without it; the rest of the package goes through the functions below, never to
the attribute itself.

Where a supported Celery release lacks one, the function falls back to what
that release does itself (Celery 5.5 and 5.6 track no scheduled requests, so a
held task is not tracked either); where nothing can stand in, :func:`check_worker`
fails the worker start with the Celery version and the feature, so no worker
dies later, mid-run. ``tests/unit/test_compat.py`` checks every entry on the
installed Celery and kombu: the first release that moves one fails CI.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import celery
import click
import kombu
from celery.events.receiver import EventReceiver
from celery.exceptions import ImproperlyConfigured
from celery.worker import state as _state

from .checks import is_number

__all__ = [
    "CELERY_VERSION",
    "KOMBU_VERSION",
    "PRIVATE",
    "RESTORE_INTERVAL",
    "REVOKES_MAX",
    "REVOKE_EXPIRES",
    "ConsumerLike",
    "DroppingEventReceiver",
    "Private",
    "QoSLike",
    "RequestLike",
    "TimerEntry",
    "active_requests",
    "after_purge_command",
    "check_worker",
    "control_purge_queues",
    "drop_acks",
    "forget_held",
    "keep_written_jobs",
    "limited_set_newest",
    "loop_closed",
    "missing",
    "narrow_prefetch",
    "on_every_app_finalize",
    "on_strategies_rebuilt",
    "order_semaphore_waiting",
    "pool_poll_start",
    "promise_proxy_parts",
    "purge_command_queues",
    "redis_queue_keys",
    "replace_connection_close",
    "request_embed",
    "request_pending",
    "reserved_requests",
    "restore_interval",
    "revoked_or_cancelled",
    "shared_task_parts",
    "stop_pool_threads",
    "task_reserved",
    "terminate_workers",
    "track_held",
    "transport_channels",
    "unacked_messages",
    "widen_prefetch",
    "with_control_mixin",
    "worker_revoked",
    "worker_revoked_stamps",
    "worker_stopping",
]

logger = logging.getLogger(__name__)

CELERY_VERSION: str = celery.__version__
KOMBU_VERSION: str = kombu.__version__


# -- the worker objects touched, as far as celery-extras relies on them -----------------------


class TimerEntry(Protocol):
    """An entry of the worker's timer (``kombu.asynchronous.timer.Entry``)."""

    def cancel(self) -> None: ...


class QoSLike(Protocol):
    """The consumer's prefetch window (``kombu.common.QoS``)."""

    def increment_eventually(self, n: int = 1) -> int: ...

    def decrement_eventually(self, n: int = 1) -> int: ...


class RequestLike(Protocol):
    """A task request of the worker (``celery.worker.request.Request``)."""

    @property
    def id(self) -> str: ...


class ConsumerLike(Protocol):
    """The worker's consumer (``celery.worker.consumer.Consumer``), the parts touched here."""

    qos: QoSLike
    pool: Any


# -- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Private:
    """One private attribute: where it is, the shape relied on, what uses it, what stands in.

    ``path`` is dotted from the module (``"Request._eta_timer_entry"``); ``shape`` checks
    what is found there. An entry with ``fallback`` degrades as it says when missing;
    one without it is required, and :func:`check_worker` refuses to start the worker.
    ``probe`` entries are instance attributes (``shape`` builds a throwaway object to
    look) or outside the worker (the command line, ``app.control``): only the tests check
    them (the worker start checks the class-level ones).
    """

    module: str
    path: str
    shape: Callable[[Any], bool]
    expects: str
    used_by: str
    fallback: str | None = None
    probe: bool = False
    since: str | None = None  # the Celery release that brought it (None: every supported one)

    @property
    def name(self) -> str:
        return f"{self.module}.{self.path}"


def _callable(*params: str) -> Callable[[Any], bool]:
    """A callable whose signature starts with *params* (after ``self`` for methods)."""

    def shape(obj: Any) -> bool:
        if not callable(obj):
            return False
        if not params:
            return True
        try:
            names = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return False
        if names and names[0] == "self":
            names = names[1:]
        return names[: len(params)] == list(params)

    return shape


def _is_set(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("add", "discard", "__contains__"))


def _limited_set_data(cls: Any) -> bool:
    data = getattr(cls(maxlen=2), "_data", None)
    return isinstance(data, dict)


def _promise_proxy_parts(cls: Any) -> bool:
    def fun() -> None: ...

    proxy = cls(lambda: None, (fun,), {"name": "n"})
    return promise_proxy_parts(proxy) == ((fun,), {"name": "n"})


def _proxy_local(cls: Any) -> bool:
    proxy = cls(lambda: None)
    return callable(object.__getattribute__(proxy, "_Proxy__local"))


def _shared_task_closure(shared_task: Any) -> bool:
    """The getter ``shared_task`` wraps in its Proxy closes over ``fun`` and ``name``.

    Read from the code objects, without calling ``shared_task`` (that would register a
    task in every app finalized afterwards).
    """
    from celery.local import Proxy

    def getters(code: Any) -> Iterable[Any]:
        for const in code.co_consts:
            if inspect.iscode(const):
                yield const
                yield from getters(const)

    proxies = "Proxy" in inspect.getsource(shared_task) and Proxy.__name__ == "Proxy"
    return proxies and any(
        {"fun", "name"} <= set(code.co_freevars) and "app" in code.co_varnames
        for code in getters(shared_task.__code__)
    )


def _hub_forgets_its_poller(close_poller: Any) -> bool:
    """``Hub._close_poller`` sets ``self._poller`` to ``None``: a closed loop has none."""
    return "self._poller = None" in inspect.getsource(close_poller)


def _pool_has_poller(cls: Any) -> bool:
    """``TaskPool.on_start`` sets ``self._pool``, an AsynPool that sets ``on_poll_start``."""
    from celery.concurrency.asynpool import AsynPool

    return "self._pool = " in inspect.getsource(cls.on_start) and (
        "self.on_poll_start = " in inspect.getsource(AsynPool._create_write_handlers)
    )


def _flush_discards_by_job(flush: Any) -> bool:
    """``AsynPool.flush`` gets rid of unaccepted jobs with ``job.discard()``, and a job
    knows where it was written (``_write_to``)."""
    from celery.concurrency.asynpool import AsynPool

    write = inspect.getsource(AsynPool._create_write_handlers)
    source = inspect.getsource(flush)
    return "job._write_to = proc" in write and "_accepted" in source and "discard()" in source


def _semaphore_waiting(cls: Any) -> bool:
    """``LaxBoundedSemaphore(n)``: its waiters in ``_waiting``, added and taken through
    ``_add_waiter``/``_pop_waiter`` (bound to it), emptied by ``clear()``."""
    semaphore = cls(1)
    return (
        order_semaphore_waiting(semaphore, _ProbeWaiting())
        and semaphore.acquire(lambda: None)
        and not semaphore.acquire(lambda: None)
        and len(semaphore._waiting) == 1
    )


class _ProbeWaiting(list):  # type: ignore[type-arg]
    def popleft(self) -> Any:
        return self.pop(0)


def _transport_channels(cls: Any) -> bool:
    from kombu.connection import Connection

    connection = Connection("memory://")
    try:
        return isinstance(transport_channels(connection.transport), list)
    finally:
        connection.release()


def _thread_pool_executor(cls: Any) -> bool:
    from concurrent.futures import ThreadPoolExecutor

    pool = cls(1)
    try:
        return isinstance(pool.executor, ThreadPoolExecutor)
    finally:
        pool.executor.shutdown()


def _virtual_qos(cls: Any) -> bool:
    from types import SimpleNamespace

    qos = cls(SimpleNamespace(do_restore=False))  # nothing to restore when it is collected
    return isinstance(qos._delivered, dict) and isinstance(qos._dirty, set)


def _receive(obj: Any) -> bool:
    from celery.events.receiver import EventReceiver

    source = inspect.getsource(EventReceiver.get_consumers)
    return _callable("body", "message")(obj) and "callbacks=[self._receive]" in source


def _number(obj: Any) -> bool:
    return is_number(obj, above=0)


def _purge_command(command: Any) -> bool:
    """``celery purge``: a click command with ``-f``, ``-Q`` and ``-X``, emptying the queues
    of ``-Q`` (else every queue the app declares) but those of ``-X``."""
    from celery.bin import purge

    source = inspect.getsource(purge)
    names = {param.name for param in getattr(command, "params", ())}
    return (
        isinstance(command, click.Command) and callable(command.callback)
        and {"force", "queues", "exclude_queues"} <= names
        and "set(queues or app.amqp.queues.keys())" in source
        and "set(exclude_queues or [])" in source
    )  # fmt: skip


def _control_cls(name: Any) -> bool:
    """``Celery.control_cls`` names Celery's ``Control``, and ``app.control``, made once, is
    kept in the app's ``__dict__`` under its name (a cached property)."""
    if name != "celery.app.control:Control":
        return False
    app = celery.Celery("compat-probe", set_as_current=False)
    try:
        return app.control is vars(app).get("control")
    finally:
        app.close()


def _control_purge(purge: Any) -> bool:
    """``Control.purge(connection=None)`` empties the queues of ``app.amqp.TaskConsumer``,
    which are the app's ``consume_from`` unless given."""
    from celery.app.amqp import AMQP

    return (
        _callable("connection")(purge)
        and "TaskConsumer(conn).purge()" in inspect.getsource(purge)
        and "self.queues.consume_from.values()" in inspect.getsource(AMQP.TaskConsumer)
    )


def _payload(obj: Any) -> bool:
    """``Request._payload``: a cached property whose value is the body's 3-tuple."""
    import functools

    return isinstance(obj, functools.cached_property) and obj.attrname == "_payload"


PRIVATE: tuple[Private, ...] = (
    Private("celery.worker.state", "revoked", lambda o: _is_set(o) and hasattr(o, "purge"),
            "the LimitedSet of revoked ids", "sync: revokes merged into the worker"),
    Private("celery.worker.state", "revoked_stamps", lambda o: isinstance(o, dict),
            "a dict {header: [values]}", "sync: stamped-header revokes merged"),
    Private("celery.worker.state", "requests", lambda o: isinstance(o, dict),
            "a dict {task id: request}", "limits: a held task dropped on connection loss"),
    Private("celery.worker.state", "reserved_requests", _is_set,
            "a set of reserved requests",
            "fair queues: room left in the pool; concurrency: a slot whose request ended "
            "unseen is freed"),
    Private("celery.worker.state", "active_requests", _is_set,
            "a set of the requests running", "testing plugin: a worker running a task is busy"),
    Private("celery.worker.state", "task_reserved", _callable("request"),
            "task_reserved(request)", "limits: a task let through is reserved as Celery does"),
    Private("celery.worker.state", "task_scheduled", _callable("request"),
            "task_scheduled(request)", "limits: a held task is listed like an ETA task",
            fallback="Celery < 5.7 tracks no scheduled request: a held task is not either",
            since="5.7"),
    Private("celery.worker.state", "scheduled_requests", _is_set,
            "a set of scheduled requests", "limits: a held task dropped on connection loss",
            fallback="Celery < 5.7 tracks no scheduled request: nothing to drop", since="5.7"),
    Private("celery.worker.state", "should_terminate", lambda o: o is None,
            "None until a worker of this process is to terminate (then 0)",
            "testing plugin: an in-process worker told to end as start_worker's exit does"),
    Private("celery.worker.state", "should_stop", lambda o: o is None,
            "None until a worker of this process is to stop warm (then its exit code)",
            "batches: a batch not yet in the pool when a warm stop begins does not start"),
    Private("celery.worker.state", "REVOKES_MAX", _number,
            "an int", "sync: default of extras_revoke_max",
            fallback="50000, Celery's documented default"),
    Private("celery.worker.state", "REVOKE_EXPIRES", _number,
            "a number of seconds", "sync: default of extras_revoke_expires",
            fallback="10800, Celery's documented default"),
    Private("celery.worker.request", "Request._eta_timer_entry", lambda o: o is None,
            "a class attribute, None until a timer entry is set",
            "limits: Celery's on_close() cancels a held task's timer entry",
            fallback="Celery < 5.7: the policies step cancels its own entries on close",
            since="5.7"),
    Private("celery.worker.request", "Request.on_accepted", _callable("pid", "time_accepted"),
            "on_accepted(pid, time_accepted), overridden in a subclass",
            "stats: a task counted as started"),
    Private("celery.worker.request", "Request.on_success", _callable("failed__retval__runtime"),
            "on_success((failed, retval, runtime)), overridden in a subclass",
            "stats: outcome and runtime counted; concurrency: the slot freed"),
    Private("celery.worker.request", "Request.on_failure", _callable("exc_info"),
            "on_failure(exc_info, ...), overridden in a subclass",
            "stats: failures counted; concurrency: the slot freed"),
    Private("celery.worker.request", "Request.terminate", _callable("pool", "signal"),
            "terminate(pool, signal=None), overridden in a subclass",
            "concurrency: the slot of a terminated task freed"),
    Private("celery.worker.request", "Request.cancel", _callable("pool", "signal"),
            "cancel(pool, signal=None, ...), overridden in a subclass",
            "concurrency: the slot of a task cancelled on a lost connection freed"),
    Private("celery.worker.request", "Request.on_timeout", _callable("soft", "timeout"),
            "on_timeout(soft, timeout), overridden in a subclass",
            "concurrency: the slot of a task killed by its hard time limit freed"),
    Private("celery.worker.request", "Request.execute_using_pool", _callable("pool"),
            "execute_using_pool(pool, ...), raising TaskRevokedError for a revoked task, "
            "overridden in a subclass",
            "concurrency: the slot of a task revoked while it waited freed"),
    Private("celery.worker.request", "Request._already_revoked", lambda o: o is False,
            "a class attribute, False until Celery announced the request revoked",
            "stats: a child killed by a terminate is not counted again as a failure",
            fallback="such a child counts as failed, as a lost worker would"),
    Private("celery.worker.request", "Request._already_cancelled", lambda o: o is False,
            "a class attribute, False until Celery cancelled the request",
            "stats: a child killed by a cancel is not counted as a failure",
            fallback="such a child counts as failed, as a lost worker would"),
    Private("kombu.common", "QoS.increment_eventually", _callable("n"),
            "increment_eventually(n=1)", "limits: prefetch widened while a task is held"),
    Private("kombu.common", "QoS.decrement_eventually", _callable("n"),
            "decrement_eventually(n=1)", "limits: prefetch narrowed when a held task goes"),
    Private("celery.utils.collections", "LimitedSet", _limited_set_data,
            "LimitedSet()._data, a dict in insertion order", "sync: revoked ids listed",
            fallback="the set's own (sorted) iteration, slower", probe=True),
    Private("celery.local", "PromiseProxy", _promise_proxy_parts,
            "_Proxy__args and _Proxy__kwargs of a pending @app.task",
            "limit()/retry_policy() above @app.task before the app is finalized", probe=True),
    Private("celery.local", "Proxy", _proxy_local,
            "_Proxy__local, the getter of a @shared_task proxy",
            "limit()/retry_policy() above @shared_task", probe=True),
    Private("celery", "shared_task", _shared_task_closure,
            "closure cells 'fun' and 'name' of the shared task's getter",
            "limit()/retry_policy() above @shared_task", probe=True),
    Private("celery._state", "connect_on_app_finalize", _callable("callback"),
            "connect_on_app_finalize(callback), called with every app as it finalizes",
            "a policy task sent from an app without install(app) warns",
            fallback="no warning at send (the worker still refuses to start)", probe=True),
    Private("celery.events.receiver", "EventReceiver._receive", _receive,
            "_receive(body, message), the callback of get_consumers()",
            "stats monitor: a malformed event is dropped, not raised"),
    Private("celery.concurrency.prefork", "TaskPool", _pool_has_poller,
            "TaskPool()._pool.on_poll_start, the prefork pool's writer tick",
            "fair queues: jobs handed on reach idle processes at once",
            fallback="jobs reach the processes at the event loop's next wake-up", probe=True),
    Private("celery.concurrency.asynpool", "AsynPool.flush", _flush_discards_by_job,
            "flush() discards a job not _accepted through job.discard(), the jobs in _cache "
            "keyed by job._job, job._write_to the process it was written to",
            "pool flush guard: a job written to a process at a stop is waited for",
            fallback="a job in flight at a stop makes the stop 30 s longer and runs again",
            probe=True),
    Private("kombu.asynchronous.semaphore", "LaxBoundedSemaphore", _semaphore_waiting,
            "LaxBoundedSemaphore(n)._waiting, with _add_waiter/_pop_waiter its append/popleft",
            "priority: requests waiting for a prefork process taken in priority order",
            fallback="requests wait for a process in arrival order (the broker's order only)",
            probe=True),
    Private("kombu.transport.virtual", "Transport", _transport_channels,
            "Transport().channels, the list of open channels",
            "Redis close guard: acks on a lost connection dropped", probe=True),
    Private("celery.worker.consumer.consumer", "Consumer.update_strategies", _callable(),
            "update_strategies(), building consumer.strategies anew",
            "delay gate, stats: a reload's new strategies wrapped again"),
    Private("celery.concurrency.thread", "TaskPool", _thread_pool_executor,
            "TaskPool().executor, a ThreadPoolExecutor (shut down on stop, not on terminate)",
            "testing plugin: a terminated in-process worker's threads stopped",
            fallback="the threads of a terminated thread pool are left running", probe=True),
    Private("kombu.transport.virtual", "QoS", _virtual_qos,
            "QoS()._delivered (dict) and _dirty (set): messages delivered, and acked of them",
            "testing plugin: a worker with a message unacked is not settled",
            fallback="the plugin's settle sees only queues and requests", probe=True),
    Private("celery.worker.request", "Request._payload", _payload,
            "a cached property: the message body's (args, kwargs, embed)",
            "covered messages: their callbacks, errbacks, chain and chord kept for their end",
            fallback="the message's payload (kombu's Message.payload), the same tuple"),
    Private("kombu.asynchronous.hub", "Hub._close_poller", _hub_forgets_its_poller,
            "Hub.close() sets the hub's _poller to None",
            "event loop guard: a closed loop another worker left current is forgotten",
            fallback="the loop is taken as open (kombu 5.6 forgets a loop as it closes)"),
    Private("kombu.connection", "Connection.collect", _callable(),
            "Connection.collect()", "Redis close guard: wraps the close of a lost connection"),
    Private("celery.bin.purge", "purge", _purge_command,
            "a click command with -f, -Q and -X, emptying -Q (else every queue the app "
            "declares) but -X",
            "delay store: celery purge drops the tasks parked for the queues it empties",
            fallback="celery purge empties the broker's queues only (app.control.purge() and "
            "celery extras delayed --drop drop parked tasks)", probe=True),
    Private("celery.app.base", "Celery.control_cls", _control_cls,
            "the control class's name, 'celery.app.control:Control' by default, and "
            "app.control made once, kept in the app's __dict__",
            "delay store: app.control.purge() drops the tasks parked for its queues",
            fallback="app.control.purge() empties the broker's queues only", probe=True),
    Private("celery.app.control", "Control.purge", _control_purge,
            "purge(connection=None), emptying the app's consume_from queues",
            "delay store: app.control.purge() drops the tasks parked for its queues",
            fallback="app.control.purge() empties the broker's queues only", probe=True),
    Private("kombu.connection", "Connection.release", _callable(),
            "Connection.release()", "Redis close guard: wraps the close of a lost connection"),
    Private("kombu.transport.redis", "Channel._q_for_pri", _callable("queue", "pri"),
            "_q_for_pri(queue, pri), the list of a queue's priority step",
            "queue figures: a Redis queue's depth and oldest message, over its lists"),
)  # fmt: skip


def _find(entry: Private, import_module: Callable[[str], ModuleType]) -> Any:
    obj: Any = import_module(entry.module)
    for part in entry.path.split("."):
        obj = getattr(obj, part)
    return obj


def missing(
    entries: Iterable[Private] = PRIVATE,
    import_module: Callable[[str], ModuleType] = importlib.import_module,
    probes: bool = True,
) -> list[tuple[Private, str]]:
    """``(entry, what is wrong)`` for each entry absent or of another shape than relied on."""
    problems: list[tuple[Private, str]] = []
    for entry in entries:
        if entry.probe and not probes:
            continue
        try:
            found = _find(entry, import_module)
        except (ImportError, AttributeError) as exc:
            problems.append((entry, f"{entry.name} is missing ({exc})"))
            continue
        try:
            ok = entry.shape(found)
        except Exception as exc:
            ok, why = False, f" ({exc!r})"
        else:
            why = ""
        if not ok:
            problems.append((entry, f"{entry.name} is not {entry.expects}{why}"))
    return problems


def check_worker(import_module: Callable[[str], ModuleType] = importlib.import_module) -> None:
    """At worker start: fail naming the Celery version and feature when a required internal
    is missing; log what falls back."""
    problems = missing(import_module=import_module, probes=False)
    required = [f"{why}: needed by {e.used_by}" for e, why in problems if e.fallback is None]
    if required:
        raise ImproperlyConfigured(
            f"celery-extras does not support Celery {CELERY_VERSION} / kombu {KOMBU_VERSION}: "
            + "; ".join(required)
        )
    for entry, why in problems:
        logger.info("celery-extras on Celery %s: %s; %s", CELERY_VERSION, why, entry.fallback)


# -- celery.worker.state -----------------------------------------------------------------------

REVOKES_MAX: int = getattr(_state, "REVOKES_MAX", 50000)
REVOKE_EXPIRES: float = getattr(_state, "REVOKE_EXPIRES", 10800)


def worker_revoked() -> Any:
    """The worker's revoked ids (a ``celery.utils.collections.LimitedSet``)."""
    return _state.revoked


def worker_revoked_stamps() -> dict[str, Any]:
    """The worker's revoked stamps ``{header: value or [values]}``."""
    stamps: dict[str, Any] = _state.revoked_stamps
    return stamps


def on_strategies_rebuilt(consumer: Any, callback: Callable[[Any], None], on: bool = True) -> None:
    """Call ``callback(consumer)`` each time the consumer builds its strategies anew while it
    runs (``Consumer.update_strategies``, which ``WorkController.reload()`` calls: the way
    Celery's test workers learn a task defined in a test); *on* ``False`` stops that."""
    callbacks: list[Callable[[Any], None]] | None = consumer.__dict__.get("_extras_rebuilt")
    if callbacks is None:
        callbacks = consumer._extras_rebuilt = []
        original = consumer.update_strategies

        def update_strategies(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            for each in list(callbacks):
                each(consumer)
            return result

        consumer.update_strategies = update_strategies
    if on and callback not in callbacks:
        callbacks.append(callback)
    elif not on and callback in callbacks:
        callbacks.remove(callback)


def terminate_workers() -> None:
    """Tell this process's workers to terminate, as Celery's ``start_worker`` does when its
    block ends (each sees it at the top of its event loop's next round)."""
    _state.should_terminate = 0


def worker_stopping() -> bool:
    """Whether a warm or cold stop of this process's worker began (Celery's signal handler
    set the flag its loop reads; the loop still takes messages for one more turn)."""
    flags = (getattr(_state, "should_stop", None), getattr(_state, "should_terminate", None))
    return any(flag is not None and flag is not False for flag in flags)


def stop_pool_threads(pool: Any) -> None:
    """Stop the threads of Celery's thread pool, which a terminate (the in-process test
    worker's end) leaves running; nothing for other pools."""
    executor = getattr(pool, "executor", None)
    if executor is not None and hasattr(executor, "shutdown"):
        executor.shutdown(wait=True, cancel_futures=True)


def unacked_messages(consumer: Any) -> int:
    """Messages the consumer's channel delivered and has not acked (0 on a transport that
    does not count them here, as py-amqp's)."""
    channel = getattr(getattr(consumer, "task_consumer", None), "channel", None)
    qos = getattr(channel, "qos", None)
    delivered, dirty = getattr(qos, "_delivered", None), getattr(qos, "_dirty", None)
    if not isinstance(delivered, dict) or not isinstance(dirty, set):
        return 0
    return max(0, len(delivered) - len(dirty))


def active_requests() -> Any:
    """The set of requests running in this process's workers."""
    return _state.active_requests


def reserved_requests() -> Any:
    """The set of requests reserved for the pool."""
    return _state.reserved_requests


def request_pending(request: RequestLike) -> bool:
    """*request* is reserved or running in this worker (Celery has not marked it ready).

    By identity, in the reserved or the active set: a second delivery of the same task id
    is another request, and its bookkeeping says nothing of this one. The active set too:
    Celery 5.5 and 5.6 empty the reserved set as the connection is lost
    (``Consumer.on_close``; celery#10345, fixed in 5.7), running requests with it, and one
    the pool accepts after that joins the active set alone. Their bodies run on.
    """
    return request in _state.reserved_requests or request in _state.active_requests


def request_embed(request: Any) -> dict[str, Any]:
    """The *embed* of a worker request's body (protocol 2: ``callbacks``, ``errbacks``,
    ``chain``, ``chord``), which Celery merges into the task's context only in the pool;
    ``{}`` when the body has none (or is not a protocol 2 body)."""
    try:
        payload = request._payload
    except AttributeError:
        payload = getattr(getattr(request, "message", None), "payload", None)
    embed = payload[2] if isinstance(payload, tuple | list) and len(payload) == 3 else None
    return embed if isinstance(embed, dict) else {}


def task_reserved(request: RequestLike) -> None:
    """Reserve *request* as Celery's strategy does before handing it to the pool."""
    _state.task_reserved(request)


def track_held(request: RequestLike, entry: TimerEntry) -> None:
    """Register a request held in the timer as Celery registers an ETA task.

    Celery 5.7 lists it among the scheduled requests, and its ``on_close()`` cancels
    the request's timer entry; older releases track ETA tasks nowhere, and neither
    does this (the policies step cancels its own entries when the connection goes).
    """
    scheduled = getattr(_state, "task_scheduled", None)
    if scheduled is None:
        return
    if "_eta_timer_entry" in dir(type(request)):
        request._eta_timer_entry = entry  # type: ignore[attr-defined]
    scheduled(request)


def revoked_or_cancelled(request: Any) -> bool:
    """Whether Celery already revoked (terminated) or cancelled *request* itself."""
    return bool(getattr(request, "_already_revoked", False)) or bool(
        getattr(request, "_already_cancelled", False)
    )


def forget_held(request: RequestLike) -> None:
    """Drop a held request from the worker's state (its message goes back to the broker)."""
    scheduled = getattr(_state, "scheduled_requests", None)
    if scheduled is not None:
        scheduled.discard(request)
    _state.requests.pop(request.id, None)


# -- the prefetch window -----------------------------------------------------------------------


def widen_prefetch(consumer: ConsumerLike) -> None:
    """One more unacked message allowed (a task waits without a pool slot)."""
    consumer.qos.increment_eventually()


def narrow_prefetch(consumer: ConsumerLike) -> None:
    """Undo :func:`widen_prefetch`."""
    consumer.qos.decrement_eventually()


# -- collections, proxies, apps ----------------------------------------------------------------


def limited_set_newest(limited: Any, limit: int) -> list[Any]:
    """The *limit* items of a ``LimitedSet`` added last, oldest first.

    Read from the end of its dict (nothing else is copied); without it, from the
    set's own (sorted) iteration.
    """
    data = getattr(limited, "_data", None)
    if not isinstance(data, Mapping):
        return list(limited)[-limit:] if limit > 0 else []
    newest = list(itertools.islice(reversed(data), max(limit, 0)))
    newest.reverse()
    return newest


def on_every_app_finalize(callback: Callable[[Any], None]) -> None:
    """Call *callback* with every app as it finalizes (the hook ``@shared_task`` uses)."""
    connect = getattr(importlib.import_module("celery._state"), "connect_on_app_finalize", None)
    if connect is not None:
        connect(callback)


def promise_proxy_parts(proxy: Any) -> tuple[tuple[Any, ...], Mapping[str, Any]]:
    """``(args, kwargs)`` a pending ``@app.task`` proxy will build its task from."""
    args = object.__getattribute__(proxy, "_Proxy__args")
    kwargs = object.__getattribute__(proxy, "_Proxy__kwargs")
    return tuple(args), dict(kwargs)


def shared_task_parts(proxy: Any) -> tuple[Callable[..., Any] | None, str | None]:
    """``(function, name)`` behind a ``@shared_task`` proxy (``None`` where not found)."""
    local = object.__getattribute__(proxy, "_Proxy__local")
    code = getattr(local, "__code__", None)
    cells = getattr(local, "__closure__", None) or ()
    if code is None:
        return None, None
    scope = {n: c.cell_contents for n, c in zip(code.co_freevars, cells, strict=False)}
    fun, name = scope.get("fun"), scope.get("name")
    return (fun if callable(fun) else None), (name if isinstance(name, str) else None)


class DroppingEventReceiver(EventReceiver):
    """An ``EventReceiver`` whose messages go to :meth:`receive_events` (its ``_receive``)."""

    def receive_events(self, body: Any, message: Any) -> None:
        raise NotImplementedError

    def _receive(self, body: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        self.receive_events(body, message)


# -- the pool, kombu connections ---------------------------------------------------------------


def loop_closed(hub: Any) -> bool:
    """Whether the event loop *hub* was closed (its poller gone)."""
    return getattr(hub, "_poller", True) is None


def pool_poll_start(pool: Any) -> Callable[[], None] | None:
    """The prefork pool's writer tick (``on_poll_start``), or ``None`` for other pools."""
    tick = getattr(getattr(pool, "_pool", None), "on_poll_start", None)
    return tick if callable(tick) else None


def keep_written_jobs(pool: Any, kept: Callable[[int], None]) -> bool:
    """Make the prefork pool's ``flush`` keep the jobs already written to a live process.

    ``flush`` (``Consumer.on_close``: the connection lost, or the worker stopping)
    discards every job its process has not yet acknowledged receiving, from Celery 5.6
    on; a job written whole to the process's pipe runs all the same, and its result goes
    uncounted: the process then waits 30 s at exit for the count
    (``billiard.pool.Worker._ensure_messages_consumed``) and the pool's join with it, and
    the message, never acked, runs again. Kept, the job's acceptance and result are read as
    any other's. *kept* hears how many a flush kept. ``False`` for a pool with no such
    ``flush`` (not prefork, or one that negotiates with ``synack``)."""
    asyn = getattr(pool, "_pool", None)
    flush, cache = getattr(pool, "flush", None), getattr(asyn, "_cache", None)
    if not callable(flush) or not isinstance(cache, dict) or getattr(asyn, "synack", True):
        return False

    def written(job: Any) -> bool:
        process = getattr(job, "_write_to", None)
        return process is not None and not getattr(job, "_accepted", True) and process._is_alive()

    def guarded() -> None:
        jobs = {key: job for key, job in cache.items() if written(job)}
        for job in jobs.values():
            job.discard = _not_discarded  # shadows ApplyResult.discard for this flush
        try:
            flush()
        finally:
            for key, job in jobs.items():
                del job.discard
                cache.setdefault(key, job)
        if jobs:
            kept(len(jobs))

    pool.flush = guarded
    return True


def _not_discarded() -> None:
    """A written job's ``discard`` during a flush: it stays in the pool's cache."""


def order_semaphore_waiting(semaphore: Any, waiting: Any) -> bool:
    """Make *waiting* (``append``, ``popleft``, ``clear``, ``len``) the list of requests
    waiting for a pool process in the worker's ``LaxBoundedSemaphore``; ``False`` (left as
    it is) when the semaphore is not shaped so or already has waiters."""
    found = getattr(semaphore, "_waiting", None)
    if found is None or len(found) or not hasattr(semaphore, "_pop_waiter"):
        return False
    semaphore._waiting = waiting
    semaphore._add_waiter = waiting.append
    semaphore._pop_waiter = waiting.popleft
    return True


def transport_channels(transport: Any) -> list[Any]:
    """The open channels of a virtual kombu transport (Redis...)."""
    channels: list[Any] = getattr(transport, "channels", None) or []
    return channels


def redis_queue_keys(channel: Any, queue: str) -> list[str]:
    """The lists of *queue* on kombu's Redis *channel*, one per priority step, with the
    transport's ``global_keyprefix``."""
    prefix = getattr(channel, "global_keyprefix", "") or ""
    steps = getattr(channel, "priority_steps", None) or [0]
    return list(dict.fromkeys(prefix + channel._q_for_pri(queue, step) for step in steps))


#: Seconds between kombu's restores of unacked Redis messages where it has no setting for it
#: (kombu 5.5 and 5.6: its event loop's timer, hard-coded)
RESTORE_INTERVAL = 10.0


def restore_interval(connection: Any) -> float:
    """Seconds between kombu's Redis transport's restores of unacked messages, as its event
    loop timer has them: ``unacked_restore_interval`` (kombu 5.7), else 10."""
    from kombu.transport.redis import Channel

    if not hasattr(Channel, "unacked_restore_interval"):
        return RESTORE_INTERVAL
    default = float(Channel.unacked_restore_interval)
    interval = connection.transport_options.get("unacked_restore_interval", default)
    return float(interval) if is_number(interval) and float(interval) > 0 else default


def replace_connection_close(
    connection: Any, wrap: Callable[[Callable[..., None], bool], Callable[..., None]]
) -> None:
    """Route ``collect`` (a lost connection: ``wrap(collect, False)``), ``release`` and
    ``close`` (a clean stop: ``wrap(release, True)``) of a kombu Connection through *wrap*."""
    connection.collect = wrap(connection.collect, False)
    connection.release = connection.close = wrap(connection.release, True)


def drop_acks(channel: Any, dropped: Callable[..., None]) -> None:
    """Make ``basic_ack``/``basic_reject`` of a kombu channel call *dropped* instead."""
    channel.basic_ack = channel.basic_reject = dropped


# -- the command line and app.control ----------------------------------------------------------

#: Called by ``celery purge`` once it emptied the broker's queues (:func:`after_purge_command`).
AfterPurge = Callable[[click.Context, set[str]], None]
_after_purge: list[AfterPurge] = []


def purge_command_queues(
    app: Any, queues: Iterable[str] | None, exclude_queues: Iterable[str] | None
) -> set[str]:
    """The queues ``celery purge`` empties: those of ``-Q`` (else every queue the app
    declares) but those of ``-X``, as ``celery/bin/purge.py`` computes them."""
    return set(queues or app.amqp.queues.keys()) - set(exclude_queues or [])


def after_purge_command(after: AfterPurge, on: bool = True, note: str = "") -> bool:
    """Make ``celery purge`` call ``after(ctx, queues)`` once it has emptied the broker's
    *queues* (not when it was refused at its prompt, nor when it failed); *on* ``False``
    stops that. *note*: a paragraph added, once, to the command's help. Celery's command is
    wrapped once, in place (its callback): the command group it belongs to adds it after
    loading the ``celery.commands`` plugins, so it cannot be replaced. ``False`` (nothing
    done) when Celery's command is not of the shape relied on."""
    from celery.bin.purge import purge

    if missing([e for e in PRIVATE if e.name == "celery.bin.purge.purge"]):
        return False
    if note and note not in (purge.help or ""):
        purge.help = f"{(purge.help or '').rstrip()}\n\n{note}"
    if not getattr(purge.callback, "_extras_after_purge", False):
        original = purge.callback
        assert original is not None

        @functools.wraps(original)
        def callback(*args: Any, **params: Any) -> Any:
            result = original(*args, **params)
            ctx = click.get_current_context()
            names = purge_command_queues(ctx.obj.app, params.get("queues"),
                                         params.get("exclude_queues"))  # fmt: skip
            for each in list(_after_purge):
                each(ctx, names)
            return result

        callback._extras_after_purge = True  # type: ignore[attr-defined]
        purge.callback = callback
    if on and after not in _after_purge:
        _after_purge.append(after)
    elif not on and after in _after_purge:
        _after_purge.remove(after)
    return True


def control_purge_queues(app: Any) -> list[str]:
    """The queues ``app.control.purge()`` empties: those ``app.amqp.TaskConsumer`` consumes
    by default, the app's ``consume_from`` (outside a worker, every queue it declares)."""
    return list(app.amqp.queues.consume_from)


_mixes: dict[tuple[type[Any], type[Any]], type[Any]] = {}


def _mixed(mixin: type[Any], base: type[Any]) -> type[Any]:
    """*base* with *mixin* first in its MRO (made once per pair)."""
    if issubclass(base, mixin):
        return base
    mixed = _mixes.get((mixin, base))
    if mixed is None:
        name = f"{mixin.__name__}{base.__name__}"
        mixed = _mixes[mixin, base] = type(name, (mixin, base), {"__module__": mixin.__module__})
    return mixed


def with_control_mixin(app: Any, mixin: type[Any]) -> None:
    """Make *app*'s ``app.control`` a *mixin* (a subclass of Celery's ``Control`` whose
    methods end in ``super()``) on top of the app's own control class, whatever it is
    (Celery's, a user's, another capability's): through ``app.control_cls``, or, where
    ``app.control`` was made already (a cached property, kept in the app's ``__dict__``),
    on that instance."""
    from kombu.utils.imports import symbol_by_name

    made = vars(app).get("control")
    if made is not None:
        if not isinstance(made, mixin):
            made.__class__ = _mixed(mixin, type(made))
        return
    current = app.control_cls
    base = symbol_by_name(current) if isinstance(current, str) else current
    app.control_cls = _mixed(mixin, base)
