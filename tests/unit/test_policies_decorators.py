"""limit() and retry_policy() at decoration time: bad input named, every task flavour found."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery, shared_task

import celery_extras
from celery_extras import ExponentialBackoff, PolicyError, limit, retry_policy
from celery_extras.admission.decorators import _STRATEGY
from celery_extras.admission.policy import registered
from celery_extras.admission.registry import policies_of, target_of
from celery_extras.limits.spec import LimitSpec


def make_app(name: str = "unit") -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    celery_extras.install(app)
    return app


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": "10/x"}, "limit() on task 'unit.t': rate '10/x': unit must be one of s, m, h"),
        ({"rate": "fast"}, "limit() on task 'unit.t': rate 'fast': expected a number"),
        ({"rate": 0}, "limit() on task 'unit.t': rate 0: must be between one a day"),
        ({"rate": "1e-300/s"}, "limit() on task 'unit.t': rate '1e-300/s': must be between"),
        ({"rate": 10**400}, "limit() on task 'unit.t': rate 1000"),
        ({"rate": "1/s", "burst": 10**30},
         "limit() on task 'unit.t': burst 1000000000000000000000000000000: expected an integer"),
        ({"rate": "1/s", "burst": 0}, "limit() on task 'unit.t': burst 0: expected an integer"),
        ({"rate": "1/s", "scope": "cluster"},
         "limit() on task 'unit.t': scope 'cluster': expected 'global' or 'worker'"),
        ({"rate": "1/s", "key": "customer"}, "limit() on task 'unit.t': key 'customer'"),
    ],
)  # fmt: skip
def test_bad_limit_names_task_and_argument(kwargs: dict[str, Any], message: str) -> None:
    app = make_app()
    with pytest.raises(PolicyError) as info:

        @limit(**kwargs)
        @app.task(name="unit.t", shared=False)
        def t() -> None: ...

    assert str(info.value).startswith(message)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": ExponentialBackoff(base=-1, cap=5)},
         "retry_policy() on task 'unit.r': policy ExponentialBackoff base: must be >= 0"),
        ({"policy": ExponentialBackoff(base=5, cap=1)},
         "retry_policy() on task 'unit.r': policy ExponentialBackoff cap: must be >= base"),
        ({"policy": 5}, "retry_policy() on task 'unit.r': policy 5: expected a retry policy"),
        ({"policy": ExponentialBackoff(1, 2), "on": "ValueError"},
         "retry_policy() on task 'unit.r': on 'ValueError': expected an exception class"),
        ({"policy": ExponentialBackoff(1, 2), "max_retries": -1},
         "retry_policy() on task 'unit.r': max_retries -1"),
        ({"policy": ExponentialBackoff(1, 2), "per_item": True},
         "retry_policy() on task 'unit.r': per_item=True needs key="),
        ({"policy": ExponentialBackoff(1, 2), "key": lambda a, k: a[0]},
         "retry_policy() on task 'unit.r': key is only used with per_item=True"),
    ],
)  # fmt: skip
def test_bad_retry_policy_names_task_and_argument(kwargs: dict[str, Any], message: str) -> None:
    app = make_app()
    with pytest.raises(PolicyError) as info:

        @retry_policy(**kwargs)
        @app.task(name="unit.r", shared=False)
        def r() -> None: ...

    assert str(info.value).startswith(message)


def test_not_a_task_is_refused() -> None:
    with pytest.raises(TypeError, match=r"put limit\(\)/retry_policy\(\) above @app.task"):
        limit("1/s")(lambda: None)


def test_limit_on_app_task_sets_the_strategy_when_finalized() -> None:
    app = make_app()

    @limit("10/s", burst=3, scope="worker")
    @app.task(name="unit.limited", shared=False)
    def limited() -> None: ...

    @app.task(name="unit.plain", shared=False)
    def plain() -> None: ...

    app.finalize()
    task = app.tasks["unit.limited"]
    assert task.Strategy == _STRATEGY
    assert app.tasks["unit.plain"].Strategy == "celery.worker.strategy:default"
    assert "run" not in app.tasks["unit.plain"].__dict__  # untouched
    policies = policies_of(task)
    assert policies is not None
    assert policies.limits == (LimitSpec(10.0, 3, "worker", None, "10/s"),)


def test_shared_task_proxy_in_two_apps_and_an_app_finalized_before() -> None:
    early = make_app("early")
    early.finalize()

    @retry_policy(on=KeyError, policy=ExponentialBackoff(0.1, 1.0), max_retries=4)
    @limit("5/m")
    @shared_task(name="unit.shared")
    def shared(x: int) -> int:
        return x

    late = make_app("late")
    late.finalize()
    assert target_of(shared)[1] == "unit.shared"
    for app in (early, late):
        task = app.tasks["unit.shared"]
        assert task.Strategy == _STRATEGY
        assert task.__dict__["run"] is not task._extras_run  # retry wrapper installed
        assert task._extras_retry.max_retries == 4
        assert task.run(7) == 7  # called directly: no retry machinery


def test_uninstalled_app_is_left_alone() -> None:
    plain = Celery("plain", broker="memory://", set_as_current=False)
    plain.finalize()

    @limit("5/s")
    @shared_task(name="unit.shared_plain")
    def shared_plain() -> None: ...

    assert plain.tasks["unit.shared_plain"].Strategy == "celery.worker.strategy:default"


def test_called_directly_a_retried_task_raises_the_original() -> None:
    app = make_app()

    @retry_policy(on=ValueError, policy=ExponentialBackoff(0.1, 1.0))
    @app.task(name="unit.boom", shared=False)
    def boom() -> None:
        raise ValueError("original")

    app.finalize()
    with pytest.raises(ValueError, match="original"):
        app.tasks["unit.boom"]()


def test_limit_above_shared_task_does_not_evaluate_the_proxy() -> None:
    other = Celery("other", broker="memory://")  # current, finalized, without this task
    other.finalize()
    plain = Celery("plain", broker="memory://", set_as_current=False)
    plain.finalize()

    @limit("5/s")
    @shared_task(name="unit.shared_late")
    def shared_late() -> None: ...

    assert "unit.shared_late" in plain.tasks  # registered, not looked up in `other`
    other.close()


BARE = [
    (celery_extras.limit, "@limit('10/s')"),
    (celery_extras.concurrency, "@concurrency(2)"),
    (celery_extras.coalesce, "@coalesce(key=lambda args, kwargs: args[0])"),
    (celery_extras.debounce, "@debounce(5.0, key=lambda args, kwargs: args[0])"),
    (celery_extras.batch, "@batch(100, wait=1.0)"),
    (celery_extras.memoize, "@memoize(60.0)"),
    (celery_extras.retry_policy, "@retry_policy(policy=ExponentialBackoff(base=1, cap=60))"),
]


@pytest.mark.parametrize(("decorator", "example"), BARE, ids=[d.__name__ for d, _ in BARE])
def test_a_policy_decorator_used_bare_fails_naming_the_fix(
    decorator: Callable[..., Any], example: str
) -> None:
    app = make_app()
    name = decorator.__name__
    message = (f"@{name} on task 'unit.bare' is used bare: use @{name}(...) with its "
               f"arguments, e.g. {example}")  # fmt: skip
    with pytest.raises(TypeError) as raised:
        decorator(app.task(name="unit.bare", shared=False)(lambda: None))
    assert str(raised.value) == message
    with pytest.raises(TypeError, match=rf"^@{name} on <function .*> is used bare"):
        decorator(lambda: None)  # above a plain function, not even a task


def test_every_policy_decorator_is_checked_for_bare_use() -> None:
    policies = {"limit", "concurrency", "coalesce", "debounce", "batch", "memoize", "retry_policy"}
    assert {d.__name__ for d, _ in BARE} == policies
    decorated = [p for p in registered() if p.decorator.endswith("()")]  # not a setting's
    assert {p.decorator.rstrip("()") for p in decorated} <= policies


@pytest.mark.parametrize(
    ("decorator", "what"),
    [(lambda: limit("5/s"), "limit()"), (lambda: celery_extras.concurrency(2), "concurrency()")],
)
def test_limit_or_concurrency_over_celerys_rate_limit_fails_at_import(
    decorator: Callable[[], Callable[[Any], Any]], what: str
) -> None:
    app = make_app()
    message = (rf"^{re.escape(what)} on task 'unit.rated(_late)?': the task also has Celery's "
               r"rate_limit='10/s'; do not combine them")  # fmt: skip

    def rated() -> None: ...

    with pytest.raises(PolicyError, match=message):  # @app.task before the app is finalized
        decorator()(app.task(name="unit.rated", rate_limit="10/s", shared=False)(rated))
    app.finalize()
    with pytest.raises(PolicyError, match=message):  # and after: a task itself
        decorator()(app.task(name="unit.rated_late", rate_limit="10/s", shared=False)(rated))
    decorator()(app.task(name="unit.unrated", shared=False)(rated))  # no rate_limit: fine
