"""Release notices from other workers: a Redis pub/sub channel read by one thread, handed
to the event loop through a pipe.

A worker that frees a global concurrency slot, or ends a coalesced run with a run
waiting, publishes the bucket (task and key); every worker with waiters in it asks
again at once instead of waiting for a lease to run out. The reading thread only
queues the bucket and writes a byte to a pipe the event loop watches (or, without a
hub, schedules a timer call); the event loop does the rest.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..store.health import store_text
from ..threads import FORK_GATE, start_thread
from .serial import serial

__all__ = [
    "ALL",
    "Bucket",
    "NoticeSource",
    "ReleaseNotices",
    "bucket_tag",
    "notice",
    "parse_notice",
]

logger = logging.getLogger(__name__)

#: What a notice names: ``(task name, key)``; key ``""`` is the task's shared bucket.
Bucket = tuple[str, str]

#: A notice meaning "every bucket": the listener (re)subscribed and may have missed some.
ALL: Bucket = ("", "\0all")


@functools.lru_cache(maxsize=4096)
def bucket_tag(name: str, key: str) -> str:
    """The hash tag of bucket ``(name, key)``'s keys in the store: a digest (any key fits,
    and the bucket's keys share a Redis Cluster slot), kept for the buckets in use (a
    run's arrival and its end name the same bucket)."""
    digest = hashlib.sha1(f"{name}\0{key}".encode(), usedforsecurity=False).hexdigest()[:20]
    return f"{{{digest}}}"


@functools.lru_cache(maxsize=4096)
def notice(name: str, key: str) -> str:
    """The text published for bucket ``(name, key)`` (each release of a slot carries it),
    kept for the buckets in use."""
    return json.dumps([name, key])


def parse_notice(raw: Any) -> Bucket | None:
    """The bucket a published text names, or ``None`` for anything else."""
    try:
        name, key = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if isinstance(name, str) and isinstance(key, str):
        return name, key
    return None


class NoticeSource(Protocol):
    """A store that publishes notices: its client and channel."""

    client: Any
    channel: str


class ReleaseNotices:
    """Delivers release notices to *wake* (``wake(bucket)``) in the consumer's event loop."""

    def __init__(self, wake: Callable[[Bucket], None], what: str) -> None:
        self.wake = wake
        self.what = what  # "concurrency", "coalescing": names the thread and the log line
        self._consumer: Any = None
        self._listener: _Listener | None = None
        self._notices: deque[Bucket] = deque()
        self._pipe: tuple[int, int] | None = None

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def start(self, consumer: Any) -> None:
        self._consumer = consumer
        hub = getattr(consumer, "hub", None)
        if hub is not None and self._pipe is None:
            read, write = os.pipe()
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            self._pipe = (read, write)
            hub.add_reader(read, self._on_pipe)

    def listen(self, store: NoticeSource) -> None:
        """Subscribe (once) to the store's release channel."""
        if self._listener is None:
            self._listener = _Listener(store, self.what, self._arrived, lambda: self._arrived(ALL))
            self._listener.start()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if self._pipe is not None:
            hub = getattr(self._consumer, "hub", None)
            if hub is not None:
                with contextlib.suppress(Exception):
                    hub.remove(self._pipe[0])
            for fd in self._pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._pipe = None

    def _arrived(self, bucket: Bucket) -> None:
        """In the listener's thread: queue the bucket and wake the event loop. Not filtered
        here: a waiter refused a moment ago may not be queued yet."""
        self._notices.append(bucket)
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
                os.write(self._pipe[1], b"x")
        elif self._consumer is not None:
            self._consumer.timer.call_after(0.0, self.drain, priority=6)

    def _on_pipe(self, *args: Any) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.read(self._pipe[0], 4096)
        self.drain()

    def drain(self) -> None:
        """Wake each bucket noticed since the last drain, once (:data:`ALL` included)."""
        if self._consumer is None:
            return
        seen: set[Bucket] = set()
        with serial(self._consumer):
            while self._notices:
                bucket = self._notices.popleft()
                if bucket not in seen:
                    seen.add(bucket)
                    self.wake(bucket)


class _Listener:
    """Reads release notices from the store's pub/sub channel (one thread per worker)."""

    #: Seconds each read waits for a notice (a fork waits for it at most that long).
    READ = 0.25

    def __init__(
        self,
        store: NoticeSource,
        what: str,
        on_notice: Callable[[Bucket], None],
        on_subscribed: Callable[[], None],
    ) -> None:
        self.store = store
        self.what = what
        self.on_notice = on_notice
        self.on_subscribed = on_subscribed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread(self._run, f"celery-extras-{self.what}-notices")

    def stop(self) -> None:
        """Stop reading, and wait for the thread (it closes its subscription itself)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.READ + 2.0)
        self._thread = None

    def _run(self) -> None:
        failed = False
        while not self._stop.is_set():
            pubsub = None
            try:
                with FORK_GATE.operation():
                    pubsub = self.store.client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.store.channel)
                self.on_subscribed()
                failed = False
                while not self._stop.is_set():
                    with FORK_GATE.operation():
                        message = pubsub.get_message(timeout=self.READ)
                    if message and message.get("type") == "message":
                        bucket = parse_notice(message.get("data"))
                        if bucket is not None:
                            self.on_notice(bucket)
            except Exception as exc:
                if not failed and not self._stop.is_set():  # a stop closes the connection
                    failed = True
                    logger.warning(
                        "celery-extras: %s release notices lost (%s); waiters ask "
                        "again when leases run out until the store answers",
                        self.what,
                        store_text(exc),
                    )
                self._stop.wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception), FORK_GATE.operation():
                        pubsub.close()
