"""The real brokers the integration tests run against, and a check that they answer."""

from __future__ import annotations

import socket

__all__ = ["BACKEND_URL", "BROKERS", "REDIS_URL", "require_broker"]

REDIS_URL = "redis://127.0.0.1:6379/0"
BACKEND_URL = "redis://127.0.0.1:6379/1"
BROKERS = {
    "redis": REDIS_URL,
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672//",
}
_PORTS = {"redis": 6379, "rabbitmq": 5672}


def require_broker(name: str) -> str:
    """The broker's URL; fails (never skips) when nothing listens on its port."""
    try:
        socket.create_connection(("127.0.0.1", _PORTS[name]), timeout=2).close()
    except OSError as exc:
        raise RuntimeError(
            f"{name} is not running on 127.0.0.1:{_PORTS[name]} ({exc}); start it as .ci/run does"
        ) from exc
    return BROKERS[name]
