"""The code blocks of a reStructuredText page: ``.. code-block::`` directives and the
literal blocks a paragraph ending in ``::`` introduces."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCS", "Block", "blocks_of", "commands", "python_blocks"]

DOCS = Path(__file__).resolve().parents[2] / "docs"
_DIRECTIVE = re.compile(r"^(\s*)\.\. (?:code-block|code|sourcecode)::\s*(\S*)")


@dataclass(frozen=True)
class Block:
    page: str  # file name under docs/
    line: int  # of its first line of code, 1-based
    language: str  # "" for a literal block
    text: str  # dedented

    @property
    def first(self) -> str:
        """Its first line, stripped: the checks' table names a block by its start."""
        return self.text.splitlines()[0].strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def blocks_of(page: Path) -> list[Block]:
    """Every code block of *page*, in order."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        directive = _DIRECTIVE.match(lines[i])
        literal = lines[i].rstrip().endswith("::") and not lines[i].lstrip().startswith("..")
        if not (directive or literal):
            i += 1
            continue
        outer = _indent(lines[i])
        i += 1
        while i < len(lines) and re.match(r"^\s+:[\w-]+:", lines[i]):  # directive options
            i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        start, body = i, []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > outer):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        inner = min(_indent(line) for line in body if line.strip())
        text = "\n".join(line[inner:] for line in body)
        found.append(Block(page.name, start + 1, directive[2] if directive else "", text))
    return found


def commands(block: Block) -> list[tuple[str, list[str]]]:
    """``[(command, the output lines shown under it)]``: the ``$ `` lines of a console
    block, or every line of a block without one (comments and blank lines left out)."""
    lines = block.text.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return [(line.split("  #")[0].strip(), []) for line in lines
                if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    found: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("$ "):
            found.append((line[2:].strip(), []))
        elif found and line.strip():
            found[-1][1].append(line)
    return found


def python_blocks(page: Path) -> list[Block]:
    """The blocks of *page* that are Python (they parse as Python)."""
    found = []
    for block in blocks_of(page):
        try:
            ast.parse(block.text)
        except SyntaxError:  # a console block, output, a diagram
            continue
        found.append(block)
    return found
