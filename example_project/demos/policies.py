"""Limits and retry policies: a cluster-wide 10/s limit over two workers, and a per-item backoff."""

from __future__ import annotations

import time

from celery import Celery, Task, group, shared_task

from celery_extras import ExponentialBackoff, limit, retry_policy

__all__ = ["flaky", "limited", "run"]


@limit("10/s", scope="global")
@shared_task(name="example.policies.limited")
def limited(i: int) -> float:
    return time.time()


@retry_policy(on=ConnectionError, policy=ExponentialBackoff(base=0.05, cap=0.2), per_item=True,
              key=lambda args, kwargs: args[0])  # fmt: skip
@shared_task(bind=True, name="example.policies.flaky")
def flaky(self: Task, account: str) -> int:
    if self.request.retries < 3:
        raise ConnectionError(f"{account}: upstream not ready")
    return int(self.request.retries)


def run(app: Celery) -> list[str]:
    starts = sorted(group(limited.s(i) for i in range(21)).apply_async().get(timeout=30))
    rate = 20 / (starts[-1] - starts[0])
    if not 9.0 <= rate <= 11.0:
        raise AssertionError(f"limit('10/s', scope='global') ran at {rate:.1f}/s")
    began = time.monotonic()
    retries = flaky.delay("acct-42").get(timeout=30)
    took = time.monotonic() - began
    if retries != 3 or took < 0.05 + 0.1 + 0.2:
        raise AssertionError(f"flaky() retried {retries} times in {took:.2f} s")
    return [
        f"21 tasks limited to 10/s across both workers ran at {rate:.2f}/s",
        f"flaky('acct-42') failed 3 times, retried after 0.05, 0.1, 0.2 s, succeeded "
        f"({took:.2f} s in all)",
    ]
