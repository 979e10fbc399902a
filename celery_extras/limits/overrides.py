"""Run-time rates: what ``celery extras limit`` sets for a limit (or one key of it), over the
rate its ``limit()`` declared. No Celery import."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..bounds import shown
from ..checks import is_int
from .rate import format_rate, parse_burst, parse_rate
from .redis_bucket import Override, override_field
from .spec import LimitSpec, limit_id

__all__ = ["RateOverrides", "check_key"]


def check_key(key: object) -> str:
    """A bucket key given to a command (``""``: none); :class:`ValueError` naming it."""
    if key is None:
        return ""
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise ValueError(f"key {shown(key)}: expected a bucket key (1 to 200 characters)")
    return key


class RateOverrides:
    """The run-time rates of one worker's limits, by :func:`~.redis_bucket.override_field`.

    *specs* are the limits of each task (the planner's, shared); *changed* is told the
    task whose rates changed, so its buckets take them.
    """

    def __init__(
        self, specs: Mapping[str, tuple[LimitSpec, ...]], changed: Callable[[str], None]
    ) -> None:
        self.specs = specs
        self.changed = changed
        self.overrides: dict[str, Override] = {}

    def effective(self, limit: str, key: str, spec: LimitSpec) -> tuple[float, int]:
        """The rate and burst of *limit* (an id) for *key*: a run-time rate set for that key,
        else for the limit, else its ``limit()``."""
        override = self.overrides.get(override_field(limit, key)) if key else None
        if override is None:
            override = self.overrides.get(limit)
        if override is None:
            return spec.rate, spec.burst
        return override.rate, override.burst or spec.burst

    def limit_of(self, name: object, limit: object = None) -> tuple[str, LimitSpec]:
        """``(id, spec)`` of the *limit*-th (1-based, top first; may be left out when the task
        has one) ``limit()`` of task *name*; :class:`ValueError` naming the culprit."""
        if not isinstance(name, str):
            raise ValueError(f"task_name {shown(name)}: expected a task name (a string)")
        specs = self.specs.get(name)
        if not specs:
            raise ValueError(f"task {shown(name)} has no limit() on this worker")
        if limit is None and len(specs) == 1:
            limit = 1
        if not is_int(limit, minimum=1, maximum=len(specs)):
            listed = ", ".join(f"{i}: {s.text}" for i, s in enumerate(specs, 1))
            raise ValueError(
                f"limit {shown(limit)}: task {name} has {len(specs)} limit()s; name one of "
                f"them by its place, top first ({listed})"
            )
        return limit_id(name, limit - 1), specs[limit - 1]

    def set(
        self, name: object, rate: object, burst: object = None, key: object = None,
        limit: object = None,
    ) -> str:  # fmt: skip
        """Apply a new rate for a limit of *name* (for one *key* of it); what it is now."""
        limit_name, spec = self.limit_of(name, limit)
        key = check_key(key)
        per_second = parse_rate(rate)
        checked = None if burst is None else parse_burst(burst)
        text = rate.strip() if isinstance(rate, str) else format_rate(per_second)
        self.overrides[override_field(limit_name, key)] = Override(per_second, checked, text)
        self.changed(str(name))
        for_key = f" for key {key!r}" if key else ""
        return f"{limit_name}{for_key}: {text} (burst {checked or spec.burst}, {spec.scope})"

    def reset(self, name: object, key: object = None, limit: object = None) -> str:
        """Drop the run-time rate of a limit of *name* (of one *key*); what it is now."""
        limit_name, spec = self.limit_of(name, limit)
        key = check_key(key)
        had = self.overrides.pop(override_field(limit_name, key), None)
        self.changed(str(name))
        for_key = f" for key {key!r}" if key else ""
        back = f"{limit_name}{for_key}: back to {spec.text} (burst {spec.burst}, {spec.scope})"
        return back if had is not None else back + "; it had no run-time rate"
