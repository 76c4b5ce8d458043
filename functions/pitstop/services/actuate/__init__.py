"""The actuate service: every side effect of a remediation, exactly once per incident step.

The workflow calls ``{op, incident, step, execution, extra}``. The op's handler comes from one
table (registry.py); its phases live in one module each: fence.py (claim, fence, checkpoint,
unfence), gang.py (early requeue, requeue, the gang running again), checks.py (diagnose, validate),
repair.py (the Compute call, its operation, verify), ending.py (escalate, close, fail) and
resubmit.py (a Vertex AI job read back and resubmitted whole). What they decide without I/O is in
core/remediation.py (core/vertex.py for a Vertex AI job).

Each effect runs under the step runner (core/steps.py), its record ``steps/<step>-<op>`` under its
incident: claimed ``in_progress`` before the effect (with its owner, the execution), ``done``
with the result after, which every later call replays. What an op decides before its first
effect (act: the Compute method and its arguments, and the VM as it was) is saved in the record
first, and every later attempt reuses it. A call that finds the record in progress answers 503
(the workflow asks again) until that attempt finishes or its claim expires (longer than the
function's own timeout, so the attempt is dead by then). That is safe because every effect
carries a deterministic id: Compute's ``requestId`` (pitstop.core.ids.request_id), the Slurm
agent's command id, and store writes that set rather than add.

Before any effect the incident itself is checked (core/aggregate.op_refusal, the step runner's
guard, read in the same atomic operation as the claim): still this step's, in a state the op
belongs to, owned by this execution. A closed, failed or held incident is never
acted on by an execution that did not notice (answered 409: the workflow ends). Every state change
goes through the state table (core/lifecycle.py). Read-only probes are answered fresh.

Answers: 200 with a JSON body; 429/503 for transient trouble (the workflow retries); 4xx for a
final refusal (the workflow fails the incident and leaves the node fenced).
"""

from __future__ import annotations

import concurrent.futures as futures
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.core import lifecycle, steps
from pitstop.core.aggregate import HoldStep, op_guard
from pitstop.core.answers import OpAnswer, Refused, Reply
from pitstop.core.control import Hold
from pitstop.core.degraded import Telemetry
from pitstop.core.domain import JsonObject
from pitstop.core.evidence import Warrant, describe
from pitstop.core.ops import Op, step_key
from pitstop.core.policy import Policy
from pitstop.core.scheduling import Scheduler
from pitstop.core.store import IncidentStore
from pitstop.core.validation import ValidationTable
from pitstop.services.actuate.context import STEP_CLAIM_S, Deps, Step, StepBusyError
from pitstop.services.actuate.registry import OPS, Kind, Spec
from pitstop.services.control import RuntimeControl
from pitstop.services.launch import Launcher, Publisher, Starter

__all__ = ["STEP_CLAIM_S", "Actuator", "StepBusyError"]

# Trouble in a backing service that a retry can outlast (Firestore or Pub/Sub unavailable or slow,
# a contended transaction): answered 503. A Pub/Sub publish whose future times out raises
# concurrent.futures.TimeoutError, which is the builtin TimeoutError since Python 3.11.
_TRANSIENT = (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError, futures.TimeoutError, ValueError)
_OP_VALUES = frozenset(o.value for o in Op)


def _warn(message: str, fields: Mapping[str, str]) -> None:
    log.emit("WARNING", f"actuate: {message}", **fields)


class Actuator:
    def __init__(
        self,
        policy: Policy,
        store: IncidentStore,
        compute: ComputeAdapter,
        schedulers: Mapping[str, Scheduler],
        notifier: Publisher | None,
        starter: Starter | None = None,
        clock: Callable[[], float] = time.time,
        claim_s: float = STEP_CLAIM_S,
        validation_table: ValidationTable | None = None,
        telemetry: Telemetry | None = None,
        prometheus: Telemetry | None = None,
        control: RuntimeControl | None = None,
    ) -> None:
        self.deployed, self.control = policy, control  # the policy as deployed; the runtime control
        launcher = Launcher(store, starter, notifier)
        self.deps = Deps(
            policy,
            store,
            compute,
            schedulers,
            launcher,
            clock,
            claim_s,
            validation_table,
            telemetry,
            prometheus,
        )

    @property
    def store(self) -> IncidentStore:
        return self.deps.store

    @property
    def claim_s(self) -> float:
        return self.deps.claim_s

    @property
    def launcher(self) -> Launcher:
        return self.deps.launcher

    @property
    def starter(self) -> Starter | None:
        return self.deps.launcher.starter

    @property
    def notifier(self) -> Publisher | None:
        return self.deps.launcher.notifier

    def handle(self, req: JsonObject) -> tuple[JsonObject, int]:
        """One workflow call, as JSON comes and goes (only its op, incident and step are checked)."""
        reply, status = self.answer(req)
        return dict(reply), status

    def answer(self, req: JsonObject) -> tuple[Reply, int]:
        """The op's typed answer (core/answers.py), or why it was refused, and its HTTP status."""
        raw, iid, step = req.get("op"), req.get("incident"), req.get("step")
        if (
            not isinstance(raw, str)
            or raw not in _OP_VALUES
            or not isinstance(iid, str)
            or not isinstance(step, int)
        ):
            return {"error": "request needs op (known), incident (string) and step (integer)"}, 400
        op = Op(raw)
        try:
            if self.control is not None:  # the policy in force: read once per store.control_cache_s
                self.deps.policy = self.control.policy(self.deployed)
            return self._run(op, iid, step, req)
        except ActuatorError as exc:
            return _refused(op, iid, step, exc)
        except lifecycle.IllegalTransitionError as exc:
            return _refused(op, iid, step, ActuatorError(409, str(exc), False))
        except _TRANSIENT as exc:
            # Firestore or Pub/Sub trouble on our side (an outage, a publish that timed out, a
            # contended transaction): the workflow asks again, and step records make that safe.
            what = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.emit("WARNING", "actuate: backing service unavailable, asking for a retry", op=op,
                     incident=iid, step=step, error=what[:300])  # fmt: skip
            return {"error": f"backing service unavailable: {what}", "retryable": True}, 503

    def _run(self, op: Op, iid: str, step: int, req: JsonObject) -> tuple[Reply, int]:
        inc = self.deps.store.get(iid)
        if inc is None:
            return {"error": f"no incident {iid}"}, 404
        extra = req.get("extra")
        s = Step(
            self.deps,
            inc,  # the store's document, typed at its edge (core/store.IncidentStore.get)
            step,
            op,
            str(req.get("execution") or ""),
            extra if isinstance(extra, dict) else {},  # JSON: an object is a dict
            states=OPS[op].states,
        )
        spec = OPS[op]
        if spec.kind is Kind.EFFECT:
            return self._once(s, spec), 200
        out = spec.handler(s)  # the claim, or a probe: asked again, answered fresh
        return (cast(OpAnswer, out.answer) if isinstance(out, steps.Release) else out), 200  # fail's, kept

    def _once(self, s: Step, spec: Spec) -> Reply:
        """Run an effect once per step, through the step runner alone: a done record is replayed;
        503 while another attempt runs it; its claim is taken only if the incident, read in the
        same atomic operation, is still this step's, in a state the op belongs to, owned by this
        execution and (for a disruptive op) neither paused nor silenced before its repair began
        (then the incident is held: :meth:`_held`) and confirmed on the node
        (core/aggregate.op_refusal). ``fail`` has its own rules (core/aggregate.FailStep) and
        claims unguarded."""
        pol = self.deps.policy
        warrants: list[Warrant] = []  # a disruptive op's, as its guard read it with the claim
        guard = (
            None
            if s.op == Op.FAIL
            else op_guard(
                s.op, s.at, spec.disruptive, pol.corroborate, pol.control, self.deps.clock(), warrants
            )
        )
        runner: steps.StepRunner[Any] = steps.StepRunner(
            self.deps.store.steps(s.iid), self.deps.claim_s, self.deps.clock, _warn
        )
        payload = {"op": str(s.op), "incident": s.iid, "step": s.step}
        try:
            done = runner.run(
                step_key(s.step, s.op),
                payload,
                lambda c: _plain(_handle(spec, replace(s, claim=c, runner=runner), warrants)),
                s.execution,
                guard,
            )
            return cast(OpAnswer, done)  # the op's answer, or its record's when replayed
        except steps.PreconditionError as exc:
            superseded = exc.refusal.superseded_by
            if superseded is not None:  # a newer step owns the incident: this execution only winds down
                return {"outcome": "superseded", "current_step": superseded, "operation": None}
            if exc.refusal.held is not None:
                _held(s, Hold("silence" if exc.refusal.held == "silence" else "pause", exc.refusal.why))
            raise ActuatorError(409, f"{s.op} refused: {exc.refusal.why}", False) from None
        except steps.BusyError as exc:
            raise StepBusyError(str(exc)) from None
        except steps.PayloadMismatchError as exc:
            raise ActuatorError(409, str(exc), False) from None


def _handle(spec: Spec, s: Step, warrants: list[Warrant]) -> OpAnswer | steps.Release:
    """The op's handler; a disruptive one with the warrant its guard read (never without one)."""
    if spec.disrupt is None:
        return cast(Callable[[Step], OpAnswer | steps.Release], spec.run)(s)
    if not warrants:
        raise ActuatorError(409, f"{s.op} refused: nothing warrants it (no guard read the incident)", False)
    log.emit("INFO", "actuate: disruptive op", op=s.op, incident=s.iid, rests_on=describe(warrants[-1]))
    return spec.disrupt(s, warrants[-1])


def _held(s: Step, hold: Hold) -> None:
    """The brake refused a disruptive op: the incident is held, its node fenced, with a page (its
    workflow's ``fail`` then finds it HELD and records nothing); the sweep lets it go on later."""
    out = s.decide(HoldStep(s.at, hold), strict=False)
    log.emit("WARNING", "actuate: held by the runtime control", incident=s.iid, op=s.op,
             result=out.result, why=hold.why)  # fmt: skip


def _plain(out: OpAnswer | steps.Release) -> JsonObject | steps.Release:
    """An answer as the step runner keeps it: a JSON object it replays unread (core/steps.Handler)."""
    return out if isinstance(out, steps.Release) else dict(out)


def _refused(op: Op, iid: str, step: int, exc: ActuatorError) -> tuple[Refused, int]:
    log.emit("WARNING" if exc.retryable else "ERROR", "actuate failed", op=op, incident=iid, step=step,
             status=exc.status, error=exc.message)  # fmt: skip
    body: Refused = {"error": exc.message, "retryable": exc.retryable}
    if isinstance(exc, StepBusyError):
        body["in_progress"] = True
    return body, exc.status
