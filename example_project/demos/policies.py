"""Limits and retry policies: a cluster-wide 10/s limit over two workers, per-customer limits
under a global one with a shadow limit beside them, and a per-item backoff."""

from __future__ import annotations

import time

from celery import Celery, Task, group, shared_task

from celery_extras import ExponentialBackoff, limit, retry_policy

__all__ = ["api_call", "flaky", "limited", "run"]


@limit("10/s", scope="global")
@shared_task(name="example.policies.limited")
def limited(i: int) -> float:
    return time.time()


@limit("20/s", scope="global")  # the API's own quota, for everyone
@limit("4/s", key=lambda args, kwargs: args[0])  # and each customer's plan
@limit("5/s", shadow=True)  # a stricter quota being considered: counted, not enforced
@shared_task(name="example.policies.api_call")
def api_call(customer: str, i: int) -> float:
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
    calls = group(api_call.s(c, i) for i in range(9) for c in ("acme", "globex"))
    results = calls.apply_async().get(timeout=30)
    per_customer = {
        c: 8 / (max(results[k::2]) - min(results[k::2])) for k, c in enumerate(("acme", "globex"))
    }
    if not all(3.6 <= r <= 4.4 for r in per_customer.values()):
        raise AssertionError(f"limit('4/s', key=customer) ran at {per_customer}")
    shadowed = sum(
        reply.get("extras", {})
        .get("tasks", {})
        .get(api_call.name, {})
        .get("shadow_limited", [0])[-1]
        for reply in (app.control.inspect(timeout=1).stats() or {}).values()
    )
    began = time.monotonic()
    retries = flaky.delay("acct-42").get(timeout=30)
    took = time.monotonic() - began
    if retries != 3 or took < 0.05 + 0.1 + 0.2:
        raise AssertionError(f"flaky() retried {retries} times in {took:.2f} s")
    return [
        f"21 tasks limited to 10/s across both workers ran at {rate:.2f}/s",
        f"9 calls each of acme and globex, limited to 4/s per customer under 20/s, ran at "
        f"{per_customer['acme']:.2f}/s and {per_customer['globex']:.2f}/s side by side; a "
        f"shadow 5/s on the same task would have held {shadowed} of the 18",
        f"flaky('acct-42') failed 3 times, retried after 0.05, 0.1, 0.2 s, succeeded "
        f"({took:.2f} s in all)",
    ]
