"""One store round trip for what several gates ask the store about one task.

A gate whose first question for an arriving task (or whose last, as it ends) is one store
script can hand that call over as data, a :class:`StoreCall`, instead of making it. The
pipeline runs the calls of one task's gates as one script (:class:`StoreRound`): each
call's script becomes a function of it, called in the pipeline's order while the one
before *passes* (says of its reply what its gate says when it lets the task on), so a gate
after one that holds the task back is not asked, as when each gate asked alone, and the
whole admission is one atomic step of the store. Each gate then reads its reply instead of
asking (:meth:`Ticket.reply <.gate.Ticket.reply>`).

The keys of one script must lie in one slot of a Redis Cluster: calls whose keys do not
are not joined (each gate asks alone, as before). No Celery import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from ..scripts import NOW, StoreScript, register

__all__ = [
    "ALWAYS",
    "NO_REPLY",
    "PASSES",
    "StoreCall",
    "StoreRound",
    "answered",
    "deliver",
    "handed",
]

logger = logging.getLogger(__name__)

#: :attr:`StoreCall.passes` of a call after which the next always runs (endings)
ALWAYS = "true"
#: What a gate reads when no round made its call (it asks the store itself)
NO_REPLY: Any = object()
#: What a gate hands over instead of a call when it lets the task on without asking the
#: store (the round goes on to the next gate's call)
PASSES: Any = object()


@dataclass(frozen=True)
class StoreCall:
    """One script call a gate would make: its script, keys and arguments (the time, first
    for a timed script, is the round's), and *passes*, a Lua expression of ``reply``
    true when the gate lets the task on, so that the next gate's call runs. A round of
    calls that all *may_wait* may go a few milliseconds later, with other rounds (see
    :mod:`.store_line`): calls whose replies no other task's admission waits for."""

    script: StoreScript
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    passes: str = ALWAYS
    may_wait: bool = False

    def __call__(self) -> Any:
        """Make the call alone."""
        return self.script(keys=self.keys, args=self.args)


def answered(reply: Any) -> Any:
    """A round's *reply* to one call: raised when it is the round's exception (the gate
    meets it as its own call's failure)."""
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _function(script: StoreScript) -> str:
    """*script*'s text as the body of a Lua function of ``KEYS`` and ``ARGV`` (the round's
    ``now`` prefix serves it: its own is cut); a script with a flag line cannot join."""
    if script.timed and not script.text.startswith(NOW):
        raise ValueError("a script that does not start with its time cannot join a round")
    body = script.text.removeprefix(NOW)
    return f"function(KEYS, ARGV)\n{body}\nend"


def _text(calls: Sequence[StoreCall]) -> str:
    """The script of a round of *calls*' scripts and predicates. Its ARGV, after the time:
    the number of calls, then each call's key count and argument count, then every
    call's arguments; its KEYS, every call's keys. Returns the replies of the calls run."""
    steps = ",\n".join(_function(call.script) for call in calls)
    passes = ",\n".join(f"function(reply) return {call.passes} end" for call in calls)
    return f"""{NOW}
local steps = {{
{steps}
}}
local passes = {{
{passes}
}}
local n = tonumber(ARGV[1])
local k, a = 0, 1 + 2 * n
local replies = {{}}
for i = 1, n do
  local nkeys, nargs = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local keys, args = {{}}, {{}}
  for j = 1, nkeys do keys[j] = KEYS[k + j] end
  for j = 1, nargs do args[j] = ARGV[a + j] end
  k, a = k + nkeys, a + nargs
  local reply = steps[i](keys, args)
  replies[i] = reply
  if not passes[i](reply) then break end
end
return replies
"""


class StoreRound:
    """Runs rounds of calls on one store *client*; each sequence of scripts and predicates
    is composed and registered once."""

    def __init__(self, connect: Callable[[], tuple[Any, bool]]) -> None:
        self._connect = connect
        self._store: tuple[Any, bool] | None = None
        self._scripts: dict[tuple[tuple[str, str], ...], StoreScript] = {}

    def store(self) -> tuple[Any, bool]:
        """The store's client, and whether it is a Redis Cluster's (*connect*, on first use)."""
        if self._store is None:
            self._store = self._connect()
        return self._store

    def joinable(self, calls: Sequence[StoreCall]) -> bool:
        """Whether *calls* can run as one script: at least two, and on a Redis Cluster their
        keys in one slot."""
        if len(calls) < 2:
            return False
        if not self.store()[1]:
            return True
        return len({key_slot(key.encode()) for call in calls for key in call.keys}) == 1

    def ask(self, ticket: Any, gates: Sequence[Any], asker: str) -> None:
        """Make the calls *gates* hand over for *ticket* (with their *asker*,
        ``arrival_call`` or ``ending_call``) in one round, up to the first gate that hands
        none: the replies go in ``ticket.replies`` by gate label (see :func:`deliver`).
        Fewer than two calls, or calls that cannot join: each gate asks alone."""
        labels, calls = handed(ticket, gates, asker)
        if not self.joinable(calls):
            return
        try:
            replies: Any = self.run(calls)
        except Exception as exc:
            replies = exc
        deliver(ticket, labels, replies)

    def command(self, calls: Sequence[StoreCall]) -> tuple[StoreScript, list[str], list[Any]]:
        """The one script call that makes *calls* (one, or several :meth:`joinable`): its
        script, keys and arguments (the time not yet first)."""
        if len(calls) == 1:
            return calls[0].script, list(calls[0].keys), list(calls[0].args)
        shape = tuple((call.script.sha, call.passes) for call in calls)
        script = self._scripts.get(shape)
        if script is None:
            script = self._scripts[shape] = register(self.store()[0], _text(calls))
        counts: list[Any] = [len(calls)]
        keys: list[str] = []
        args: list[Any] = []
        for call in calls:
            counts += [len(call.keys), len(call.args)]
            keys += call.keys
            args += call.args
        return script, keys, counts + args

    def run(self, calls: Sequence[StoreCall]) -> list[Any]:
        """Run *calls* (two or more) in order while each passes, in one round trip: the
        replies of those run (the first that did not pass last). Raises the client's errors."""
        script, keys, args = self.command(calls)
        return list(script(keys=keys, args=args))


def handed(ticket: Any, gates: Sequence[Any], asker: str) -> tuple[list[str], list[StoreCall]]:
    """The calls *gates* hand over for *ticket* with their *asker* (``arrival_call``,
    ``ending_call``), up to the first that hands none, and the gates' labels (a gate that
    hands :data:`PASSES` has no call in the round)."""
    labels, calls = [], []
    for gate in gates:
        try:
            call = getattr(gate, asker)(ticket)
        except Exception:  # a bug: the gate asks alone, and meets it there
            logger.exception("celery-extras: %s.%s failed", type(gate).__name__, asker)
            break
        if call is None:
            break
        if call is PASSES:
            continue
        calls.append(call)
        labels.append(gate.label)
    return labels, calls


def deliver(ticket: Any, labels: Sequence[str], reply: Any) -> None:
    """A round's *reply* in ``ticket.replies`` by gate label: a round of several calls
    answers a list (of the calls run), a round of one the call's own reply; an exception
    goes to every gate (each meets it as its own call's failure)."""
    if isinstance(reply, BaseException):
        replies = [reply] * len(labels)
    else:
        replies = [reply] if len(labels) == 1 else list(reply)
    ticket.replies.update(zip(labels, replies, strict=False))
