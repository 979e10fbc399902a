"""``python -m bench chaos [--minutes N] [--seed S] [--broker redis|rabbitmq|both]
[--seconds S]``: the randomized checker (tests/chaos) on random seeds for *N* minutes:
each seed a random workload of every policy in random canvas, on a random pool, with
faults (brokers and store of its own: it may run beside other tests). A failure
prints its seed; ``--seed S`` replays it (the same workload and fault schedule)."""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tests.chaos.checker import Violation, check
from tests.chaos.runner import run
from tests.chaos.workload import generate

from .table import Row

__all__ = ["measure"]


def _options(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench chaos")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=None, help="replay this seed, once")
    parser.add_argument("--broker", choices=("redis", "rabbitmq", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=60.0, help="each seed's workload")
    options = parser.parse_args(list(argv))
    if options.minutes <= 0 or options.seconds < 20:
        parser.error("--minutes must be above 0 and --seconds at least 20")
    return options


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the run's servers and workers are stopped on the way out


def measure(argv: Sequence[str] = ()) -> list[Row]:
    options = _options(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)
    brokers = ("redis", "rabbitmq") if options.broker == "both" else (options.broker,)
    deadline = time.monotonic() + options.minutes * 60.0
    started = time.monotonic()
    seeds: list[tuple[int, str]] = []
    faults: Counter[str] = Counter()
    messages = 0
    found: dict[tuple[int, str], list[Violation]] = {}
    while not seeds or (options.seed is None and time.monotonic() < deadline):
        seed = options.seed if options.seed is not None else random.SystemRandom().randrange(10**6)
        broker = brokers[len(seeds) % len(brokers)]
        workload = generate(seed, options.seconds)
        workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
        history = run(workload, broker, workdir)
        violations = check(history)
        seeds.append((seed, broker))
        faults.update(f.kind for f in workload.faults)
        messages += len(workload.nodes())
        owners = Counter(v.owner for v in violations)
        print(f"  seed {seed} {broker}: {len(workload.nodes())} messages, "
              f"{dict(owners) or 'no findings'} (logs: {workdir})", flush=True)  # fmt: skip
        for violation in violations:
            print(f"    {violation}", flush=True)
        found[(seed, broker)] = violations
    ours = {key: [v for v in vs if v.owner == "celery-extras"] for key, vs in found.items()}
    broken = [f"{seed}/{broker}" for (seed, broker), vs in ours.items() if vs]
    minutes = (time.monotonic() - started) / 60.0
    note = (
        f"{len(seeds)} seeds in {minutes:.0f} min, {messages} messages, faults "
        f"{dict(faults)}; seeds that broke a promise: {', '.join(broken) or 'none'}"
    )
    print(f"  {note}")
    count = sum(len(vs) for vs in ours.values())
    return [Row("chaos: violations of celery-extras' promises", "count", None, float(count),
                "0", count == 0, runs=len(seeds), note=note)]  # fmt: skip
