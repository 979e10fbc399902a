"""``python -m bench [NAME ...] [--OPTION ...]``: run the benchmarks, print one table, write
docs/benchmarks.md (only when every benchmark runs, with its defaults).

Each module in :data:`BENCHES` has ``measure() -> list[Row]``; it starts its own
real workers (plain Celery and celery-extras) against local Redis/RabbitMQ and
stops them before it returns. Options after the names go to the one benchmark named,
whose ``measure`` then takes them (``python -m bench forks --starts 40``).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from .table import Row, markdown, render

# module names under bench/, in table order
BENCHES: tuple[str, ...] = (
    "stats",
    "policies",
    "concurrency",
    "coalesce",
    "batch",
    "delay",
    "delay_scale",
    "herd",
    "sync",
    "consumer",
    "store",
    "testing",
    "forks",
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
INTRO = """# Benchmarks

`python -m bench` runs every benchmark against local Redis and RabbitMQ, each
figure measured for plain Celery and for celery-extras side by side in the same
run, and writes this table. "runs" is how many repetitions the median is over;
for the no-op throughput rows it is the number of alternating pairs of drains
(each worker drains alone, the other paused), and the figures are the summed
rates. On a 2-core VM the same worker's drain rate varies by 15 % or more from
one drain to the next (the pairs' quartiles show it), so the no-op task is also
measured in instructions its worker's main process retires per task, counted by
callgrind (valgrind): those repeat whatever else the machine does. With the main
process the limit, the throughput a no-op task loses is the share of
instructions celery-extras adds.

## What admission costs the store

`python -m bench gates` (also the last rows of `python -m bench admission`) drains
2,000 queued no-op tasks per gate, set so that it never binds, with the store on a
private `redis-server`: its `INFO commandstats` counts the gates' script calls and `INFO
cpu` the server's CPU time (a script's own commands are counted again inside it by
commandstats, so its CPU is read from the server), the idle store's background measured
apart and taken off. A worker with an event loop writes its rounds on its admission line
(`celery_extras/admission/store_line.py`) without waiting, and the rounds that arrive
while a write is out go in the next write: the round trips are the script calls less
those the line wrote with another (the worker counts them: `inspect stats`,
`extras_store_line`). Each drain is timed from the worker's SIGCONT (the backlog queued
while it was stopped) to the last task's result. Measured on 2026-11-26 on a 2-core VM,
one sitting, best of 3 drains each, the Redis broker's figure first, RabbitMQ's second;
the store's CPU includes its network system time.

| gate(s), never binding | trips per task | Redis CPU per task | one Redis core admits | vs plain |
|---|---|---|---|---|
| `limit(scope="worker")` | 0 | 0 | - | 0.87x / 0.92x |
| `limit(scope="global")` | 0.99 / 0.73 | 42 / 35 us | ~24,000-28,500/s | 0.79x / 0.74x |
| `concurrency(scope="global")` | 1.51 / 1.27 | 67 / 57 us | ~15,000-17,500/s | 0.85x / 0.81x |
| `coalesce`, distinct keys | 1.59 / 1.16 | 96 / 78 us | ~10,500-12,800/s | 0.76x / 0.69x |
| the three on one task | 1.66 / 0.93 | 135 / 111 us | ~7,400-9,000/s | 0.66x / 0.59x |

A slot is taken as the task arrives and released as it ends, a coalescing hold asked and
finished; the three gates on one task are asked in one round as the task arrives and one
as it ends (`celery_extras/admission/store_round.py`), fewer round trips when the line writes
several rounds at once: on RabbitMQ, whose messages reach the worker several at a time,
most writes carry more than one. Asked one by one and waited for, as before this release,
they took 5 round trips and 396-427 us of Redis CPU per task (one sitting; 238-390 us in
single rounds, three sittings). A drain of plain Celery on the Redis broker runs ~1,500
tasks/s here, on RabbitMQ ~3,300-3,500.

Redis runs scripts on one core, so these are per Redis master. On a Redis Cluster of N
masters the store admits N times as many when the tasks' keys (their coalescing keys,
the keys of per-key limits and slots) spread over its hash slots; there a task's three
gates keep their keys in three slots, so they ask one after the other (5 round trips,
spread over the masters that hold those keys). Whatever N, one key lives on one master:
every booking of one global limit bucket goes through one core, ~24,000-28,500 a second
here, so a cluster-wide rate above that is split per key.

On paper, 100 workers each draining 1,000 tasks a second (100,000 admissions a second):
with a global limit alone, 3.5-4.2 Redis cores, so a Cluster of ~5 masters with the
limit split over keys (one bucket takes no more than one core); with the three gates,
11-14 cores in rounds, more as a Cluster's single calls: a Cluster of ~15-25 masters,
the keys spread. A single Redis (or a Sentinel-managed master) serves a cluster that
admits ~7,400-9,000 tasks a second under all three gates.

"""


def main(argv: list[str]) -> int:
    first_option = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    names, options = argv[:first_option], argv[first_option:]
    if options and len(names) != 1:
        print("options go to one benchmark: python -m bench NAME --OPTION ...", file=sys.stderr)
        return 2
    chosen = names or [name.rsplit(".", 1)[-1] for name in BENCHES]
    rows: list[Row] = []
    started = time.monotonic()
    for name in chosen:
        module = importlib.import_module(f"bench.{name}")
        print(f"running {name} ...", flush=True)
        rows.extend(module.measure(options) if options else module.measure())
    print(render(rows))
    print(f"({time.monotonic() - started:.0f} s)")
    if not argv:
        DOC.write_text(INTRO + markdown(rows))
        print(f"wrote {DOC}")
    return 0 if all(r.met for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
