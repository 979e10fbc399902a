"""A seeded workload and fault schedule: the same seed gives the same sends (tasks, keys,
canvas, ids, times) and the same faults at the same moments. No Celery import."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

__all__ = ["FAULTS", "POOLS", "Fault", "Node", "Send", "Workload", "generate"]

POOLS = ("prefork", "threads", "gevent", "eventlet")
#: What the schedule may inject: a worker SIGKILLed or warm-stopped (each started again
#: after the fault's length), the store stalled (a proxy stops forwarding), SIGSTOPped or
#: restarted, the broker restarted, a worker started while the others work.
FAULTS = ("kill", "term", "store_stall", "store_pause", "store_restart", "broker_restart",
          "join")  # fmt: skip
#: The tasks a node may be, by how often the workload draws them.
TASKS = {
    "chaos.plain": 2, "chaos.limited": 3, "chaos.several": 2, "chaos.capped": 2,
    "chaos.coalesced": 3, "chaos.debounced": 2, "chaos.retried": 1, "chaos.batched": 3,
}  # fmt: skip
SHAPES = {"one": 8, "chain": 2, "group": 2, "chord": 1, "link": 1, "countdown": 1}


@dataclass(frozen=True)
class Node:
    """One task message: its id, task and arguments ``(key, tag, seconds)``."""

    id: str
    task: str
    key: str
    tag: int
    seconds: float


@dataclass(frozen=True)
class Send:
    """What one producer sends at *at* s: *nodes* as *shape* (``chain``: in order; ``group``;
    ``chord``: the last node is the body; ``link``: the second is the first's callback;
    ``countdown``: one node, due *countdown* s after its send)."""

    at: float
    producer: int
    shape: str
    nodes: tuple[Node, ...]
    countdown: float = 0.0


@dataclass(frozen=True)
class Fault:
    """*kind* at *at* s for *length* s, on worker *target* (an index) where it names one."""

    at: float
    kind: str
    length: float
    target: int = 0


@dataclass
class Workload:
    seed: int
    seconds: float
    pool: str
    workers: int
    sends: list[Send] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def nodes(self) -> list[Node]:
        return [node for send in self.sends for node in send.nodes]

    def describe(self) -> str:
        kinds = ", ".join(f"{f.kind}@{f.at:.0f}s" for f in self.faults) or "none"
        return (f"seed {self.seed}: {self.seconds:.0f} s, {self.workers} workers on "
                f"{self.pool}, {len(self.sends)} sends ({len(self.nodes())} messages), "
                f"faults: {kinds}")  # fmt: skip


def _pick(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def generate(seed: int, seconds: float = 60.0, *, pool: str | None = None, workers: int = 2,
             faults: tuple[str, ...] = FAULTS, rate: float | None = None,
             producers: int = 2) -> Workload:  # fmt: skip
    """The workload of *seed*: sends for *seconds* at a random rate (or *rate* per second)
    from *producers*, on *pool* (random when ``None``), with about one fault of *faults*
    every 25 s (none in the first 5 s or the last 10 s)."""
    rng = random.Random(seed)
    work = Workload(seed, seconds, pool or rng.choice(POOLS), workers)
    rate = rate if rate is not None else rng.uniform(4.0, 12.0)
    tag = 0
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            break
        shape = _pick(rng, SHAPES)
        size = {"one": 1, "countdown": 1, "link": 2}.get(shape, rng.randint(2, 4))
        nodes = []
        for _ in range(size):
            task = _pick(rng, TASKS)
            key = f"k{rng.randrange(4)}"
            nodes.append(Node(str(uuid.UUID(int=rng.getrandbits(128), version=4)), task, key,
                              tag, round(rng.uniform(0.0, 0.1), 3)))  # fmt: skip
            tag += 1
        countdown = round(rng.uniform(1.5, 4.0), 2) if shape == "countdown" else 0.0
        work.sends.append(Send(round(at, 3), rng.randrange(producers), shape, tuple(nodes),
                               countdown))  # fmt: skip
    if faults and seconds > 20:
        count = max(1, round(seconds / 25.0))
        for _ in range(count):
            kind = rng.choice(faults)
            length = round(rng.uniform(1.0, 4.0), 2)
            work.faults.append(Fault(round(rng.uniform(5.0, seconds - 10.0), 2), kind, length,
                                     rng.randrange(workers)))  # fmt: skip
        work.faults.sort(key=lambda f: f.at)
    return work
