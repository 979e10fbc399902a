"""Memoize (the first seed's LRU ``memoize``, cluster-wide): a key's result is reused for
``ttl`` seconds, runs in flight are joined; the third rule of the key-run machinery
(:mod:`celery_extras.keyed`): its pure table, its Lua part, the gate, the decorator, the
policy entry and :func:`~.invalidate.invalidate` (see :mod:`.gate`)."""

from .spec import MemoizeSpec

__all__ = ["MemoizeSpec"]
