"""The calls the remediation workflow (workflows/remediate.yaml) makes to actuate, and its plans.

The values are the strings the workflow sends and compares; they are also part of the ids
of the step records (``steps/<step>-<op>``) stored under each incident.
"""

from __future__ import annotations

from enum import StrEnum

from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action
from pitstop.core.domain import Incident


class Op(StrEnum):
    """One actuate call: ``{op, incident, step}``."""

    CLAIM = "claim"
    FENCE = "fence"
    CORROBORATE = "corroborate"
    CORROBORATION = "corroboration"
    JUDGE_CORROBORATION = "judge_corroboration"
    CHECKPOINT = "checkpoint"
    JOBS_DONE = "jobs_done"
    ACT = "act"
    OPERATION = "operation"
    VERIFY = "verify"
    RESCHEDULE_EARLY = "reschedule_early"
    DIAGNOSE = "diagnose"
    DIAGNOSIS = "diagnosis"
    JUDGE_DIAGNOSIS = "judge_diagnosis"
    VALIDATE = "validate"
    VALIDATION = "validation"
    REVALIDATE = "revalidate"  # a busbw shortfall: the NCCL test again with a second healthy peer
    REVALIDATION = "revalidation"  # ... the probe polled until it has finished
    JUDGE_VALIDATION = "judge_validation"
    RESUMED = "resumed"
    LOCALISE = "localise"  # a hung job: the node check on every node of the job at once
    SWEEP = "sweep"  # ... the probe polled until it has finished
    LINKS = "links"  # ... judged; nothing found: NCCL between ring neighbours
    LINKS_DONE = "links_done"
    CONCLUDE = "conclude"  # culprits get their own node incidents; else one restart in place and a page
    ESCALATE = "escalate"
    UNFENCE = "unfence"
    RESCHEDULE = "reschedule"
    CLOSE = "close"
    FAIL = "fail"


# Effects: recorded under the incident and replayed when called again, so a retry acts once.
MUTATING_OPS = frozenset(
    {
        Op.FENCE,
        Op.CORROBORATE,
        Op.JUDGE_CORROBORATION,
        Op.CHECKPOINT,
        Op.RESCHEDULE_EARLY,
        Op.DIAGNOSE,
        Op.JUDGE_DIAGNOSIS,
        Op.ACT,
        Op.VALIDATE,
        Op.REVALIDATE,
        Op.JUDGE_VALIDATION,
        Op.ESCALATE,
        Op.UNFENCE,
        Op.RESCHEDULE,
        Op.CLOSE,
        Op.FAIL,
        Op.LOCALISE,
        Op.LINKS,
        Op.CONCLUDE,
    }
)
# Probes the workflow polls; recording them would replay a stale answer. They change nothing but
# timeline stamps of what they observe (healthy, job_running).
PROBE_OPS = frozenset(
    {
        Op.CORROBORATION,
        Op.JOBS_DONE,
        Op.OPERATION,
        Op.VERIFY,
        Op.DIAGNOSIS,
        Op.VALIDATION,
        Op.REVALIDATION,
        Op.RESUMED,
        Op.SWEEP,
        Op.LINKS_DONE,
    }
)
# What escalate answers when no stronger action takes over: the step goes on to unfence.
CONTINUE = "continue"


class Plan(StrEnum):
    """The branch of the workflow an action takes (claim's answer)."""

    NOTIFY_ONLY = "notify_only"
    DRAIN = "drain"
    REMEDIATE = "remediate"
    LOCALISE = "localise"  # a hung job: find its culprit node before the gang restarts


def plan_for(action: str, inc: Incident | None = None) -> Plan:
    """A hang the engine chose to localise is localised; record-only actions only notify; a drain
    checkpoints first; the rest remediate the node."""
    localise = inc.get("localise") if inc is not None else None
    if localise and localise.get("run") is True:
        return Plan.LOCALISE
    if action in RECORD_ONLY_ACTIONS:
        return Plan.NOTIFY_ONLY
    if action == Action.DRAIN_NODE:
        return Plan.DRAIN
    return Plan.REMEDIATE


def step_key(step: int, op: Op) -> str:
    """The id of an op's record under its incident."""
    return f"{step}-{op}"
