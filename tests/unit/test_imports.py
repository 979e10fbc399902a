"""Every module of the package imports on its own, and no two of them import each other,
even lazily."""

from __future__ import annotations

import ast
import graphlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import celery_extras

#: Run in a fresh interpreter: import the package, then each module it does not import,
#: each after forgetting every celery_extras module; print the ones that failed, with their
#: error. Importing any module runs the package's ``__init__`` first, which imports the
#: others it reaches in one order, the same whichever module was asked for: those are
#: imported on their own by the first import; the rest each after the package, alone.
PROBE = """
import importlib, sys
failures = []
def alone(name):
    for loaded in [m for m in sys.modules if m.split(".")[0] == "celery_extras"]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failures.append(f"{name}: {exc!r}")
alone("celery_extras")
for name in [m for m in sys.argv[1:] if m not in sys.modules]:
    alone(name)
print("\\n".join(failures))
"""


def package_modules() -> list[str]:
    return sorted(
        info.name for info in pkgutil.walk_packages(celery_extras.__path__, "celery_extras.")
    )


def test_every_module_imports_on_its_own() -> None:
    modules = package_modules()
    assert "celery_extras.limits.gate" in modules and len(modules) > 40
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_install_is_the_function_with_no_module_trick() -> None:
    """``celery_extras.install`` is the function, however the module was imported first;
    the module itself is a plain module (no callable-module class)."""
    import types

    from celery import Celery

    probe = (
        "import celery_extras.install as m, celery_extras, sys;"
        "print(callable(m), celery_extras.install is m,"
        " type(sys.modules['celery_extras.install']) is __import__('types').ModuleType)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.split() == ["True", "True", "True"]
    assert type(sys.modules["celery_extras.install"]) is types.ModuleType
    app = Celery("unit", set_as_current=False)
    assert celery_extras.install(app) is app


def import_graph() -> dict[str, set[str]]:
    """``{module: celery_extras modules it imports}``, from every import statement in it.

    Function-level (lazy) and ``TYPE_CHECKING`` imports count; relative imports are
    resolved. ``from package import name`` is an import of ``package.name`` when that
    is a module, else of the package. A package's ``__init__`` being run first, when
    one of its modules is imported, is not an edge.
    """
    root = Path(celery_extras.__file__).parent
    files: dict[str, tuple[Path, bool]] = {}
    for path in root.rglob("*.py"):
        parts = ["celery_extras", *path.relative_to(root).with_suffix("").parts]
        package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if package else parts)] = (path, package)
    graph: dict[str, set[str]] = {}
    for name, (path, package) in files.items():
        here = name if package else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in files:
                        edges.add(f"{target}.{alias.name}")
                    elif target in files:
                        edges.add(target)
        graph[name] = edges - {name}
    return graph


def test_no_import_cycle_among_the_package_modules_lazy_imports_included() -> None:
    graph = import_graph()
    assert "celery_extras.stats.prometheus" in graph["celery_extras.stats.flower"]  # lazy, seen
    assert graph["celery_extras.flower"] == {"celery_extras.stats.flower"}
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None
    assert set(order) == set(graph)
