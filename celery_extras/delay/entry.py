"""A parked message as the delay store keeps it: the whole message, as JSON.

An :class:`Entry` holds what is needed to publish a message again exactly as it
was: body, headers, the properties that belong to the message (not to the
transport), content type and encoding, exchange and routing key, and the queue
it was consumed from. It is stored as JSON (no other serializer): a body that is not
UTF-8 text is kept in base64. Version 2 (written since the store was sharded) names its
fields with a letter or two and leaves out the task's name and id where its headers hold
them (protocol 2), a sixth of a small task's entry; version 1, with the names spelt out,
is still read. No Celery import.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLAIM_HEADER",
    "DUE_SUFFIX",
    "MESSAGE_PROPERTIES",
    "PARKED_HEADER",
    "Entry",
    "due_queue_name",
    "entry_id",
]

#: Header of a message a mover published: the id of its entry in the store.
PARKED_HEADER = "extras_parked"
#: Header of a message a mover published: the claim token it was published under.
CLAIM_HEADER = "extras_claim"
#: Suffix of the due queue of a queue (``<queue>.extras-due``).
DUE_SUFFIX = ".extras-due"
#: Message properties kept with an entry (the transport's own, such as delivery tags, are not).
MESSAGE_PROPERTIES = ("correlation_id", "reply_to", "priority", "delivery_mode", "expiration")


#: Version 2's field names, and version 1's for each.
_VERSION_1 = {
    "t": "task",
    "i": "id",
    "k": "kind",
    "b": "body",
    "ct": "content_type",
    "ce": "content_encoding",
    "h": "headers",
    "p": "properties",
    "x": "exchange",
    "r": "routing_key",
    "q": "queue",
}


def due_queue_name(queue: str) -> str:
    """The due queue of *queue*: released messages go there, consumed before the backlog."""
    return queue + DUE_SUFFIX


def entry_id(task_id: str, retries: int, kind: str, source: str = "") -> str:
    """The id of the entry parking one delivery of a task.

    It is derived from the message, not random, so the same message parked twice
    (its worker died after parking it and before acking it, and the broker
    delivered it again) lands on the same entry and runs once. *source* is the
    entry the message itself came from, if any, so a released message parked
    again gets an entry of its own.
    """
    raw = json.dumps([task_id, retries, kind, source]).encode()
    return hashlib.sha256(raw).hexdigest()[:32]


@dataclass
class Entry:
    """One parked message; :meth:`dumps` and :meth:`loads` are its JSON form."""

    task: str
    task_id: str
    kind: str  # why it was parked: "limit" (a booked slot), "retry" or "eta"
    body: bytes
    content_type: str
    content_encoding: str
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    exchange: str = ""
    routing_key: str = ""
    queue: str | None = None

    def dumps(self) -> str:
        try:
            body: str = self.body.decode("utf-8")
            base64_body = False
        except UnicodeDecodeError:
            body, base64_body = base64.b64encode(self.body).decode("ascii"), True
        fields: dict[str, Any] = {
            "v": 2,
            "t": self.task,
            "i": self.task_id,
            "k": self.kind,
            "b": body,
            "ct": self.content_type,
            "ce": self.content_encoding,
            "h": self.headers,
            "p": self.properties,
            "x": self.exchange,
            "r": self.routing_key,
            "q": self.queue,
        }
        if base64_body:
            fields["b64"] = 1
        if self.headers.get("task") == self.task:  # protocol 2 names the task in its headers
            del fields["t"]
        if self.headers.get("id") == self.task_id:
            del fields["i"]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def loads(cls, raw: str) -> Entry:
        """Parse a stored entry (version 2, or 1); :class:`ValueError` naming what is wrong."""
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("v") not in (1, 2):
                raise ValueError("not a version 1 or 2 entry")
            if data["v"] == 1:
                data = {short: data.get(long) for short, long in _VERSION_1.items()} | {
                    "b64": data["body_encoding"] == "base64"
                }
            body = data["b"]
            payload = base64.b64decode(body) if data.get("b64") else str(body).encode("utf-8")
            headers, properties = data["h"], data["p"]
            if not isinstance(headers, dict) or not isinstance(properties, dict):
                raise ValueError("headers and properties must be objects")
            queue = data.get("q")
            return cls(
                task=str(data["t"] if "t" in data else headers["task"]),
                task_id=str(data["i"] if "i" in data else headers["id"]),
                kind=str(data["k"]),
                body=payload,
                content_type=str(data["ct"]),
                content_encoding=str(data["ce"]),
                headers=headers,
                properties={k: v for k, v in properties.items() if k in MESSAGE_PROPERTIES},
                exchange=str(data.get("x") or ""),
                routing_key=str(data.get("r") or ""),
                queue=str(queue) if queue else None,
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"stored delay entry is not valid: {exc!r}") from None

    def counted_queue(self) -> str:
        """The queue this entry counts for in the store's parked figures: the queue it
        records, else its routing key (the queue's name on the default exchange, and on a
        direct exchange routed by queue name); ``""``: it counts for none."""
        return self.queue or self.routing_key

    def meta(self) -> dict[str, Any]:
        """The small part the store's scripts read: task id and name, kind, and the queue it
        counts for (``scripts/delay_parked.lua``), when there is one."""
        meta = {"t": self.task_id, "n": self.task, "k": self.kind}
        queue = self.counted_queue()
        return {**meta, "q": queue} if queue else meta
