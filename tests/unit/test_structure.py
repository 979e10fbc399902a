"""The layout DESIGN.md fixes, read from the source with ``ast``: the admission pipeline
imports no policy, no class grows past 250 lines, and the pure cores import nothing but
the standard library and other pure modules (no Celery, kombu or redis)."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import celery_extras
from celery_extras.policies import POLICIES

PACKAGE = Path(celery_extras.__file__).parent
#: The policy packages: every folder holding a ``policy.py`` (one entry of POLICIES each;
#: ``admission/policy.py`` says what an entry is).
POLICY_PACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/policy.py")
                         if p.parent.name != "admission")  # fmt: skip
#: The pure cores (no Celery import, an injectable clock) and what they may import of the
#: package besides each other.
PURE = (
    "limits/token_bucket.py", "limits/rate.py", "limits/all_of.py", "limits/local_buckets.py",
    "concurrency/slot_table.py", "keyed/table.py", "coalesce/table.py",
    "debounce/table.py", "memoize/table.py", "batch/table.py", "batch/call.py",
    "retries/policies.py", "retries/failure_memory.py", "stats/timewheel.py",
    "stats/histogram.py", "consumer/weighted_cycle.py", "sync/state.py", "sync/entries.py",
    "sync/digest.py", "delay/entry.py", "threads.py", "priority/buffer.py",
)  # fmt: skip
PURE_HELPERS = ("clock.py", "checks.py", "bounds.py")


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import of *path*, lazy ones too; relative ones resolved
    to a path inside the package (``limits/rate``)."""
    parts = path.relative_to(PACKAGE).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, node.module or ""
                continue
            base = list(parts[: len(parts) - node.level + 1])
            modules = [node.module] if node.module else [a.name for a in node.names]
            for module in modules:
                target = "/".join(p for p in [*base, *module.split(".")] if p)
                yield node.lineno, f"celery_extras/{target}"


def test_every_registered_policy_has_its_package() -> None:
    assert sorted(p.name for p in POLICIES) == sorted(
        name
        for folder in POLICY_PACKAGES
        for name in {"limits": ("limits",), "concurrency": ("concurrency", "queue_concurrency"),
                     "coalesce": ("coalesce",), "batch": ("batch",), "retries": ("retry",),
                     "debounce": ("debounce",), "memoize": ("memoize",)}[folder]
    )  # fmt: skip


def test_the_admission_pipeline_imports_no_policy_package() -> None:
    found = []
    for path in sorted((PACKAGE / "admission").glob("*.py")):
        for line, module in imports(path):
            for policy in POLICY_PACKAGES:
                if module.startswith((f"celery_extras/{policy}", f"celery_extras.{policy}")):
                    found.append(f"admission/{path.name}:{line} imports {module}")
    assert found == []


def test_no_class_is_over_250_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > 250:
                    long.append(f"{path.relative_to(PACKAGE)}: {node.name} ({length} lines)")
    assert long == []


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long.append(f"{path.relative_to(PACKAGE)}: {node.name} ({length} lines)")
    assert long == []


def test_a_gate_is_handed_a_handle_and_nothing_reaches_through_the_consumer() -> None:
    """Gates hold a ``GateHandle``, never the pipeline; only the admission step reads the
    delay store's arrival gate off the consumer (and hands it to the pipeline)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text, name = path.read_text(), str(path.relative_to(PACKAGE))
        if "_pipeline" in text and name not in ("admission/handle.py", "admission/consumer.py"):
            found.append(f"{name} holds a pipeline")
        if re.search(r"getattr\([^)]*DELAY_ATTR", text) and name != "admission/capability.py":
            found.append(f"{name} reads the delay store's gate off the consumer")
    assert found == []


@pytest.mark.parametrize("module", PURE)
def test_a_pure_core_imports_only_the_standard_library_and_pure_modules(module: str) -> None:
    allowed = {f"celery_extras/{m.removesuffix('.py')}" for m in (*PURE, *PURE_HELPERS)}
    found = []
    for line, name in imports(PACKAGE / module):
        top = name.split(".")[0]
        if name.startswith("celery_extras/"):
            owner = next((a for a in allowed if name == a or name.startswith(a + "/")), None)
            if owner is None:
                found.append(f"{module}:{line} imports {name}")
        elif top not in sys.stdlib_module_names and top != "__future__":
            found.append(f"{module}:{line} imports {name}")
    assert found == [], "a pure core imports Celery, kombu, redis or a module that may"
