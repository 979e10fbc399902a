"""``python -m bench.launch [celery] ARGS``: ``celery ARGS`` as it runs without Flower installed.

``celery`` loads every ``celery.commands`` plug-in when it starts. Flower's (installed
here by the ``dev`` extra) imports tornado, whose ``tornado.netutil`` encodes a name with
the ``idna`` codec at import: every ``celery`` process started beside Flower has
``encodings.idna`` loaded before a worker starts, which hides a thread that imports it
(under its first ``socket.getaddrinfo``) while the prefork pool forks (issue #33: the pool
process inherits the module's import lock held, and hangs at its first connection). A
worker's environment seldom has Flower; this launcher loads celery-extras' plug-in only,
so the worker starts as it does there. :mod:`bench.forks` starts its workers with it.

``BENCH_SLOW_IMPORT=SECONDS`` also makes the first import of ``encodings.idna`` in this
process take *SECONDS* longer, its import lock held meanwhile: the window issue #33's
pool processes were forked in (a millisecond or two here, right beside the pool's first
fork), widened so that a fork during a thread's import is certain rather than rare. Only
the import is slowed; whoever imports the module, whatever forks meanwhile, is the code's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import time
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any, cast

_entry_points = importlib.metadata.entry_points

#: The ``celery.commands`` plug-ins loaded (by the module their entry point names).
KEPT = ("celery_extras",)


def entry_points(**params: Any) -> Any:
    found = _entry_points(**params)
    if params.get("group") != "celery.commands":
        return found
    plugins = cast(Iterable[importlib.metadata.EntryPoint], found)
    return importlib.metadata.EntryPoints(ep for ep in plugins if ep.value.startswith(KEPT))


class SlowImport(importlib.abc.MetaPathFinder):
    """Finds module *name* as the other finders do, with a loader that sleeps *seconds*
    before running it (the module's import lock is held meanwhile)."""

    def __init__(self, name: str, seconds: float) -> None:
        self.name = name
        self.seconds = seconds

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if isinstance(spec, importlib.machinery.ModuleSpec) and spec.loader is not None:
                spec.loader = _SlowLoader(spec.loader, self.seconds)
                return spec
        return None


class _SlowLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, seconds: float) -> None:
        self.loader = loader
        self.seconds = seconds

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        time.sleep(self.seconds)
        self.loader.exec_module(module)


def main() -> None:
    # ``python -m bench.launch celery -A ... worker``: the word keeps the command line one
    # that ``pgrep -f 'celery .*worker'`` finds (CI's check for processes left behind)
    if sys.argv[1:2] == ["celery"]:
        del sys.argv[1]
    importlib.metadata.entry_points = entry_points  # before celery.bin.celery reads them
    slow = float(os.environ.get("BENCH_SLOW_IMPORT") or 0)
    if slow > 0 and "encodings.idna" not in sys.modules:
        sys.meta_path.insert(0, SlowImport("encodings.idna", slow))
    from celery.__main__ import main as celery_main

    celery_main()


if __name__ == "__main__":
    main()
