from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
from kombu.utils.scheduling import FairCycle

from celery_extras.consumer.weighted_cycle import WeightedCycle, WeightedOrder


def always(resource: str) -> bool:
    return True


def picks(order: WeightedOrder[str], n: int, ready: Callable[[str], bool] = always) -> list[str]:
    return [p for p in (order.pick(ready) for _ in range(n)) if p is not None]


def test_order_is_smooth_not_bursty() -> None:
    assert picks(WeightedOrder({"a": 3, "b": 1}), 8) == list("aabaaaba")


def test_nginx_reference_sequence() -> None:
    # The sequence nginx documents for weights 5, 1, 1.
    assert picks(WeightedOrder({"a": 5, "b": 1, "c": 1}), 7) == list("aabacaa")


@pytest.mark.parametrize("seed", range(20))
def test_shares_converge_to_the_weights_for_random_weights(seed: int) -> None:
    rng = random.Random(seed)
    weights = {f"q{i}": rng.randint(1, 20) for i in range(rng.randint(2, 8))}
    total = sum(weights.values())
    counts = Counter(picks(WeightedOrder(weights), total * 50))
    assert counts == {r: w * 50 for r, w in weights.items()}  # exact after whole rounds


def test_empty_resources_are_skipped_and_hoard_no_credit() -> None:
    order = WeightedOrder({"a": 1, "b": 10})
    assert picks(order, 100, lambda r: r == "a") == ["a"] * 100
    # b becomes ready: it gets its share from now on, not a burst paid for by its idle time
    counts = Counter(picks(order, 110))
    assert counts == {"a": 10, "b": 100}


def test_nothing_ready_returns_none_after_trying_each_once() -> None:
    tried: list[str] = []
    order = WeightedOrder({"a": 2, "b": 1, "c": 1})
    assert order.pick(lambda r: bool(tried.append(r))) is None
    assert sorted(tried) == ["a", "b", "c"]
    assert picks(order, 4) == picks(WeightedOrder({"a": 2, "b": 1, "c": 1}), 4)  # state undone


def test_weight_change_takes_effect_from_the_next_pick() -> None:
    order = WeightedOrder({"a": 1, "b": 1})
    picks(order, 10)
    order.update({"a": 4, "b": 1})
    assert Counter(picks(order, 50)) == {"a": 40, "b": 10}


@pytest.mark.parametrize("weight", [0, -1, 1.5, True, "2"])
def test_bad_weight_is_named(weight: object) -> None:
    with pytest.raises(ValueError, match=r"^weight of 'a': expected an integer >= 1"):
        WeightedOrder({"a": weight})  # type: ignore[dict-item]


class Empty(Exception):
    pass


def test_cycle_has_faircycle_interface_and_weights() -> None:
    queues = {"a": list(range(30)), "b": list(range(30))}

    def fetch(name: str, callback: Callable[[str, int], str]) -> str:
        if not queues[name]:
            raise Empty()
        return callback(name, queues[name].pop())

    cycle = WeightedCycle(fetch, ["a", "b"], Empty, weights={"a": 2})
    got = [cycle.get(lambda name, item: name) for _ in range(30)]
    assert Counter(got) == {"a": 20, "b": 10}
    got = [cycle.get(lambda name, item: name) for _ in range(30)]
    assert Counter(got) == {"a": 10, "b": 20}  # a ran dry after 30: b alone is served
    with pytest.raises(Empty):
        cycle.get(lambda name, item: name)
    fair = FairCycle(fetch, ["a", "b"], Empty)
    with pytest.raises(Empty):  # same contract as kombu's FairCycle
        fair.get(lambda name, item: name)
    cycle.close()
