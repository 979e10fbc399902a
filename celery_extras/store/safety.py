"""Whether the store's Redis may drop what celery-extras must not lose.

A Redis whose ``maxmemory-policy`` evicts keys drops them silently: a parked task
whose message was acked is then gone, a revoked task runs, a concurrency cap is
exceeded. :data:`KEPT` says what the store keeps that must not be lost and whether
its keys carry a TTL (the ``volatile-*`` policies evict only those);
:func:`at_risk` says, per policy, what of it may be evicted. :class:`StoreSafety`
reads the policy from ``INFO memory`` (it answers where ``CONFIG`` is disabled, as
on managed Redis) when first asked, again every :data:`REFRESH` seconds, and after
every new connection or store failure (a reconnect may reach another Redis: a
failover), and says whether parking is allowed. No Celery import.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from ..bounds import cut
from .health import StoreHealth, answered_with_error

__all__ = [
    "COALESCING",
    "FULL_RECHECK",
    "HEADROOM",
    "KEPT",
    "PARKED",
    "REFRESH",
    "Kept",
    "SafetyVerdict",
    "StoreSafety",
    "at_risk",
]

#: Seconds between two reads of the store's eviction policy (it can change at run time).
REFRESH = 60.0
#: After a write refused for memory, parks wait until the store's used memory is below
#: this share of its ``maxmemory`` (read at most every :data:`FULL_RECHECK` seconds), so a
#: store at the brink does not take and refuse parks in turn.
HEADROOM = 0.9
FULL_RECHECK = 1.0


@dataclass(frozen=True)
class Kept:
    """One kind of data the store keeps that must not be lost."""

    what: str
    #: its keys carry a TTL, so the ``volatile-*`` policies may evict them too
    expires: bool
    #: what its eviction does
    consequence: str


PARKED = Kept("parked tasks", False, "a parked task whose message was acked never runs")
KEPT: tuple[Kept, ...] = (
    PARKED,
    Kept("revokes", False, "a revoked task runs"),
    Kept("limit and cap overrides", False, "a task runs at its decorated limit again"),
    Kept("retry failure memory", True, "a retried item's backoff starts over"),
    Kept("concurrency slot holds", True, "a concurrency cap is exceeded"),
    Kept(
        "coalescing holds",
        True,
        "a key runs twice at once, or a covered message's result never comes",
    ),
)
#: The coalescing holds of :data:`KEPT` (held back, as in an outage, where they may go).
COALESCING = KEPT[-1]


def at_risk(policy: str) -> tuple[Kept, ...]:
    """What of :data:`KEPT` a Redis with ``maxmemory-policy`` *policy* may evict.

    ``noeviction`` evicts nothing (a write over ``maxmemory`` is refused instead);
    ``volatile-*`` only keys with a TTL; ``allkeys-*``, and any policy not known
    here, everything.
    """
    if policy == "noeviction":
        return ()
    if policy.startswith("volatile-"):
        return tuple(k for k in KEPT if k.expires)
    return KEPT


@dataclass(frozen=True)
class SafetyVerdict:
    """What one look at the store found."""

    policy: str
    maxmemory: int
    risk: tuple[Kept, ...]
    #: ``"aof"``, ``"rdb"``, ``"aof+rdb"``, ``"none"`` or ``"unknown"`` (``CONFIG`` disabled)
    persistence: str
    checked_at: float = field(compare=False, default=0.0)

    @property
    def risk_text(self) -> str:
        return ", ".join(k.what for k in self.risk)


def _nodes(answer: Any) -> Iterator[Mapping[str, Any]]:
    """The per-node answers of *answer* (a Redis Cluster client answers per node)."""
    if (
        isinstance(answer, Mapping)
        and answer
        and all(isinstance(v, Mapping) for v in answer.values())
    ):
        yield from answer.values()
    elif isinstance(answer, Mapping):
        yield answer


def _masters(client: Any) -> dict[str, Any]:
    """Options that send a command to every master: a Redis Cluster client sends ``INFO``
    and ``CONFIG GET`` to one default node unless told."""
    primaries = getattr(client, "get_primaries", None)
    return {"target_nodes": primaries()} if callable(primaries) else {}


def read_policy(client: Any) -> tuple[str, int]:
    """``(maxmemory-policy, maxmemory)`` of the store; of a cluster, the worst master's."""
    policies: list[tuple[str, int]] = []
    for node in _nodes(client.info("memory", **_masters(client))):
        policy = node.get("maxmemory_policy")
        if isinstance(policy, str) and policy:
            maxmemory = node.get("maxmemory")
            policies.append((policy, maxmemory if isinstance(maxmemory, int) else 0))
    if not policies:
        return "unknown", 0
    return max(policies, key=lambda p: len(at_risk(p[0])))


def read_fill(client: Any) -> float:
    """``used_memory / maxmemory`` of the store (of a cluster, its fullest master); 0.0 where
    no ``maxmemory`` is set."""
    fills = [
        node["used_memory"] / node["maxmemory"]
        for node in _nodes(client.info("memory", **_masters(client)))
        if isinstance(node.get("used_memory"), int) and isinstance(node.get("maxmemory"), int)
        and node["maxmemory"] > 0
    ]  # fmt: skip
    return max(fills, default=0.0)


def read_persistence(client: Any) -> str:
    """How the store survives a restart (of a cluster: what every master does);
    ``"unknown"`` where ``CONFIG`` is refused."""
    masters = _masters(client)
    answers = list(_nodes(client.info("persistence", **masters)))
    aof = bool(answers) and all(node.get("aof_enabled") in (1, "1") for node in answers)
    try:
        saves = [
            node.get("save")
            for node in _nodes(client.config_get("save", **masters))
            if "save" in node
        ]
    except redis.ResponseError:  # CONFIG disabled or renamed (managed Redis)
        return "aof" if aof else "unknown"
    rdb = bool(saves) and all(isinstance(s, str) and s.strip() for s in saves)
    return "+".join(kind for kind, on in (("aof", aof), ("rdb", rdb)) if on) or "none"


class StoreSafety:
    """The store's eviction policy as last read, and what it means for parking.

    *client* returns the store's client. With *logger*, every change of verdict is
    logged (an error naming the policy, what is at risk and the fix; a warning when
    the risk is gone), and a store that keeps nothing across a restart is warned of
    once. *allow_eviction* (``extras_store_allow_eviction``) lets parks go on into an
    evicting store anyway. With *health* (the process' breaker), nothing is read while the
    store is known unreachable, and a read that cannot reach it opens the breaker.
    """

    def __init__(
        self,
        client: Callable[[], Any],
        *,
        allow_eviction: bool = False,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh: float = REFRESH,
        health: StoreHealth | None = None,
    ) -> None:
        self.client = client
        self.health = health
        self.allow_eviction = allow_eviction
        self.logger = logger
        self.clock = clock
        self.refresh = refresh
        self.verdict: SafetyVerdict | None = None
        self._due = 0.0
        self._warned_persistence = False
        self._lock = threading.Lock()
        #: a write was refused for memory: parks wait for :data:`HEADROOM` (see :meth:`full`)
        self.is_full = False
        self._full_due = 0.0

    def stale(self) -> None:
        """Read the policy again at the next question (a store call failed: the next
        connection may reach another Redis)."""
        self._due = 0.0

    def check(self) -> SafetyVerdict:
        """Read the policy now (store errors propagate); log a change of verdict."""
        client = self.client()
        policy, maxmemory = read_policy(client)
        persistence = self.verdict.persistence if self.verdict else read_persistence(client)
        verdict = SafetyVerdict(policy, maxmemory, at_risk(policy), persistence, self.clock())
        with self._lock:
            previous, self.verdict = self.verdict, verdict
            self._due = verdict.checked_at + self.refresh
        if self.logger is not None:
            self._log(previous, verdict)
        return verdict

    def current(self) -> SafetyVerdict | None:
        """The verdict, read again first when it is older than :attr:`refresh` (or stale);
        ``None`` when the store cannot be read (an outage: the callers' own handling)."""
        if self.verdict is None or self.clock() >= self._due:
            if not self._reachable():
                return None
            try:
                return self.check()
            except Exception as exc:  # unreadable (an outage): the caller's own call meets it
                self._failed(exc)
                return None
        return self.verdict

    def _reachable(self) -> bool:
        return self.health is None or self.health.reachable()

    def _failed(self, exc: BaseException) -> None:
        self.stale()
        if self.health is not None and not answered_with_error(exc):
            self.health.unreachable(exc)

    def full(self) -> None:
        """A write was refused for memory (``OOM command not allowed``): refuse parks until
        the store's used memory is below :data:`HEADROOM` of its ``maxmemory``."""
        self.is_full, self._full_due = True, self.clock() + FULL_RECHECK

    def _still_full(self) -> bool:
        if not self.is_full:
            return False
        now = self.clock()
        if now < self._full_due:
            return True
        self._full_due = now + FULL_RECHECK
        if not self._reachable():
            return False  # the park itself meets the outage
        try:
            fill = read_fill(self.client())
        except Exception as exc:  # unreadable: the park itself meets the outage
            self._failed(exc)
            return False
        self.is_full = fill >= HEADROOM
        return self.is_full

    def refusal(self) -> str | None:
        """Why a park must not go to the store now: ``"full"`` (it refused a write for
        memory and has not freed enough since), ``"evicting"`` (it may evict parked tasks
        and that was not allowed), or ``None``."""
        if self._still_full():
            return "full"
        verdict = self.current()
        if verdict is None:
            return None  # unreadable: the park itself meets the outage, if it is one
        return None if self.allow_eviction or PARKED not in verdict.risk else "evicting"

    def evicts(self, kept: Kept) -> bool:
        """Whether *kept* must not go to the store now: it is full, or its policy may
        evict *kept* and that was not allowed."""
        if self._still_full():
            return True
        verdict = self.current()
        return verdict is not None and not self.allow_eviction and kept in verdict.risk

    def parks_allowed(self) -> bool:
        return self.refusal() is None

    def info(self) -> dict[str, Any]:
        verdict = self.verdict
        if verdict is None:
            return {"policy": "unknown"}
        out: dict[str, Any] = {
            "policy": verdict.policy,
            "maxmemory": verdict.maxmemory,
            "at_risk": [k.what for k in verdict.risk],
            "persistence": verdict.persistence,
        }
        if PARKED in verdict.risk:
            out["parking"] = "allowed" if self.allow_eviction else "refused"
        if self.is_full:
            out["full"] = True
        return out

    def _log(self, previous: SafetyVerdict | None, verdict: SafetyVerdict) -> None:
        assert self.logger is not None
        if previous is None or previous.risk != verdict.risk or previous.policy != verdict.policy:
            if verdict.risk:
                parking = (
                    "parking goes on (extras_store_allow_eviction)"
                    if self.allow_eviction
                    else "nothing is parked there: waits stay held in the worker or unacked"
                )
                self.logger.error(
                    "celery-extras: the store's Redis has maxmemory-policy %s, which may evict "
                    "%s (%s); %s. Fix: maxmemory-policy noeviction, or a Redis of its own "
                    "for the store (extras_redis_url); extras_store_allow_eviction = True "
                    "accepts the risk",
                    cut(verdict.policy, 60), verdict.risk_text,
                    "; ".join(k.consequence for k in verdict.risk), parking,
                )  # fmt: skip
            elif previous is not None and previous.risk:
                self.logger.warning(
                    "celery-extras: the store's Redis has maxmemory-policy %s now: nothing "
                    "celery-extras keeps there can be evicted",
                    cut(verdict.policy, 60),
                )
        if verdict.persistence == "none" and not self._warned_persistence:
            self._warned_persistence = True
            self.logger.warning(
                "celery-extras: the store's Redis keeps nothing on disk (no AOF, no RDB "
                "snapshots): parked tasks, revokes and slot holds would not survive its restart"
            )
