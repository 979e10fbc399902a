"""A worker consumer as the admission pipeline and its gates use it, for unit tests."""

from __future__ import annotations

from typing import Any

from celery_extras.admission.serial import Serial

__all__ = ["Consumer"]


class Consumer:
    """Records which requests went to the pool, and the timer entries asked for (which never
    fire by themselves: ``scheduled`` holds ``(seconds, function, args)``); ``prefetch``
    counts the widenings of the prefetch window not yet narrowed."""

    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.timer = self
        self.qos = self
        self.hub = None
        self.prefetch = 0
        self.scheduled: list[tuple[float, Any, Any]] = []

    def on_task_request(self, request: Any) -> None:
        self.ran.append(request)

    def call_after(self, secs: float, fun: Any, args: Any = (), **kwargs: Any) -> Any:
        if getattr(fun, "__func__", None) is Serial.run:  # recorded as the call it makes
            fun, args = args[0], tuple(args[1:])
        self.scheduled.append((secs, fun, args))
        return self

    def call_repeatedly(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def cancel(self) -> None:
        pass

    def increment_eventually(self) -> None:
        self.prefetch += 1

    def decrement_eventually(self) -> None:
        self.prefetch -= 1
