"""The delay store as ``install(app)`` wires it: settings, the due queues, mover, gate, and
``app.control.purge()`` dropping parked tasks too (:mod:`.purge`)."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps
from celery.worker.consumer.tasks import Tasks

from .. import compat
from ..admission.registry import policies_of
from ..capability import Capability
from ..settings import Setting, boolean, integer, number, optional, settings_of
from ..store.client import StoreStep, store_url
from .entry import DUE_SUFFIX, due_queue_name
from .gate import DELAY_ATTR, ArrivalGate
from .mover_thread import MoverThread
from .parking import STORE_ERRORS, Parker, due_queue
from .purge import connect

__all__ = ["DELAY", "DelayGateStep", "DelayWorkerStep", "delayed", "parking_uses"]

logger = logging.getLogger(__name__)


def parking_uses(app: Celery) -> list[str]:
    """Why workers of *app* may park tasks: ``extras_eta_store``, and each task with a policy
    that parks (a ``limit()`` hands tasks back, a ``retry_policy()`` parks long countdowns,
    a ``coalesce()`` or ``debounce()`` a long-waiting message). Empty: nothing of the app
    parks, so its workers need no due queue and no mover."""
    uses = ["extras_eta_store"] if settings_of(app)["eta_store"] else []
    for name, task in sorted(app.tasks.items()):
        policies = policies_of(task)
        for policy in policies.declared() if policies is not None else ():
            if policy.parks:
                uses.append(f"{policy.decorator} on {name}")
    return uses


def _left_parked(parker: Parker) -> str | None:
    """Why a worker whose app parks nothing must release all the same: entries parked
    earlier (before ``extras_eta_store`` or the last policy was taken away), or a store
    it cannot read at start (it may hold some). ``None``: the store holds none."""
    try:
        depth = parker.store.depth()
    except STORE_ERRORS as exc:
        return f"the delay store could not be read at start ({exc!r:.100})"
    return f"{depth} entries parked earlier" if depth else None


def delayed(app: Celery) -> dict[str, Any]:
    """What the delay store holds and who releases it: ``{"depth", "shards": {shard:
    depth}, "tasks": {name: {"parked", "next_due_in"}}, "uses", "due_queues", "store"}``:
    why the app parks, the due queues its workers consume for that, and the store's
    eviction policy."""
    parker = Parker(app, background=True)
    store = parker.store
    summary = store.summary()
    app.loader.import_default_modules()  # the task modules a worker imports (include, imports)
    uses = parking_uses(app)
    parker.safety.check()  # read now, not the cached verdict of an earlier call
    shards = store.shard_depths()
    return {
        "depth": sum(shards.values()),
        "shards": shards,
        "tasks": {
            name: {"parked": s.parked, "next_due_in": s.next_in}
            for name, s in sorted(summary.items())
        },
        "uses": uses,
        "due_queues": sorted(due_queue_name(q) for q in app.amqp.queues) if uses else [],
        "store": parker.safety.info(),
    }


class DelayWorkerStep(bootsteps.StartStopStep):
    """Worker step: where the app may park tasks, consume the due queue of each queue and
    run this worker's mover; elsewhere nothing (no queue, no thread, no polling). The mover
    starts after the pool: a pool process forked while it works could inherit its locks."""

    label = "extras-delay"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        super().__init__(w, **kwargs)
        app = w.app
        self.thread: MoverThread | None = None
        self.uses: list[str] = []
        self.due_queues: list[str] = []
        if store_url(app) is None:
            return
        settings = settings_of(app)
        self.parker = Parker(app, settings["delay_tombstone_ttl"], background=True)
        self.looking = Parker(app, settings["delay_tombstone_ttl"])  # info(), on the loop
        self.uses = parking_uses(app)
        if not self.uses:
            left = _left_parked(self.parker)
            if left is None:
                return
            logger.warning("celery-extras: nothing of this app parks tasks, but %s: this "
                           "worker consumes due queues and releases them", left)  # fmt: skip
            self.uses = [left]
        queues = app.amqp.queues
        for name in list(queues.consume_from or ()):
            if not name.endswith(DUE_SUFFIX):
                queues.select_add(due_queue(name))
                self.due_queues.append(due_queue_name(name))
        self.thread = MoverThread(app, self.parker, settings)

    def start(self, w: Any) -> None:
        if self.thread is not None:
            self.thread.start()

    def stop(self, w: Any) -> None:
        if self.thread is not None:
            self.thread.stop()

    shutdown = terminate = stop  # the in-process test worker ends with terminate

    def info(self, w: Any) -> dict[str, Any]:
        if self.thread is None:
            return {"extras_delay": {"due_queues": [], "uses": []}}
        out: dict[str, Any] = {**self.thread.info(), "due_queues": self.due_queues,
                               "uses": self.uses}  # fmt: skip
        looking = self.looking
        if not looking.health.up():  # asked on the worker's loop: never wait on it
            out["depth"], out["store"] = None, f"down: {looking.health.reason}"[:200]
            return {"extras_delay": out}
        try:
            out["depth"] = out["parked"] = looking.store.depth()  # the whole store's
            out["store"] = "ok"
        except STORE_ERRORS as exc:
            looking.store_failed("reading its depth", exc)
            out["depth"], out["store"] = None, f"down: {exc!r}"[:200]
        return {"extras_delay": out}


class DelayGateStep(bootsteps.StartStopStep):
    """Consumer step: every task strategy passes through the :class:`ArrivalGate`."""

    label = "extras-delay-gate"
    requires = (Tasks, StoreStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        app = c.app
        self.gate: ArrivalGate | None = None
        if store_url(app) is None:
            return
        settings = settings_of(app)
        self.gate = ArrivalGate(
            app,
            Parker(app, settings["delay_tombstone_ttl"]),
            eta_store=settings["eta_store"],
            eta_threshold=settings["eta_threshold"],
            store_retry=settings["store_retry"],
        )
        setattr(c, DELAY_ATTR, self.gate)

    def start(self, c: Any) -> None:
        if self.gate is None:
            return
        self._wrap(c)
        compat.on_strategies_rebuilt(c, self._wrap)

    def _wrap(self, c: Any) -> None:
        assert self.gate is not None
        for name, strategy in list(c.strategies.items()):
            c.strategies[name] = self.gate.wrap(c, name, strategy)

    def stop(self, c: Any) -> None:
        if self.gate is not None:
            compat.on_strategies_rebuilt(c, self._wrap, on=False)
            self.gate.stop()

    shutdown = stop

    def info(self, c: Any) -> dict[str, Any]:
        return {"extras_delay_gate": self.gate.info()} if self.gate is not None else {}


DELAY = Capability(
    name="delay",
    settings=(
        Setting(
            "delay_max_hold",
            2.0,
            number(minimum=0),
            "float",
            "Longest wait (seconds) a task is held in the worker (no pool slot, prefetch "
            "window widened): a rate-limited task, a coalesced waiting run. A longer wait "
            "parks the message in the delay store (a limited task with its booked slot; "
            "stored, then the original acked); so does a retry whose countdown is longer. "
            "Formerly ``extras_limit_max_hold``.",
            formerly=("limit_max_hold",),
        ),
        Setting(
            "delay_lead",
            1.0,
            number(minimum=0),
            "float",
            "Seconds before its due time a mover publishes a parked task (to the due "
            "queue of its queue), so that it reaches a worker on time.",
        ),
        Setting(
            "delay_lookahead",
            300.0,
            number(minimum=0),
            "float",
            "Seconds before their due time that movers may publish the ETA and retry tasks "
            "of a herd (at most half the Redis broker's visibility timeout): a herd due at "
            "once then reaches the workers' timers ahead of its time, as Celery's own ETA "
            "tasks do, instead of queueing behind itself when it falls due. 0: every task "
            "is published ``extras_delay_lead`` seconds before it is due.",
        ),
        Setting(
            "delay_herd_rate",
            100.0,
            number(above=0),
            "float",
            "Tasks per second the workers are counted on to take when a herd falls due: a "
            "parked ETA or retry task is published early when more tasks are due up to its "
            "time than that rate takes meanwhile (a steady stream slower than it never is).",
        ),
        Setting(
            "delay_shards",
            None,
            optional(integer(minimum=1, maximum=256)),
            "int | None",
            "Shards of the delay store, each under a hash tag of its own (a Redis Cluster "
            "spreads them over its masters evenly when this is a multiple of their number). "
            "``None``: 12 on a Redis Cluster, 1 elsewhere. Changing it later is safe: "
            "movers go on releasing what the former shards hold.",
        ),
        Setting(
            "delay_lease",
            10.0,
            number(above=0),
            "float",
            "Seconds a mover holds a claimed entry; an entry whose mover died is claimed "
            "again by another mover after that.",
        ),
        Setting(
            "delay_recheck",
            600.0,
            number(above=0),
            "float",
            "Seconds after publishing an entry that the mover publishes it again if no "
            "worker has taken it yet (the broker lost the message); copies run once.",
        ),
        Setting(
            "delay_poll",
            0.25,
            number(above=0),
            "float",
            "Longest sleep of a mover between two looks at the store.",
        ),
        Setting(
            "delay_batch",
            100,
            integer(minimum=1, maximum=10_000),
            "int",
            "Most entries a mover claims at once.",
        ),
        Setting(
            "delay_tombstone_ttl",
            86400.0,
            number(above=0),
            "float",
            "Seconds the store remembers a taken entry, so that a second copy of its "
            "message (or a redelivery of the parked original) is recognised and dropped.",
        ),
        Setting(
            "delay_park_replicas",
            None,
            optional(integer(minimum=0, maximum=100)),
            "int | None",
            "Replicas that must acknowledge a parked task (Redis ``WAIT``) before its "
            "message is acked, so a failover cannot drop it; when fewer do within "
            "``extras_delay_park_wait``, the park is withdrawn and the task held or kept "
            "unacked. ``None``: 1 when the store is behind Sentinel, 0 (no ``WAIT``) on a "
            "single Redis or a Redis Cluster.",
        ),
        Setting(
            "delay_park_wait",
            1.0,
            number(above=0),
            "float",
            "Seconds a park waits for ``extras_delay_park_replicas`` replicas to acknowledge "
            "it. While none does, parks are tried again at most every 5 s per process.",
        ),
        Setting(
            "eta_store",
            False,
            boolean,
            "bool",
            "Park every task that arrives with an ETA or countdown further away than "
            "``extras_eta_threshold`` in the delay store instead of keeping it in the "
            "worker's memory, unacked (where Redis' visibility timeout delivers it again).",
        ),
        Setting(
            "eta_threshold",
            30.0,
            number(minimum=0),
            "float",
            "Seconds of ETA beyond which ``extras_eta_store`` parks a task.",
        ),
    ),
    worker_steps=(DelayWorkerStep,),
    consumer_steps=(DelayGateStep,),
    connect=connect,
)
