"""Every module of the package imports on its own, without ``celery_extras.install``."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import celery_extras

#: Run in a fresh interpreter: for each module, forget every celery_extras module, import
#: that one alone, and say which ones pulled ``celery_extras.install`` in.
PROBE = """
import importlib, sys
failures = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] == "celery_extras"]:
        del sys.modules[loaded]
    importlib.import_module(name)
    if "celery_extras.install" in sys.modules:
        failures.append(name)
print("\\n".join(failures))
"""


def package_modules() -> list[str]:
    return sorted(
        info.name
        for info in pkgutil.walk_packages(celery_extras.__path__, "celery_extras.")
        if info.name != "celery_extras.install"
    )


def test_no_module_imports_install() -> None:
    modules = package_modules()
    assert "celery_extras.policies.enforce" in modules and len(modules) > 40
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "celery_extras", *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_install_is_callable_as_the_module_too() -> None:
    """Python binds ``celery_extras.install`` to the module once it is imported."""
    import importlib

    module = importlib.import_module("celery_extras.install")
    from celery import Celery

    app = Celery("unit", set_as_current=False)
    assert module(app) is app  # type: ignore[operator]
    assert celery_extras.install(app) is app
