"""How the pipeline makes a task's store rounds (:mod:`.store_round`): on the line of the
consumer's event loop (:mod:`.store_line`), answered as their replies come; where there is
no line (a pool without an event loop, an in-process worker, a Redis Cluster, a pool's
thread hearing an ending), as one call."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from redis import RedisCluster

from ..settings import STORE_TIMEOUT, settings_of
from ..store.client import LazyCluster, redis_client
from .store_line import StoreLine
from .store_round import NO_REPLY, StoreRound, deliver, handed

__all__ = ["Rounds"]


class Rounds:
    """One consumer's rounds: its :class:`StoreRound` and, with an event loop, its line."""

    def __init__(self) -> None:
        self._round: StoreRound | None = None
        #: ``None``: no event loop, a Redis Cluster, or not made yet
        self.line: StoreLine | None = None
        #: what the consumer's lines did, on this connection and earlier ones (see :meth:`info`)
        self.counts: Counter[str] = Counter()
        self._consumer: Any = None  # with an event loop: the consumer
        self._loop = 0  # the thread of its loop
        self._hub: Any = None  # the loop of the line, which flushes it each turn

    def send(self, ticket: Any, gates: Sequence[Any], asker: str,
             then: Callable[[Any], None]) -> bool:  # fmt: skip
        """The round of *gates* for *ticket* (with their *asker*, ``arrival_call`` or
        ``ending_call``): ``True`` when it went on the line (*then* is called with the
        ticket once its replies are in ``ticket.replies``, or none when the line could
        not make it: each gate asks alone), else made as a call (see
        :meth:`StoreRound.ask`), or by each gate alone."""
        line = self._line()
        if line is None:
            if len(gates) > 1:  # one gate's call is its own
                self._rounds(ticket.consumer.app).ask(ticket, gates, asker)
            return False
        labels, calls = handed(ticket, gates, asker)
        if not calls:
            return False

        def answer(reply: Any) -> None:
            if reply is not NO_REPLY:
                deliver(ticket, labels, reply)
            then(ticket)

        # no line on a Redis Cluster: any calls join
        line.send(*self._rounds(ticket.consumer.app).command(calls), answer,
                  may_wait=all(call.may_wait for call in calls))  # fmt: skip
        return True

    def start(self, consumer: Any) -> None:
        """*consumer* started, in the thread of its event loop (if it has one: a line)."""
        self._consumer = consumer if getattr(consumer, "hub", None) is not None else None
        self._loop = threading.get_ident()

    def tick(self) -> None:
        if self.line is not None:
            self.line.tick()

    def close(self) -> None:
        """Answer the rounds on the line (the consumer stops), and let its connection go."""
        line, self.line = self.line, None
        if line is not None:
            self._hub.on_tick.discard(line.flush)
            line.close()

    def info(self) -> dict[str, int]:
        """Rounds sent on the line, the writes (round trips) they took, and its connections
        lost, since the worker started; and the rounds out now, unanswered."""
        counts = {what: self.counts[what] for what in ("rounds", "writes", "failed")}
        return {**counts, "unanswered": 0 if self.line is None else self.line.in_flight()}

    def _rounds(self, app: Any) -> StoreRound:
        if self._round is None:
            self._round = StoreRound(lambda: _store_client(app))
        return self._round

    def _line(self) -> StoreLine | None:
        """The line of the consumer's event loop, made on first use, used from that loop's
        thread only (a pool's thread may hear an ending: it makes a call)."""
        consumer = self._consumer
        if consumer is None or threading.get_ident() != self._loop:
            return None
        if self.line is None:
            client, cluster = self._rounds(consumer.app).store()
            if cluster:
                self._consumer = None
                return None
            hub = consumer.hub

            def watch(fd: int, readable: Callable[[], None] | None) -> None:
                if readable is not None:
                    hub.add_reader(fd, readable)
                    return
                with contextlib.suppress(Exception):  # the loop may have closed its poller
                    hub.remove_reader(fd)

            timeout = settings_of(consumer.app)[STORE_TIMEOUT]
            self.line = StoreLine(client, watch, timeout, counts=self.counts,
                                  later=hub.call_later)  # fmt: skip
            self._hub = hub
            hub.on_tick.add(self.line.flush)  # one write a turn, before the loop polls
        return self.line


def _store_client(app: Any) -> tuple[Any, bool]:
    """The app's store client, and whether it is a Redis Cluster's."""
    client = redis_client(app)
    return client, isinstance(client, LazyCluster | RedisCluster)
