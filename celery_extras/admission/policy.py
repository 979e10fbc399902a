"""What a policy hands to the admission pipeline: one entry, declared in its own folder.

A policy (``limit``, ``concurrency``, ``coalesce``, ``debounce``, ``batch``,
``retry_policy``...) is one :class:`Policy`: the name its spec is recorded under on a
task's function, its gate (if it acts in the worker's main process), its settings, what it
connects once per app (control commands, signal receivers), what it does to each task that
declares it, and where its gate's ``info()`` goes. The list of them is
``celery_extras.policies.POLICIES``; ``install(app)`` hands it to :func:`use`, and the
pipeline, the decorators' machinery and the eager warning read it from here: this package
imports no policy.

Adding a policy is its folder (its spec, decorator, gate and :class:`Policy`) plus one line
in that list (``docs/architecture.rst`` walks through one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task

from ..settings import Setting
from .gate import GateFactory

__all__ = ["Policy", "registered", "use"]


@dataclass(frozen=True)
class Policy:
    """One policy, as the pipeline, the decorators and ``install(app)`` see it.

    *name*: the attribute its spec is recorded under (``policies.coalesce``); *decorator*:
    what users write (``coalesce()``), for messages; *gate*: its gate, asked in the order
    of the list (``None``: it acts elsewhere, as retries do in the pool); *stacks*: several
    on one task, a tuple top first (``limit()``); *apply*: called with each task declaring
    it, as the task is made in an app (wrappers of ``run`` or ``retry``); *connect*: called
    once per app; *info_key*: where its gate's ``info()`` goes in ``inspect stats``'
    ``extras_policies`` (``""``: merged at the top); *parks*: a message of a task declaring
    it may be parked in the delay store (its app's workers then consume due queues).
    """

    name: str
    decorator: str
    gate: GateFactory | None = None
    settings: tuple[Setting[Any], ...] = ()
    stacks: bool = False
    apply: Callable[[Task, Any], None] | None = None
    connect: Callable[[Celery], None] | None = None
    info_key: str | None = None
    parks: bool = False

    @property
    def empty(self) -> Any:
        """A task's spec of this policy when it declares none."""
        return () if self.stacks else None


_policies: dict[str, Policy] = {}


def use(policies: Sequence[Policy]) -> None:
    """The policies of this process, in the pipeline's order (``install`` hands them)."""
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policies named twice in {names}")
    _policies.clear()
    _policies.update((p.name, p) for p in policies)


def registered() -> tuple[Policy, ...]:
    """The policies :func:`use` was given, in order."""
    return tuple(_policies.values())


def policy_named(name: str) -> Policy | None:
    return _policies.get(name)
