"""Per-queue concurrency (``extras_queue_concurrency``): the slot gate, per queue.

A cap applies to every task of its queue, with a policy or without one:

* a task with a policy passes the pipeline anyway; :class:`QueueSlotGate` is one more gate
  of its chain (right after ``concurrency()``'s), which lets a request of an uncapped queue
  on and takes a slot of its queue's bucket for one of a capped queue;
* a task without a policy has Celery's strategy: its requests reach the consumer's
  ``on_task_request``, where the request hook asks :meth:`QueueSlotGate.divert` first
  (the one line ``admission/request_hook.py`` has for it); a request of a capped queue is
  submitted to the pipeline instead, and goes on to the pool once the gate grants it a
  slot (then the hook lets it through).

A request waiting for its queue's slot holds no pool process and widens the prefetch
window, as ``concurrency()``'s waits do; the slots, their leases, the store's tickets
(``scope: "global"``), the release notices and the renewals are the slot gate's. The queue
of a request is the queue among those the worker consumes that its route names (a due
queue's is the queue it serves).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery, bootsteps
from celery.exceptions import ImproperlyConfigured

from ..admission.gate import Ticket
from ..admission.handle import GateHandle
from ..admission.request_hook import request_hook
from ..admission.spec import PolicyError
from ..delay.parking import origin_queue
from ..settings import settings_of
from .gate import SlotGate
from .queue_caps import SETTING, bucket_name, normalised, queue_caps

__all__ = ["QueueCapsHook", "QueueSlotGate", "check_setting", "connect", "queue_of"]


def check_setting(key: str, value: Any) -> dict[str, dict[str, Any]]:
    """The setting's check: its value in full, or an error naming the setting."""
    try:
        return normalised(key, value)
    except PolicyError as exc:
        raise ImproperlyConfigured(str(exc)) from None


class QueueCapsHook(bootsteps.Step):
    """Consumer step: with queue caps, the request hook wraps ``on_task_request`` as the
    consumer is made, before Celery's strategies take it (the stats' step does too; this
    one makes the caps hold with ``extras_stats_enabled = False``)."""

    label = "extras-queue-caps-hook"

    def create(self, c: Any) -> None:
        if settings_of(c.app)["queue_concurrency"]:
            request_hook(c).wrap(c)


def connect(app: Celery) -> None:
    """Once per app: the consumer step above."""
    app.steps["consumer"].add(QueueCapsHook)


def queue_of(app: Celery, request: Any) -> str | None:
    """The queue *request* came from, among those the worker consumes."""
    info = getattr(request, "delivery_info", None) or {}
    queues = app.amqp.queues.consume_from or app.amqp.queues
    return origin_queue(list(queues.values()), str(info.get("exchange") or ""),
                        str(info.get("routing_key") or ""))  # fmt: skip


class QueueSlotGate(SlotGate):
    """The slots of capped queues: one bucket per queue, ``queue:<name>``."""

    label = "queue_concurrency"

    def __init__(self, app: Celery, settings: Mapping[str, Any]) -> None:
        super().__init__(app, settings)
        self.caps = queue_caps(SETTING, settings["queue_concurrency"])
        self.specs = {bucket_name(queue): spec for queue, spec in self.caps.items()}
        self._routed: set[str] = set()  # tasks without a policy this gate routes

    def handles(self, name: str) -> bool:
        return bool(self.caps)

    def register(self, name: str, policies: Any) -> None:
        """Nothing per task: the request's queue decides."""

    def spec_name(self, ticket: Ticket) -> str | None:
        queue = queue_of(self.app, ticket.request)
        return bucket_name(queue) if queue in self.caps else None

    def start(self, handle: GateHandle, consumer: Any) -> None:
        super().start(handle, consumer)
        if self.caps:
            hook = request_hook(consumer)
            hook.divert = self.divert
            hook.wrap(consumer)

    def divert(self, request: Any) -> bool:
        """``True`` when *request* (reaching the consumer's ``on_task_request``) is a task
        without a policy from a capped queue, not yet granted its slot: it is submitted to
        the pipeline instead of going to the pool."""
        if id(request) in self.grants or self._handle is None:
            return False  # granted: on to the pool
        name = getattr(request, "name", None)
        if not isinstance(name, str) or queue_of(self.app, request) not in self.caps:
            return False
        if name not in self._routed:
            if self._handle.has_gates(name):
                return False  # a task with a policy: this gate is in its chain already
            self._routed.add(name)
        self._handle.submit(request, name)
        return True

    def info(self) -> dict[str, Any]:
        figures = super().info()
        figures["queues"] = {
            name.removeprefix("queue:"): entry for name, entry in figures.pop("tasks").items()
        }
        return figures
