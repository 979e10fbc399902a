"""``python -m bench [NAME ...] [--OPTION ...]``: run the benchmarks, print one table, write
its rows in docs/benchmarks.md, below the text written there by hand (only when every
benchmark runs, with its defaults).

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

from .table import MEASURED_ON, TABLE_HEADER, Row, markdown, render

# module names under bench/, in table order
BENCHES: tuple[str, ...] = (
    "stats",
    "policies",
    "concurrency",
    "coalesce",
    "batch",
    "batch_huge",
    "delay",
    "delay_scale",
    "herd",
    "sync",
    "consumer",
    "priority",
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
"""


def prose() -> str:
    """The text of :data:`DOC` before its table (written by hand, kept as it is), or
    :data:`INTRO` when it has none."""
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    table = text.find(TABLE_HEADER)
    return text[: text.rfind(MEASURED_ON, 0, table)] if table > 0 else INTRO


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
        DOC.write_text(prose() + markdown(rows))
        print(f"wrote {DOC}")
    return 0 if all(r.met for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
