"""The migration guide's example (docs/migrating-from-celery-batches.rst includes it from
here): a celery-batches bulk-indexing task moved to ``batch()``, each document ending on
its own (indexed, rejected, or retried when the index throttles it).

``bulk_index`` stands in for Elasticsearch's ``_bulk`` (one answer per document, in
order): a document without an ``id`` is rejected (400), one marked ``"busy"`` is throttled
(429) the first time it is sent, and the rest are indexed (201), in a Redis hash.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import current_app, shared_task

from celery_extras import Call, batch

from .brokers import REDIS_URL

__all__ = ["bulk_index", "index"]


def bulk_index(docs: list[Any]) -> list[dict[str, Any]]:
    """One answer per document, as Elasticsearch's ``_bulk`` gives them."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    where = f"{current_app.main}:index"
    answers: list[dict[str, Any]] = []
    try:
        for doc in docs:
            if not isinstance(doc, dict) or "id" not in doc:
                answers.append({"status": 400, "error": f"document without an id: {doc!r}"})
            elif doc.get("busy") and client.set(f"{where}:busy:{doc['id']}", 1, nx=True, ex=600):
                answers.append({"status": 429, "error": "too many requests"})
            else:
                client.hset(where, doc["id"], doc.get("text", ""))
                client.expire(where, 600)
                answers.append({"status": 201, "id": doc["id"]})
    finally:
        client.close()
    return answers


class RejectedDocument(Exception):
    """The index refused a document (its answer's error)."""


@batch(size=100, wait=1.0)
@shared_task(name="tests.batch.migrated.index", max_retries=3)
def index(calls: list[Call]) -> list[Any]:
    answers = bulk_index([call.args[0] for call in calls])
    return [
        answer["id"]
        if answer["status"] == 201  # this call's result
        else Call.retry(countdown=0.5)
        if answer["status"] == 429  # this call again, alone
        else RejectedDocument(answer["error"])  # this call fails, alone
        for answer in answers
    ]
