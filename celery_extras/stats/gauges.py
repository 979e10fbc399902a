"""The worker's gauges (``extras_state``), declared once: where each comes from, where it goes.

One :class:`Gauge` per field of an event's ``extras_state`` says

* how the worker reads it from the merged ``info()`` of its celery-extras steps
  (:func:`.emitter.worker_state`, which also gives ``inspect stats`` readers the
  same gauges);
* how a monitor checks it when an event arrives (:func:`.schema.parse`: a value
  that does not hold is :class:`~.schema.Malformed`);
* which Prometheus gauge families it feeds, and with which samples
  (:class:`.prometheus.ThroughputCollector`);
* what a worker's line on the Flower page says of it, and how the workers' values
  make the cluster's (:func:`.flower.page_data`, ``extras top``).

Those places iterate over :data:`GAUGES`, so adding a gauge is adding an entry
here. Pure, no Celery import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import is_int, is_number
from .text import printable
from .wire import MAX_QUEUES, MAX_TASKS, count, short

__all__ = ["GAUGES", "MAX_AT_RISK", "MAX_LIMITS", "Family", "Gauge", "Sample"]

#: Kinds of data at risk an ``eviction`` gauge may list.
MAX_AT_RISK = 16
#: Limits of one task a ``limits`` gauge may list.
MAX_LIMITS = 64

#: One Prometheus sample: the label values after ``worker``, and the value.
Sample = tuple[tuple[str, ...], float]


@dataclass(frozen=True)
class Family:
    """A Prometheus gauge family one gauge feeds: labelled ``worker``, then :attr:`labels`.

    :attr:`samples` turns the gauge's checked value into samples; the collector
    escapes their label values (:func:`~.text.printable`).
    """

    name: str
    help: str
    labels: tuple[str, ...]
    samples: Callable[[Any], Iterable[Sample]]


@dataclass(frozen=True)
class Gauge:
    """One field of ``extras_state``: its source, its check, its metrics, its Flower text.

    * :attr:`read`: its value from the merged ``info()`` of a worker's steps
      (``{"extras_policies": {...}, ...}``), ``None`` when the worker has none;
    * :attr:`check`: the value of an incoming event (never ``None``) checked and
      copied, or ``None`` when it does not hold; :attr:`expected` completes the
      refusal, ``extras_state[key] must ...``;
    * :attr:`families`: the Prometheus gauge families it feeds;
    * :attr:`page`: its part of a worker's line on the Flower page (names escaped),
      or ``None`` for no part; :attr:`merge`: the cluster's value from the workers'
      values, for gauges that have one; :attr:`cluster`: Prometheus families of that
      cluster value, labelled without ``worker`` (the queues' figures).
    """

    key: str
    read: Callable[[Mapping[str, Any]], Any]
    check: Callable[[Any], Any]
    expected: str
    families: tuple[Family, ...] = ()
    page: Callable[[Any], str | None] | None = None
    merge: Callable[[list[Any]], Any] | None = None
    cluster: tuple[Family, ...] = ()


# --- sources: the steps' info() ------------------------------------------------------------


def _field(infos: Mapping[str, Any], step: str, name: str) -> Any:
    info = infos.get(step)
    return info.get(name) if isinstance(info, dict) else None


#: The capabilities whose steps report their view of the store (a ``store_up`` row each).
_CAPABILITIES = ("policies", "sync", "delay")


def _read_store(infos: Mapping[str, Any]) -> dict[str, str] | None:
    """Each capability's view of the store: the ``store`` field of its step's info; and each
    policy's (its gate's figures in ``extras_policies``), where ``policies`` is the first
    of them not ``ok``, else ``ok``."""
    store: dict[str, str] = {}
    policies = _policy_stores(infos.get("extras_policies"))
    if policies:
        store["policies"] = next((s for s in policies.values() if s != "ok"), "ok")
    for capability in _CAPABILITIES[1:]:
        status = _field(infos, f"extras_{capability}", "store")
        if isinstance(status, str):
            store[capability] = status
    store.update(policies)
    return store or None


def _policy_stores(figures: Any) -> dict[str, str]:
    """Each policy's ``store`` field in ``extras_policies``: the limits' at its top (their
    figures come first, as before there were other policies), the others' in their own."""
    if not isinstance(figures, dict):
        return {}
    stores = {"limits": figures["store"]} if isinstance(figures.get("store"), str) else {}
    for policy, figure in figures.items():
        if isinstance(figure, dict) and isinstance(figure.get("store"), str):
            stores[policy] = figure["store"]
    return stores


def _read_eviction(infos: Mapping[str, Any]) -> dict[str, Any] | None:
    """The store's ``maxmemory-policy`` and what it may evict (``extras_store``)."""
    policy = _field(infos, "extras_store", "policy")
    if not isinstance(policy, str):
        return None
    at_risk = _field(infos, "extras_store", "at_risk")
    return {
        "policy": policy,
        "at_risk": [str(k) for k in at_risk] if isinstance(at_risk, list) else [],
    }


def _read_int(step: str, *names: str) -> Callable[[Mapping[str, Any]], int | None]:
    """A reader of the first of *names* in *step*'s info that is an integer."""

    def read(infos: Mapping[str, Any]) -> int | None:
        for name in names:
            value = _field(infos, step, name)
            if is_int(value):
                return value
        return None

    return read


def _read_buffered(infos: Mapping[str, Any]) -> dict[str, int] | None:
    """Messages the fair consumer holds per queue (``extras_queues.buffered``)."""
    buffered = _field(infos, "extras_queues", "buffered")
    if not isinstance(buffered, dict):
        return None
    return {str(queue): n for queue, n in buffered.items() if is_int(n)}


def _read_concurrency(infos: Mapping[str, Any]) -> dict[str, dict[str, int]] | None:
    """Per task with ``concurrency()``, slots held and tasks waiting for one."""
    slots = _field(infos, "extras_policies", "concurrency")
    tasks = slots.get("tasks") if isinstance(slots, dict) else None
    if not isinstance(tasks, dict):
        return None
    return {
        str(name): {"holding": entry["holding"], "waiting": entry["waiting"]}
        for name, entry in tasks.items()
        if isinstance(entry, dict) and is_int(entry.get("holding")) and is_int(entry.get("waiting"))
    }


def _read_limits(infos: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]] | None:
    """Per task and limit: tasks it held, tasks a shadow limit would have held and the
    seconds it would have made them wait (``extras_policies.by_limit``)."""
    by_limit = _field(infos, "extras_policies", "by_limit")
    return _check_limits(by_limit) if isinstance(by_limit, dict) else None


def _read_priority(infos: Mapping[str, Any]) -> Any:
    """Requests waiting for a pool process per queue and priority level
    (``extras_priority.waiting``: ``{queue: {"0": n, ...}}``)."""
    return _field(infos, "extras_priority", "waiting")


def _read_queues(infos: Mapping[str, Any]) -> dict[str, dict[str, float]] | None:
    """Per queue: depth on the broker, age of its oldest message (when known), entries the
    delay store holds for it (when read), messages buffered in the worker
    (``extras_queue_figures``, plus what the fair consumer holds)."""
    figures = _field(infos, "extras_queue_figures", "queues")
    if not isinstance(figures, dict):
        return None
    held = _read_buffered(infos) or {}
    out: dict[str, dict[str, float]] = {}
    for queue, entry in figures.items():
        if not isinstance(entry, dict):
            continue
        kept = {k: entry[k] for k in _QUEUE_FIGURES if is_number(entry.get(k))}
        kept["buffered"] = int(kept.get("buffered", 0)) + held.get(str(queue), 0)
        out[str(queue)] = kept
    return out


# --- checks: an incoming event's value ------------------------------------------------------


def _check_store(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict) or not all(short(k) and short(v) for k, v in value.items()):
        return None
    return dict(value)


def _check_eviction(value: Any) -> dict[str, Any] | None:
    at_risk = value.get("at_risk") if isinstance(value, dict) else None
    if (
        not isinstance(value, dict)
        or not short(value.get("policy"))
        or not isinstance(at_risk, list)
        or len(at_risk) > MAX_AT_RISK
        or not all(short(k) for k in at_risk)
    ):
        return None
    return {"policy": value["policy"], "at_risk": list(at_risk)}


def _check_count(value: Any) -> int | None:
    return value if count(value) else None


def _check_buffered(value: Any) -> dict[str, int] | None:
    if (
        not isinstance(value, dict)
        or len(value) > MAX_QUEUES
        or not all(short(k) and count(v) for k, v in value.items())
    ):
        return None
    return dict(value)


#: The levels a ``priority`` gauge may name (Celery's 0-9 on Redis; AMQP's up to 255).
_LEVELS = frozenset(str(level) for level in range(256))


def _check_priority(value: Any) -> dict[str, dict[str, int]] | None:
    if (
        not isinstance(value, dict)
        or len(value) > MAX_QUEUES
        or not all(
            short(queue)
            and isinstance(levels, dict)
            and all(level in _LEVELS and count(n) for level, n in levels.items())
            for queue, levels in value.items()
        )
    ):
        return None
    return {queue: dict(levels) for queue, levels in value.items()}


def _check_concurrency(value: Any) -> dict[str, dict[str, int]] | None:
    if (
        not isinstance(value, dict)
        or len(value) > MAX_TASKS
        or not all(
            short(name)
            and isinstance(entry, dict)
            and count(entry.get("holding"))
            and count(entry.get("waiting"))
            for name, entry in value.items()
        )
    ):
        return None
    return {name: {"holding": e["holding"], "waiting": e["waiting"]} for name, e in value.items()}


#: The figures of a queue, and a number's check for each (``buffered`` always there).
_QUEUE_FIGURES: dict[str, Callable[[Any], bool]] = {
    "depth": count,
    "oldest": lambda v: is_number(v, minimum=0),
    "parked": count,
    "buffered": count,
}


def _check_queues(value: Any) -> dict[str, dict[str, float]] | None:
    if not isinstance(value, dict) or len(value) > MAX_QUEUES:
        return None
    checked: dict[str, dict[str, float]] = {}
    for queue, entry in value.items():
        if not short(queue) or not isinstance(entry, dict) or "buffered" not in entry:
            return None
        if not all(k in _QUEUE_FIGURES and _QUEUE_FIGURES[k](v) for k, v in entry.items()):
            return None
        checked[queue] = dict(entry)
    return checked


def _merge_queues(values: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The cluster's figures per queue: the largest depth, age and parked count the workers
    read (each read the same broker and store at its tick), the sum of what they buffer."""
    merged: dict[str, dict[str, float]] = {}
    for value in values:
        for queue, entry in value.items():
            into = merged.setdefault(queue, {"buffered": 0})
            into["buffered"] += entry.get("buffered", 0)
            for name in ("depth", "oldest", "parked"):
                if name in entry:
                    into[name] = max(into.get(name, 0), entry[name])
    return merged


#: The figures kept per task and limit, and a number's check for each.
def _seconds(value: Any) -> bool:
    return is_number(value, minimum=0)


_LIMIT_FIGURES: dict[str, Callable[[Any], bool]] = {
    "held": count,
    "shadow": count,
    "shadow_wait": _seconds,
}


def _check_limits(value: Any) -> dict[str, dict[str, dict[str, float]]] | None:
    if not isinstance(value, dict) or len(value) > MAX_TASKS:
        return None
    checked: dict[str, dict[str, dict[str, float]]] = {}
    for task, limits in value.items():
        if not short(task) or not isinstance(limits, dict) or len(limits) > MAX_LIMITS:
            return None
        for label, figures in limits.items():
            if not short(label) or not isinstance(figures, dict):
                return None
            if not all(ok(figures.get(name)) for name, ok in _LIMIT_FIGURES.items()):
                return None
            checked.setdefault(task, {})[label] = {n: figures[n] for n in _LIMIT_FIGURES}
    return checked


# --- Prometheus samples and Flower text -----------------------------------------------------


def _one(value: int) -> Iterable[Sample]:
    return [((), value)]


def _per_key(value: dict[str, int]) -> Iterable[Sample]:
    return [((key,), n) for key, n in value.items()]


def _per_level(value: dict[str, dict[str, int]]) -> Iterable[Sample]:
    return [((queue, level), n) for queue, levels in value.items() for level, n in levels.items()]


def _field_per_key(name: str) -> Callable[[dict[str, dict[str, int]]], Iterable[Sample]]:
    def samples(value: dict[str, dict[str, int]]) -> Iterable[Sample]:
        return [((key,), entry[name]) for key, entry in value.items()]

    return samples


def _per_limit(name: str) -> Callable[[dict[str, dict[str, dict[str, float]]]], Iterable[Sample]]:
    def samples(value: dict[str, dict[str, dict[str, float]]]) -> Iterable[Sample]:
        return [
            ((task, label), figures[name])
            for task, limits in value.items()
            for label, figures in limits.items()
        ]

    return samples


def _queue_figure(name: str) -> Callable[[dict[str, dict[str, float]]], Iterable[Sample]]:
    def samples(value: dict[str, dict[str, float]]) -> Iterable[Sample]:
        return [((queue,), entry[name]) for queue, entry in value.items() if name in entry]

    return samples


def _queues_text(value: dict[str, dict[str, float]]) -> str | None:
    total = sum(entry["buffered"] for entry in value.values())
    return f"prefetched {total}" if total else None


def _store_up(value: dict[str, str]) -> Iterable[Sample]:
    return [((capability,), 1.0 if status == "ok" else 0.0) for capability, status in value.items()]


def _evictable(value: dict[str, Any]) -> Iterable[Sample]:
    return [((value["policy"],), len(value["at_risk"]))]


def _store_text(value: dict[str, str]) -> str | None:
    """The capabilities' rows, and a policy's only when it is not ``ok``."""
    shown = [(k, v) for k, v in value.items() if k in _CAPABILITIES or v != "ok"]
    if not shown:
        return None
    return "store: " + ", ".join(f"{printable(k)} {printable(v)}" for k, v in shown)


def _eviction_text(value: dict[str, Any]) -> str | None:
    if not value["at_risk"]:
        return None
    at_risk = ", ".join(printable(k) for k in value["at_risk"])
    return f"store may evict {at_risk} (maxmemory-policy {printable(value['policy'])})"


def _labelled(label: str) -> Callable[[Any], str]:
    return lambda value: f"{label} {value}"


def _buffered_text(value: dict[str, int]) -> str | None:
    total = sum(value.values())
    return f"buffered {total}" if total else None


def _largest(values: list[int]) -> int:
    return max(values, default=0)


def _sum(values: list[int]) -> int:
    return sum(values)


#: Every gauge of ``extras_state``, in the order the event, the metrics and the page give them.
GAUGES: tuple[Gauge, ...] = (
    Gauge(
        key="store",
        read=_read_store,
        check=_check_store,
        expected="map capabilities to short strings",
        families=(
            Family(
                "celery_extras_store_up",
                "1 when this capability (sync, policies, delay) or policy (limits, concurrency, "
                "coalesce...) of the worker reaches the store, 0 when it reports it down",
                ("capability",),
                _store_up,
            ),
        ),
        page=_store_text,
    ),
    Gauge(
        key="eviction",
        read=_read_eviction,
        check=_check_eviction,
        expected="be {'policy': short string, 'at_risk': [short strings]}",
        families=(
            Family(
                "celery_extras_store_evictable",
                "Kinds of data celery-extras must not lose that the store's maxmemory-policy may "
                "evict (0 under noeviction); while parked tasks are among them, nothing is parked",
                ("policy",),
                _evictable,
            ),
        ),
        page=_eviction_text,
    ),
    Gauge(
        key="waiting",  # per worker: the cluster's is the sum
        read=_read_int("extras_policies", "waiting"),
        check=_check_count,
        expected="be an integer >= 0",
        families=(
            Family(
                "celery_extras_tasks_waiting",
                "Tasks held in the worker for a rate limit",
                (),
                _one,
            ),
        ),
        page=_labelled("waiting"),
        merge=_sum,
    ),
    Gauge(
        key="parked",  # the shared store's depth, each worker sees all of it: the largest
        read=_read_int("extras_delay", "depth", "parked"),
        check=_check_count,
        expected="be an integer >= 0",
        families=(
            Family(
                "celery_extras_tasks_parked",
                "Tasks parked in the delay store (store-wide), as the worker reads it",
                (),
                _one,
            ),
        ),
        page=_labelled("parked"),
        merge=_largest,
    ),
    Gauge(
        key="concurrency",
        read=_read_concurrency,
        check=_check_concurrency,
        expected="map task names to {'holding': int >= 0, 'waiting': int >= 0}",
        families=(
            Family(
                "celery_extras_concurrency_holding",
                "Concurrency slots the worker holds for running tasks, per task with concurrency()",
                ("task",),
                _field_per_key("holding"),
            ),
            Family(
                "celery_extras_concurrency_waiting",
                "Tasks waiting in the worker for a concurrency slot, per task with concurrency()",
                ("task",),
                _field_per_key("waiting"),
            ),
        ),
    ),
    Gauge(
        key="limits",
        read=_read_limits,
        check=_check_limits,
        expected="map task names to {limit: {'held': int >= 0, 'shadow': int >= 0, "
        "'shadow_wait': number >= 0}}",
        families=(
            Family(
                "celery_extras_limit_held",
                "Tasks this limit held back since the worker started (which limit held them)",
                ("task", "limit"),
                _per_limit("held"),
            ),
            Family(
                "celery_extras_limit_shadow_held",
                "Tasks this shadow limit would have held since the worker started (they ran)",
                ("task", "limit"),
                _per_limit("shadow"),
            ),
            Family(
                "celery_extras_limit_shadow_wait_seconds",
                "Seconds this shadow limit would have made tasks wait, summed since the worker "
                "started",
                ("task", "limit"),
                _per_limit("shadow_wait"),
            ),
        ),
    ),
    Gauge(
        key="buffered",
        read=_read_buffered,
        check=_check_buffered,
        expected="map queue names to integers >= 0",
        families=(
            Family(
                "celery_extras_queue_buffered",
                "Messages the fair consumer holds for a queue",
                ("queue",),
                _per_key,
            ),
        ),
        page=_buffered_text,
    ),
    Gauge(
        key="priority",
        read=_read_priority,
        check=_check_priority,
        expected="map queue names to {level '0'-'255': int >= 0}",
        families=(
            Family(
                "celery_extras_priority_waiting",
                "Requests of a queue waiting in the worker for a pool process, per priority "
                "level (extras_priority)",
                ("queue", "level"),
                _per_level,
            ),
        ),
    ),
    Gauge(
        key="queues",
        read=_read_queues,
        check=_check_queues,
        expected="map queue names to {'depth': int >= 0, 'oldest': number >= 0, "
        "'parked': int >= 0, 'buffered': int >= 0} (depth, oldest and parked when known)",
        families=(
            Family(
                "celery_extras_queue_prefetched",
                "Messages of a queue in the worker not yet running (prefetched, or held by "
                "the fair consumer)",
                ("queue",),
                _queue_figure("buffered"),
            ),
        ),
        page=_queues_text,
        merge=_merge_queues,
        cluster=(
            Family(
                "celery_extras_queue_depth",
                "Messages ready in the queue on the broker (the largest a worker read at its "
                "last stats tick)",
                ("queue",),
                _queue_figure("depth"),
            ),
            Family(
                "celery_extras_queue_oldest_seconds",
                "Age of the queue's oldest message on the broker, from its publish stamp "
                "(Redis only: RabbitMQ cannot tell it)",
                ("queue",),
                _queue_figure("oldest"),
            ),
            Family(
                "celery_extras_queue_parked",
                "Tasks of the queue the delay store holds, not yet taken by a worker (parked, "
                "or published to its due queue), from the counts the store keeps",
                ("queue",),
                _queue_figure("parked"),
            ),
        ),
    ),
)
