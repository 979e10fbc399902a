"""One benchmark figure for plain Celery and for celery-extras, and the table they make."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["MEASURED_ON", "TABLE_HEADER", "Row", "markdown", "median_of", "render"]


@dataclass(frozen=True)
class Row:
    """A measured figure: plain Celery's and celery-extras', with the target it must meet."""

    name: str
    unit: str
    plain: float | None
    extras: float
    target: str
    met: bool
    runs: int = 1
    note: str = ""

    @property
    def ratio(self) -> str:
        if self.plain is None or self.plain == 0:
            return "-"
        return f"{self.extras / self.plain:.2f}x"


def median_of(runs: int, measure: Callable[[], float]) -> float:
    """The median of *runs* calls of *measure*."""
    return statistics.median(measure() for _ in range(runs))


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def render(rows: Sequence[Row]) -> str:
    """A plain-text table for the terminal, the rows' notes below it."""
    header = ("figure", "unit", "plain", "extras", "ratio", "target", "met", "runs")
    body = [
        (r.name, r.unit, _fmt(r.plain), _fmt(r.extras), r.ratio, r.target,
         "yes" if r.met else "NO", str(r.runs))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in
             (header, *body)]  # fmt: skip
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["notes:", *notes] if notes else []))


#: What the table's Markdown opens with, then its header line.
MEASURED_ON = "Measured on "
TABLE_HEADER = "| figure | unit | plain Celery | celery-extras | ratio | target | met | runs |"


def markdown(rows: Sequence[Row]) -> str:
    """The table as Markdown, with the machine it ran on."""
    out = [
        f"{MEASURED_ON}{platform.node()}: {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}.",
        "",
        TABLE_HEADER,
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = f" ({r.note})" if r.note else ""
        out.append(
            f"| {r.name}{note} | {r.unit} | {_fmt(r.plain)} | {_fmt(r.extras)} | {r.ratio} "
            f"| {r.target} | {'yes' if r.met else 'NO'} | {r.runs} |"
        )
    return "\n".join(out) + "\n"
