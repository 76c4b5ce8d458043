"""The calls the remediation workflow (workflows/remediate.yaml) makes to actuate, and its plans.

The values are the strings the workflow sends and compares; they are also part of the ids
of the step records (``steps/<step>-<op>``) stored under each incident.
"""

from __future__ import annotations

from enum import StrEnum

from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action


class Op(StrEnum):
    """One actuate call: ``{op, incident, step}``."""

    CLAIM = "claim"
    FENCE = "fence"
    CHECKPOINT = "checkpoint"
    JOBS_DONE = "jobs_done"
    ACT = "act"
    OPERATION = "operation"
    VERIFY = "verify"
    UNFENCE = "unfence"
    RESCHEDULE = "reschedule"
    CLOSE = "close"
    FAIL = "fail"


# Effects: recorded under the incident and replayed when called again, so a retry acts once.
MUTATING_OPS = frozenset({Op.FENCE, Op.CHECKPOINT, Op.ACT, Op.UNFENCE, Op.RESCHEDULE, Op.CLOSE, Op.FAIL})
# Read-only probes the workflow polls; recording them would replay a stale answer.
PROBE_OPS = frozenset({Op.JOBS_DONE, Op.OPERATION, Op.VERIFY})


class Plan(StrEnum):
    """The branch of the workflow an action takes (claim's answer)."""

    NOTIFY_ONLY = "notify_only"
    DRAIN = "drain"
    REMEDIATE = "remediate"


def plan_for(action: str) -> Plan:
    """Record-only actions only notify; a drain checkpoints first; the rest remediate the node."""
    if action in RECORD_ONLY_ACTIONS:
        return Plan.NOTIFY_ONLY
    if action == Action.DRAIN_NODE:
        return Plan.DRAIN
    return Plan.REMEDIATE


def step_key(step: int, op: Op) -> str:
    """The id of an op's record under its incident."""
    return f"{step}-{op}"
