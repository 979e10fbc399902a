"""The Lua scripts of the Redis store, one ``<name>.lua`` file each beside this module.

A file may open with ``--`` comment lines documenting the script (its KEYS, ARGV and
reply); :func:`load` drops those leading lines and returns the rest unchanged, so the
text a module hands to Redis (and the SHA1 Redis caches it by) does not depend on the
documentation. Modules compose their scripts from these texts (a shared prefix, a body,
the ``#!lua`` flag line of :mod:`celery_extras.delay.redis_store`) at import.
"""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["load", "names"]

#: What a script file's documentation lines start with (dropped by :func:`load`).
_DOC = "--"


@functools.cache
def load(name: str) -> str:
    """The text of the script ``<name>.lua`` without its leading ``--`` lines (read once);
    :class:`FileNotFoundError` if there is no such script."""
    text = resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    while text.startswith(_DOC):
        text = text.partition("\n")[2]
    return text


def names() -> list[str]:
    """Every script shipped, by name (``<name>.lua``), sorted."""
    return sorted(
        entry.name.removesuffix(".lua")
        for entry in resources.files(__name__).iterdir()
        if entry.name.endswith(".lua")
    )
