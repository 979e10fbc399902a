"""What ``limit(...)`` asks for, checked once at decoration time (no Celery import)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..admission.spec import SCOPES, KeyFunc, PolicyError
from ..bounds import shown
from ..checks import is_int
from .rate import MAX_BURST, format_rate, parse_burst, parse_rate

__all__ = ["CostError", "CostFunc", "LimitSpec", "limit_id"]

#: ``cost(args, kwargs) -> int``: the tokens one call takes.
CostFunc = Callable[[Sequence[Any], Mapping[str, Any]], Any]


class CostError(ValueError):
    """A task's cost cannot be taken from one of its limits (above its burst, or not a count)."""


def limit_id(task: str, index: int) -> str:
    """How the *index*-th ``limit()`` of *task* (0: the top one) is named in the store: its
    bucket, its run-time rate. The first keeps the task's name, as when a task had one."""
    return task if index == 0 else f"{task}#{index + 1}"


@dataclass(frozen=True)
class LimitSpec:
    """A token-bucket limit: *rate* tasks per second, *burst* at once, per *scope* and key;
    each call takes *cost* tokens; a *shadow* limit is counted, never enforced."""

    rate: float
    burst: int
    scope: str
    key: KeyFunc | None
    text: str
    cost: int | CostFunc = 1
    shadow: bool = False

    @classmethod
    def build(
        cls,
        task: str,
        rate: object,
        burst: object,
        scope: object,
        key: object,
        cost: object = 1,
        shadow: object = False,
    ) -> LimitSpec:
        where = f"limit() on task {task!r}"
        try:
            per_second = parse_rate(rate)
        except ValueError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        try:
            burst = 1 if burst is None else parse_burst(burst)
        except ValueError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        if scope not in SCOPES:
            raise PolicyError(f"{where}: scope {scope!r}: expected 'global' or 'worker'")
        if key is not None and not callable(key):
            raise PolicyError(f"{where}: key {key!r}: expected a callable (args, kwargs) -> key")
        if not callable(cost):
            try:
                cost = check_cost(cost, burst)
            except CostError as exc:
                raise PolicyError(f"{where}: {exc}") from None
        if not isinstance(shadow, bool):
            raise PolicyError(f"{where}: shadow {shown(shadow)}: expected True or False")
        text = rate if isinstance(rate, str) else format_rate(per_second)
        return cls(per_second, burst, str(scope), key, text, cost, shadow)

    def cost_of(self, args: Sequence[Any], kwargs: Mapping[str, Any], burst: int) -> int:
        """The tokens a call takes from this limit, whose burst is *burst* now (a run-time
        rate may change it); :class:`CostError` naming the cost and the burst."""
        cost = self.cost(args, kwargs) if callable(self.cost) else self.cost
        return check_cost(cost, burst)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "rate": self.text,
            "burst": self.burst,
            "scope": self.scope,
            "per_key": self.key is not None,
        }
        if self.cost != 1:
            described["cost"] = "per call" if callable(self.cost) else self.cost
        if self.shadow:
            described["shadow"] = True
        return described


def check_cost(cost: object, burst: int) -> int:
    """*cost* if it is a count of tokens a bucket of *burst* can hand out at once."""
    if not is_int(cost, minimum=0, maximum=MAX_BURST):
        raise CostError(f"cost {shown(cost)}: expected an integer from 0 to the burst ({burst})")
    if cost > burst:
        raise CostError(
            f"cost {cost} is above the burst ({burst}): no bucket of that burst ever has "
            f"{cost} tokens at once (raise burst=, or lower the cost)"
        )
    return cost
