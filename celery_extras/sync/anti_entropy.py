"""The worker's revokes and the durable store's, merged both ways.

:meth:`AntiEntropy.load` reads the whole store, synchronously, before the worker
consumes anything: a revoke sent while no worker ran is honoured from the first
message on. Then :meth:`AntiEntropy.cycle`, one round on the sync thread every
``extras_sync_interval``, compares each shard's version with its cursor, pulls only
the changes, and writes back the revokes the worker learnt from a broadcast alone.
Pulls come a page at a time, and the thread waits for each page to be merged (in
the consumer's thread, through the :class:`~.syncer.Syncer`'s inbox) before it
reads the next: catching up with a full store costs the worker one page's memory,
not the store's (the allocator keeps what a pull once took).

The store's outages are a ``StoreUser``'s (``store/health.py``; ``revoke store``):
logged once when one starts and once when it ends; the round is tried every
interval all the same, and after an outage the worker writes again what it holds.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from celery import Celery
from celery.utils.log import get_logger

from ..store.client import StoreUnavailable, redis_client, store_key, store_user
from ..store.health import answered_with_error
from ..threads import FORK_GATE
from .digest import Pull, Version, plan_pull
from .entries import Parsed, Stamp
from .revoke_store import SHARDS, RevokeStore, Snapshot
from .state import WorkerRevokes, trim_oldest

__all__ = ["REVOKE_STORE", "AntiEntropy", "Owner"]

logger = get_logger(__name__)

#: The store's user name in the outage lines: ``celery-extras: revoke store: ...``.
REVOKE_STORE = "revoke store"


class Owner(Protocol):
    """What the anti-entropy uses of the :class:`~.syncer.Syncer` that owns it."""

    app: Celery
    revokes: WorkerRevokes
    interval: float
    inbox: queue.SimpleQueue[Callable[[], None]]
    stopping: threading.Event
    stats: dict[str, Any]

    def drain(self) -> None: ...

    def note_dropped(self, source: str, *parsed: Parsed) -> None: ...


class AntiEntropy:
    """Loads the store, then syncs with it once a round; see the module docstring."""

    def __init__(self, syncer: Owner, revoke_max: int) -> None:
        self.syncer = syncer
        self.app = app = syncer.app
        self.revokes = syncer.revokes
        self.store: RevokeStore | None = None
        self.unavailable: str | None = None  # why there is no store at all
        try:
            self.store = RevokeStore(redis_client(app, background=True), store_key(app), revoke_max)
        except StoreUnavailable as exc:
            self.unavailable = str(exc)
        every = f"(tried every {syncer.interval} s)"
        self.health = store_user(
            app, logger, REVOKE_STORE, f"revokes are not synced through it until it answers {every}"
        )
        self.starting = (
            f"the worker starts without the durable revokes and will catch up once it answers "
            f"{every}"
        )
        self.failure: BaseException | None = None  # what the last failed call raised
        #: Per shard, the version read up to (``None``: never read).
        self.shard_cursors: list[Version | None] = [None] * SHARDS
        #: Revokes to write to the store, with their expiry.
        self.pending_ids: dict[str, float] = {}
        self.pending_stamps: dict[Stamp, float] = {}
        self.lock = threading.Lock()
        self._merged = threading.Event()  # the page last queued is merged
        self._merged.set()

    @property
    def cursor(self) -> Version | None:
        """Where this worker has read the store up to (``None`` until it has read every shard)."""
        if any(shard is None for shard in self.shard_cursors):
            return None
        return Version.of_shards([shard for shard in self.shard_cursors if shard is not None])

    # -- consumer thread ---------------------------------------------------

    def load(self) -> None:
        """Merge the whole store into the worker's state now (a store that is down is skipped)."""
        if self.store is None:
            logger.warning("celery-extras sync: no durable revokes: %s", self.unavailable)
            return
        stats = self.syncer.stats
        self.syncer.drain()  # merges a restarted consumer's thread left queued
        if stats["last_sync"] is None:  # what Celery loaded itself (--statedb) is shared
            self.revokes.adopt_held()
        started = time.monotonic()
        loaded = [0, 0]

        def merge(page: Snapshot) -> bool:
            self._apply(page)
            loaded[0] += len(page.ids.kept)
            loaded[1] += len(page.stamps.kept)
            return True

        try:  # the cursors are set when the consumer restarts (e.g. after a lost connection)
            self._catch_up(merge, self.restore)
        except Exception as exc:  # whatever the store holds, the worker starts
            self.failed(exc, starting=True)
            return
        stats["last_sync"] = time.time()
        stats["loaded"] = sum(loaded)
        stats["load_seconds"] = round(time.monotonic() - started, 4)
        logger.info(
            "celery-extras sync: %d revoked ids and %d stamps loaded from the store in %.3f s",
            loaded[0], loaded[1], stats["load_seconds"],
        )  # fmt: skip

    def pend(self, ids: dict[str, float], stamps: dict[Stamp, float]) -> None:
        """Queue revokes only this worker holds, to be written by the next round."""
        with self.lock:  # bounded like the revoked set, through an outage too
            self.pending_ids.update(ids)
            self.pending_stamps.update(stamps)
            trim_oldest(self.pending_ids, self.revokes.max_entries)
            trim_oldest(self.pending_stamps, self.revokes.max_entries)

    def restore(self) -> None:
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

    # -- sync thread -------------------------------------------------------

    def cycle(self) -> None:
        """One anti-entropy round: pull the changes, page by page, then push what only we hold."""
        if self.store is None or not self.health.up():  # none, or it failed a moment ago
            return
        syncer = self.syncer
        try:
            if self._merged.is_set():  # else the consumer is busy: it merges, we pull next round
                self._catch_up(self._hand_over, lambda: syncer.inbox.put(self.restore))
            with self.lock:
                ids, stamps = dict(self.pending_ids), dict(self.pending_stamps)
            if ids or stamps:
                self.store.add(ids, stamps, clock=self.app.clock.value)
                with self.lock:
                    for task_id in ids:
                        self.pending_ids.pop(task_id, None)
                    for stamp in stamps:
                        self.pending_stamps.pop(stamp, None)
                syncer.stats["pushed"] += len(ids) + len(stamps)
        except Exception as exc:  # unreachable, a wrong-type key, a reply we cannot read
            self.failed(exc)
            return
        syncer.stats["last_sync"] = time.time()
        if self.health.down:  # back after an outage: what it missed is written again
            syncer.inbox.put(self.restore)
        self.health.answered()

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
            self.syncer.note_dropped("store", drops)

    def _read_shard(self, n: int, after: int, take: Callable[[Snapshot], bool]) -> bool:
        assert self.store is not None
        for page in self.store.pages(n, after, clock=self.app.clock.value):
            self.shard_cursors[n] = page.version
            if not take(page):
                return False
        return True

    def _hand_over(self, page: Snapshot) -> bool:
        """Queue *page* for the consumer; wait until it is merged (``False``: not in time).

        The store has these entries already: they are not pushed (no write amplification).
        """
        if not page.ids.kept and not page.stamps.kept and not page.dropped:
            return True
        syncer = self.syncer
        syncer.stats["pulls"] += 1
        syncer.stats["pulled"] += len(page.ids.kept) + len(page.stamps.kept)
        with self.lock:
            for task_id in page.ids.kept:
                self.pending_ids.pop(task_id, None)
            for stamp in page.stamps.kept:
                self.pending_stamps.pop(stamp, None)
        self._merged.clear()
        syncer.inbox.put(lambda: self._merge_page(page))
        with FORK_GATE.idle():  # the consumer's thread merges it: it may fork meanwhile
            merged = self._merged.wait(max(syncer.interval, 1.0))
        return merged and not syncer.stopping.is_set()

    # -- the store's health ------------------------------------------------

    def failed(self, exc: BaseException, starting: bool = False) -> None:
        """Note a failed call (logged if it starts an outage, with Redis' text kept).

        A reply this version cannot read is an answer: the store is in error, not down.
        """
        self.failure = exc
        self.health.failed(exc, self.starting if starting else None)

    def info(self) -> dict[str, Any]:
        """``store``: ``absent``, ``ok``, ``down`` (cannot reach it) or ``error`` (it answered
        with an error, or with something this version cannot read)."""
        if self.store is None:
            return {"store": "absent"}
        if not self.health.down:
            return {"store": "ok"}
        last = self.syncer.stats["last_sync"]
        answered = self.failure is not None and answered_with_error(self.failure)
        return {
            "store": "error" if answered else "down",
            "store_error": self.health.reason,
            "last_sync_age": None if last is None else round(time.time() - last, 1),
        }
