"""The action vocabulary shared by the CLI, schemas, policy and workflow (DESIGN.md)."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    NONE = "NONE"
    RESTART_JOB = "RESTART_JOB"
    DRAIN_NODE = "DRAIN_NODE"
    RESET_GPU = "RESET_GPU"
    RESCHEDULE_JOB = "RESCHEDULE_JOB"
    REBOOT_NODE = "REBOOT_NODE"
    REPLACE_NODE = "REPLACE_NODE"


# How disruptive an action is. An incident only ever moves up this order, so a later
# event can raise a planned action but never silently lower it.
RANK: dict[str, int] = {a.value: i for i, a in enumerate(Action)}

# Actions that touch the node itself (fence it first); the rest only touch the job.
NODE_ACTIONS = frozenset({Action.DRAIN_NODE, Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE_NODE})

# Nothing to do on the node: the incident is a record, and its workflow only notifies. Such an
# episode ends with its burst.
RECORD_ONLY_ACTIONS = frozenset({Action.NONE, Action.RESTART_JOB})

# Actions on the job alone: repeated inside their cooldown they are dropped quietly, not held.
JOB_ACTIONS = frozenset({Action.RESTART_JOB, Action.RESCHEDULE_JOB})


def higher(a: str, b: str) -> str:
    """The more disruptive of two actions."""
    return a if RANK[a] >= RANK[b] else b
