"""The limits as a policy of the admission pipeline: ``limit()``, its gate, settings and
control commands, in one entry of ``celery_extras.policies.POLICIES``."""

from __future__ import annotations

from celery import Celery

from ..admission.policy import Policy
from ..settings import Setting, boolean, choice
from .gate import LimitGate

__all__ = ["LIMITS"]


def _connect(app: Celery) -> None:
    from . import control  # noqa: F401  (registers the extras_limit control commands)


LIMITS = Policy(
    name="limits",
    parks=True,
    decorator="limit()",
    gate=LimitGate,
    stacks=True,
    connect=_connect,
    info_key="",  # its figures at the top of extras_policies, as before there were others
    settings=(
        Setting(
            "limits_shadow",
            False,
            boolean,
            "bool",
            "Every ``limit()`` in shadow mode, as if declared with ``shadow=True``: evaluated "
            "and counted (``shadow_limited``, and the wait it would have imposed, per limit "
            "in ``inspect stats`` and Prometheus) but never delaying a task. To see what "
            "limits would do to production before they are enforced.",
        ),
        Setting(
            "limit_on_store_error",
            "local",
            choice("local", "allow", "delay"),
            "str",
            "What a global limit does while its Redis store cannot be reached: ``'local'`` "
            "applies the same rate per worker, ``'allow'`` runs tasks unlimited, ``'delay'`` "
            "keeps each task waiting (unacked, never lost) and asks the store again every "
            "``extras_store_retry`` seconds. Logged once per outage.",
        ),
    ),
)
