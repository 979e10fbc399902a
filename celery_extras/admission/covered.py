"""The one rule for a message a policy covers without running it (coalesced, debounced, or a
call of a batch): it ends as if it had run, with the outcome of the run that covered it.

"Ends" is what Celery's tracer (``celery.app.trace.build_tracer``) does when a task
returns or raises, done with Celery's own pieces on a :class:`celery.app.task.Context`
rebuilt from the covered message: on success its ``link`` callbacks and the rest of its
``chain`` are applied with the result (``signature(...).apply_async``, as the tracer
does), then ``backend.mark_as_done(..., request=...)`` stores its result and counts its
chord part; on failure ``backend.mark_as_failure(..., request=..., call_errbacks=True)``
stores it, fails the rest of its chain, propagates to its chord and calls its errbacks;
a revoked run revokes it (``mark_as_revoked``, its chord part too). Its ``task_success``
or ``task_failure`` signal follows, and :data:`~celery_extras.signals.task_covered_ended`
for the stats. The task's own handlers (``on_success``, ``after_return``...) are not
called: they belong to the run.

The covering run may end on another worker than the one that received (and acked) the
covered message, so what the ending needs travels with the covered id in the policy's
store: :func:`context_of` takes it from the worker request, :func:`encode_context` makes
it JSON text (kombu's JSON: dates, UUIDs and bytes round-trip; nothing else) of at most
:data:`MAX_CONTEXT` bytes, and :func:`decode_context` checks what comes back, so a
malformed or forged context is a logged drop (the id still gets its result), never a
crash. An id stored without a context (by a release before this one) gets its result
only, as it did then.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, group, signals, states
from celery.app.task import Context
from celery.backends.base import DisabledBackend
from celery.canvas import maybe_signature
from kombu.utils import json as kombu_json

from .. import compat
from ..signals import task_covered_ended
from .gate import COVERED, Ticket
from .serial import serial

__all__ = [
    "ATTEMPTS",
    "CHUNK",
    "CONTEXT_VERSION",
    "MAX_CONTEXT",
    "PAUSE_ACK_ENV",
    "SPACING",
    "CoveredEndings",
    "CoveredMessage",
    "Outcome",
    "context_of",
    "decode_context",
    "encode_context",
    "end_covered",
    "outcome_of",
    "pause_for_tests",
]

logger = logging.getLogger("celery_extras.covered")

#: The version of the stored context (its ``"v"``); another is dropped, logged.
CONTEXT_VERSION = 1
#: Most bytes a stored context takes (JSON text); over it the arguments are left out
#: first (they only feed ``result_extended``), then the whole context (logged).
MAX_CONTEXT = 64 * 1024
#: How many times (every :data:`SPACING` seconds) the run's stored state is read before
#: giving up, and how many covered messages end per turn of the worker's timer.
ATTEMPTS = 25
SPACING = 0.2
#: Then every SLOW s for up to PATIENCE s: a run replaced by ``self.replace`` has its result
#: only when its replacement ends
SLOW, PATIENCE = 5.0, 3600.0
CHUNK = 50

_TEXT = ("task", "shadow", "root_id", "parent_id", "group", "reply_to", "correlation_id",
         "origin", "hostname", "argsrepr", "kwargsrepr")  # fmt: skip
_INT = ("group_index", "retries", "replaced_task_nesting")
_SIGNATURES = ("callbacks", "errbacks", "chain")
_NAMES = ("stamped_headers", "groups")
_MAPPINGS = ("chord", "stamps", "kwargs")
#: What a covered message's ending needs of its request (headers, properties, body embed).
FIELDS = (*_TEXT, *_INT, *_SIGNATURES, *_NAMES, *_MAPPINGS, "args", "ignore_result",
          "delivery_info")  # fmt: skip
#: Left out first when the context is too large.
_BULKY = ("args", "kwargs", "argsrepr", "kwargsrepr")


# -- the context that travels with a covered id ------------------------------------------------


def context_of(request: Any) -> dict[str, Any]:
    """What the ending of worker request *request* needs, as plain data: its id, task,
    callbacks, errbacks, chain, chord, group and index, root and parent, reply-to, stamps,
    routing key and priority, arguments."""
    fields = dict(getattr(request, "request_dict", None) or {})
    fields.update(compat.request_embed(request))
    context: dict[str, Any] = {"v": CONTEXT_VERSION, "id": request.id}
    for name in FIELDS:
        value = fields.get(name)
        if value is not None and value != [] and value != {}:
            context[name] = value
    context["task"] = fields.get("task") or getattr(request, "name", None)
    delivery = fields.get("delivery_info") or {}
    context["delivery_info"] = {
        "routing_key": delivery.get("routing_key"),
        "priority": delivery.get("priority"),
    }
    if isinstance(context.get("args"), tuple):
        context["args"] = list(context["args"])
    return context


def encode_context(context: Mapping[str, Any]) -> str:
    """*context* as JSON text of at most :data:`MAX_CONTEXT` bytes (the arguments left out
    if need be); ``""`` (logged) when it cannot be: the message then gets its result only."""
    for lean in (False, True):  # the arguments left out only when the whole is too large
        candidate = {k: v for k, v in context.items() if k not in _BULKY} if lean else context
        try:
            text = str(kombu_json.dumps(candidate))
        except Exception as exc:
            logger.warning(
                "celery-extras: the ending of covered message %s cannot be stored as JSON "
                "(%r): it will get its result, not its callbacks, chain or chord",
                context.get("id"), exc,
            )  # fmt: skip
            return ""
        if len(text) <= MAX_CONTEXT // 4 or len(text.encode()) <= MAX_CONTEXT:  # <= 4 B a char
            return text
    logger.warning(
        "celery-extras: the ending of covered message %s is over %d bytes without its "
        "arguments: it will get its result, not its callbacks, chain or chord",
        context.get("id"), MAX_CONTEXT,
    )  # fmt: skip
    return ""


def _signatures(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(one, dict) and isinstance(one.get("task"), str) for one in value
    )


def _valid(context: Any, task_id: str) -> str:
    """Why *context* is not a context of *task_id* (``""`` when it is)."""
    if not isinstance(context, dict):
        return "not an object"
    if context.get("v") != CONTEXT_VERSION:
        return f"version {context.get('v')!r}"
    if context.get("id") != task_id:
        return f"the id {context.get('id')!r}"
    if not isinstance(context.get("task"), str) or not context["task"]:
        return "no task name"
    checks: list[tuple[tuple[str, ...], Callable[[Any], bool]]] = [
        (_TEXT, lambda v: isinstance(v, str)),
        (_INT, lambda v: isinstance(v, int) and not isinstance(v, bool)),
        (_SIGNATURES, _signatures),
        (_NAMES, lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)),
        (_MAPPINGS, lambda v: isinstance(v, dict)),
        (("args",), lambda v: isinstance(v, list)),
        (("ignore_result",), lambda v: isinstance(v, bool)),
        (("delivery_info",), lambda v: isinstance(v, dict)),
    ]
    for names, check in checks:
        for name in names:
            value = context.get(name)
            if value is not None and not check(value):
                return f"its {name!r}"
    return ""


def decode_context(text: Any, task_id: str) -> dict[str, Any] | None:
    """The context *text* stored for covered id *task_id*, checked; ``None`` when there is
    none, and (logged) when it is malformed or not that id's: the id gets its result only."""
    if text is None or text == "" or text == b"":
        return None
    why = ""
    context: Any = None
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            why = "not UTF-8"
    if not why and (not isinstance(text, str) or len(text) > 2 * MAX_CONTEXT):
        why = "not text of a bounded size"
    if not why:
        try:
            context = kombu_json.loads(text)
        except Exception:
            why = "not JSON"
    why = why or _valid(context, task_id)
    if why:
        logger.warning(
            "celery-extras: dropped the stored ending of covered message %s (%s): it gets "
            "its result, not its callbacks, chain or chord", task_id, why,
        )  # fmt: skip
        return None
    assert isinstance(context, dict)
    return {k: context[k] for k in ("id", *FIELDS) if context.get(k) is not None}


# -- the outcome and the ending ------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How the covering run *by* ended: *state* (``SUCCESS``, ``FAILURE`` or ``REVOKED``),
    its *result* (a return value, or the exception) and *traceback* text."""

    state: str
    result: Any = None
    traceback: str | None = None
    by: str = ""


def outcome_of(meta: Mapping[str, Any], by: str) -> Outcome | None:
    """The outcome stored for run *by* (its backend meta), ``None`` until it is ready."""
    state = meta.get("status")
    if state not in states.READY_STATES:
        return None
    result = meta.get("result")
    if state in states.EXCEPTION_STATES and not isinstance(result, BaseException):
        result = Exception(repr(result))
    return Outcome(str(state), result, meta.get("traceback"), by)


@dataclass(frozen=True)
class CoveredMessage:
    """A covered message: its id, and its ending context (``None``: result only)."""

    id: str
    context: Mapping[str, Any] | None = None


def _ignores_result(task: Any, request: Any) -> bool:
    explicit = request.__dict__.get("ignore_result")
    return bool(explicit if explicit is not None else getattr(task, "ignore_result", False))


def _apply_callbacks(app: Celery, request: Context, retval: Any) -> None:
    """The ``link`` callbacks and the next step of the chain of *request*, with *retval*,
    as Celery's tracer applies them."""
    uuid = request.id
    options = {
        "parent_id": uuid,
        "root_id": request.root_id or uuid,
        "priority": (request.delivery_info or {}).get("priority")
        if app.conf.task_inherit_parent_priority
        else None,
    }
    callbacks = request.callbacks
    if callbacks:
        if len(callbacks) > 1:
            sigs: list[Any] = []
            groups: list[Any] = []
            for one in callbacks:
                sig = maybe_signature(one, app=app)
                (groups if isinstance(sig, group) else sigs).append(sig)
            for group_ in groups:
                group_.apply_async((retval,), **options)
            if sigs:
                group(sigs, app=app).apply_async((retval,), **options)
        else:
            maybe_signature(callbacks[0], app=app).apply_async((retval,), **options)
    chain = request.chain
    if chain:
        following = maybe_signature(chain[-1], app=app)
        following.apply_async((retval,), chain=list(chain[:-1]), **options)


def end_covered(app: Celery, name: str, message: CoveredMessage, outcome: Outcome) -> str:
    """End *message*, a covered message of task *name*, as if it had run with *outcome*;
    the state it ended in.

    A message revoked meanwhile (the worker's revoked set, kept in sync) stays revoked.
    Without a context, only its result is stored, as before contexts were kept.
    """
    revoked = message.id in compat.worker_revoked()
    state = states.REVOKED if revoked else outcome.state
    task = app.tasks.get((message.context or {}).get("task") or name)
    backend = task.backend if task is not None else app.backend
    if message.context is None or task is None:
        if state == states.REVOKED:
            backend.mark_as_revoked(message.id, reason="revoked")
        else:
            backend.store_result(message.id, outcome.result, state, outcome.traceback)
        return state
    fields = {k: v for k, v in message.context.items() if k != "v"}
    fields.setdefault("delivery_info", {})
    # on the task's request stack, as the tracer does: receivers read it in task.request
    task.push_request(fields, called_directly=False, is_eager=False)
    try:
        request = task.request
        ignored = _ignores_result(task, request)
        keep_errors = not ignored or bool(task.store_errors_even_if_ignored)
        if state == states.SUCCESS:
            _apply_callbacks(app, request, outcome.result)  # before the result, as Celery
            backend.mark_as_done(request.id, outcome.result, request=request,
                                 store_result=not ignored)  # fmt: skip
            signals.task_success.send(sender=task, result=outcome.result, runtime=0.0)
        elif state == states.REVOKED:
            reason = "revoked" if revoked else str(outcome.result or "revoked")
            backend.mark_as_revoked(request.id, reason, request=request, store_result=keep_errors)
        else:
            exc = outcome.result
            if not isinstance(exc, BaseException):
                exc = Exception(repr(exc))
            backend.mark_as_failure(request.id, exc, outcome.traceback, request=request,
                                    store_result=keep_errors, call_errbacks=True)  # fmt: skip
            signals.task_failure.send(sender=task, task_id=request.id, exception=exc,
                                      args=request.args, kwargs=request.kwargs,
                                      traceback=None, einfo=None)  # fmt: skip
    finally:
        task.pop_request()
    return state


# -- from the worker's timer ---------------------------------------------------------------------

#: Test-only (documented in docs/reliability.rst): seconds between a covered message's
#: ending here and its ack, a window for a test's broker restart.
PAUSE_ACK_ENV = "CELERY_EXTRAS_TEST_PAUSE_COVERED_ACK"


def pause_for_tests(env: str) -> float:
    """Seconds of a test-only pause that environment variable *env* asks for (this module's
    :data:`PAUSE_ACK_ENV`, :data:`.keyed.endings.PAUSE_ENV`); 0 when unset or not a number."""
    try:
        return max(float(os.environ.get(env, "0") or 0), 0.0)
    except ValueError:
        return 0.0


class CoveredEndings:
    """Ends covered messages from a consumer's timer, once their covering run's outcome is
    stored (or known to the worker that ran it), a few at a time."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.counts = {"ended": 0, "gave_up": 0, "errors": 0, "purged": 0}
        #: messages ending here before their ack (covered by a run that had ended), by id
        self.here: dict[int, Ticket] = {}

    def stores_results(self, name: str) -> bool:
        """Whether runs of task *name* store their outcome in the result backend."""
        task = self.app.tasks.get(name)
        ignored = task.ignore_result if task is not None else self.app.conf.task_ignore_result
        return not ignored and not isinstance(self.app.backend, DisabledBackend)

    def schedule(self, consumer: Any, name: str, run_id: str,
                 covered: Sequence[CoveredMessage], known: Outcome | None = None,
                 done: Callable[[], None] | None = None) -> None:  # fmt: skip
        """End *covered* with the outcome of run *run_id* of task *name*: the stored one when
        the task stores results, else *known* (what the worker saw of the run); then call
        *done*."""
        if not covered:
            if done is not None:
                done()
            return
        job = (consumer, name, run_id, list(covered), known, done, 1)
        serial(consumer).call_after(0.0, self._run, job)

    def end_purged(self, consumer: Any, name: str, covered: Sequence[CoveredMessage],
                   outcome: Outcome) -> None:  # fmt: skip
        """End *covered* with *outcome* itself, no stored result read: what a waiting run
        that a purge dropped covered ends revoked (the run has no result, and never will)."""
        if covered:
            self.counts["purged"] += len(covered)
            serial(consumer).call_after(0.0, self._end, (consumer, name, list(covered),
                                                         outcome, None))  # fmt: skip

    def end_here(self, consumer: Any, handle: Any, ticket: Ticket, by: str,
                 mark: Callable[[], None] | None = None) -> None:  # fmt: skip
        """End *ticket*'s message, covered by run *by* that has ended, with that run's
        outcome, then *mark* it ended (so that a delivery of it again, its ack lost with the
        connection, is acked without a second ending), and only then have *handle* ack it
        (as covered): a worker dying meanwhile has the broker deliver it again."""
        self.here[id(ticket)] = ticket
        message = CoveredMessage(ticket.request.id, context_of(ticket.request))

        def ended() -> None:
            if mark is not None:
                mark()
            pause = pause_for_tests(PAUSE_ACK_ENV)
            if pause:  # a test's window between the ending and the ack (see PAUSE_ACK_ENV)
                serial(consumer).call_after(pause, resume, ())
            else:
                resume()

        def resume() -> None:
            if self.here.pop(id(ticket), None) is ticket:
                handle.resume(ticket, COVERED)

        self.schedule(consumer, ticket.name, by, [message], done=ended)

    def forget_here(self) -> None:
        """The connection is gone: the messages ending here are acked by nobody (the broker
        delivers them again)."""
        for ticket in self.here.values():
            compat.forget_held(ticket.request)
        self.here.clear()

    def _run(self, consumer: Any, name: str, run_id: str, covered: list[CoveredMessage],
             known: Outcome | None, done: Callable[[], None] | None,
             attempt: int) -> None:  # fmt: skip
        outcome = self._outcome(name, run_id, known)
        if outcome is None:
            waited = min(attempt, ATTEMPTS) * SPACING + max(attempt - ATTEMPTS, 0) * SLOW
            if waited < PATIENCE:
                again = (consumer, name, run_id, covered, known, done, attempt + 1)
                serial(consumer).call_after(SPACING if attempt < ATTEMPTS else SLOW,
                                            self._run, again)  # fmt: skip
                return
            self.counts["gave_up"] += len(covered)
            logger.warning(
                "celery-extras: run %s of %s has no result after %.0f s; the %d message(s) "
                "it covered keep theirs pending", run_id, name, waited, len(covered),
            )  # fmt: skip
            if done is not None:
                done()
            return
        self._end(consumer, name, covered, outcome, done)

    def _outcome(self, name: str, run_id: str, known: Outcome | None) -> Outcome | None:
        if not self.stores_results(name):
            return known or Outcome(states.SUCCESS, None, None, run_id)
        try:
            return outcome_of(self.app.backend.get_task_meta(run_id), run_id)
        except Exception:
            logger.exception("celery-extras: reading the outcome of run %s failed", run_id)
            return None

    def _end(self, consumer: Any, name: str, covered: list[CoveredMessage], outcome: Outcome,
             done: Callable[[], None] | None, failed: tuple[CoveredMessage, ...] = (),
             attempt: int = 1) -> None:  # fmt: skip
        """End *covered*, :data:`CHUNK` per turn of the loop; those whose ending failed (a
        callback's publish in a broker outage: chaos seed 444331, where the message stayed
        ``PENDING`` for good) are ended again after ``attempt`` s (at most :data:`SLOW`),
        for :data:`PATIENCE` s; then *done*."""
        for message in covered[:CHUNK]:
            try:
                state = end_covered(self.app, name, message, outcome)
            except Exception:
                self.counts["errors"] += 1
                failed += (message,)
                if attempt == 1:
                    logger.exception(
                        "celery-extras: ending covered message %s with the outcome of run %s "
                        "failed; it is ended again until it succeeds", message.id, outcome.by,
                    )  # fmt: skip
                continue
            self.counts["ended"] += 1
            task_covered_ended.send(sender=name, task_id=message.id, state=state,
                                    by=outcome.by)  # fmt: skip
        loop = serial(consumer)
        if covered[CHUNK:]:
            loop.call_after(0.0, self._end, (consumer, name, covered[CHUNK:], outcome, done,
                                             failed, attempt))  # fmt: skip
        elif failed and attempt * SLOW < PATIENCE:
            loop.call_after(
                min(float(attempt), SLOW),
                self._end,
                (consumer, name, list(failed), outcome, done, (), attempt + 1),
            )
        else:
            self._gave_up(failed, outcome)
            if done is not None:
                done()

    def _gave_up(self, failed: tuple[CoveredMessage, ...], outcome: Outcome) -> None:
        if failed:
            self.counts["gave_up"] += len(failed)
            logger.error("celery-extras: gave up ending %s covered by run %s",
                         ", ".join(m.id for m in failed), outcome.by)  # fmt: skip
