"""The calls the remediation workflow (workflows/remediate.yaml) makes to actuate, and its plans.

The values are the strings the workflow sends and compares; they are also part of the ids
of the step records (``steps/<step>-<op>``) stored under each incident.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Generic, TypeVar, cast

from pitstop.core.actions import RECORD_ONLY_ACTIONS, Action
from pitstop.core.domain import Incident
from pitstop.core.evidence import Warrant
from pitstop.core.states import State
from pitstop.core.vertex import SCHEDULER


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
    RESUBMIT = "resubmit"  # a Vertex AI job: read back, classed, resubmitted from its checkpoint or paged
    ESCALATE = "escalate"
    UNFENCE = "unfence"
    RESCHEDULE = "reschedule"
    CLOSE = "close"
    FAIL = "fail"


class Kind(Enum):
    CLAIM = "claim"  # takes the step for one execution (a conditioned change of the incident)
    EFFECT = "effect"  # recorded under the incident by the step runner: runs once, replayed after
    PROBE = "probe"  # asked again and again by the workflow's polls: answered fresh, never recorded


S = TypeVar("S")
A = TypeVar("A")
_WORKING = frozenset({State.OPEN, State.FENCED, State.ACTING, State.VERIFYING})
# The states each op may find its incident in (the workflow's order: claim and fence on OPEN;
# checkpoint, early requeue and diagnosis while FENCED; act moves it to ACTING; verify to
# VERIFYING). An op that finds its incident anywhere else (closed by a person, failed by the
# watchdog, held) must not act: the execution that asks is stale.
WORKING = _WORKING
FENCED_ONLY = frozenset({State.FENCED})
AFTER_FENCE = _WORKING - {State.OPEN}
OPEN_ONLY = frozenset({State.OPEN})  # a hung job's incident: nothing of its own is fenced


@dataclass(frozen=True)
class OpSpec(Generic[S, A]):
    """Everything an op is, in one place (services/actuate/registry.OPS holds one per op): its
    handler (whose return annotation is its answer, core/answers.py), how it runs, the states its
    incident may be in for it to run (None: any), and whether it disrupts the job or touches the VM
    (then only on a fault confirmed on the node, with the Evidence that confirmed it)."""

    run: Callable[[S], A] | None
    kind: Kind
    states: frozenset[State] | None = None
    disrupt: Callable[[S, Warrant], A] | None = None  # a disruptive op's handler: it needs a Warrant

    def __post_init__(self) -> None:
        if (self.run is None) == (self.disrupt is None):
            raise TypeError("an op has one handler: run(step), or disrupt(step, warrant)")

    @classmethod
    def disrupting(
        cls, handler: Callable[[S, Warrant], A], kind: Kind, states: frozenset[State] | None = None
    ) -> OpSpec[S, A]:
        """A disruptive op: its handler cannot be called without what it rests on."""
        return cls(None, kind, states, handler)

    @property
    def disruptive(self) -> bool:
        return self.disrupt is not None

    @property
    def handler(self) -> Callable[..., A]:
        return self.disrupt if self.disrupt is not None else cast(Callable[[S], A], self.run)

    @property
    def answer(self) -> object:
        """The op's answer type: its handler's return annotation."""
        return typing.get_type_hints(self.handler)["return"]


# What escalate answers when no stronger action takes over: the step goes on to unfence.
CONTINUE = "continue"


class Plan(StrEnum):
    """The branch of the workflow an action takes (claim's answer)."""

    NOTIFY_ONLY = "notify_only"
    DRAIN = "drain"
    REMEDIATE = "remediate"
    LOCALISE = "localise"  # a hung job: find its culprit node before the gang restarts
    RESUBMIT = "resubmit"  # a Vertex AI job: the platform owns its VMs; the job is resubmitted whole


def plan_for(action: str, inc: Incident | None = None) -> Plan:
    """A Vertex AI job's episode (it ended, or hung) is read back and resubmitted; a hang the engine
    chose to localise is localised; record-only actions only notify; a drain checkpoints first; the
    rest remediate the node."""
    if inc is not None and inc["scheduler"] == SCHEDULER and action != Action.NONE:
        return Plan.RESUBMIT
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
