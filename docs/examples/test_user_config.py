"""The plugin composes with pytest-celery's settings: ``celery_config``, the ``celery``
mark, tasks defined inside a test (docs: "Testing your tasks")."""

import pytest

from celery_extras import limit


@pytest.fixture(scope="session")
def celery_config():
    return {"task_default_queue": "jobs", "result_extended": False}


@pytest.mark.celery(result_extended=True)
def test_the_celery_mark_and_celery_config_both_apply(extras_app):
    assert extras_app.conf.task_default_queue == "jobs"
    assert extras_app.conf.result_extended is True
    assert extras_app.conf.broker_url.startswith("redis://")  # the store's, as none is set


def test_a_task_defined_in_the_test(extras_app, extras_worker, extras_clock):
    @limit("2/s")
    @extras_app.task(name="local.double")
    def double(i):
        return 2 * i

    extras_worker.reload()  # as with Celery's celery_worker: the worker learns the task
    results = [double.delay(i) for i in range(4)]
    extras_clock.advance(0)
    assert [r.ready() for r in results] == [True, False, False, False]
    extras_clock.advance(1.5)
    assert [r.get(timeout=10) for r in results] == [0, 2, 4, 6]


@pytest.mark.celery(broker_url="memory://")
def test_a_broker_of_the_tests_own(extras_app, extras_worker, extras_clock):
    @limit("1/s")
    @extras_app.task(name="local.echo")
    def echo(i):
        return i

    extras_worker.reload()
    results = [echo.delay(i) for i in range(3)]
    extras_clock.advance(2)
    assert [r.get(timeout=10) for r in results] == [0, 1, 2]
