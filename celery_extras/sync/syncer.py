"""One worker's sync with the durable store and its neighbours.

At start :meth:`Syncer.load` reads the whole store, synchronously, before the
worker consumes anything: a revoke sent while no worker ran is honoured from
the first message on. Everything after runs on a background thread, so the
worker's readiness and its event loop never wait on the network: the thread
says hello to the live neighbours (merging their replies as they arrive) and
then, every ``extras_sync_interval``, compares each shard's version with its
cursor, pulls only the changes, and writes back the revokes the worker learnt
from a broadcast alone. Results are queued and merged by :meth:`Syncer.drain`
in the consumer's thread, the only one that touches Celery's worker state.
Pulls come a page at a time, and the thread waits for each page to be merged
before it reads the next: catching up with a full store costs the worker one
page's memory, not the store's (the allocator keeps what a pull once took).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from celery import Celery
from celery.utils.log import get_logger

from ..bounds import shown
from ..store.client import StoreUnavailable, redis_client, store_key
from ..store.health import store_text
from .digest import Pull, Version, plan_pull
from .entries import Parsed, Stamp, parse_ids, parse_stamps, valid_clock
from .memory import malloc_trim
from .revoke_store import SHARDS, RevokeStore, Snapshot
from .state import WorkerRevokes, trim_oldest

__all__ = ["HELLO", "Syncer"]

logger = get_logger(__name__)

#: Ids merged or revoked since the last trim that make the worker hand freed memory back.
TRIM_CHURN = 10_000

#: The control command a starting worker broadcasts to its neighbours.
HELLO = "extras_sync_hello"


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
        self.store: RevokeStore | None = None
        self.store_error: str | None = None
        try:
            self.store = RevokeStore(redis_client(app), store_key(app), settings["revoke_max"])
        except StoreUnavailable as exc:
            self.store_error = str(exc)
        #: Per shard, the version read up to (``None``: never read).
        self.shard_cursors: list[Version | None] = [None] * SHARDS
        self.inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.pending_ids: dict[str, float] = {}
        self.pending_stamps: dict[Stamp, float] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._merged = threading.Event()  # the page last queued is merged
        self._merged.set()
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
        #: ``ok``, ``down`` (cannot reach it) or ``error`` (it answered with an error, or
        #: with something this version cannot read): see :meth:`info`.
        self.store_state = "ok"
        self.store_reason = ""

    # -- consumer thread ---------------------------------------------------

    def load(self) -> None:
        """Merge the whole store into the worker's state now (a store that is down is skipped)."""
        if self.store is None:
            logger.warning("celery-extras sync: no durable revokes: %s", self.store_error)
            return
        self.drain()  # merges a restarted consumer's thread left queued
        if self.stats["last_sync"] is None:  # what Celery loaded itself (--statedb) is shared
            self.revokes.adopt_held()
        started = time.monotonic()
        loaded = [0, 0]

        def merge(page: Snapshot) -> bool:
            self._apply(page)
            loaded[0] += len(page.ids.kept)
            loaded[1] += len(page.stamps.kept)
            return True

        try:  # the cursors are set when the consumer restarts (e.g. after a lost connection)
            self._catch_up(merge, self._restore)
        except Exception as exc:  # whatever the store holds, the worker starts
            self._store_failed(exc, starting=True)
            return
        self.stats["last_sync"] = time.time()
        self.stats["loaded"] = sum(loaded)
        self.stats["load_seconds"] = round(time.monotonic() - started, 4)
        logger.info(
            "celery-extras sync: %d revoked ids and %d stamps loaded from the store in %.3f s",
            loaded[0], loaded[1], self.stats["load_seconds"],
        )  # fmt: skip

    @property
    def cursor(self) -> Version | None:
        """Where this worker has read the store up to (``None`` until it has read every shard)."""
        if any(shard is None for shard in self.shard_cursors):
            return None
        return Version.of_shards([shard for shard in self.shard_cursors if shard is not None])

    def _catch_up(self, take: Callable[[Snapshot], bool], lost: Callable[[], None]) -> None:
        """Read each shard's changes after its cursor, a page at a time, handing each page
        to *take* (which returns ``False`` to stop for now); call *lost* when the store went
        back (a failover, a flush), so what it lost is written again. Malformed entries are
        logged once for the whole read."""
        assert self.store is not None
        version, store_clock = self.store.probe(self.app.clock.value)
        self.app.clock.adjust(store_clock)
        drops = Parsed()

        def counted(page: Snapshot) -> bool:
            drops.add_drops(page.ids)
            drops.add_drops(page.stamps)
            return take(page)

        try:
            first = all(shard is None for shard in self.shard_cursors)
            if first and not counted(self.store.legacy()):  # the previous layout's, read once
                return
            went_back = False
            for n, theirs in enumerate(version.shards):
                mine = self.shard_cursors[n]
                plan = plan_pull(mine, theirs)
                if plan is Pull.NOTHING:
                    continue
                went_back = went_back or (plan is Pull.EVERYTHING and mine is not None)
                after = mine.seq if mine is not None and plan is Pull.CHANGES else 0
                if not self._read_shard(n, after, counted):
                    break
            if went_back:
                lost()
        finally:
            self._note_dropped("store", drops)

    def _read_shard(self, n: int, after: int, take: Callable[[Snapshot], bool]) -> bool:
        assert self.store is not None
        for page in self.store.pages(n, after, clock=self.app.clock.value):
            self.shard_cursors[n] = page.version
            if not take(page):
                return False
        return True

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
            with self.lock:  # bounded like the revoked set, through an outage too
                self.pending_ids.update(ids)
                self.pending_stamps.update(stamps)
                trim_oldest(self.pending_ids, self.revokes.max_entries)
                trim_oldest(self.pending_stamps, self.revokes.max_entries)

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
        if snapshot.clock > self.app.clock.value:  # one tick per newer clock, not per page
            self.app.clock.adjust(snapshot.clock)
        self.revokes.merge_ids(snapshot.ids.kept, stored=True)
        self.revokes.merge_stamps(snapshot.stamps.kept, stored=True)

    def _merge_page(self, page: Snapshot) -> None:
        try:
            self._apply(page)
        finally:
            self._merged.set()

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
            try:
                self.cycle()
            except Exception:  # cycle() catches the store's errors; this is the last guard
                logger.exception("celery-extras sync: anti-entropy round failed; carrying on")

    def cycle(self) -> None:
        """One anti-entropy round: pull the changes, page by page, then push what only we hold."""
        if self.store is None:
            return
        try:
            if self._merged.is_set():  # else the consumer is busy: it merges, we pull next round
                self._catch_up(self._hand_over, lambda: self.inbox.put(self._restore))
            with self.lock:
                ids, stamps = dict(self.pending_ids), dict(self.pending_stamps)
            if ids or stamps:
                self.store.add(ids, stamps, clock=self.app.clock.value)
                with self.lock:
                    for task_id in ids:
                        self.pending_ids.pop(task_id, None)
                    for stamp in stamps:
                        self.pending_stamps.pop(stamp, None)
                self.stats["pushed"] += len(ids) + len(stamps)
        except Exception as exc:  # unreachable, a wrong-type key, a reply we cannot read
            self._store_failed(exc, starting=False)
            return
        self.stats["last_sync"] = time.time()
        if self.store_state != "ok":
            self.store_state, self.store_reason = "ok", ""
            self.inbox.put(self._restore)
            logger.warning("celery-extras sync: the revoke store is reachable again; catching up")

    def _hand_over(self, page: Snapshot) -> bool:
        """Queue *page* for the consumer; wait until it is merged (``False``: not in time).

        The store has these entries already: they are not pushed (no write amplification).
        """
        if not page.ids.kept and not page.stamps.kept and not page.dropped:
            return True
        self.stats["pulls"] += 1
        self.stats["pulled"] += len(page.ids.kept) + len(page.stamps.kept)
        with self.lock:
            for task_id in page.ids.kept:
                self.pending_ids.pop(task_id, None)
            for stamp in page.stamps.kept:
                self.pending_stamps.pop(stamp, None)
        self._merged.clear()
        self.inbox.put(lambda: self._merge_page(page))
        return self._merged.wait(max(self.interval, 1.0)) and not self.stopping.is_set()

    def _restore(self) -> None:
        """Write again everything this worker knows the store held (consumer thread).

        After an outage or a store that went back (a Sentinel failover can drop the
        last writes the old master acknowledged but had not replicated), the revokes
        it lost come back from the workers that hold them; writes are idempotent.
        """
        ids, stamps = self.revokes.held()
        with self.lock:
            for task_id, expiry in ids.items():
                self.pending_ids.setdefault(task_id, expiry)
            for stamp, expiry in stamps.items():
                self.pending_stamps.setdefault(stamp, expiry)

    def _store_failed(self, exc: Exception, starting: bool) -> None:
        """Mark the store down or in error, and log it once per outage (Redis' text kept)."""
        unreachable = isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError)
        state = "down" if unreachable else "error"
        reason = store_text(exc)
        first = self.store_state == "ok" or (starting and self.stats["last_sync"] is None)
        self.store_state, self.store_reason = state, reason
        if not first:
            return
        what = (
            "the revoke store is unreachable"
            if unreachable
            else "the revoke store answered with an error or with data this version cannot read"
        )
        then = (
            "starting without the durable revokes"
            if starting
            else "revokes are not synced through it"
        )
        logger.error(
            "celery-extras sync: %s (%s); %s, retrying every %s s (logged once per outage)",
            what, reason, then, self.interval,
        )  # fmt: skip

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
            logger.warning("celery-extras sync: dropped a malformed hello reply: %s", shown(body))
            return
        ((node, reply),) = body.items()
        if node == self.hostname or reply is None:
            return
        if not isinstance(reply, dict):
            logger.warning(
                "celery-extras sync: dropped a malformed hello reply from %s", shown(node)
            )
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
        last = self.stats["last_sync"]
        health: dict[str, Any] = {}
        if self.store_state != "ok":
            health = {
                "store_error": self.store_reason,
                "last_sync_age": None if last is None else round(time.time() - last, 1),
            }
        return {
            "store": "absent" if self.store is None else self.store_state,
            **health,
            "cursor": None if self.cursor is None else self.cursor.seq,
            "clock": self.app.clock.value,
            "revoked": len(self.revokes.revoked),
            "unstored": len(self.revokes.unstored_ids) + len(self.pending_ids),
            "stamps": sum(1 for _ in self.revokes.local_stamps()),
            "interval": self.interval,
            **self.stats,
        }
