"""Admission rounds sent on the worker's event loop without waiting for their replies.

A round (:mod:`.store_round`) made as a call blocks the consumer's loop for its round trip,
and redis-py's command path costs the loop more CPU than the trip itself. A
:class:`StoreLine` keeps one connection of the store's pool for the loop's rounds: it
writes a round and returns; the loop goes on (the next message, a result of the pool)
and reads the replies when the socket is readable. The line writes once per turn of the
loop (:meth:`StoreLine.flush`, which the loop calls before it polls): the rounds of one
turn (a message, the pool's results, the replies of the last write) and those sent while
a write is answered go out together, as one write of several ``EVALSHA``. A busy worker
admits several tasks per round trip, and the loop never waits on the store.

A round that *may wait* (:attr:`.StoreCall.may_wait`: a coalescing hold's ask or finish)
goes at least :data:`WRITE_GAP` after the line's last write: with the next write of a
round that may not wait, or on a timer of the loop, as Nagle's algorithm gathers a
socket's small writes. On the Redis broker a worker's loop receives one message a turn,
so without the gap a busy worker would write once a task; with it, a write carries the
arrivals and endings of a few milliseconds, and the store and the worker serve a
fraction of the round trips (a store's per-request work, a worker's send, poll and read,
cost more than a round's script). At a few writes a second nothing waits. A limit's
booking never waits (while it is out, each arrival of its bucket books its own instead
of spending the calls it books ahead), nor does a slot's (a worker elsewhere may be
queued for a release), nor a finish a run of the key waits for on this worker.

A round the line cannot make (no connection, a reset) is answered :data:`NO_REPLY`: its
gates then ask the store alone, through the client and its retry, as when no round is
made. A write unanswered within the store's timeout is answered with the timeout, as a
call that timed out would have been. No Celery import.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as StoreTimeout

from ..scripts import StoreScript
from .store_round import NO_REPLY

try:  # a write's commands packed in C, without redis-py's per-argument checks
    from hiredis import pack_command as _pack_command
except ImportError:  # hiredis before 2.1: redis-py packs them
    _pack_command = None  # type: ignore[assignment]

__all__ = ["WRITE_GAP", "StoreLine"]

logger = logging.getLogger(__name__)

#: Least seconds from a line's last write to one of rounds that may wait, on a line with a
#: timer (see the module's text): at most this much more wait for such a round, and only
#: while the line writes more often.
WRITE_GAP = 0.005

#: What :meth:`StoreLine._read` gives for a script the store does not have (``NOSCRIPT``).
_LOST_SCRIPT: Any = object()


@dataclass
class _Round:
    """One script call of the line, whom to tell its reply, and whether it may wait."""

    script: StoreScript
    command: tuple[Any, ...]
    answer: Callable[[Any], None]
    may_wait: bool = False


class StoreLine:
    """Rounds of one loop (*watch*: ``(fd, callback)`` registers a reader, ``(fd, None)``
    removes it; the loop calls :meth:`flush` once a turn) on a connection of *client*'s
    pool; a write unanswered after *timeout* seconds fails (see :meth:`tick`). With
    *later* (``(seconds, callback)``: a timer of the loop), rounds that may wait go *gap*
    seconds after the last write at the earliest; without, every turn's rounds go at its
    end."""

    def __init__(
        self,
        client: Any,
        watch: Callable[[int, Callable[[], None] | None], None],
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
        counts: Counter[str] | None = None,
        later: Callable[[float, Callable[[], None]], Any] | None = None,
        gap: float = WRITE_GAP,
    ) -> None:
        self.client = client
        self.watch = watch
        self.timeout = timeout
        self.clock = clock  # real time: a socket's wait, whatever clock the tasks see
        self.later = later
        self.gap = gap
        self._written = -math.inf  # when the last write went
        self._timed = False  # a timer of the loop is to flush
        #: rounds written, writes, connections lost (*counts*: added to a caller's counter)
        self.counts: Counter[str] = Counter() if counts is None else counts
        self._connection: Any = None
        self._fd: int | None = None
        self._queued: list[_Round] = []
        self._sent: list[_Round] = []
        self._since = 0.0

    def send(
        self, script: StoreScript, keys: Sequence[str], args: Sequence[Any],
        answer: Callable[[Any], None], may_wait: bool = False,
    ) -> None:  # fmt: skip
        """Make *script*'s call (the time first when it is timed, now) with the next
        write (:meth:`flush`; if it *may_wait*, not before the gap) and call *answer*
        with its reply, the :class:`~redis.exceptions.ResponseError` it raised, a
        timeout, or :data:`NO_REPLY`, later, from the loop."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *script.args(args))
        self._queued.append(_Round(script, command, answer, may_wait))

    def flush(self) -> None:
        """The loop's turn ends (it is about to poll): the rounds queued go, as one write,
        unless a write is out (they go once its replies are in) or every one queued may
        wait and the last write went less than the gap ago (they go when it has passed,
        on the loop's timer, or with a round that may not wait)."""
        if not self._queued or self._sent:
            return
        later = self.later if all(r.may_wait for r in self._queued) else None
        wait = self._written + self.gap - self.clock() if later is not None else 0.0
        if wait <= 0 or later is None:
            self._write()
        elif not self._timed:
            self._timed = True
            later(wait, self._gap_passed)

    def _gap_passed(self) -> None:
        self._timed = False
        self.flush()

    def in_flight(self) -> int:
        """Rounds written or waiting to be, unanswered."""
        return len(self._sent) + len(self._queued)

    def readable(self) -> None:
        """The connection's socket is readable: the written rounds' replies are read (all
        of one write come together) and answered; the rounds queued meanwhile go with the
        loop's next :meth:`flush`."""
        rounds, self._sent = self._sent, []
        replies: list[Any] = []
        try:
            if not rounds:  # nothing asked: the store closed the connection
                raise ConnectionError("the store closed the connection")
            for _ in rounds:
                replies.append(self._read())
        except Exception as exc:
            self._lost(exc)
        replies += [NO_REPLY] * (len(rounds) - len(replies))
        self._answer(rounds, replies)

    def tick(self) -> None:
        """A write unanswered for longer than the timeout: the store stalls; its rounds are
        answered with a timeout (the gates meet it as their call's), the connection closed.
        The rounds queued meanwhile are not written to the stalled store: they are answered
        :data:`NO_REPLY` (each gate asks alone, and finds the store backing off)."""
        if self._sent and self.clock() - self._since > self.timeout:
            rounds, self._sent = self._sent, []
            exc = StoreTimeout(f"no reply from the store in {self.timeout:g} s")
            self._lost(exc)
            self._answer(rounds, [exc] * len(rounds))
            queued, self._queued = self._queued, []
            self._answer(queued, [NO_REPLY] * len(queued))

    def drain(self) -> None:
        """Answer every round now, waiting for the store (the loop stops): what was written
        is read, then what was queued is written and read."""
        while self.in_flight():
            if self._sent:
                self.readable()
            else:
                self._write()

    def close(self) -> None:
        """Answer every round (:meth:`drain`), then give the connection back."""
        self.drain()
        self._disconnect()

    # -- the connection ------------------------------------------------------------------

    def _write(self) -> None:
        rounds, self._queued = self._queued, []
        if not rounds:
            return
        try:
            connection = self._connect()
            commands = [r.command for r in rounds]
            packed = ([b"".join(map(_pack_command, commands))] if _pack_command is not None
                      else connection.pack_commands(commands))  # fmt: skip
            connection.send_packed_command(packed, check_health=False)
        except Exception as exc:
            self._lost(exc)
            self._answer(rounds, [NO_REPLY] * len(rounds))
            return
        self._sent = rounds
        self._since = self._written = self.clock()
        self.counts["rounds"] += len(rounds)
        self.counts["writes"] += 1

    def _read(self) -> Any:
        """The next reply (a :class:`ResponseError` as a value); a script the store lost is
        loaded again, and its round answered :data:`NO_REPLY` (its gates ask alone)."""
        try:
            return self._connection.read_response()
        except NoScriptError:
            return _LOST_SCRIPT
        except ResponseError as exc:
            return exc

    def _connect(self) -> Any:
        if self._connection is None:
            pool = self.client.connection_pool
            try:
                self._connection = pool.get_connection()
            except TypeError:  # redis-py before 5.3 wants a command's name
                self._connection = pool.get_connection("EVALSHA")
            self._fd = self._connection._sock.fileno()  # redis-py keeps no public one
            self.watch(self._fd, self.readable)
        return self._connection

    def _lost(self, exc: BaseException) -> None:
        """The connection failed (*exc*): it goes; the next write takes another."""
        self.counts["failed"] += 1
        logger.debug("celery-extras: the admission line lost its connection: %r", exc)
        self._disconnect()

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if self._fd is not None:
            self.watch(self._fd, None)
            self._fd = None
        if connection is not None:
            connection.disconnect()
            self.client.connection_pool.release(connection)

    def _answer(self, rounds: list[_Round], replies: list[Any]) -> None:
        for round_, reply in zip(rounds, replies, strict=True):
            if reply is _LOST_SCRIPT:
                reply = self._reload(round_.script)
            try:
                round_.answer(reply)
            except Exception:
                logger.exception("celery-extras: answering an admission round failed")

    def _reload(self, script: StoreScript) -> Any:
        """The store lost *script* (restarted, flushed): loaded again for the next rounds."""
        try:
            self.client.script_load(script.text)
        except Exception as exc:
            logger.debug("celery-extras: could not load a script again: %r", exc)
        return NO_REPLY
