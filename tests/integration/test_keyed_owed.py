"""The endings a key run owes (``key_holds.lua``'s ``owe``, ``key_ops.lua``'s ``ended``
and ``owed``): a settle keeps what the run covered until ``ended``, and a settle asked again
(its reply lost) answers with it; coalescing's and debounce's scripts, on a real Redis and on
the 3-master Redis Cluster. No worker and no broker here (the workers' side: tests/reliability/
test_keyed_endings.py)."""

from __future__ import annotations

import uuid
from typing import Any

from celery_extras.coalesce.redis_holds import RedisHolds
from celery_extras.debounce.redis_holds import RedisDebounce
from tests.support.workers import wait_for
from tests.unit.test_coalesce_table import KEY


def _covered_by_r(holds: RedisHolds, client: Any) -> None:
    """Run ``r`` of KEY covering ``a`` and ``b`` (sent before it started), contexts kept."""
    seconds, _ = client.time()
    assert holds.ask(KEY, "r", seconds - 10, "w1", 30.0, "first", 0).kind == "run"
    for one in ("a", "b"):
        verdict = holds.ask(KEY, one, seconds - 10, "w2", 30.0, "first", 0, f"ctx-{one}")
        assert (verdict.kind, verdict.by) == ("covered", "r")


def test_a_settle_keeps_what_the_run_covered_until_it_is_ended(
    holds: RedisHolds, client: Any
) -> None:
    _covered_by_r(holds, client)
    done = holds.finish(KEY, "r", "w1", settle=True)
    assert done is not None
    assert (sorted(done.covered), done.contexts) == (["a", "b"], {"a": "ctx-a", "b": "ctx-b"})
    again = holds.finish(KEY, "r", "w1", settle=True)  # its reply lost: asked again
    assert again is not None and sorted(again.covered) == ["a", "b"]
    assert again.contexts == {"a": "ctx-a", "b": "ctx-b"}
    assert holds.finish(KEY, "r", "w9", settle=True) is None  # another's, claimed by w1
    assert holds.claim_owed(KEY, "w9") == (1, [])  # the claim has not run out
    assert holds.ended(KEY, "r", "w1") == 0
    assert holds.finish(KEY, "r", "w1", settle=True) is None  # nothing owed any more
    key = holds.hash_key(*KEY)
    assert set(client.hgetall(key)) == {"n", "k", "last"}
    assert not client.exists(f"{key}:w:r")


def test_a_plain_finish_hands_what_the_run_covered_over_at_once(
    holds: RedisHolds, client: Any
) -> None:
    _covered_by_r(holds, client)
    done = holds.finish(KEY, "r", "w1")
    assert done is not None and sorted(done.covered) == ["a", "b"]
    assert holds.finish(KEY, "r", "w1") is None
    assert set(client.hgetall(holds.hash_key(*KEY))) == {"n", "k", "last"}


def test_the_finisher_claims_its_owed_endings_again_and_the_index_notes_the_key(
    holds: RedisHolds, client: Any
) -> None:
    _covered_by_r(holds, client)
    holds.finish(KEY, "r", "w1", settle=True)
    holds.note_owed(KEY, seconds=-1.0)  # due for a sweep now
    assert holds.owed_due(10) == [KEY]
    left, claimed = holds.claim_owed(KEY, "w1")  # its own claim: taken again
    assert left == 1
    assert [(by, sorted(done.covered)) for by, done in claimed] == [("r", ["a", "b"])]
    assert holds.renew(KEY, ["r"], "w1", 30.0) == []  # the claim renewed, not lost
    assert holds.ended(KEY, "r", "w1") == 0
    assert holds.owed_due(10) == []  # the key owes nothing: no longer noted


def test_a_debounce_settle_keeps_what_the_run_covered_until_it_is_ended(client: Any) -> None:
    """A burst's earlier message is covered by its last one, which runs: the settle of that
    run owes it (unconfirmed: no context) until ``ended``."""
    holds = RedisDebounce(client, f"t{uuid.uuid4().hex[:10]}")
    try:
        seconds, micros = client.time()
        sent = seconds + micros / 1e6
        assert holds.ask(KEY, "a", sent, "w2", 0.05, None, 30.0).kind == "wait"
        assert holds.ask(KEY, "r", sent + 0.001, "w1", 0.05, None, 30.0).kind == "wait"
        wait_for(lambda: holds.ask(KEY, "r", sent + 0.001, "w1", 0.05, None, 30.0).kind == "run",
                 timeout=10, what="the burst's last message to run")  # fmt: skip
        done = holds.finish(KEY, "r", "w1", settle=True)
        assert done is not None and (done.covered, done.contexts) == (["a"], {})
        again = holds.finish(KEY, "r", "w1", settle=True)
        assert again is not None and again.covered == ["a"]
        assert holds.ended(KEY, "r", "w1") == 0
        assert holds.finish(KEY, "r", "w1", settle=True) is None
        assert "w" not in client.hgetall(holds.hash_key(*KEY))
    finally:
        for key in client.scan_iter(f"{holds.prefix}:*"):
            client.delete(key)
