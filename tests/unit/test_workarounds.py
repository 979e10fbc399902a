"""The worker steps that guard against known bugs of the supported Celery and kombu
releases (``celery_extras/workarounds.py``), on real kombu objects."""

from __future__ import annotations

from types import SimpleNamespace

from celery import Celery
from kombu.asynchronous import Hub, get_event_loop, set_event_loop

from celery_extras.workarounds import PREFETCH_REDUCTION, EventLoopGuard, PrefetchRestoreGuard


def test_the_event_loop_is_forgotten_when_its_hub_closes_not_before() -> None:
    """The pool stops before the hub and may still use the loop (Celery 5.7's prefork pool
    fires its timers while it drains): the step leaves the loop current until the hub
    closes, then forgets it, as kombu 5.6's Hub.close does (kombu 5.5's left it current)."""
    hub = Hub()
    previous = set_event_loop(hub)
    try:
        worker = SimpleNamespace(hub=hub, use_eventloop=True)
        step = EventLoopGuard(worker)
        assert step.include_if(worker)
        step.start(worker)
        step.stop(worker)
        step.terminate(worker)
        assert get_event_loop() is hub
        hub.close()
        assert get_event_loop() is None
    finally:
        set_event_loop(previous)


def test_a_closing_hub_that_is_not_current_leaves_the_current_one() -> None:
    current, other = Hub(), Hub()
    previous = set_event_loop(current)
    try:
        EventLoopGuard(SimpleNamespace()).start(SimpleNamespace(hub=other))
        other.close()
        assert get_event_loop() is current
    finally:
        current.close()
        set_event_loop(previous)


def test_a_closed_loop_another_worker_left_current_is_forgotten_as_the_worker_is_built() -> None:
    """A worker without the step (another app's, plain Celery's) on kombu 5.5 leaves its
    closed loop current: the next worker would take it in its Hub step, and run on the
    other worker's timer. Every step is made before the Hub step runs; this one forgets a
    closed loop then, and leaves an open one (a loop somebody runs) alone."""
    left, running = Hub(), Hub()
    previous = set_event_loop(left)
    try:
        left.close()
        set_event_loop(left)  # as kombu before 5.6 left it
        EventLoopGuard(SimpleNamespace())
        assert get_event_loop() is None
        set_event_loop(running)
        EventLoopGuard(SimpleNamespace())
        assert get_event_loop() is running
    finally:
        running.close()
        set_event_loop(previous)


def test_celerys_prefetch_reduction_is_turned_off_unless_the_app_sets_it_seed_578629() -> None:
    """Celery's restore of the window after a reconnect drops the widenings of held tasks
    (``tests/reliability/test_prefetch_restart.py``): off by default, as the app says."""
    default, chosen = Celery("default"), Celery("chosen")
    chosen.conf[PREFETCH_REDUCTION] = True
    for app in (default, chosen):
        app.finalize()
        PrefetchRestoreGuard(SimpleNamespace(app=app))
    assert default.conf[PREFETCH_REDUCTION] is False
    assert chosen.conf[PREFETCH_REDUCTION] is True
