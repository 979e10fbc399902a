"""Debounce (Inngest's debounce, BullMQ's debounce mode, cluster-wide): a key runs once it
has been quiet for a while, with its last message's arguments: the pure table, its Redis
form, the gate, the decorator and the policy entry (see :mod:`.gate`)."""

from .spec import DebounceSpec

__all__ = ["DebounceSpec"]
