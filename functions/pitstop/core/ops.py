"""The calls the remediation workflow (workflows/remediate.yaml) makes to actuate, and its plans.

The values are the strings the workflow sends and compares; they are also part of the ids
of the step records (``steps/<step>-<op>``) stored under each incident.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action


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


def plan_for(action: str, inc: Mapping[str, Any] | None = None) -> Plan:
    """A hang the engine chose to localise is localised; record-only actions only notify; a drain
    checkpoints first; the rest remediate the node."""
    if inc is not None and (inc.get("localise") or {}).get("run") is True:
        return Plan.LOCALISE
    if action in RECORD_ONLY_ACTIONS:
        return Plan.NOTIFY_ONLY
    if action == Action.DRAIN_NODE:
        return Plan.DRAIN
    return Plan.REMEDIATE


def step_key(step: int, op: Op) -> str:
    """The id of an op's record under its incident."""
    return f"{step}-{op}"


# -- a step record's life (actuate's idempotency record) ------------------------------------------
STEP_IN_PROGRESS = "in_progress"  # claimed: an attempt runs the op until ``expires_at`` (epoch s)
STEP_DONE = "done"  # ``result`` holds the answer; replayed to every later call
STEP_RELEASED = "released"  # the attempt raised; the next call runs the op again at once

ClaimVerdict = Literal["done", "busy", "take"]


def step_state(rec: Mapping[str, Any]) -> str:
    """A record's state; records written before in-progress claims hold only ``result``."""
    state = rec.get("state")
    if isinstance(state, str) and state:
        return state
    return STEP_DONE if "result" in rec else STEP_RELEASED


def claim_verdict(rec: Mapping[str, Any], now: float) -> ClaimVerdict:
    """What a new attempt may do with an existing record: replay it, wait, or take it over.

    An in-progress claim is respected until it expires; an expired or released one is taken
    over (the op runs again, with the same request ids, so what already happened is not repeated).
    """
    state = step_state(rec)
    if state == STEP_DONE:
        return "done"
    if state == STEP_IN_PROGRESS:
        try:
            expires = float(rec.get("expires_at") or 0)
        except (TypeError, ValueError):
            expires = 0.0
        if expires > now:
            return "busy"
    return "take"


# -- a job's run: which execution of a job a fault hit (Slurm: restart count and start time) -------


def job_run(job: Mapping[str, Any]) -> dict[str, Any]:
    """The run of a job as a scheduler reported it: ``{restarts, start_time}`` (None when unknown)."""
    restarts = job.get("restarts")
    start = job.get("start_time")
    return {
        "restarts": restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None,
        "start_time": start if isinstance(start, str) and start else None,
    }


def known_run(run: Mapping[str, Any]) -> bool:
    return run.get("restarts") is not None and run.get("start_time") is not None
