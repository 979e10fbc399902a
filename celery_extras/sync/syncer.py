"""One worker's sync with the durable store and its neighbours.

At start :meth:`Syncer.load` reads the whole store, synchronously, before the
worker consumes anything: a revoke sent while no worker ran is honoured from
the first message on. Everything after runs on a background thread, so the
worker's readiness and its event loop never wait on the network: the thread
says hello to the live neighbours (merging their replies as they arrive) and
then, every ``extras_sync_interval``, compares the store's version with its
cursor, pulls only the changes, and writes back the revokes the worker learnt
from a broadcast alone. Results are queued and merged by :meth:`Syncer.drain`
in the consumer's thread, the only one that touches Celery's worker state.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from celery.utils.log import get_logger

from ..store import StoreUnavailable, redis_client, store_key
from .digest import Pull, Version, plan_pull
from .entries import Parsed, Stamp, parse_ids, parse_stamps, valid_clock
from .revoke_store import RevokeStore, Snapshot
from .state import WorkerRevokes

__all__ = ["HELLO", "Syncer"]

logger = get_logger(__name__)

#: The control command a starting worker broadcasts to its neighbours.
HELLO = "extras_sync_hello"


class Syncer:
    """Loads, re-syncs and shares one worker's revokes; see the module docstring."""

    def __init__(
        self, app: Celery, hostname: str, revokes: WorkerRevokes, settings: dict[str, Any]
    ) -> None:
        self.app = app
        self.hostname = hostname
        self.revokes = revokes
        self.interval: float = settings["sync_interval"]
        self.reply_max: int = settings["sync_reply_max"]
        self.hello_timeout: float = settings["sync_hello_timeout"]
        self.store: RevokeStore | None = None
        self.store_error: str | None = None
        try:
            self.store = RevokeStore(redis_client(app), store_key(app), settings["revoke_max"])
        except StoreUnavailable as exc:
            self.store_error = str(exc)
        self.cursor: Version | None = None
        self.inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.pending_ids: dict[str, float] = {}
        self.pending_stamps: dict[Stamp, float] = {}
        self.lock = threading.Lock()
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
            "last_sync": None,
        }
        self._store_down = False

    # -- consumer thread ---------------------------------------------------

    def load(self) -> None:
        """Merge the whole store into the worker's state now (a store that is down is skipped)."""
        if self.store is None:
            logger.warning("celery-extras sync: no durable revokes: %s", self.store_error)
            return
        self.drain()  # merges a restarted consumer's thread left queued
        started = time.monotonic()
        cursor = self.cursor  # set when the consumer restarts (e.g. after a lost connection)
        try:
            snapshot = self.store.pull(-1 if cursor is None else cursor.seq, self.app.clock.value)
            if cursor is not None and plan_pull(cursor, snapshot.version) is Pull.EVERYTHING:
                snapshot = self.store.pull(-1, clock=self.app.clock.value)
        except redis.RedisError as exc:
            self._store_failed(exc, starting=True)
            return
        self._apply(snapshot)
        self.stats["loaded"] = len(snapshot.ids.kept) + len(snapshot.stamps.kept)
        self.stats["load_seconds"] = round(time.monotonic() - started, 4)
        logger.info(
            "celery-extras sync: %d revoked ids and %d stamps loaded from the store in %.3f s",
            len(snapshot.ids.kept), len(snapshot.stamps.kept), self.stats["load_seconds"],
        )  # fmt: skip

    def drain(self) -> None:
        """Apply what the background thread queued (store pulls, neighbour replies)."""
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
        ids, stamps = self.revokes.unstored()
        if ids or stamps:
            with self.lock:
                self.pending_ids.update(ids)
                self.pending_stamps.update(stamps)

    def start(self) -> None:
        """Start the background threads: the hello, and the periodic anti-entropy."""
        self.stopping.clear()
        self.threads = [
            threading.Thread(target=self.hello, name="extras-sync-hello", daemon=True),
            threading.Thread(target=self._run, name="extras-sync", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=self.hello_timeout + 3.0)
        self.threads = []

    def _apply(self, snapshot: Snapshot) -> None:
        self.app.clock.adjust(snapshot.clock)
        self.revokes.merge_ids(snapshot.ids.kept, stored=True)
        self.revokes.merge_stamps(snapshot.stamps.kept, stored=True)
        self.cursor = snapshot.version
        self._note_dropped("store", snapshot.ids, snapshot.stamps)

    def _note_dropped(self, source: str, *parsed: Parsed) -> None:
        dropped = sum(p.dropped for p in parsed)
        if dropped:
            self.stats["dropped"] += dropped
            examples = [e for p in parsed for e in p.examples][:3]
            logger.warning(
                "celery-extras sync: dropped %d malformed revoke entries from %s, e.g. %s",
                dropped, source, ", ".join(examples) or "(over the size bound)",
            )  # fmt: skip

    # -- background thread -------------------------------------------------

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.cycle()

    def cycle(self) -> None:
        """One anti-entropy round: push what only we hold, compare versions, pull the changes."""
        if self.store is None:
            return
        with self.lock:
            ids, stamps = dict(self.pending_ids), dict(self.pending_stamps)
        try:
            if ids or stamps:
                self.store.add(ids, stamps, clock=self.app.clock.value)
                with self.lock:
                    for task_id in ids:
                        self.pending_ids.pop(task_id, None)
                    for stamp in stamps:
                        self.pending_stamps.pop(stamp, None)
                self.stats["pushed"] += len(ids) + len(stamps)
            version, store_clock = self.store.probe(self.app.clock.value)
            self.app.clock.adjust(store_clock)
            plan = plan_pull(self.cursor, version)
            if plan is not Pull.NOTHING:
                after = -1 if plan is Pull.EVERYTHING else self.cursor.seq  # type: ignore[union-attr]
                snapshot = self.store.pull(after, clock=self.app.clock.value)
                self.stats["pulls"] += 1
                self.stats["pulled"] += len(snapshot.ids.kept) + len(snapshot.stamps.kept)
                self.inbox.put(lambda: self._apply(snapshot))
        except redis.RedisError as exc:
            self._store_failed(exc, starting=False)
            return
        self.stats["last_sync"] = time.time()
        if self._store_down:
            self._store_down = False
            logger.warning("celery-extras sync: the revoke store is reachable again; catching up")

    def _store_failed(self, exc: Exception, starting: bool) -> None:
        if starting:
            logger.warning(
                "celery-extras sync: the revoke store is unreachable (%r); starting without "
                "the durable revokes, will catch up every %s s once it is back", exc, self.interval,
            )  # fmt: skip
        elif not self._store_down:
            logger.warning("celery-extras sync: the revoke store is unreachable: %r", exc)
        self._store_down = True

    def hello(self) -> None:
        """Ask live neighbours for their revokes and clocks; merge each reply as it arrives."""
        arguments = {"from_node": self.hostname, "clock": self.app.clock.forward()}
        try:
            with self.app.connection_for_write() as conn:
                self.app.control.broadcast(
                    HELLO, arguments=arguments, reply=True, timeout=self.hello_timeout,
                    callback=self.on_reply, connection=conn,
                )  # fmt: skip
        except Exception as exc:  # the broker may be gone again; anti-entropy covers it
            logger.warning("celery-extras sync: hello to neighbours failed: %r", exc)

    def on_reply(self, body: Any) -> None:
        """One neighbour's reply ``{hostname: {"clock", "revoked", "stamps"}}``, validated."""
        if not isinstance(body, dict) or len(body) != 1:
            logger.warning("celery-extras sync: dropped a malformed hello reply: %.80r", body)
            return
        ((node, reply),) = body.items()
        if node == self.hostname or reply is None:
            return
        if not isinstance(reply, dict):
            logger.warning("celery-extras sync: dropped a malformed hello reply from %.80r", node)
            return
        if "error" in reply:  # e.g. a neighbour without celery-extras: no such command
            logger.debug("celery-extras sync: %s cannot sync: %.200r", node, reply["error"])
            return
        clock = reply.get("clock")
        if valid_clock(clock):
            self.app.clock.adjust(clock)
        ids = parse_ids(reply.get("revoked"), self.reply_max)
        stamps = parse_stamps(reply.get("stamps"), self.reply_max)
        self.stats["neighbours"] = [*self.stats["neighbours"], str(node)][-20:]

        def merge() -> None:
            self.revokes.merge_ids(ids.kept, stored=False)
            self.revokes.merge_stamps(stamps.kept, stored=False)
            self._note_dropped(f"neighbour {node}", ids, stamps)

        self.inbox.put(merge)

    def info(self) -> dict[str, Any]:
        return {
            "store": "absent" if self.store is None else ("down" if self._store_down else "ok"),
            "cursor": None if self.cursor is None else self.cursor.seq,
            "clock": self.app.clock.value,
            "revoked": len(self.revokes.revoked),
            "stamps": sum(1 for _ in self.revokes.local_stamps()),
            "interval": self.interval,
            **self.stats,
        }
