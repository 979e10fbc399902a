"""The admission line (``admission/store_line.py``) on a real Redis, driven as the worker's
event loop drives it: rounds go out as one write when the loop's turn ends (before it
polls), those that may wait the gap after the last write at the earliest (on the loop's
timer, or with one that may not wait); the socket, polled here, says when replies are in;
rounds sent meanwhile go out together with the next turn. And each way a store fails it: a script
it lost, a Lua error, a store that does not answer, one that refuses connections, one that
closes the connection. No worker and no broker here."""

from __future__ import annotations

import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as StoreTimeout

from celery_extras.admission.store_line import StoreLine
from celery_extras.admission.store_round import NO_REPLY
from celery_extras.scripts import register
from tests.integration.conftest import REDIS_URL
from tests.support.brokers import PrivateRedis
from tests.support.workers import wait_for

#: a script of one key: adds its argument to the key, answers the sum
ADD = "return redis.call('incrby', KEYS[1], ARGV[1])"
FAILS = "return redis.error_reply('ERR this round fails')"


class Loop:
    """What the worker's hub is to the line: the readers it watches, polled on demand, and
    the callbacks it calls before it polls (``on_tick``)."""

    def __init__(self) -> None:
        self.readers: dict[int, Callable[[], None]] = {}
        self.on_tick: list[Callable[[], None]] = []

    def watch(self, fd: int, readable: Callable[[], None] | None) -> None:
        if readable is None:
            del self.readers[fd]
        else:
            self.readers[fd] = readable

    def turn(self, timeout: float = 5.0) -> int:
        """One turn: the tick callbacks, then the readable readers called; how many were."""
        for tick in self.on_tick:
            tick()
        ready, _, _ = select.select(list(self.readers), [], [], timeout)
        for fd in ready:
            self.readers[fd]()
        return len(ready)


class Answers:
    """The replies a test's rounds were answered with, in order."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def __call__(self, reply: Any) -> None:
        self.got.append(reply)


def store_client(url: str) -> Any:
    return redis.Redis.from_url(url, decode_responses=True)


def line_on(client: Any, loop: Loop, timeout: float = 1.0) -> StoreLine:
    line = StoreLine(client, loop.watch, timeout)
    loop.on_tick.append(line.flush)
    return line


@pytest.fixture
def key() -> Iterator[str]:
    name = f"line-test:{os.urandom(6).hex()}"
    yield name
    redis.Redis.from_url(REDIS_URL).delete(name)


def test_rounds_of_a_turn_and_those_sent_while_one_is_out_go_as_one_write_each(
    key: str,
) -> None:
    client, loop, answers = store_client(REDIS_URL), Loop(), Answers()
    add = register(client, ADD)
    add(keys=[key], args=[0])  # loaded
    line = line_on(client, loop)
    line.send(add, [key], [1], answers)
    line.send(add, [key], [2], answers)  # the same turn: queued until it ends
    assert line.counts == {} and loop.readers == {}  # nothing written yet
    assert loop.turn() == 1  # the turn ends: one write of both; its replies come
    assert answers.got == [1, 3] and line.counts == {"rounds": 2, "writes": 1}
    line.send(add, [key], [10], answers)
    line.flush()  # written: out until its reply is read
    for n in (100, 1000):  # sent while it is out: queued, even across turns' ends
        line.send(add, [key], [n], answers)
        line.flush()
    assert line.counts == {"rounds": 3, "writes": 2} and line.in_flight() == 3
    assert loop.turn() == 1
    assert answers.got == [1, 3, 13]  # the out write's reply; the two queued go next turn
    wait_for(lambda: loop.turn(0.1) and len(answers.got) == 5, timeout=5, what="2 replies")
    assert answers.got == [1, 3, 13, 113, 1113]
    assert line.counts == {"rounds": 5, "writes": 3}
    line.close()
    assert loop.readers == {}


class Timers:
    """The loop's timers (``call_later``), and a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: list[tuple[float, Callable[[], None]]] = []

    def clock(self) -> float:
        return self.now

    def later(self, seconds: float, callback: Callable[[], None]) -> None:
        self.due.append((seconds, callback))


def test_rounds_that_may_wait_go_the_gap_after_the_last_write_or_with_one_that_may_not(
    key: str,
) -> None:
    client, loop, answers, timers = store_client(REDIS_URL), Loop(), Answers(), Timers()
    add = register(client, ADD)
    add(keys=[key], args=[0])
    line = StoreLine(client, loop.watch, 1.0, clock=timers.clock, later=timers.later, gap=0.005)
    loop.on_tick.append(line.flush)
    line.send(add, [key], [1], answers, may_wait=True)
    assert loop.turn() == 1  # no write before it: it goes as its turn ends
    assert answers.got == [1] and line.counts == {"rounds": 1, "writes": 1}
    timers.now += 0.002
    line.send(add, [key], [2], answers, may_wait=True)
    assert loop.turn(0.05) == 0  # 2 ms after the last write: it waits the gap's rest
    line.send(add, [key], [3], answers, may_wait=True)
    assert loop.turn(0.05) == 0  # the next turn's waits with it
    assert line.counts == {"rounds": 1, "writes": 1} and line.in_flight() == 2
    assert [round(seconds, 6) for seconds, _ in timers.due] == [0.003]  # one timer
    line.send(add, [key], [4], answers)  # one that may not wait: all three go at once
    assert loop.turn() == 1
    assert answers.got == [1, 3, 6, 10] and line.counts == {"rounds": 4, "writes": 2}
    timers.now += 0.0031
    timers.due.pop()[1]()  # the timer: nothing left to write
    assert line.counts == {"rounds": 4, "writes": 2}
    timers.now += 0.001  # 4.1 ms after the last write
    line.send(add, [key], [5], answers, may_wait=True)
    assert loop.turn(0.05) == 0 and [round(s, 6) for s, _ in timers.due] == [0.0009]
    timers.now += 0.001
    timers.due.pop()[1]()  # the gap passed: the loop's timer writes it
    assert line.counts == {"rounds": 5, "writes": 3}
    assert loop.turn() == 1 and answers.got == [1, 3, 6, 10, 15]
    timers.now += 0.010  # a quiet spell: the next goes as its turn ends, no timer
    line.send(add, [key], [6], answers, may_wait=True)
    assert loop.turn() == 1 and answers.got == [1, 3, 6, 10, 15, 21] and timers.due == []
    line.close()
    assert loop.readers == {}


def test_a_script_the_store_lost_is_answered_no_reply_and_loaded_again(key: str) -> None:
    client, loop, answers = store_client(REDIS_URL), Loop(), Answers()
    add = register(client, f"{ADD} -- {os.urandom(6).hex()}")  # a text never loaded
    line = line_on(client, loop)
    line.send(add, [key], [5], answers)  # never loaded: NOSCRIPT
    loop.turn()
    assert answers.got == [NO_REPLY]  # its gates ask alone (redis-py loads it then)
    line.send(add, [key], [5], answers)
    loop.turn()
    assert answers.got == [NO_REPLY, 5]  # the line loaded it again
    line.close()


def test_a_lua_error_is_that_rounds_answer_and_the_next_goes_on(key: str) -> None:
    client, loop, answers = store_client(REDIS_URL), Loop(), Answers()
    fails, add = register(client, FAILS), register(client, ADD)
    client.script_load(FAILS)
    add(keys=[key], args=[0])
    line = line_on(client, loop)
    line.send(fails, [], [], answers)
    line.send(add, [key], [2], answers)
    line.drain()  # as the consumer's stop answers them: no loop needed
    assert isinstance(answers.got[0], ResponseError) and "this round fails" in str(answers.got[0])
    assert answers.got[1:] == [2]
    line.close()


def test_a_store_that_does_not_answer_times_the_round_out_and_the_line_lets_go(
    tmp_path: Path,
) -> None:
    store = PrivateRedis(tmp_path).start()
    try:
        client, loop, answers = (
            redis.Redis.from_url(store.url, decode_responses=True),
            Loop(),
            Answers(),
        )
        add = register(client, ADD)
        add(keys=["k"], args=[0])
        line = line_on(client, loop, timeout=0.3)
        line.send(add, ["k"], [1], answers)
        loop.turn()  # the connection made, one round answered
        assert answers.got == [1] and len(loop.readers) == 1
        assert store.proc is not None
        os.kill(store.proc.pid, signal.SIGSTOP)
        try:
            line.send(add, ["k"], [1], answers)
            line.flush()  # written to the stopped store
            line.send(add, ["k"], [10], answers)  # queued behind the write that is out
            line.flush()
            line.tick()
            assert answers.got == [1]  # not yet: the store has 0.3 s
            assert loop.turn(0.5) == 0  # the store does not answer (the turn writes nothing)
            line.tick()
            assert len(answers.got) == 3 and isinstance(answers.got[1], StoreTimeout)
            assert answers.got[2] is NO_REPLY  # not written to the stalled store
            assert loop.readers == {} and line.in_flight() == 0  # the connection went
        finally:
            os.kill(store.proc.pid, signal.SIGCONT)
        line.send(add, ["k"], [1], answers)  # a new connection
        loop.turn()
        assert answers.got[3] in (2, 3)  # the stalled write may have run when it woke: the
        # queued one (10) never went
        line.close()
    finally:
        store.stop()


def test_a_store_that_refuses_connections_answers_no_reply_at_once(tmp_path: Path) -> None:
    store = PrivateRedis(tmp_path).start()
    client, loop, answers = (
        redis.Redis.from_url(store.url, decode_responses=True),
        Loop(),
        Answers(),
    )
    add = register(client, ADD)
    store.stop()
    line = line_on(client, loop)
    asked = time.monotonic()
    line.send(add, ["k"], [1], answers)
    line.flush()
    assert answers.got == [NO_REPLY] and time.monotonic() - asked < 1.0  # its gates ask alone
    assert line.counts["failed"] == 1 and loop.readers == {} and line.in_flight() == 0


def test_a_connection_the_store_closes_is_let_go_and_made_again(key: str) -> None:
    client, loop, answers = store_client(REDIS_URL), Loop(), Answers()
    add = register(client, ADD)
    add(keys=[key], args=[0])
    line = line_on(client, loop)
    line.send(add, [key], [1], answers)
    loop.turn()
    (fd,) = loop.readers
    with socket.socket(fileno=os.dup(fd)) as sock:  # the line's connection, as Redis names it
        host, port = sock.getsockname()[:2]
    client.client_kill(f"{host}:{port}")
    assert loop.turn() == 1  # readable with nothing asked: the store closed it
    assert loop.readers == {} and line.counts["failed"] == 1
    line.send(add, [key], [1], answers)
    loop.turn()
    assert answers.got == [1, 2]
    line.close()
