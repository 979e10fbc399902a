"""The priority buffer (pure): levels, FIFO within a level, aging on a fake clock, counts."""

from __future__ import annotations

import pytest

from celery_extras.priority.buffer import LEVELS, PriorityBuffer, amqp_level, redis_level


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drain(buffer: PriorityBuffer[str]) -> list[str]:
    return [buffer.pop().item for _ in range(len(buffer))]


def test_levels_in_order_and_fifo_within_a_level() -> None:
    buffer: PriorityBuffer[str] = PriorityBuffer(clock=Clock())
    for i in range(2):
        for level in range(LEVELS - 1, -1, -1):
            buffer.push(f"{level}.{i}", level)
    assert drain(buffer) == [f"{level}.{i}" for level in range(LEVELS) for i in range(2)]
    with pytest.raises(IndexError):
        buffer.pop()


def test_the_issue_s_backlog_comes_out_without_an_inversion() -> None:
    buffer: PriorityBuffer[tuple[int, int]] = PriorityBuffer(clock=Clock())
    sent = (
        [(9, i) for i in range(20)]
        + [(2 - i % 2, i) for i in range(10)]
        + [(0, i) for i in range(5)]
    )
    for item in sent:
        buffer.push(item, item[0])
    assert [buffer.pop().item for _ in sent] == sorted(sent)


def test_aging_raises_a_waiting_item_one_level_every_s_seconds() -> None:
    clock = Clock()
    buffer: PriorityBuffer[str] = PriorityBuffer(aging=2.0, clock=clock)
    low = buffer.push("low", 9)
    clock.now += 11.0  # 5.5 levels: ranks at 3.5
    assert buffer.effective_level(low) == 3.5
    buffer.push("four", 4)
    buffer.push("three", 3)
    assert drain(buffer) == ["three", "low", "four"]


def test_an_aged_item_ranks_ahead_of_those_it_caught_up_with() -> None:
    clock = Clock()
    buffer: PriorityBuffer[str] = PriorityBuffer(aging=1.0, clock=clock)
    buffer.push("nine", 9)
    clock.now += 9.0  # ranks as 0 now, and came first
    buffer.push("zero", 0)
    clock.now += 100.0  # never above 0
    assert buffer.effective_level(buffer.peek()) == 0.0
    assert drain(buffer) == ["nine", "zero"]


def test_without_aging_a_low_waits_for_every_high() -> None:
    clock = Clock()
    buffer: PriorityBuffer[str] = PriorityBuffer(clock=clock)
    buffer.push("nine", 9)
    clock.now += 1000.0
    buffer.push("eight", 8)
    assert drain(buffer) == ["eight", "nine"]


def test_counts_per_queue_per_level_and_oldest_wait() -> None:
    clock = Clock()
    buffer: PriorityBuffer[str] = PriorityBuffer(clock=clock)
    buffer.push("a", 0, "q1")
    clock.now += 2.5
    buffer.push("b", 3, "q1")
    buffer.push("c", 3, "q1")
    buffer.push("d", 9, "q2")
    assert buffer.counts() == {"q1": {0: 1, 3: 2}, "q2": {9: 1}}
    assert buffer.oldest_wait() == 2.5
    buffer.pop()
    assert buffer.counts() == {"q1": {3: 2}, "q2": {9: 1}}
    assert [e.item for e in buffer.clear()] == ["b", "c", "d"]
    assert buffer.counts() == {} and len(buffer) == 0 and buffer.oldest_wait() == 0.0


def test_aging_must_be_positive() -> None:
    with pytest.raises(ValueError, match="aging must be > 0"):
        PriorityBuffer(aging=0)


@pytest.mark.parametrize(
    ("priority", "level"),
    [(None, 0), (0, 0), (1, 1), (5, 5), (9, 9), (12, 9), (-3, 0), ("7", 0), (True, 0), (4.0, 4)],
)
def test_redis_level_is_the_priority_clamped_0_first(priority: object, level: int) -> None:
    assert redis_level(priority) == level


@pytest.mark.parametrize(
    ("priority", "level"), [(None, 9), (0, 9), (9, 0), (5, 4), (200, 0), (-1, 9)]
)
def test_amqp_level_runs_the_highest_priority_first(priority: object, level: int) -> None:
    assert amqp_level(priority, 9) == level


def test_the_buffer_is_a_pure_core() -> None:
    """No Celery, kombu or redis: only the standard library and the package's clock."""
    import ast
    from pathlib import Path

    import celery_extras.priority.buffer as module

    tree = ast.parse(Path(module.__file__).read_text())
    found = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert found == {"__future__", "heapq", "itertools", "collections.abc", "dataclasses",
                     "typing", "clock"}  # fmt: skip
