"""One worker's sync with the durable store and its neighbours: the threads and the hand-over.

At start the whole store is read, synchronously, before the worker consumes
anything. Everything after runs on background threads, so the worker's readiness
and its event loop never wait on the network: one says hello to the live
neighbours (:class:`~.hello.Hello`), the other runs an anti-entropy round with the
store every ``extras_sync_interval`` (:class:`~.anti_entropy.AntiEntropy`). What they
bring is queued and merged by :meth:`Syncer.drain` in the consumer's thread, the
only one that touches Celery's worker state; :meth:`Syncer.collect`, there too,
hands the revokes only this worker holds to the next round.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.utils.log import get_logger

from ..threads import FORK_GATE, start_thread
from .anti_entropy import AntiEntropy
from .entries import Parsed
from .hello import HELLO, Hello
from .memory import malloc_trim
from .state import WorkerRevokes

__all__ = ["HELLO", "Syncer"]

logger = get_logger(__name__)

#: Ids merged or revoked since the last trim that make the worker hand freed memory back.
TRIM_CHURN = 10_000


class Syncer:
    """Loads, re-syncs and shares one worker's revokes; see the module docstring."""

    def __init__(
        self, app: Celery, hostname: str, revokes: WorkerRevokes, settings: Mapping[str, Any]
    ) -> None:
        self.app = app
        self.hostname = hostname
        self.revokes = revokes
        self.interval: float = settings["sync_interval"]
        self.reply_max: int = settings["sync_reply_max"]
        self.hello_timeout: float = settings["sync_hello_timeout"]
        #: Merges for the consumer's thread (store pages, neighbour replies, restores).
        self.inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.stats: dict[str, Any] = {
            "loaded": 0,
            "load_seconds": None,
            "pulls": 0,
            "pulled": 0,
            "pushed": 0,
            "neighbours": [],
            "dropped": 0,
            "trims": 0,
            "last_sync": None,
        }
        self.anti_entropy = AntiEntropy(self, settings["revoke_max"])
        self.hello = Hello(self)

    # -- consumer thread ---------------------------------------------------

    def load(self) -> None:
        """Merge the whole store into the worker's state now (a store that is down is skipped)."""
        self.anti_entropy.load()

    def drain(self) -> None:
        """Apply what the background threads queued (store pulls, neighbour replies)."""
        while True:
            try:
                merge = self.inbox.get_nowait()
            except queue.Empty:
                return
            try:
                merge()
            except Exception:  # a bad merge must never take the worker down
                logger.exception("celery-extras sync: merge failed")

    def collect(self) -> None:
        """Hand the revokes only this worker holds to the thread, to be stored."""
        self.drain()  # what the thread pulled is in the store: merge it first, not push it
        try:
            ids, stamps = self.revokes.unstored()
        except Exception:  # a timer of the consumer: log, and try again next time
            logger.exception("celery-extras sync: collecting unstored revokes failed")
            return
        if self.revokes.churn >= TRIM_CHURN:  # see .memory: a burst's pages go back
            self.revokes.churn = 0
            self.stats["trims"] += malloc_trim()
        if ids or stamps:
            self.anti_entropy.pend(ids, stamps)

    def note_dropped(self, source: str, *parsed: Parsed) -> None:
        """Count and log (with examples) the malformed entries *source* sent."""
        dropped = sum(p.dropped for p in parsed)
        if dropped:
            self.stats["dropped"] += dropped
            examples = [e for p in parsed for e in p.examples][:3]
            logger.warning(
                "celery-extras sync: dropped %d malformed revoke entries from %s, e.g. %s",
                dropped, source, ", ".join(examples) or "(over the size bound)",
            )  # fmt: skip

    # -- background threads ------------------------------------------------

    def start(self, hello: bool = True) -> None:
        """Start the background threads: the hello (unless *hello* is ``False``: a worker
        started without Mingle), and the periodic anti-entropy."""
        self.stopping.clear()
        self.threads = [start_thread(self._run, "extras-sync")]
        if hello:
            self.threads.append(start_thread(self._hello, "extras-sync-hello"))

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.hello_timeout + 3.0)
        self.threads = []

    def _hello(self) -> None:
        with FORK_GATE.operation():
            self.hello.send()

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                with FORK_GATE.operation():
                    self.anti_entropy.cycle()
            except Exception:  # cycle() catches the store's errors; this is the last guard
                logger.exception("celery-extras sync: anti-entropy round failed; carrying on")

    def info(self) -> dict[str, Any]:
        anti_entropy = self.anti_entropy
        cursor = anti_entropy.cursor
        return {
            **anti_entropy.info(),
            "cursor": None if cursor is None else cursor.seq,
            "clock": self.app.clock.value,
            "revoked": len(self.revokes.revoked),
            "unstored": len(self.revokes.unstored_ids) + len(anti_entropy.pending_ids),
            "stamps": sum(1 for _ in self.revokes.local_stamps()),
            "interval": self.interval,
            **self.stats,
        }
