"""A journal of task runs in Redis, so tests can see what ran where and when."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import redis
from celery import Task

from .brokers import REDIS_URL
from .workers import wait_for

__all__ = ["Journal"]


class Journal:
    """Append-only list ``<ns>:journal`` of ``{"task", "id", "t", "pid", "worker", ...}``."""

    def __init__(self, ns: str, url: str = REDIS_URL) -> None:
        self.key = f"{ns}:journal"
        self.client = redis.Redis.from_url(url, decode_responses=True)

    def note(self, task: Task, **fields: Any) -> None:
        entry = {
            "task": task.name,
            "id": task.request.id,
            "t": time.time(),
            "pid": os.getpid(),
            "worker": task.request.hostname,
            "retries": task.request.retries,
            # the broker delivered its message again (a restore of what was not acked)
            "redelivered": bool((task.request.delivery_info or {}).get("redelivered")),
            **fields,
        }
        payload = json.dumps(entry)
        deadline = time.monotonic() + 60  # rides out a Redis restart in the reliability tests
        while True:
            try:
                self.client.rpush(self.key, payload)
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def note_calls(self, task: Task, calls: Sequence[Any], **fields: Any) -> None:
        """In a batched task whose calls' arguments are ``(key, tag, ...)``: one ``start``
        entry per call, under the call's id (so bodies are counted per message), in one write."""
        base = {"task": task.name, "t": time.time(), "pid": os.getpid(),
                "worker": task.request.hostname, "retries": 0, "phase": "start",
                "batch": task.request.id, **fields}  # fmt: skip
        self.client.rpush(self.key, *(json.dumps({**base, "id": c.id, "key": c.args[0],
                                                  "tag": c.args[1]}) for c in calls))  # fmt: skip

    def raise_flag(self, name: str) -> None:
        """Tell tasks waiting in :meth:`wait_for_flag` to go on."""
        self.client.set(f"{self.key}:flag:{name}", 1, ex=600)

    def wait_for_flag(self, name: str, timeout: float = 60.0) -> None:
        """In a task: block until the test raises flag *name*; fail after *timeout* s."""
        deadline = time.monotonic() + timeout
        while not self.client.exists(f"{self.key}:flag:{name}"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"flag {name!r} was not raised within {timeout} s")
            time.sleep(0.05)

    def mark(self, kind: str, value: str) -> None:
        """Add *value* to the set ``<ns>:journal:<kind>`` (e.g. the ids a worker acked)."""
        self.client.sadd(f"{self.key}:{kind}", value)
        self.client.expire(f"{self.key}:{kind}", 600)

    def marked(self, kind: str) -> set[str]:
        return set(self.client.smembers(f"{self.key}:{kind}"))

    def wait_for_runs(self, count: int, timeout: float, what: str) -> None:
        """Wait until *count* entries are in (*what* they are, for the failure)."""
        wait_for(lambda: len(self) >= count, timeout=timeout, interval=0.2, what=what)

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.key, 0, -1)]

    def __len__(self) -> int:
        return int(self.client.llen(self.key))

    def clear(self) -> None:
        self.client.delete(self.key, *self.client.keys(f"{self.key}:*"))  # flags and marks
