"""The hello: a starting worker asks its live neighbours for their revokes and clocks.

Celery's Mingle without the wait: the broadcast runs on a thread of its own, and each
reply is validated and queued, as it arrives, for the consumer's thread to merge
(through the :class:`~.syncer.Syncer`'s inbox). The answering side is
:func:`~.control.extras_sync_hello`.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, Protocol

from celery import Celery
from celery.utils.log import get_logger

from ..bounds import shown
from .entries import Parsed, parse_ids, parse_stamps, valid_clock
from .state import WorkerRevokes

__all__ = ["HELLO", "Hello", "Owner"]

logger = get_logger(__name__)

#: The control command a starting worker broadcasts to its neighbours.
HELLO = "extras_sync_hello"


class Owner(Protocol):
    """What the hello uses of the :class:`~.syncer.Syncer` that owns it."""

    app: Celery
    hostname: str
    revokes: WorkerRevokes
    hello_timeout: float
    reply_max: int
    inbox: queue.SimpleQueue[Callable[[], None]]
    stats: dict[str, Any]

    def note_dropped(self, source: str, *parsed: Parsed) -> None: ...


class Hello:
    """One worker's hello to its neighbours, and their replies merged."""

    def __init__(self, syncer: Owner) -> None:
        self.syncer = syncer

    def send(self) -> None:
        """Ask live neighbours for their revokes and clocks; merge each reply as it arrives."""
        syncer, app = self.syncer, self.syncer.app
        arguments = {"from_node": syncer.hostname, "clock": app.clock.forward()}
        try:
            with app.connection_for_write() as conn:
                app.control.broadcast(
                    HELLO, arguments=arguments, reply=True, timeout=syncer.hello_timeout,
                    callback=self.on_reply, connection=conn,
                )  # fmt: skip
        except Exception as exc:  # the broker may be gone again; anti-entropy covers it
            logger.warning("celery-extras sync: hello to neighbours failed: %r", exc)

    def on_reply(self, body: Any) -> None:
        """One neighbour's reply ``{hostname: {"clock", "revoked", "stamps"}}``, validated."""
        syncer = self.syncer
        if not isinstance(body, dict) or len(body) != 1:
            logger.warning("celery-extras sync: dropped a malformed hello reply: %s", shown(body))
            return
        ((node, reply),) = body.items()
        if node == syncer.hostname or reply is None:
            return
        if not isinstance(reply, dict):
            logger.warning(
                "celery-extras sync: dropped a malformed hello reply from %s", shown(node)
            )
            return
        if "error" in reply:  # e.g. a neighbour without celery-extras: no such command
            logger.debug("celery-extras sync: %s cannot sync: %.200r", node, reply["error"])
            return
        clock = reply.get("clock")
        if valid_clock(clock):
            syncer.app.clock.adjust(clock)
        ids = parse_ids(reply.get("revoked"), syncer.reply_max)
        stamps = parse_stamps(reply.get("stamps"), syncer.reply_max)
        syncer.stats["neighbours"] = [*syncer.stats["neighbours"], str(node)][-20:]
        revokes = syncer.revokes

        def merge() -> None:
            revokes.merge_ids(ids.kept, stored=False)
            revokes.merge_stamps(stamps.kept, stored=False)
            syncer.note_dropped(f"neighbour {node}", ids, stamps)

        syncer.inbox.put(merge)
