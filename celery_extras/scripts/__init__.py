"""The Lua scripts of the Redis store, one ``<name>.lua`` file each beside this module.

A file may open with ``--`` comment lines documenting the script (its KEYS, ARGV and
reply); :func:`load` drops those leading lines and returns the rest unchanged, so the
text a module hands to Redis (and the SHA1 Redis caches it by) does not depend on the
documentation. Modules compose their scripts from these texts (a shared prefix, a body,
the ``#!lua`` flag line of :mod:`celery_extras.delay.redis_store`) at import, and register
them with :func:`register`: a script that starts with :data:`NOW` is told the time
(:func:`celery_extras.clock.store_time`) as its first argument.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import resources
from typing import Any

from .. import clock

__all__ = ["NOW", "StoreScript", "load", "names", "register"]

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


#: The prefix of every timed script (``now_ms.lua``): the time, from its first argument.
NOW = load("now_ms")


class StoreScript:
    """A registered script (redis-py's ``Script``), told the time first when it is timed."""

    def __init__(self, client: Any, text: str) -> None:
        self.script = client.register_script(text)
        self.text = text
        self.timed = NOW in text

    @functools.cached_property
    def sha(self) -> str:
        return str(self.script.sha)

    def args(self, args: Sequence[Any]) -> list[Any]:
        """The arguments the script is sent: the time first when it is timed."""
        return [clock.store_time(), *args] if self.timed else list(args)

    def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = (),
                 client: Any = None) -> Any:  # fmt: skip
        return self.script(keys=list(keys), args=self.args(args), client=client)


def register(client: Any, text: str) -> StoreScript:
    """*text* registered on *client* (a store client, a cluster client or a pipeline)."""
    return StoreScript(client, text)
