"""Which state an incident may move to from which: one table every state change goes through.

The incident engine (a new, raised, held, released, stepped-up, closed or failed incident) and
actuate (fence, act, verify, resolve, reject, fail) both move incidents; both call :func:`move`,
so a transition the table does not name is refused wherever it is attempted: a late workflow
step can never turn a RESOLVED incident back into ACTING, nor a person's close be undone.

    OPEN ──fence──▶ FENCED ──act──▶ ACTING ──verify──▶ VERIFYING ──close──▶ RESOLVED
      │ ▲             │               │                  │
      │ └──── step up (a stronger fault while fenced: the next step starts from OPEN) ◀──┘
      ├─hold─▶ HELD ──release──▶ OPEN     OPEN, FENCED, ACTING, VERIFYING ──fail──▶ FAILED
    FENCED ──hold (the runtime control, before the repair began)──▶ HELD
      └─end of burst, suppressed, rejected, closed ──▶ RESOLVED
    HELD, FAILED ──closed by a person──▶ RESOLVED
    RESOLVED ──reopen──▶ OPEN: only a record-only episode a late, stronger line of its burst reopens.
"""

from __future__ import annotations

from collections.abc import Mapping

from pitstop.core.domain import Draft
from pitstop.core.states import State

# target states allowed from each state; staying in a state is always allowed (a retried step)
ALLOWED: Mapping[State, frozenset[State]] = {
    State.OPEN: frozenset({State.FENCED, State.HELD, State.RESOLVED, State.FAILED}),
    State.HELD: frozenset({State.OPEN, State.RESOLVED}),
    State.FENCED: frozenset(
        {State.ACTING, State.VERIFYING, State.OPEN, State.HELD, State.RESOLVED, State.FAILED}
    ),
    State.ACTING: frozenset({State.VERIFYING, State.OPEN, State.RESOLVED, State.FAILED}),
    State.VERIFYING: frozenset({State.OPEN, State.RESOLVED, State.FAILED}),
    State.RESOLVED: frozenset({State.OPEN}),
    State.FAILED: frozenset({State.RESOLVED}),
}


class IllegalTransitionError(Exception):
    """A state change the table does not allow (never a ValueError: callers retry those)."""

    def __init__(self, incident: str, frm: str, to: str, why: str) -> None:
        super().__init__(f"incident {incident}: {frm} -> {to} is not allowed ({why})")
        self.incident, self.frm, self.to = incident, frm, to


def allowed(frm: str, to: str) -> bool:
    """Whether an incident in ``frm`` may move to ``to``."""
    if frm == to:
        return True
    try:
        return State(to) in ALLOWED[State(frm)]
    except ValueError:  # a state no table row names
        return False


def move(inc: Draft, to: State, why: str) -> None:
    """Move the incident (a dict, changed in place) to ``to``, or raise if the table forbids it.

    ``why`` names the event, for the error a refused move raises.
    """
    frm = str(inc["state"])
    if not allowed(frm, to):
        raise IllegalTransitionError(str(inc.get("id")), frm, str(to), why)
    inc["state"] = to
