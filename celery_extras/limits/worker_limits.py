"""One worker's limits: what they are (specs, run-time rates) and what they decide with
(the worker's own buckets, the store's bucket and health). No Celery import: the decision
is :class:`~.planner.LimitPlanner`'s, the gate :mod:`.gate`'s."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..clock import monotonic
from ..store.health import StoreHealth, StoreUser, store_text
from .local_buckets import LocalBuckets
from .overrides import RateOverrides
from .redis_bucket import GlobalTokenBucket, Override
from .spec import LimitSpec, limit_id
from .token_bucket import TokenBucket

__all__ = ["WorkerLimits"]

#: Named after the module the limits came from, so logging set-ups keep working.
logger = logging.getLogger("celery_extras.limits.gate")


class WorkerLimits:
    """One worker's limits on *clock*: their specs, run-time rates, its own buckets, the
    store's bucket and health; what :class:`~.planner.LimitPlanner` decides with.

    *global_bucket* builds the store's :class:`GlobalTokenBucket` when first needed;
    *store* reports its calls (by default a store health of its own).
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        global_bucket: Callable[[], GlobalTokenBucket],
        clock: Callable[[], float] = monotonic,
        store: StoreUser | None = None,
    ) -> None:
        self.clock = clock
        self._make_bucket = global_bucket
        self.max_hold: float = settings["delay_max_hold"]
        self.on_store_error: str = settings["limit_on_store_error"]
        self.store_retry: float = settings["store_retry"]
        self.all_shadow: bool = bool(settings.get("limits_shadow", False))
        self.specs: dict[str, tuple[LimitSpec, ...]] = {}
        #: run-time rates by :func:`~.redis_bucket.override_field`
        self.rates = RateOverrides(self.specs, self._retune)
        self.buckets = LocalBuckets(clock)
        if store is None:
            store = StoreHealth(self.store_retry, clock).user(logger, *self.outage_texts())
        self.store = store
        self._bucket: GlobalTokenBucket | None = None

    @property
    def overrides(self) -> dict[str, Override]:
        """The run-time rates, by :func:`~.redis_bucket.override_field`."""
        return self.rates.overrides

    @property
    def local(self) -> dict[tuple[str, str], TokenBucket]:
        """This worker's own buckets (:class:`~.local_buckets.LocalBuckets`)."""
        return self.buckets.buckets

    # -- set-up --------------------------------------------------------------------------

    def register(self, name: str, specs: LimitSpec | tuple[LimitSpec, ...]) -> None:
        """Task *name* has these limits (top first)."""
        self.specs[name] = (specs,) if isinstance(specs, LimitSpec) else tuple(specs)

    def outage_texts(self) -> tuple[str, str]:
        """What this planner is called in the outage log, and what an outage does to it."""
        return (
            "global limits",
            f"they fall back to extras_limit_on_store_error={self.on_store_error!r} "
            "until it answers",
        )

    def global_bucket(self) -> GlobalTokenBucket:
        if self._bucket is None:
            self._bucket = self._make_bucket()
        return self._bucket

    def load_overrides(self) -> None:
        """Read the run-time rates stored by ``celery extras limit`` (bad entries are logged)."""
        try:
            stored = self.global_bucket().overrides()
        except Exception as exc:  # unreachable, a wrong-type key: the task's own limits apply
            logger.warning(
                "celery-extras: could not read run-time limits from the store: %s",
                store_text(exc),
            )
            return
        for field, raw in stored.items():
            try:
                self.overrides[field] = Override.loads(raw)
            except ValueError as exc:
                self.global_bucket().report_ignored(field, str(exc))
        for name in self.specs:
            self._retune(name)

    # -- run-time rates --------------------------------------------------------------------

    def shadow(self, spec: LimitSpec) -> bool:
        return spec.shadow or self.all_shadow

    def effective(self, limit: str, key: str, spec: LimitSpec) -> tuple[float, int]:
        return self.rates.effective(limit, key, spec)

    def _retune(self, name: str) -> None:
        for index, spec in enumerate(self.specs.get(name, ())):
            limit = limit_id(name, index)
            self.buckets.retune(limit, lambda key: self.rates.effective(limit, key, spec))  # noqa: B023

    def limit_of(self, name: object, limit: object = None) -> tuple[str, LimitSpec]:
        return self.rates.limit_of(name, limit)

    def set_limit(
        self, name: object, rate: object, burst: object = None, key: object = None,
        limit: object = None,
    ) -> str:  # fmt: skip
        """Apply a new rate for a limit of *name* (for one *key* of it) on this worker;
        :class:`ValueError` naming the culprit."""
        applied = self.rates.set(name, rate, burst, key, limit)
        if self._bucket is not None:
            self._bucket.expire_overrides()
        return applied

    def reset_limit(self, name: object, key: object = None, limit: object = None) -> str:
        """Drop the run-time rate of a limit of *name* (of one *key*) on this worker."""
        return self.rates.reset(name, key, limit)
