"""``python -m bench.launch ARGS``: ``celery ARGS`` as it runs where Flower is not installed.

``celery`` loads every ``celery.commands`` plug-in when it starts. Flower's (installed
here by the ``dev`` extra) imports tornado, whose ``tornado.netutil`` encodes a name with
the ``idna`` codec at import: every ``celery`` process started beside Flower has
``encodings.idna`` loaded before a worker starts, which hides a thread that imports it
(under its first ``socket.getaddrinfo``) while the prefork pool forks (issue #33: the pool
process inherits the module's import lock held, and hangs at its first connection). A
worker's environment seldom has Flower; this launcher loads celery-extras' plug-in only,
so the worker starts as it does there. :mod:`bench.forks` starts its workers with it.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
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


def main() -> None:
    importlib.metadata.entry_points = entry_points  # before celery.bin.celery reads them
    from celery.__main__ import main as celery_main

    celery_main()


if __name__ == "__main__":
    main()
