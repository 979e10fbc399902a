"""The mover: the loop every worker runs to publish the due entries of a delay store.

Each turn claims a batch of entries due within a lead time (and the ETA and retry entries
of a herd due within a lookahead, see :mod:`.store`), publishes each one through a
callable it is given and releases the published ones in one call; an entry it cannot
publish stays claimed and is claimed again when its lease ends. No Celery import: the
thread that runs it and the publishing are in :mod:`.mover_thread`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

from .entry import Entry
from .store import Claim, DelayStore

__all__ = ["Mover"]

#: Named after the module the mover came from, so logging set-ups keep working.
logger = logging.getLogger("celery_extras.delay.core")


class Mover:
    """One worker's mover: claims due entries, publishes them, releases them.

    *publish* sends one claimed entry (``Entry``, entry id, token) to its queue and
    raises when it cannot; the entry is then left claimed, and claimed again when
    its lease ends. *confirm*, if given, returns once the broker has every entry published
    in the turn, or raises: then none of them is released (they are claimed again).
    :meth:`run_once` returns how long to sleep before the next turn. *new_token* gives each
    turn a random text; the turn's claims carry it and their number.
    """

    def __init__(
        self,
        store: DelayStore,
        publish: Callable[[Entry, Claim], None],
        *,
        lead: float = 1.0,
        lookahead: float = 0.0,
        pace: float = 0.0,
        lease: float = 10.0,
        recheck: float = 600.0,
        batch: int = 100,
        poll: float = 0.5,
        on_released: Callable[[Entry, Claim], None] | None = None,
        confirm: Callable[[], None] | None = None,
        new_token: Callable[[], str] = lambda: secrets.token_hex(8),
    ) -> None:
        self.store = store
        self.publish = publish
        self.lead = lead
        self.lookahead = lookahead
        self.pace = pace
        self.lease = lease
        self.recheck = recheck
        self.batch = batch
        self.poll = poll
        self.on_released = on_released
        self.confirm = confirm
        self.new_token = new_token
        self.counts = {"claimed": 0, "released": 0, "publish_errors": 0, "invalid": 0}
        self.broker_down = False

    def run_once(self) -> float:
        """One turn; seconds to sleep before the next. Store errors propagate."""
        turn = self.new_token()  # one random text a turn: its claims are numbered
        tokens = [f"{turn}.{i}" for i in range(self.batch)]
        # published but not yet taken, per shard, before the lookahead waits: two batches
        claimed = self.store.claim(self.lead, self.lease, tokens, self.lookahead,
                                   2 * self.batch, self.pace)  # fmt: skip
        self.counts["claimed"] += len(claimed.items)
        published: list[tuple[Entry, Claim]] = []
        try:
            failed = self._publish_all(claimed.items, published)
            if published and not self._confirmed(published):
                failed = True
        finally:  # what was published is released, even when a publish or the store failed
            if published:
                self.store.release_all(
                    [(claim.entry_id, claim.token) for _, claim in published], self.recheck
                )
                self.counts["released"] += len(published)
                if self.on_released is not None:
                    for entry, claim in published:
                        self.on_released(entry, claim)
        if failed:
            return self.poll  # the rest of the batch waits for its lease
        if len(claimed.items) >= self.batch:
            return 0.0
        if claimed.next_in is None:
            return self.poll
        return min(self.poll, max(0.0, claimed.next_in - self.lead))

    def _publish_all(self, claims: list[Claim], published: list[tuple[Entry, Claim]]) -> bool:
        """Publish *claims* in order, appending each to *published*; ``True`` when the broker
        refused one (the rest are left claimed)."""
        for claim in claims:
            try:
                entry = Entry.loads(claim.raw)
            except ValueError as exc:
                self.counts["invalid"] += 1
                logger.error("celery-extras: dropping delay entry %s: %s", claim.entry_id, exc)
                self.store.discard(claim.entry_id)
                continue
            try:
                self.publish(entry, claim)
            except Exception as exc:
                self._cannot_publish(exc, f"{entry.task}[{entry.task_id}]")
                return True
            if self.broker_down:
                self.broker_down = False
                logger.warning("celery-extras: the delay mover publishes again")
            published.append((entry, claim))
        return False

    def _confirmed(self, published: list[tuple[Entry, Claim]]) -> bool:
        """``True`` when the broker confirmed *published*; else they are taken off it (left
        claimed: the broker may have some, which the store's take then drops as copies)."""
        if self.confirm is None:
            return True
        try:
            self.confirm()
        except Exception as exc:
            self._cannot_publish(exc, f"{len(published)} published, unconfirmed")
            published.clear()
            return False
        return True

    def _cannot_publish(self, exc: Exception, what: str) -> None:
        self.counts["publish_errors"] += 1
        if not self.broker_down:
            self.broker_down = True
            logger.warning(
                "celery-extras: the delay mover cannot publish (%r, %s); claimed entries are "
                "claimed again when their lease of %.0f s ends (logged once per outage)",
                exc, what, self.lease,
            )  # fmt: skip

    def info(self) -> dict[str, Any]:
        return dict(self.counts)
