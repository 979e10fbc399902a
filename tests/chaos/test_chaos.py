"""CI's fixed seeds of the randomized checker: each 40 s of a random workload under
every policy and canvas, with faults, on a pool and a broker; no violation of
celery-extras' promises (Celery's own, under a SIGKILL or a broker restart, are printed).
``python -m bench chaos --minutes N`` runs random seeds for longer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.checker import check
from tests.chaos.runner import run
from tests.chaos.workload import generate

#: Minute-long runs with their own workers and private Redis servers.
pytestmark = pytest.mark.scenario

#: (seed, broker, pool, faults): every pool, both brokers and every fault kind, each seed
#: drawing both of its two faults
SEEDS = [
    (105, "redis", "prefork", ("kill", "store_pause")),
    (202, "redis", "threads", ("store_stall", "broker_restart")),
    (303, "rabbitmq", "gevent", ("broker_restart", "join")),
    (401, "rabbitmq", "eventlet", ("store_restart", "term")),
]


@pytest.mark.parametrize(("seed", "broker", "pool", "faults"), SEEDS,
                         ids=[f"{s}-{b}-{p}" for s, b, p, _ in SEEDS])  # fmt: skip
def test_a_seed_breaks_no_promise(
    seed: int, broker: str, pool: str, faults: tuple[str, ...], tmp_path: Path
) -> None:
    workload = generate(seed, 40.0, pool=pool, faults=faults)
    history = run(workload, broker, tmp_path)
    found = check(history)
    for violation in found:
        print(violation)
    ours = [v for v in found if v.owner == "celery-extras"]
    assert not ours, (f"seed {seed} ({workload.describe()}, {broker}) broke "
                      f"{len(ours)} promise(s):\n" + "\n".join(map(str, ours[:30])))  # fmt: skip
