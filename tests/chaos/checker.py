"""The checker of a run's history: what was sent, every body's start and end (the journal),
every result, the faults injected and the workers' answers to ``ping``. No Celery import.

Each finding is a :class:`Violation` of one of celery-extras' promises (docs/reliability.rst),
or a :class:`Violation` whose ``owner`` is ``"celery"``: Celery's or kombu's own behaviour
under that fault (a body run again after its worker was SIGKILLed, a message a dying
worker's ``BRPOP`` took, acks and results lost with a restarted broker), reported apart.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.workload import Workload

__all__ = ["History", "Violation", "Window", "check"]

READY = ("SUCCESS", "FAILURE", "REVOKED")
#: A limit's busiest second may carry the pool's dispatch jitter (tests/support/rates.py)
JITTER = 1.25
#: Seconds after a fault during which a worker may be silent (restarting, reconnecting)
RECOVERY = 20.0
#: The longest a live worker may go without answering ``ping`` outside faults
SILENCE = 10.0
#: How far before a fault a body may have started and still be excused by it (any time
#: in a run)
EARLIER = 600.0


@dataclass(frozen=True)
class Window:
    """A fault (*kind*) from *start* to *end* (wall time), on worker *worker* if it names one
    (a SIGKILL's window is the instant of the kill)."""

    kind: str
    start: float
    end: float
    worker: str = ""


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    owner: str = "celery-extras"

    def __str__(self) -> str:
        return f"[{self.owner}] {self.check}: {self.detail}"


@dataclass
class History:
    workload: Workload
    sent: dict[str, float]  # message id -> when its send began (wall)
    entries: list[dict[str, Any]]  # the journal
    results: dict[str, tuple[str, Any]]  # message id -> (state, result)
    windows: list[Window] = field(default_factory=list)
    pings: list[tuple[float, str, bool]] = field(default_factory=list)  # (t, worker, answered)
    rates: dict[str, tuple[float, int]] = field(default_factory=dict)  # task -> (rate, burst)
    caps: dict[str, int] = field(default_factory=dict)
    broker: str = "redis"
    #: ids of messages the Redis transport popped for a worker and never booked as unacked
    #: (kombu#305: a worker SIGKILLed in its blocked ``BRPOP``, a broker restarted), read
    #: from the broker's append-only file
    in_transit: set[str] = field(default_factory=set)
    #: ids of the messages of sends that raised (the broker was down): maybe never sent
    unsent: set[str] = field(default_factory=set)

    def near(self, t: float, kinds: Iterable[str], after: float = 0.0, before: float = 0.0,
             worker: str = "") -> bool:  # fmt: skip
        """Whether a fault of *kinds* was under way at *t* (*before* s ahead of its start to
        *after* s beyond its end), on *worker* when given."""
        kinds = tuple(kinds)
        return any(w.kind in kinds and w.start - before <= t <= w.end + after
                   and (not worker or not w.worker or w.worker == worker)
                   for w in self.windows)  # fmt: skip


STORE_FAULTS = ("store_stall", "store_pause", "store_restart")
#: What a result's text says when its task failed for a lost broker connection.
LOST_CONNECTION = ("onnection", "ECONNREFUSED", "ECONNRESET")


def check(history: History) -> list[Violation]:
    """Every violation the history shows, the project's and Celery's."""
    found: list[Violation] = []
    starts = [e for e in history.entries if e.get("phase") == "start"]
    ends = [e for e in history.entries if e.get("phase") == "end"]
    found += _lost(history)
    found += _twice(history, starts)
    found += _limits(history, starts)
    found += _caps(history, starts, ends)
    found += _covering_runs(history, starts)
    found += _batches(history, starts, ends)
    found += _silences(history)
    return found


def _after(history: History) -> dict[str, list[str]]:
    """The ids a message is published after (by a worker, as Celery runs the canvas): a
    chain's previous step, a link's parent, a chord's header."""
    before: dict[str, list[str]] = {}
    for send in history.workload.sends:
        ids = [n.id for n in send.nodes]
        if send.shape == "chain":
            before.update({b: [a] for a, b in itertools.pairwise(ids)})
        elif send.shape == "link":
            before[ids[1]] = [ids[0]]
        elif send.shape == "chord":
            before[ids[-1]] = ids[:-1]
    return before


def _published_in_outage(history: History, parents: list[str], ended: dict[str, float],
                         after: dict[str, list[str]] | None = None) -> bool:  # fmt: skip
    """Whether a message was to be published by a worker as what it follows (*parents*)
    ended, while the broker was restarting; with *after*, as the nearest of what it follows
    that ran ended (a chain Celery failed at a step whose next could not be published fails
    every step after it: seed 758327)."""
    last, todo, seen = None, list(parents), set()
    while todo:
        parent = todo.pop()
        if parent in ended:
            last = max(last or ended[parent], ended[parent])
        elif after is not None and parent not in seen:
            seen.add(parent)
            todo.extend(after.get(parent, ()))
    return last is not None and history.near(last, ("broker_restart",), after=5.0, before=1.0)


def _lost(history: History) -> list[Violation]:
    """Every message sent reaches a final state; a failure is a broker's fault or a bug."""
    ended = {e["id"]: e["t"] for e in history.entries if e.get("phase") == "end"}
    for e in history.entries:  # a batch's end ends each of its calls
        ended.update(dict.fromkeys(e.get("calls") or (), e["t"]))
    after = _after(history)
    retried = {e["id"] for e in history.entries if e.get("phase") == "end" and e.get("retries")}
    found = []
    for node in history.workload.nodes():
        state, result = history.results.get(node.id, ("PENDING", None))
        if state == "RETRY" and node.id in retried:
            # the retry ended before its first attempt stored RETRY, which then overwrote
            # the SUCCESS: Celery's backends check, then write (not atomic)
            found.append(Violation("RETRY over SUCCESS", f"{node.task}[{node.id}]", "celery"))
        elif state not in READY:
            parents = after.get(node.id, [])
            if node.id in history.unsent or any(p not in ended for p in parents):
                continue  # never sent, or what it follows never ended: reported there
            owner = "celery" if node.id in history.in_transit else "celery-extras"
            if owner != "celery" and _published_in_outage(history, parents, ended):
                owner = "celery"  # Celery's publish of a callback gave up, the broker down
            found.append(Violation("lost", f"{node.task}[{node.id}] ended {state}", owner))
        elif state != "SUCCESS":
            text = str(result)
            restarted = any(w.kind == "broker_restart" for w in history.windows)
            lost_connection = any(
                word in text for word in ("onnection", "ECONNREFUSED", "ECONNRESET")
            )
            owner = "celery" if restarted and lost_connection else "celery-extras"
            if owner != "celery" and _published_in_outage(history, after.get(node.id, []), ended,
                                                          after):  # fmt: skip
                owner = "celery"  # a chord's callback Celery could not publish (seed 36348)
            found.append(Violation("failed", f"{node.task}[{node.id}] {state}: {text}", owner))
    return found


def _succeeded(history: History) -> Counter[str]:
    """How many times each message's body succeeded (a batch's end, each of its calls)."""
    done: Counter[str] = Counter()
    for e in history.entries:
        if e.get("phase") == "end" and not e.get("failed"):
            done.update([e["id"], *(e.get("calls") or ())])
    return done


def _twice(history: History, starts: list[dict[str, Any]]) -> list[Violation]:
    """No body runs twice under one id (and attempt), but once more after its first ran in
    a worker that was SIGKILLed (Celery's at-least-once with ``acks_late``), or whose ack
    was lost with a restarted broker; or as often as what it follows succeeded (a chain's
    step run again publishes the next again: seed 277911)."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for e in starts:
        runs[(e["id"], e.get("retries", 0))].append(e)
    after, succeeded = _after(history), _succeeded(history)
    found = []
    for (task_id, attempt), bodies in runs.items():
        if len(bodies) < 2:
            continue
        bodies.sort(key=lambda e: e["t"])
        excused = sum(1 for e in bodies[:-1] if history.near(
            e["t"], ("kill",), after=0.0, before=EARLIER, worker=e["worker"]))  # fmt: skip
        restarts = sum(1 for e in bodies[:-1] if history.near(
            e["t"], ("broker_restart",), after=RECOVERY, before=EARLIER))  # fmt: skip
        extra = len(bodies) - 1
        published = max((succeeded[p] - 1 for p in after.get(task_id, ())), default=0)
        what = f"{bodies[0]['task']}[{task_id}] attempt {attempt} ran {len(bodies)} times"
        if extra <= excused:
            found.append(Violation("ran again after SIGKILL", what, "celery"))
        elif extra <= excused + restarts:
            found.append(Violation("ran again after a broker restart", what, "celery"))
        elif extra <= excused + restarts + published:
            found.append(Violation("published again as what it follows ran again", what,
                                   "celery"))  # fmt: skip
        else:
            found.append(Violation("ran twice", what))
    return found


def _busiest(times: list[float]) -> tuple[int, float]:
    best, at = 0, 0.0
    for i, t in enumerate(times):
        n = sum(1 for s in times[i:] if s < t + 1.0)
        if n > best:
            best, at = n, t
    return best, at


def _limits(history: History, starts: list[dict[str, Any]]) -> list[Violation]:
    """No limit exceeded beyond its burst (with the pool's jitter), but while the store is
    away (its documented ``local`` fallback)."""
    found = []
    for task, (rate, burst) in history.rates.items():
        times = sorted(e["t"] for e in starts if e["task"] == task)
        busiest, at = _busiest(times)
        if busiest <= (rate + burst) * JITTER:
            continue
        owner = "fallback" if history.near(at, STORE_FAULTS, after=5.0, before=1.0) else (
            "celery-extras")  # fmt: skip
        found.append(Violation("limit", f"{task}: {busiest} starts in the second at {at:.3f} "
                                        f"for {rate:g}/s, burst {burst}", owner))  # fmt: skip
    return found


def _body_key(e: dict[str, Any]) -> tuple[Any, ...]:
    """What one body's start and end entries share: the id, attempt, worker and process."""
    return e["id"], e.get("retries", 0), e["worker"], e.get("pid")


def _bodies(history: History, starts: list[dict[str, Any]], ends: list[dict[str, Any]]
            ) -> list[tuple[float, float, dict[str, Any]]]:  # fmt: skip
    """Each body's ``(start, end, start entry)``: a start is paired with the first end after
    it of the same body (:func:`_body_key`), so a message run twice is two bodies, each with
    its own end (seed 665725: a body run again 30 s later, after its ack was lost with a
    restarted broker, was counted as running all along with the last end of its id). A body
    that never ended ends at its worker's next SIGKILL, or runs 60 s."""
    pending: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for e in sorted(ends, key=lambda e: e["t"]):
        pending[_body_key(e)].append(e["t"])
    bodies = []
    for e in sorted(starts, key=lambda e: e["t"]):
        queue = pending[_body_key(e)]
        later = next((i for i, t in enumerate(queue) if t >= e["t"]), None)
        if later is not None:
            end = queue.pop(later)
        else:
            kills = [
                w.start
                for w in history.windows
                if w.kind == "kill" and w.worker == e["worker"] and w.start >= e["t"]
            ]
            end = min(kills, default=e["t"] + 60.0)
        bodies.append((e["t"], end, e))
    return bodies


def _caps(history: History, starts: list[dict[str, Any]], ends: list[dict[str, Any]]
          ) -> list[Violation]:  # fmt: skip
    """No cap exceeded, but after a dead holder's lease or while the store is away; a finding
    names the bodies running at once (id, attempt, worker, start and end), the first of
    each owner."""
    found = []
    for task, cap in history.caps.items():
        bodies = _bodies(history, [e for e in starts if e["task"] == task],
                         [e for e in ends if e["task"] == task])  # fmt: skip
        events = sorted([(start, 1, i) for i, (start, _, _) in enumerate(bodies)]
                        + [(end, -1, i) for i, (_, end, _) in enumerate(bodies)],
                        key=lambda ev: (ev[0], ev[1]))  # fmt: skip
        running: set[int] = set()
        # the first excess of each owner is reported: one excused (a store stall's) hides no
        # later one of ours
        owners: set[str] = set()
        for t, step, i in events:
            (running.add if step > 0 else running.discard)(i)
            if len(running) > cap:
                owner = ("fallback" if history.near(t, STORE_FAULTS, after=6.0)
                         else "lease" if history.near(t, ("kill",), after=6.0)
                         else "celery-extras")  # fmt: skip
                if owner in owners:
                    continue
                owners.add(owner)
                at_once = "; ".join(
                    f"{e['id']} attempt {e.get('retries', 0)} on {e['worker']} "
                    f"{start:.3f}-{end:.3f}"
                    for start, end, e in sorted((bodies[j] for j in running), key=lambda b: b[0])
                )  # fmt: skip
                found.append(Violation("cap", f"{task}: {len(running)} running at {t:.3f} for "
                                              f"concurrency({cap}): {at_once}", owner))  # fmt: skip
    return found


def _covering_runs(history: History, starts: list[dict[str, Any]]) -> list[Violation]:
    """A coalesced or debounced message is answered by a run that started after it was
    sent (no lost update): the run's last body, when it ran again (its ack lost with a
    restarted broker, the first ran before the message was sent: seed 646042)."""
    last: dict[str, float] = {}
    for e in starts:
        last[e["id"]] = max(last.get(e["id"], e["t"]), e["t"])
    found = []
    for node in history.workload.nodes():
        if node.task not in ("chaos.coalesced", "chaos.debounced"):
            continue
        state, result = history.results.get(node.id, ("PENDING", None))
        if state != "SUCCESS" or not isinstance(result, dict):
            continue
        run = result.get("run")
        began = last.get(run) if isinstance(run, str) else None
        sent = history.sent.get(node.id, 0.0)
        if began is None:
            found.append(Violation("covering run", f"{node.task}[{node.id}] answered by run "
                                                   f"{run}, which never started"))  # fmt: skip
        elif began < sent - 0.05:
            found.append(Violation("lost update", f"{node.task}[{node.id}] sent at {sent:.3f} "
                                                  f"answered by run {run} started at "
                                                  f"{began:.3f}"))  # fmt: skip
    return found


def _batches(history: History, starts: list[dict[str, Any]], ends: list[dict[str, Any]]
             ) -> list[Violation]:  # fmt: skip
    """Every batched call that succeeded was in exactly one batch that ended (once more
    after a SIGKILL); one that never ended is the lost check's."""
    ended = Counter(call for e in ends for call in e.get("calls") or ())
    found = []
    for node in history.workload.nodes():
        state, _ = history.results.get(node.id, ("PENDING", None))
        if node.task != "chaos.batched" or state != "SUCCESS":
            continue
        count = ended[node.id]
        if count == 1:
            continue
        # once more after a SIGKILL, or its ack lost with a restarted broker (as _twice)
        again = history.near(history.sent.get(node.id, 0.0), ("kill", "broker_restart"),
                             before=EARLIER)  # fmt: skip
        owner = "celery" if count == 2 and again else "celery-extras"
        found.append(Violation("batch", f"call {node.id} in {count} batches that ended", owner))
    return found


def _silences(history: History) -> list[Violation]:
    """Every worker answers ``ping`` throughout, but around a fault."""
    by_worker: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for t, worker, answered in history.pings:
        by_worker[worker].append((t, answered))
    found = []
    for worker, pings in by_worker.items():
        silent_since: float | None = None
        for t, answered in sorted(pings):
            if answered or history.near(t, ("kill", "term", "broker_restart", "store_pause",
                                            "store_stall", "store_restart", "join"),
                                        after=RECOVERY, before=1.0):  # fmt: skip
                silent_since = None
                continue
            silent_since = t if silent_since is None else silent_since
            if t - silent_since >= SILENCE:
                found.append(Violation("silent", f"{worker} answered no ping from "
                                                 f"{silent_since:.1f} to {t:.1f}"))  # fmt: skip
                break
    return found
