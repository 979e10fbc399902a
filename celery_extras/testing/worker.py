"""An in-process worker as simulated time sees it: its parked waits, and when it is quiet.

:class:`SettlingWorker` is what :class:`~.clock.SimulatedClock` attaches: it reads the
earliest due time of the app's delay store, releases what is due through a mover of its
own (the worker's mover thread may release it too: a claim goes to one of them), and
settles: what it released was taken by the worker, the worker's queues are empty, no
message is unacked but those waiting in its gates, no request is reserved or running, and
still so after two rounds of the worker's event loop (:class:`LoopProbe`: a message the
broker handed over but the worker has not read yet is read in them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

from celery import Celery
from kombu.transport.virtual import Channel

from .. import clock, compat
from ..admission.gate import Gate
from ..admission.pipeline import PIPELINE_ATTR
from ..admission.serial import serial
from ..delay.mover_thread import app_mover
from ..delay.parking import Parker
from ..delay.redis_store import RedisDelayStore
from ..delay.shards import shard_named
from ..settings import settings_of
from ..store.client import redis_client, store_key

__all__ = ["LoopProbe", "SettlingWorker", "logging_kept"]


#: What a worker is busy with while a message it received is not acked yet.
_ON_THE_WAY = "on their way in"
#: Pause between two looks at a busy worker.
_LOOK_EVERY = 0.002
#: Without an event loop (a broker without one, as ``memory://``): looks in a row that must
#: find the worker quiet, and the pause between two.
_QUIET_LOOKS, _QUIET_EVERY = 10, 0.005


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """Give the loggers back as they were: an in-process worker sets logging up as a worker
    does (levels, handlers), which would change what later tests of the process capture."""
    loggers = [logging.root, *(logging.getLogger(name) for name in
                               list(logging.root.manager.loggerDict))]  # fmt: skip
    saved = [(lg, lg.level, lg.propagate, lg.disabled, list(lg.handlers)) for lg in loggers]
    try:
        yield
    finally:
        for lg, level, propagate, disabled, handlers in saved:
            lg.setLevel(level)
            lg.propagate, lg.disabled, lg.handlers = propagate, disabled, handlers


class LoopProbe:
    """Counts rounds of a kombu event loop (``Hub``) woken through a pipe of its own.

    A round woken after a message reached the worker's socket handles that message in the
    same poll, or before the next round: after two rounds, nothing handed over is unread.
    """

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._rounds = 0
        self._woken = threading.Condition()
        hub.add_reader(self._read, self._wake)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 4096)
        with self._woken:
            self._rounds += 1
            self._woken.notify_all()

    def wake(self) -> None:
        """Wake the loop once, waiting for nothing."""
        os.write(self._write, b".")

    def rounds(self, n: int, timeout: float) -> bool:
        """Wake the loop *n* times, one after another; ``False`` if a round did not come."""
        for _ in range(n):
            with self._woken:
                before = self._rounds
                os.write(self._write, b".")
                if not self._woken.wait_for(lambda: self._rounds > before, timeout):  # noqa: B023
                    return False
        return True

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):  # the loop may have closed its poller
                self.hub.remove_reader(self._read)
        finally:
            os.close(self._read)
            os.close(self._write)


class SettlingWorker:
    """*controller* (Celery's in-process ``WorkController``) of *app*, driven by a test."""

    def __init__(self, app: Celery, controller: Any, settle_timeout: float = 30.0) -> None:
        self.app = app
        self.controller = controller
        self.settle_timeout = settle_timeout
        settings = settings_of(app)
        self.parker = Parker(app, settings["delay_tombstone_ttl"], background=True)
        self.mover = app_mover(
            app, self.parker, settings, lead=0.0,
            on_released=lambda entry, claim: self._released.append((claim.entry_id, claim.token)),
        )  # fmt: skip
        #: (entry id, claim token) released by this worker's mover and not seen taken yet
        self._released: list[tuple[str, str]] = []
        self._prefix = store_key(app)
        self._connection = app.connection_for_write()
        hub = getattr(controller, "hub", None)
        self._probe = LoopProbe(hub) if hub is not None else None

    def next_due(self) -> float | None:
        """The earliest parked wait, open batch's wait or gate's wait (a debounced message's
        quiet period: ``Gate.next_due()``) of the worker (wall time)."""
        store = cast("RedisDelayStore", self.parker.store)
        client = redis_client(self.app, background=True)
        firsts = [client.zrange(shard.key("due"), 0, 0, withscores=True)
                  for shard in store.shards()]  # fmt: skip
        dues = [float(f[0][1]) / 1000.0 for f in firsts if f]
        for due in self._gate_dues():  # on the monotonic clock: as a wall time
            dues.append(clock.wall() + due - clock.monotonic())
        return min(dues, default=None)

    def _gate_dues(self) -> list[float]:
        """When the worker's open batches and its gates' waits are due (monotonic)."""
        dues = [gate.next_due() for gate in self._gates()]
        return [due for due in dues if due is not None]

    def release_due(self) -> None:
        while self.mover.run_once() == 0.0:  # a parked batch: more may be due
            pass
        loop = serial(self.controller.consumer)
        for gate in self._gates():  # gates' waits that passed (batches, debounced messages)
            if gate.next_due() is not None:  # run on the worker's loop
                loop.call_after(0.0, gate.run_due)
        if self._probe is not None:
            self._probe.wake()

    def _gates(self) -> tuple[Gate, ...]:
        """The gates of the worker's pipeline (none without one)."""
        pipeline = getattr(self.controller.consumer, PIPELINE_ATTR, None)
        return tuple(pipeline.gates) if pipeline is not None else ()

    def settle(self) -> None:
        deadline = time.monotonic() + self.settle_timeout
        quiet = 0
        while True:
            busy = self._busy()
            if busy:
                quiet = 0
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the worker was still busy after {self.settle_timeout:g} s "
                        f"({busy}): a task that does not end, or a queue it does not consume?"
                    )
                if self._probe is not None and busy.endswith(_ON_THE_WAY):
                    self._probe.wake()  # what the loop has queued (an ack, on 5.5) runs now
                time.sleep(_LOOK_EVERY)
            elif self._probe is not None:
                if self._probe.rounds(2, max(0.0, deadline - time.monotonic())) and not (
                    self._busy()
                ):
                    return
            else:
                quiet += 1
                if quiet >= _QUIET_LOOKS:
                    return
                time.sleep(_QUIET_EVERY)

    def _taken(self, client: Any, entry_id: str, token: str) -> bool:
        shard = shard_named(self._prefix, token)
        return shard is None or client.zscore(shard.key("taken"), entry_id) is not None

    def _busy(self) -> str:
        """What keeps the worker busy now, or ``""``."""
        client = redis_client(self.app, background=True)
        if self._released:
            self._released = [(entry_id, token) for entry_id, token in self._released
                              if not self._taken(client, entry_id, token)]  # fmt: skip
            if self._released:
                return f"{len(self._released)} released task(s) not taken yet"
        for gate in self._gates():
            if gate.busy():
                return gate.busy()
            due = gate.next_due()
            if due is not None and due <= clock.monotonic():
                return f"a wait of the {gate.label} gate due"
        running, reserved = (
            self._own(compat.active_requests()),
            self._own(compat.reserved_requests()),
        )
        if running:
            return f"{len(running)} task(s) running"
        if reserved:
            return f"{len(reserved)} task(s) reserved"
        for name in self._queues():
            waiting = self._waiting_in(name)
            if waiting:
                return f"{waiting} message(s) in {name}"
        consumer = self.controller.consumer
        pipeline = getattr(consumer, PIPELINE_ATTR, None)
        unacked = compat.unacked_messages(consumer) - (pipeline.waiting() if pipeline else 0)
        if unacked > 0:
            return f"{unacked} message(s) {_ON_THE_WAY}"
        return ""

    def _own(self, requests: Any) -> list[Any]:
        """Those of *requests* (Celery's sets, one per process) that are this worker's app's:
        another in-process worker of the process, an earlier test's, is not waited for."""
        while True:
            try:
                return [r for r in list(requests) if getattr(r, "app", self.app) is self.app]
            except RuntimeError:  # the worker's thread changed the set as it was read
                continue

    def _waiting_in(self, queue: str) -> int:
        """Messages in *queue*: a virtual transport (Redis, memory) is asked with a plain
        declare (its passive one misses the ``global_keyprefix``), others passively."""
        channel = self._connection.default_channel
        try:
            declared = channel.queue_declare(queue, passive=not isinstance(channel, Channel))
        except Exception:  # not declared yet: nothing in it
            return 0
        return int(declared.message_count)

    def _queues(self) -> list[str]:
        task_consumer = getattr(self.controller.consumer, "task_consumer", None)
        return [q.name for q in getattr(task_consumer, "queues", [])]

    def end(self) -> None:
        """Tell the worker to end, as ``start_worker``'s exit does next, and wake its loop so
        that it ends now rather than at its next poll (up to a second later)."""
        compat.terminate_workers()
        if self._probe is not None:
            self._probe.wake()

    def close(self) -> None:
        """Let go of the pipe and the connection (the worker has ended)."""
        if self._probe is not None:
            self._probe.close()
        self._connection.release()
