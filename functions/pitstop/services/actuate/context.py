"""What every op of a remediation step works with: its dependencies, and the call it answers."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, overload

from pitstop.adapters import log
from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.core import checks, remediation, steps
from pitstop.core.aggregate import At, Command
from pitstop.core.answers import (
    Acted,
    Checkpointed,
    CheckStarted,
    Corroborating,
    Decided,
    Escalated,
    GangDecided,
    Linking,
    Localising,
    OpAnswer,
    Validating,
)
from pitstop.core.degraded import Telemetry
from pitstop.core.domain import Fenced, Incident, JsonObject, Unfenced, Vm
from pitstop.core.engine import Outcome
from pitstop.core.ids import request_id
from pitstop.core.ops import Op, step_key
from pitstop.core.policy import Policy
from pitstop.core.scheduling import Scheduler, StepRef
from pitstop.core.states import State
from pitstop.core.store import IncidentStore
from pitstop.core.validation import ValidationTable
from pitstop.services.launch import Launcher
from pitstop.services.schedulers import NoScheduler

# How long an attempt's claim on a step op holds: actuate's deployed timeout (--timeout=300 in
# infra/resources.yaml) and a margin. An attempt still holding it is alive; past it, it is dead.
ACTUATE_TIMEOUT_S = 300.0
STEP_CLAIM_S = steps.claim_seconds(ACTUATE_TIMEOUT_S)


class StepBusyError(ActuatorError):
    """Another attempt holds the op's in-progress record: ask again later (503, retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, True)


@dataclass
class Deps:
    """actuate's dependencies, built once per instance."""

    policy: Policy
    store: IncidentStore
    compute: ComputeAdapter
    schedulers: Mapping[str, Scheduler]
    launcher: Launcher
    clock: Callable[[], float] = time.time
    claim_s: float = STEP_CLAIM_S
    validation_table: ValidationTable | None = None
    telemetry: Telemetry | None = None  # a degraded node's peers' readings (Cloud Monitoring)
    prometheus: Telemetry | None = None  # the same on GKE (Managed Service for Prometheus, PromQL)

    def table(self) -> ValidationTable:
        return checks.table_for(self.policy, self.validation_table)


@dataclass
class Step:
    """One call of the workflow: an op of an incident's step, by one execution."""

    deps: Deps
    inc: Incident
    step: int
    op: Op
    execution: str = ""
    extra: JsonObject = field(default_factory=dict)  # the workflow's ``extra`` (fail: stage, error)
    claim: steps.Claim | None = None
    runner: steps.StepRunner[Any] | None = None
    states: frozenset[State] | None = None  # where its op may find the incident (core/ops.OpSpec)

    # -- what the op acts on ----------------------------------------------------------------

    @property
    def iid(self) -> str:
        return str(self.inc["id"])

    @property
    def instance(self) -> str:
        return remediation.instance_of(self.inc)

    def node(self) -> tuple[str, str, str]:
        n = self.inc["node"]
        if n is None:
            raise TypeError(f"incident {self.iid} is about a job, not a node")
        return n["project"], cast(str, n["zone"]), n["instance"]  # ingest resolved a regional node's zone

    @property
    def ref(self) -> StepRef:
        return StepRef(self.iid, self.step)

    @property
    def scheduler(self) -> Scheduler:
        return self.deps.schedulers.get(self.inc.get("cluster") or "", NoScheduler())

    def vm(self) -> Vm:
        return self.deps.compute.get(*self.node())

    # -- records -----------------------------------------------------------------------------

    # What an op of this (or another) step recorded, typed by the op that answered it; None
    # until it has finished. The store's record, read back as its op wrote it.
    @overload
    def recorded(self, op: Literal[Op.FENCE], step: int | None = None) -> Fenced | None: ...
    @overload
    def recorded(self, op: Literal[Op.UNFENCE], step: int | None = None) -> Unfenced | None: ...
    @overload
    def recorded(self, op: Literal[Op.CHECKPOINT], step: int | None = None) -> Checkpointed | None: ...
    @overload
    def recorded(self, op: Literal[Op.ESCALATE], step: int | None = None) -> Escalated | None: ...
    @overload
    def recorded(self, op: Literal[Op.ACT], step: int | None = None) -> Acted | None: ...
    @overload
    def recorded(self, op: Literal[Op.CORROBORATE], step: int | None = None) -> Corroborating | None: ...
    @overload
    def recorded(self, op: Literal[Op.VALIDATE], step: int | None = None) -> Validating | None: ...
    @overload
    def recorded(
        self, op: Literal[Op.DIAGNOSE, Op.REVALIDATE], step: int | None = None
    ) -> CheckStarted | None: ...
    @overload
    def recorded(self, op: Literal[Op.LOCALISE], step: int | None = None) -> Localising | None: ...
    @overload
    def recorded(self, op: Literal[Op.LINKS], step: int | None = None) -> Linking | None: ...

    def recorded(self, op: Op, step: int | None = None) -> OpAnswer | None:
        rec = self.deps.store.step_record(self.iid, step_key(self.step if step is None else step, op)) or {}
        if steps.record_state(rec) != steps.DONE:
            return None
        return cast(OpAnswer, dict(rec.get("result") or {}))  # the op's answer, as it recorded it

    def decided(self) -> Decided:
        """What an earlier attempt of this op decided before its first effect (empty: nothing)."""
        return cast(Decided, self.claim.saved if self.claim is not None else {})  # as save() kept it

    def gang_decided(self) -> GangDecided:
        """The same for a gang check's op (localise, links)."""
        return cast(GangDecided, self.claim.saved if self.claim is not None else {})

    def save(self, fields: Decided | GangDecided) -> None:
        """Keep what this attempt decided, before its first effect; stop if its claim passed on."""
        if self.runner is None or self.claim is None:
            raise AssertionError("save() outside a recorded op")
        try:
            self.runner.save(self.claim, fields)
        except steps.ClaimLostError as exc:
            raise StepBusyError(f"the claim on {exc.key} passed to another attempt") from None

    # -- changes to the incident -----------------------------------------------------------------

    @property
    def at(self) -> At:
        """This call's step and execution: what every command it sends is checked against."""
        return At(self.step, self.execution, self.states)

    def decide(self, cmd: Command, strict: bool = True) -> Outcome:
        """Send a command to the incident (core/aggregate.decide, applied by the store in one
        transaction); publish what it recorded in the outbox. A refused one raises (409), unless
        it is a probe's record (``strict`` False): the probe's answer stands, the record is dropped."""
        now = self.deps.clock()
        out = self.deps.store.decide(self.iid, cmd, self.deps.policy, now)
        if out.result == "refused":
            if strict:
                raise ActuatorError(409, f"{self.op} refused: {out.refused}", False)
            log.emit("INFO", f"{self.op}: record not kept", incident=self.iid, why=str(out.refused))
            return out
        self.deps.launcher.follow_up(out, self.deps.policy, now)
        return out

    def changed(self, cmd: Command) -> Incident:
        """The incident after a command (:meth:`decide`)."""
        inc = self.decide(cmd).incident
        assert inc is not None  # a decision on an existing incident that was not refused
        return inc

    def label(self, op: Op, state: str | None) -> None:
        """Mark the VM's Pitstop state in labels (best effort: a label is a courtesy, not a control)."""
        try:
            self.deps.compute.set_labels(
                *self.node(),
                {"pitstop-state": state, "pitstop-incident": self.iid if state else None},
                request_id=request_id(self.iid, self.step, op, "setLabels"),
            )
        except ActuatorError as exc:
            log.emit("WARNING", "could not label instance", incident=self.iid, error=exc.message)

    def notify(self, inc: Incident, severity: str, text: str, **extra: Any) -> None:  # Notice's extras
        """Recorded in the outbox, then published: a failed publish is the sweep's to retry, not lost."""
        outbox = self.deps.launcher.outbox
        if outbox is not None:
            outbox.deliver(remediation.notification(inc, severity, text, **extra))
