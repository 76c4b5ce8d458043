"""Where an incident and its workflow run can be: each state named once.

The values are the strings stored in Firestore and sent as JSON. Members are ``str``, so a
document read back with plain strings compares equal to them.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """An incident's state: OPEN → FENCED → ACTING → VERIFYING → RESOLVED | HELD | FAILED."""

    OPEN = "OPEN"
    FENCED = "FENCED"
    ACTING = "ACTING"
    VERIFYING = "VERIFYING"
    RESOLVED = "RESOLVED"
    HELD = "HELD"
    FAILED = "FAILED"


# Not over yet: the node's next event belongs to this incident. A FAILED one waits for a person.
OPEN_STATES = frozenset(State) - {State.RESOLVED}
# A workflow is working on the node: a stronger verdict waits for its close (``escalate_to``).
ACTIVE_STATES = frozenset({State.FENCED, State.ACTING, State.VERIFYING})
# No execution may claim these: the incident ended, or it waits for a person or a budget.
UNCLAIMABLE_STATES = frozenset({State.RESOLVED, State.FAILED, State.HELD})


class RunState(StrEnum):
    """How far the start of an incident's current workflow step got (``workflow.state``)."""

    PENDING = "pending"  # decided and recorded, not yet started: whoever sees it next starts it
    OBSERVE = "observe"  # observe mode: recorded as what would have started
    STARTED = "started"  # an execution exists (and, once claimed, owns the step)
