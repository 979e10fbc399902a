"""Smooth weighted round robin over resources, skipping the empty ones.

Each pick adds every candidate's weight to its credit, serves the candidate with
the most credit and charges it the candidates' total weight (nginx's smooth
weighted round robin): with weights ``{a: 3, b: 1}`` the order is ``a a b a``,
interleaved rather than bursty. A candidate found empty has that pick undone
and is left out until the next call, so the order over the non-empty resources
is exactly the weighted one, an idle resource hoards no credit, and one call
tries each resource at most once (no spinning).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from ..checks import is_int

__all__ = ["WeightedCycle", "WeightedOrder"]

R = TypeVar("R", bound=Hashable)


def _checked(weights: Mapping[R, int]) -> dict[R, int]:
    for resource, weight in weights.items():
        if not is_int(weight, minimum=1):
            raise ValueError(f"weight of {resource!r}: expected an integer >= 1, got {weight!r}")
    return dict(weights)


class WeightedOrder(Generic[R]):
    """The weighted order itself: ``pick(ready)`` returns the next resource for which
    ``ready(resource)`` is true, or ``None`` when none is."""

    def __init__(self, weights: Mapping[R, int]) -> None:
        self.weights: dict[R, int] = {}
        self.credit: dict[R, int] = {}
        self.update(weights)

    def update(self, weights: Mapping[R, int]) -> None:
        """Replace the weights; takes effect from the next pick. Credit of kept resources stays."""
        self.weights = _checked(weights)
        self.credit = {r: self.credit.get(r, 0) for r in self.weights}

    def pick(self, ready: Callable[[R], bool]) -> R | None:
        candidates = list(self.weights)
        while candidates:
            total = 0
            best = candidates[0]
            for resource in candidates:
                self.credit[resource] += self.weights[resource]
                total += self.weights[resource]
                if self.credit[resource] > self.credit[best]:
                    best = resource
            self.credit[best] -= total
            if ready(best):
                return best
            for resource in candidates:  # undo the round: as if *best* had not been there
                self.credit[resource] -= self.weights[resource]
            self.credit[best] += total
            candidates.remove(best)
        return None


class WeightedCycle(Generic[R]):
    """A weighted :class:`kombu.utils.scheduling.FairCycle`: ``get`` calls ``fun(resource,
    callback, **kwargs)`` on resources in weighted order until one does not raise
    *predicate* (``Empty``); raises *predicate* when every resource did."""

    def __init__(
        self,
        fun: Callable[..., Any],
        resources: Iterable[R],
        predicate: type[BaseException] = Exception,
        weights: Mapping[R, int] | None = None,
    ) -> None:
        self.fun = fun
        self.predicate = predicate
        self.resources = list(resources)
        given = weights or {}
        self.order: WeightedOrder[R] = WeightedOrder({r: given.get(r, 1) for r in self.resources})

    def update(self, weights: Mapping[R, int]) -> None:
        """Change weights at run time (resources not named keep weight 1)."""
        self.order.update({r: weights.get(r, 1) for r in self.resources})

    def get(self, callback: Callable[..., Any], **kwargs: Any) -> Any:
        result: list[Any] = []

        def ready(resource: R) -> bool:
            try:
                result.append(self.fun(resource, callback, **kwargs))
            except self.predicate:
                return False
            return True

        if self.order.pick(ready) is None:
            raise self.predicate()
        return result[0]

    def close(self) -> None:
        """Nothing to release; kept for FairCycle compatibility."""
