"""The actuate service: every side effect of a remediation, exactly once per incident step.

The workflow calls ``{op, incident, step, execution, extra}``. Each mutating op runs under an
idempotency record ``steps/<step>-<op>`` under its incident, the pattern idempotency libraries
use (AWS Lambda Powertools' idempotency utility, for one):

1. **Claim.** ``create()`` the record as ``in_progress`` with its owner (the execution), a
   token and ``expires_at``; Firestore lets exactly one create of an id succeed.
2. **Act.** What an op decides before its first effect is saved in the record first (act: the
   Compute method and its arguments, and the VM as it was), and every later attempt reuses it.
3. **Save.** The record becomes ``done`` with the result, which every later call replays.

A call that finds the record in progress answers 503 (the workflow asks again) until that
attempt finishes or its claim expires (``STEP_CLAIM_S``, longer than the function's own
timeout, so the attempt is dead by then). An attempt that raised releases its claim at once.
Either way the next call takes the record over (one taker wins) and runs the op again. That is
safe because every effect carries a deterministic id: Compute's ``requestId``
(pitstop.core.ids.request_id), the Slurm agent's command id, and store writes that set rather
than add. Read-only probes (operation status, verification, job state) are not recorded.

Answers: 200 with a JSON body; 429/503 for transient trouble (the workflow retries); 4xx for a
final refusal (the workflow fails the incident and leaves the node fenced).
"""

from __future__ import annotations

import concurrent.futures as futures
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.scheduler import NoScheduler, Scheduler
from pitstop.core import checks, trust
from pitstop.core.actions import NODE_ACTIONS, RANK, RECORD_ONLY_ACTIONS, Action
from pitstop.core.ids import request_id, requeue_key
from pitstop.core.ops import (
    CONTINUE,
    MUTATING_OPS,
    STEP_DONE,
    STEP_IN_PROGRESS,
    STEP_RELEASED,
    Op,
    Plan,
    job_run,
    known_run,
    plan_for,
    step_key,
    step_state,
)
from pitstop.core.policy import Policy
from pitstop.core.states import ACTIVE_STATES, UNCLAIMABLE_STATES, RunState, State
from pitstop.core.timeline import durations, repair_s, resume_s
from pitstop.core.validation import PAGE, ValidationTable, default_validation_table
from pitstop.services.ingest import to_epoch
from pitstop.services.launch import Launcher, Publisher, Starter
from pitstop.services.outbox import notification_id

CHECKPOINT_MARGIN_S = 300.0
CHECKPOINT_DEFAULT_WAIT_S = 600.0
# How long an attempt's claim on a step op holds: the function's own timeout (--timeout=300 in
# infra/resources.yaml) and a margin. An attempt still holding it is alive; past it, it is dead.
STEP_CLAIM_S = 330.0
# Trouble in a backing service that a retry can outlast (Firestore or Pub/Sub unavailable or slow,
# a contended transaction): answered 503. A Pub/Sub publish whose future times out raises
# concurrent.futures.TimeoutError, which is the builtin TimeoutError since Python 3.11.
_TRANSIENT = (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError, futures.TimeoutError, ValueError)
# The fence answer fields kept on the incident and in the fence record (the agent's drain answer).
_FENCE_FIELDS = ("previous_state", "previous_reason", "already_drained_by_other", "reason")
# States a failed step may still turn into FAILED: the incident has not ended, nor waits for a person.
_FAILABLE = ACTIVE_STATES | {State.OPEN}


_OP_VALUES = frozenset(o.value for o in Op)


class StepBusyError(ActuatorError):
    """Another attempt holds the op's in-progress record: ask again later (503, retryable)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, True)


@dataclass
class Attempt:
    """One run of a recorded op: the claim it holds (with what an earlier attempt saved) and its request."""

    iid: str
    key: str
    claim: dict[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)
    execution: str = ""


def _merge_jobs(first: list[dict[str, Any]], then: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Jobs from two sources, once each; for a job in both, the first source's entry (its run) wins."""
    seen = {str(j["id"]) for j in first}
    return [*first, *(j for j in then if str(j["id"]) not in seen)]


def _fence_answer(answer: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the scheduler said about the node when it was fenced (empty outside any scheduler)."""
    return {k: answer[k] for k in _FENCE_FIELDS if k in answer} if answer else {}


def _measured(doc: Mapping[str, Any], record: Mapping[str, Any], step: int) -> list[dict[str, Any]]:
    """The incident's measurements with this one (one per kind and step: a retried judge replaces it)."""
    kept = [
        dict(m)
        for m in doc.get("measured") or []
        if isinstance(m, Mapping) and (m.get("kind"), m.get("step")) != (record.get("kind"), step)
    ]
    return [*kept, {**record, "step": step}][-checks.MAX_MEASURED :]


def _failure(extra: Mapping[str, Any]) -> tuple[str, str]:
    """The stage that failed and one line saying how, from the workflow's error map."""
    stage = str(extra.get("stage", "?"))
    err = extra.get("error")
    message = err.get("message") if isinstance(err, dict) else str(err)
    body = err.get("body") if isinstance(err, dict) else None
    detail = body.get("error") if isinstance(body, dict) else None
    return stage, f"{stage} failed: {detail or message}"[:500]


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
    ) -> None:
        self.policy, self.store, self.compute, self.schedulers = policy, store, compute, schedulers
        self.notifier, self.clock, self.claim_s = notifier, clock, claim_s
        self.validation_table = validation_table or default_validation_table()
        self.launcher = Launcher(store, starter, notifier)

    @property
    def starter(self) -> Starter | None:
        return self.launcher.starter

    # -- entry -----------------------------------------------------------------------

    def handle(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
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
            return self._run(op, iid, step, req)
        except ActuatorError as exc:
            log.emit(
                "WARNING" if exc.retryable else "ERROR",
                "actuate failed",
                op=op,
                incident=iid,
                step=step,
                status=exc.status,
                error=exc.message,
            )
            body: dict[str, Any] = {"error": exc.message, "retryable": exc.retryable}
            if isinstance(exc, StepBusyError):
                body["in_progress"] = True
            return body, exc.status
        except _TRANSIENT as exc:
            # Firestore or Pub/Sub trouble on our side (an outage, a publish that timed out, a
            # contended transaction): the workflow asks again, and step records make that safe.
            log.emit(
                "WARNING",
                "actuate: backing service unavailable, asking for a retry",
                op=op,
                incident=iid,
                step=step,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            what = f"{type(exc).__name__}: {str(exc)[:200]}"
            return {"error": f"backing service unavailable: {what}", "retryable": True}, 503

    def _run(self, op: Op, iid: str, step: int, req: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        inc = self.store.get(iid)
        if inc is None:
            return {"error": f"no incident {iid}"}, 404
        execution = str(req.get("execution") or "")
        if op in MUTATING_OPS:
            extra = req.get("extra")
            return self._once(op, inc, step, extra if isinstance(extra, Mapping) else {}, execution), 200
        if op == Op.CLAIM:
            return self._claim(inc, step, execution), 200
        result: dict[str, Any] = getattr(self, f"_{op}")(inc, step)  # a probe: asked again, answered fresh
        return result, 200

    # -- exactly once: the in-progress record of each op ---------------------------------

    def _once(
        self, op: Op, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any], execution: str
    ) -> dict[str, Any]:
        """Run an effect once per step (claim, act, save): a result is replayed; 503 while busy."""
        iid, key = inc["id"], step_key(step, op)
        rec = self.store.step_record(iid, key)
        if rec is not None and step_state(rec) == STEP_DONE:
            return {**rec["result"], "replayed": True}
        if inc["step"] != step:  # a newer step owns the incident: this execution only winds down
            return {"outcome": "superseded", "current_step": inc["step"], "operation": None}
        now = self.clock()
        claim = {
            "state": STEP_IN_PROGRESS,
            "op": str(op),
            "owner": execution or "unknown",
            "token": uuid.uuid4().hex,
            "claimed_at": now,
            "expires_at": now + self.claim_s,
        }
        verdict, held = self.store.claim_step(iid, key, claim, now)
        if verdict == "done":
            return {**held["result"], "replayed": True}
        if verdict == "busy":
            raise StepBusyError(
                f"{op} of step {step} is in progress (attempt {held.get('attempt', 1)} of "
                f"{held.get('owner')}, claimed until {held.get('expires_at')})"
            )
        attempt = Attempt(iid, key, held, extra, execution)
        try:
            result: dict[str, Any] = getattr(self, f"_{op}")(inc, step, attempt)
            if result.get("recorded") is False:  # it changed nothing: the next call is answered afresh
                self._release(attempt, "nothing done: " + str(result.get("why")))
                return result
            done = {"state": STEP_DONE, "result": result, "at": self.clock(), "owner": claim["owner"]}
            done.update({k: held[k] for k in ("attempt", "plan") if k in held})
            self.store.put_step_record(iid, key, done)
        except Exception as exc:
            self._release(attempt, f"{type(exc).__name__}: {exc}")
            raise
        return result

    def _save(self, attempt: Attempt, fields: Mapping[str, Any]) -> None:
        """Save what this attempt decided, before its first effect; stop if its claim passed to another."""
        if not self.store.note_step(attempt.iid, attempt.key, attempt.claim["token"], fields):
            raise StepBusyError(f"the claim on {attempt.key} passed to another attempt")
        attempt.claim.update(fields)

    def _release(self, attempt: Attempt, why: str) -> None:
        """Give the claim up at once (keeping what the attempt saved): the next call runs the op again.

        For an attempt that raised, or did nothing. Best effort: if this write fails, the claim expires.
        """
        try:
            self.store.note_step(
                attempt.iid,
                attempt.key,
                attempt.claim["token"],
                {"state": STEP_RELEASED, "error": why[:300], "released_at": self.clock()},
            )
        except Exception as again:
            log.emit(
                "WARNING",
                "actuate: step claim not released; it expires",
                incident=attempt.iid,
                record=attempt.key,
                error=f"{type(again).__name__}: {again}"[:300],
            )

    # -- helpers ---------------------------------------------------------------------

    def _scheduler(self, inc: Mapping[str, Any]) -> Scheduler:
        return self.schedulers.get(inc.get("cluster") or "", NoScheduler())

    @staticmethod
    def _ctx(inc: Mapping[str, Any], step: int) -> str:
        return f"{inc['id']}-{step}"

    def _node(self, inc: Mapping[str, Any]) -> tuple[str, str, str]:
        n = inc["node"]
        return n["project"], n["zone"], n["instance"]

    def _set_state(
        self, iid: str, state: State | None, milestone: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Move an incident (``state`` None keeps it) and stamp a timeline milestone once."""
        now = self.clock()

        def change(doc: dict[str, Any]) -> dict[str, Any]:
            if state is not None:
                doc["state"] = state
            if milestone and not doc["timeline"].get(milestone):
                doc["timeline"][milestone] = now
            doc.update(fields)
            doc["updated_at"] = now
            return doc

        return self.store.mutate(iid, change)

    def _label(self, inc: Mapping[str, Any], step: int, op: Op, state: str | None) -> None:
        """Mark the VM's Pitstop state in labels (best effort: a label is a courtesy, not a control)."""
        p, z, i = self._node(inc)
        try:
            self.compute.set_labels(
                p,
                z,
                i,
                {"pitstop-state": state, "pitstop-incident": inc["id"] if state else None},
                request_id=request_id(inc["id"], step, op, "setLabels"),
            )
        except ActuatorError as exc:
            log.emit("WARNING", "could not label instance", incident=inc["id"], error=exc.message)

    def _recorded(self, inc: Mapping[str, Any], step: int, op: Op) -> dict[str, Any]:
        """The result an earlier op of this step recorded (empty if it has not finished)."""
        rec = self.store.step_record(inc["id"], step_key(step, op)) or {}
        return dict(rec.get("result") or {}) if step_state(rec) == STEP_DONE else {}

    # -- operations ------------------------------------------------------------------

    def _claim(self, inc: Mapping[str, Any], step: int, execution: str) -> dict[str, Any]:
        def claim(doc: dict[str, Any]) -> tuple[bool, str]:
            if doc["step"] != step:
                return False, f"superseded by step {doc['step']}"
            if doc["state"] in UNCLAIMABLE_STATES:
                return False, f"incident is {doc['state']}"
            wf = doc.get("workflow") or {}
            owner = wf.get("claimed_by")
            if owner and execution and owner != execution:
                return False, "another execution owns this step"
            wf["claimed_by"] = execution or owner or "unknown"
            wf["state"] = RunState.STARTED
            doc["workflow"] = wf
            return True, ""

        ours, why = self.store.mutate(inc["id"], claim)
        if ours:
            problem = self._identity_problem(inc)
            if problem is not None:
                self._reject(inc["id"], problem)
                ours, why = False, f"rejected: {problem}"
        return {"ours": ours, "why": why, "plan": plan_for(inc["action"]), "action": inc["action"]}

    def _identity_problem(self, inc: Mapping[str, Any]) -> str | None:
        """Before a node action first touches the VM: is the live VM the one the evidence names?

        Job actions are not checked (a preempted VM may already be a new one; the job still needs
        its restart), nor a node already acted on (Pitstop's own recreate gives it a new id).
        """
        if inc["action"] not in NODE_ACTIONS or inc["timeline"].get("acted"):
            return None
        p, z, i = self._node(inc)
        try:
            vm = self.compute.get(p, z, i)
        except ActuatorError as exc:
            if exc.status == 404:
                return f"no VM {i} in {p}/{z}"
            raise
        created = to_epoch(str(vm.get("creation_timestamp") or "")) or None
        live_id = str(vm["id"]) if vm.get("id") is not None else None
        return trust.vm_identity_problem(inc["node"], float(inc["first_seen"]), live_id, created)

    def _reject(self, iid: str, problem: str) -> None:
        """End the incident without touching anything: the evidence does not match the live VM."""
        now = self.clock()

        def reject(doc: dict[str, Any]) -> dict[str, Any]:
            doc["state"] = State.RESOLVED
            doc["rejected"] = {"why": problem, "at": now}
            doc["timeline"]["resolved"] = now
            doc["updated_at"] = now
            return doc

        done = self.store.mutate(iid, reject)
        self.store.release_budget(done)
        log.emit("WARNING", "evidence rejected: not the live VM", incident=iid, why=problem)
        self._notify(done, "warning", f"Incident {iid} rejected, nothing done: {problem}")

    def _fence(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Drain the node and record the jobs on it, each with the run the fault hit, and what was there."""
        sched, node, ctx = self._scheduler(inc), inc["node"]["instance"], self._ctx(inc, step)
        jobs = _merge_jobs(self._handed_over_jobs(inc, step), sched.jobs_on(node, ctx))
        fence = _fence_answer(sched.fence(node, inc["id"], inc["action"], ctx))
        self._label(inc, step, Op.FENCE, "fenced")
        self._set_state(inc["id"], State.FENCED, "fenced", jobs=jobs, fence=fence)
        if fence.get("already_drained_by_other"):
            log.emit(
                "INFO", "node was already drained by someone else; left as it is", incident=inc["id"], **fence
            )
        return {
            "fenced": node,
            "jobs": [str(j["id"]) for j in jobs],
            "runs": {str(j["id"]): job_run(j) for j in jobs},
            "fence": fence,
        }

    def _handed_over_jobs(self, inc: Mapping[str, Any], step: int) -> list[dict[str, Any]]:
        """The jobs of the previous step if it handed the node over to this one (escalated before unfence).

        That step requeued nothing: its jobs, with the runs its fault hit, are this step's to move.
        """
        if step <= 1 or not self._recorded(inc, step - 1, Op.ESCALATE).get("handed_over"):
            return []
        prev = self._recorded(inc, step - 1, Op.FENCE)
        runs = prev.get("runs") or {}
        return [{"id": j, **(runs.get(j) or {})} for j in prev.get("jobs", [])]

    def _jobs(self, inc: Mapping[str, Any], step: int) -> list[str]:
        return list(self._recorded(inc, step, Op.FENCE).get("jobs", []))

    def _checkpoint(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        cluster = self.policy.cluster_for(inc["node"])
        signal = ((cluster.raw.get("slurm") or {}).get("checkpoint_signal") if cluster else None) or "SIGUSR1"
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        jobs = self._jobs(inc, step)
        for job in jobs:
            sched.checkpoint(job, signal, ctx)
        ws = to_epoch((inc.get("maintenance") or {}).get("window_start"))
        wait = CHECKPOINT_DEFAULT_WAIT_S if ws is None else max(0.0, ws - self.clock() - CHECKPOINT_MARGIN_S)
        return {"signalled": jobs, "signal": signal, "wait_s": min(wait, CHECKPOINT_DEFAULT_WAIT_S)}

    def _jobs_done(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        running = [j for j in self._jobs(inc, step) if sched.job_running(j, ctx)]
        return {"done": not running, "running": running}

    # -- back to training at once: the gang moves before the repair ------------------------

    def _reschedule_early(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Requeue each job now when the scheduler can run its gang without the node; else say why.

        The repair then goes on in the background of the job. A job left waiting is requeued by
        ``reschedule`` once the node is back (the old order), and the incident's ``resume`` says why.
        """
        sched, ctx, node = self._scheduler(inc), self._ctx(inc, step), inc["node"]["instance"]
        choice = self.policy.reschedule(self.policy.cluster_for(inc["node"]))
        fence = self._recorded(inc, step, Op.FENCE)
        runs = fence.get("runs") or {}
        requeued: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        moved: list[dict[str, Any]] = []
        for job in (str(j) for j in fence.get("jobs", [])):
            cap = sched.capacity(job, node, ctx) if choice == checks.EARLY else {}
            go, why = checks.early_requeue(choice, cap)
            if not go:
                waiting.append({"job": job, "why": why})
                continue
            skipped = self._requeue(inc, sched, ctx, job, runs.get(job) or {})
            (requeued if skipped is None else moved).append(
                {"job": job, "why": why if skipped is None else skipped}
            )
        resume = {
            "mode": checks.EARLY if requeued else checks.AFTER_REPAIR,
            "requeued": requeued,
            "waiting": waiting,
        }
        if moved:
            resume["skipped"] = moved
        gang_moved = requeued or any("requeued" in m["why"] for m in moved)
        self._set_state(inc["id"], None, "job_requeued" if gang_moved else None, resume=resume)
        if requeued:
            log.emit(
                "INFO",
                "gang requeued before the repair",
                incident=inc["id"],
                jobs=[r["job"] for r in requeued],
            )
        return resume

    def _watch_resume(self, inc: Mapping[str, Any], step: int) -> bool:
        """Stamp ``job_running`` once every requeued job runs a new run; whether it is stamped.

        Called by the probes the workflow polls anyway (operation, verify, checks, resumed), so the
        moment the gang runs again is seen while the node is still being repaired.
        """
        tl = inc.get("timeline") or {}
        if tl.get("job_running"):
            return True
        if not tl.get("job_requeued"):
            return False
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        runs = self._recorded(inc, step, Op.FENCE).get("runs") or {}
        watched = 0
        for job, then in runs.items():
            info = sched.job_info(str(job), ctx)
            state = str(info.get("state") or "UNKNOWN")
            if state in ("COMPLETED", "CANCELLED"):
                continue  # ended on its own: nothing to wait for
            watched += 1
            # RUNNING only: a requeued job is COMPLETING its old run first (with its new restart count)
            if state != "RUNNING" or job_run(info) == job_run(then or {}):
                return False
        if watched:
            self._set_state(inc["id"], None, "job_running")
        return watched > 0

    def _resumed(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        """Probe after the last requeue: done once the gang is seen running again (or nothing waits)."""
        if not (inc.get("timeline") or {}).get("job_requeued"):
            return {"done": True, "running": False}
        running = self._watch_resume(inc, step)
        return {"done": running, "running": running}

    # -- diagnose before an irreversible action --------------------------------------------

    def _table(self) -> ValidationTable:
        return checks.table_for(self.policy, self.validation_table)

    def _start_check(
        self, inc: Mapping[str, Any], step: int, attempt: Attempt, spec: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Start a check run once: its spec is saved before the scheduler is asked."""
        saved = attempt.claim.get("check")
        if not isinstance(saved, dict):
            self._save(attempt, {"check": dict(spec)})
            saved = dict(spec)
        started = self._scheduler(inc).start_check(inc["node"]["instance"], saved, self._ctx(inc, step))
        return {"run": True, "check": saved, "peer": started.get("peer"), "note": started.get("note")}

    def _check_result(self, inc: Mapping[str, Any], step: int, op: Op) -> dict[str, Any] | None:
        """The scheduler's answer for this step's check run (None when none ran)."""
        rec = self._recorded(inc, step, op)
        if not rec.get("run"):
            return None
        return self._scheduler(inc).check_result(inc["node"]["instance"], rec["check"], self._ctx(inc, step))

    def _final_result(self, inc: Mapping[str, Any], step: int, op: Op) -> dict[str, Any] | None:
        """The check's result for its judge: a scheduler's final refusal is a run that did not finish."""
        try:
            return self._check_result(inc, step, op)
        except ActuatorError as exc:
            if exc.retryable:
                raise
            return {"done": False, "error": exc.message}

    def _diagnose(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        need, why = checks.needs_diagnosis(inc, self.policy)
        if need and isinstance(self._scheduler(inc), NoScheduler):
            need, why = False, "no scheduler to run a diagnostic through: replacing on the evidence as it is"
        if not need:
            return {"run": False, "why": why}
        freed = self._free_node(inc, step)
        p, z, i = self._node(inc)
        vm = self.compute.get(p, z, i)
        expected = checks.gpus_of(vm)  # what the VM has; None: no count can confirm anything
        exp = self._table().expectation(checks.machine_type_of(vm))
        ask = expected or (exp.gpus if exp else 8)
        spec = checks.diagnose_spec(inc, step, self.policy, ask, expected)
        return {**self._start_check(inc, step, attempt, spec), "why": why, **freed}

    def _free_node(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        """Requeue the fenced jobs still on the node (no capacity moved them early): a check needs its GPUs.

        Any repair ends them anyway; requeued now, they wait in the queue for capacity instead. Once
        per run (``_requeue``'s record); the check's start is answered 503 until the node is empty.
        """
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        runs = self._recorded(inc, step, Op.FENCE).get("runs") or {}
        moved: list[str] = []
        for job, then in runs.items():
            info = sched.job_info(str(job), ctx)
            here = str(info.get("state")) in ("RUNNING", "SUSPENDED") and job_run(info) == job_run(then)
            if here and self._requeue(inc, sched, ctx, str(job), then) is None:
                moved.append(str(job))
        if moved:
            self._set_state(inc["id"], None, "job_requeued")
            log.emit("INFO", "jobs requeued to free the node for a check", incident=inc["id"], jobs=moved)
        return {"requeued_to_free": moved} if moved else {}

    def _diagnosis(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        res = self._check_result(inc, step, Op.DIAGNOSE)
        self._watch_resume(inc, step)
        return {"done": res is None or bool(res.get("done"))}

    def _judge_diagnosis(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Replace on what the node itself shows, or step down to REBOOT_NODE and record why."""
        rec = self._recorded(inc, step, Op.DIAGNOSE)
        if not rec.get("run"):
            return {"action": inc["action"], "confirmed": None, "why": rec.get("why")}
        res = self._final_result(inc, step, Op.DIAGNOSE)
        expected = rec["check"].get("expected_gpus")
        verdict = checks.judge_diagnosis(
            inc, res, expected if isinstance(expected, int) else None, self._table()
        )
        self._record_diagnosis(inc, step, verdict)
        if verdict.action == PAGE:
            raise ActuatorError(409, f"diagnosis: {verdict.why}", False)
        return {"action": verdict.action, "confirmed": verdict.confirmed, "why": verdict.why}

    def _record_diagnosis(self, inc: Mapping[str, Any], step: int, verdict: checks.DiagnosisVerdict) -> None:
        """The diagnosis on the incident; not confirmed, this step steps down (and says why)."""
        now = self.clock()
        record = verdict.record(now)

        def judged(doc: dict[str, Any]) -> dict[str, Any]:
            doc["diagnosis"] = record
            doc["measured"] = _measured(doc, record, step)
            if not verdict.confirmed and doc["action"] == Action.REPLACE_NODE and verdict.action != PAGE:
                doc["action"] = verdict.action
                doc.setdefault("escalations", []).append(
                    {"from": Action.REPLACE_NODE, "to": verdict.action, "at": now, "why": [verdict.why]}
                )
            if not doc["timeline"].get("diagnosed"):
                doc["timeline"]["diagnosed"] = now
            doc["updated_at"] = now
            return doc

        self.store.mutate(inc["id"], judged)
        log.emit("INFO", "diagnosed", incident=inc["id"], confirmed=verdict.confirmed, why=verdict.why)

    # -- validate before returning to service ------------------------------------------------

    def _validate(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        has_scheduler = not isinstance(self._scheduler(inc), NoScheduler)
        need, why = checks.needs_validation(inc, self.policy, has_scheduler)
        if need and (inc.get("fence") or {}).get("already_drained_by_other"):
            need, why = False, "the node stays drained by someone else, who returns it to service"
        if not need:
            return {"run": False, "why": why}
        mt = attempt.claim.get("machine_type")
        if not isinstance(mt, str):
            p, z, i = self._node(inc)
            vm = self.compute.get(p, z, i)
            mt = checks.machine_type_of(vm)
            self._save(attempt, {"machine_type": mt, "gpus": checks.gpus_of(vm)})
        gpus = attempt.claim.get("gpus")
        freed = self._free_node(inc, step)
        spec = checks.validate_spec(
            inc, step, self.policy, mt, self._table(), gpus if isinstance(gpus, int) else None
        )
        return {**self._start_check(inc, step, attempt, spec), "why": why, "machine_type": mt, **freed}

    def _validation(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        res = self._check_result(inc, step, Op.VALIDATE)
        self._watch_resume(inc, step)
        return {"done": res is None or bool(res.get("done"))}

    def _judge_validation(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Return the node on a pass; hardware evidence steps up to REPLACE_NODE; anything else pages."""
        rec = self._recorded(inc, step, Op.VALIDATE)
        if not rec.get("run"):
            return {"outcome": "skipped", "why": rec.get("why")}
        res = self._final_result(inc, step, Op.VALIDATE)
        verdict = checks.judge_validation(
            inc["action"], str(rec["machine_type"]), res, self.policy, self._table()
        )
        now = self.clock()
        record = verdict.record(now)
        passed = verdict.validation.passed

        def judged(doc: dict[str, Any]) -> dict[str, Any]:
            doc["validation"] = record
            doc["measured"] = _measured(doc, record, step)
            if passed and not doc["timeline"].get("validated"):
                doc["timeline"]["validated"] = now
            if verdict.next == Action.REPLACE_NODE and RANK[Action.REPLACE_NODE] > RANK[doc["action"]]:
                doc["escalate_to"] = Action.REPLACE_NODE
                doc["escalate_why"] = [f"validation failed: {verdict.validation.why}"]
            doc["updated_at"] = now
            return doc

        self.store.mutate(inc["id"], judged)
        log.emit(
            "INFO", "validated", incident=inc["id"], verdict=verdict.validation.verdict, next=verdict.next
        )
        if verdict.next == PAGE:
            raise ActuatorError(409, f"validation failed: {verdict.validation.why}", False)
        outcome = "pass" if passed else "step_up"
        return {"outcome": outcome, "verdict": verdict.validation.verdict, "why": verdict.validation.why}

    def _act(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Take the incident's action on the VM, once: the call is decided and saved before it is made.

        A retry reuses the saved plan, so a reportHostAsFaulty that ran but went unrecorded is
        repeated under its own request id (and ignored by Compute), never followed by a recreate.
        """
        plan = attempt.claim.get("plan")
        if not isinstance(plan, dict):
            plan = self._act_plan(inc)
            self._save(attempt, {"plan": plan})
        record = {**plan, "operation": self._compute_call(inc, step, plan)}
        self._set_state(inc["id"], State.ACTING, "acted")
        log.emit(
            "INFO",
            "remediation action taken",
            incident=inc["id"],
            node=inc["node"]["instance"],
            action=inc["action"],
            method=record["method"],
            operation=record["operation"],
            attempt=attempt.claim.get("attempt", 1),
        )
        return record

    def _act_plan(self, inc: Mapping[str, Any]) -> dict[str, Any]:
        """What act will do, decided from the VM before any effect; what the VM was is kept for verify."""
        p, z, i = self._node(inc)
        before = self.compute.get(p, z, i)
        self._learn_block(inc, before)
        return {
            "method": "none",
            "before": {
                "id": before.get("id"),
                "host": (before.get("resource_status") or {}).get("physical_host"),
                "status": before.get("status"),
            },
            **self._choose_call(inc, before),
        }

    def _learn_block(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> None:
        """From now on this node also counts against its reservation block's budget."""
        topo = (before.get("resource_status") or {}).get("physical_host_topology") or {}
        if topo.get("block"):
            self.store.set_node_fields(
                inc["node_key"], {"block": f"{topo.get('cluster', '')}/{topo['block']}"}
            )

    def _choose_call(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
        """The Compute Engine method for the action, and its arguments."""
        action = inc["action"]
        if action in (Action.RESET_GPU, Action.REBOOT_NODE):
            return {"method": "reset"}
        if action == Action.REPLACE_NODE:
            return self._choose_replace(inc, before)
        if action == Action.DRAIN_NODE:
            maint = (before.get("resource_status") or {}).get("upcoming_maintenance") or {}
            return {"method": "performMaintenance" if maint.get("can_reschedule") else "wait_for_platform"}
        return {}

    def _choose_replace(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
        """Report the host faulty where Compute allows it (reservation-bound VMs), else recreate the VM."""
        ok, why = self.compute.report_eligible(before)
        if ok:
            behavior = "UNRECOVERABLE_GPU_ERROR" if inc.get("xid") is not None else "PERFORMANCE"
            return {"method": "reportHostAsFaulty", "behavior": behavior, "description": self._evidence(inc)}
        mig = self.compute.mig_of(before) or self._policy_mig(inc)
        if mig is None:
            i = inc["node"]["instance"]
            raise ActuatorError(
                409, f"cannot replace {i}: {why}, and it is not in a managed instance group", False
            )
        return {"method": "recreateInstances", "mig": mig, "why_not_report": why}

    def _compute_call(self, inc: Mapping[str, Any], step: int, plan: Mapping[str, Any]) -> str | None:
        """Make the planned call under its deterministic request id; the operation to wait for, if any."""
        p, z, i = self._node(inc)
        method = str(plan.get("method"))
        rid = request_id(inc["id"], step, Op.ACT, method)
        if method == "reset":
            return self.compute.reset(p, z, i, request_id=rid)
        if method == "performMaintenance":
            return self.compute.perform_maintenance(p, z, i, request_id=rid)
        if method == "reportHostAsFaulty":
            return self.compute.report_host_as_faulty(
                p, z, i, str(plan["behavior"]), str(plan["description"]), request_id=rid
            )
        if method == "recreateInstances":
            return self.compute.recreate(p, z, str(plan["mig"]), i, request_id=rid)
        return None

    def _policy_mig(self, inc: Mapping[str, Any]) -> str | None:
        cluster = self.policy.cluster_for(inc["node"])
        mig = (cluster.raw.get("mig") or {}) if cluster else {}
        return str(mig["name"]) if mig.get("zone") == inc["node"]["zone"] else None

    @staticmethod
    def _evidence(inc: Mapping[str, Any]) -> str:
        """The host report's description: what Pitstop saw, from validated fields only."""
        counts = ", ".join(
            f"{k.replace('xid_', 'Xid ')} x{v}" for k, v in inc["counts"].items() if k != "events"
        )
        gpus = ", ".join(g["pci"] for g in inc.get("gpus", {}).values())
        why = "; ".join(
            w for e in inc.get("escalations", []) for w in e.get("why", []) if w.startswith("lemon")
        )
        diagnosis = inc.get("diagnosis") or {}
        if diagnosis.get("confirmed"):
            why = "; ".join(w for w in (why, str(diagnosis.get("why"))) if w)
        return f"pitstop {inc['id']}: {counts} on GPU {gpus or 'n/a'}{'; ' + why if why else ''}"[:256]

    def _operation(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        act = self._recorded(inc, step, Op.ACT)
        if not act.get("operation"):
            return {"done": True}
        p, z, _ = self._node(inc)
        self._watch_resume(inc, step)
        st = self.compute.operation(p, z, act["operation"])
        if st["error"]:
            raise ActuatorError(409, f"{act['method']} operation failed: {st['error']}", False)
        return {"done": st["done"]}

    def _verify(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        p, z, i = self._node(inc)
        act = self._recorded(inc, step, Op.ACT)
        before = act.get("before") or {}
        cur = self.compute.get(p, z, i)
        vm_ok = cur.get("status") == "RUNNING"
        host = (cur.get("resource_status") or {}).get("physical_host")
        if act.get("method") == "reportHostAsFaulty":
            vm_ok = vm_ok and host != before.get("host")  # back up on a healthy host
        elif act.get("method") == "recreateInstances":
            vm_ok = vm_ok and cur.get("id") != before.get("id")  # the replacement, not the old VM
        sched_ok = vm_ok and self._scheduler(inc).node_healthy(i, self._ctx(inc, step))
        self._watch_resume(inc, step)
        if inc["state"] != State.VERIFYING or (vm_ok and sched_ok):
            self._set_state(inc["id"], State.VERIFYING, "healthy" if vm_ok and sched_ok else None)
        return {"done": vm_ok and sched_ok, "vm": cur.get("status"), "scheduler_ok": sched_ok}

    def _escalate(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Decide a step-up while the node is still fenced: after verify, before unfence.

        A stronger fault that arrived during this step starts the next step (or is held), which
        keeps the node fenced: this step then neither unfences nor requeues (``handed_over``; the
        next step's fence takes its jobs over). Otherwise ``continue``.
        """
        fresh = self.store.get(inc["id"]) or dict(inc)
        if fresh["step"] != step:
            return {"outcome": f"superseded by step {fresh['step']}", "handed_over": True}
        if fresh["state"] == State.HELD:  # this op's own step-up, held, whose answer was lost
            return {
                "outcome": f"escalation held: {(fresh.get('held') or {}).get('reason')}",
                "handed_over": True,
            }
        escalate = fresh.get("escalate_to")
        if escalate and RANK[escalate] > RANK[fresh["action"]]:
            stepped = self._step_up(inc["id"], self.clock())
            if stepped is not None:
                log.emit("INFO", "escalated before returning the node", incident=inc["id"], **stepped)
                return {**stepped, "handed_over": True}
        return {"outcome": CONTINUE, "handed_over": False}

    def _unfence(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Lift Pitstop's drain for this incident; a drain someone else set stays (``left_drained``)."""
        node = inc["node"]["instance"]
        answer = self._scheduler(inc).unfence(node, self._ctx(inc, step)) or {}
        self._label(inc, step, Op.UNFENCE, None)
        out: dict[str, Any] = {"unfenced": node, "resumed": answer.get("resumed")}
        if answer.get("left_drained"):
            out["left_drained"] = str(answer["left_drained"])[:200]
        return out

    def _reschedule(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Requeue each job the fault hit, once: only while it is still the run the fence recorded."""
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        fence = self._recorded(inc, step, Op.FENCE)
        runs = fence.get("runs") or {}
        requeued: list[str] = []
        skipped: list[dict[str, Any]] = []
        for job in fence.get("jobs", []):
            why = self._requeue(inc, sched, ctx, str(job), runs.get(job) or {})
            if why is None:
                requeued.append(job)
            else:
                skipped.append({"job": job, "why": why})
        moved = any("requeued" in sk["why"] for sk in skipped)
        self._set_state(inc["id"], None, "job_requeued" if requeued or moved else None)
        return {"requeued": requeued, "skipped": skipped}

    def _requeue(
        self, inc: Mapping[str, Any], sched: Scheduler, ctx: str, job: str, fenced: Mapping[str, Any]
    ) -> str | None:
        """Requeue one job unless it moved on since the fence: None when requeued, else why not.

        A job already requeued (by Pitstop for another member of its gang, by Slurm, by anyone) has
        a new run: it is not requeued again. Two incidents that see the same run race for its
        requeue record (cluster, job, run): one wins. No clock decides.
        """
        info = sched.job_info(job, ctx)
        state = str(info.get("state") or "UNKNOWN")
        # After a checkpoint request a job exits on purpose: it must come back. Otherwise a job
        # that completed, was cancelled, or is already pending again is left alone.
        finished_ok = state == "COMPLETED" and plan_for(inc["action"]) == Plan.DRAIN
        if state in ("PENDING", "CANCELLED", "UNKNOWN") or (state == "COMPLETED" and not finished_ok):
            return f"job is {state}"
        now_run, then = job_run(info), job_run(fenced)
        if known_run(then) and now_run != then:
            return (
                f"job moved on since the fence (restarts {then['restarts']} -> {now_run['restarts']}, "
                f"start {then['start_time']} -> {now_run['start_time']}): already requeued"
            )
        key = requeue_key(inc.get("cluster") or "none", job, now_run)
        if not self.store.mark_job_requeue(key, inc["id"], self.clock()):
            return "this run of the job was already requeued for another incident"
        restarts = now_run.get("restarts")
        sched.requeue(job, ctx, restarts if isinstance(restarts, int) else None)  # the run it may move
        return None

    def _close(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        now = self.clock()
        fresh = self.store.get(inc["id"]) or dict(inc)
        escalate = fresh.get("escalate_to")
        if escalate and RANK[escalate] > RANK[fresh["action"]]:
            # A stronger fault that arrived after escalate decided, when the node was back in service:
            # it is a new fault for the next step (which fences the node again).
            stepped = self._step_up(inc["id"], now)
            if stepped is not None:
                return stepped
        return self._resolve(inc["id"], step, now)

    def _resolve(self, iid: str, step: int, now: float) -> dict[str, Any]:
        def resolve(doc: dict[str, Any]) -> dict[str, Any]:
            doc["state"] = State.RESOLVED
            doc["timeline"].setdefault("notified", now)
            doc["timeline"]["resolved"] = now
            doc["updated_at"] = now
            return doc

        done = self.store.mutate(iid, resolve)
        self.store.release_budget(done)
        jobs = [j["id"] for j in done.get("jobs", [])] if isinstance(done.get("jobs"), list) else []
        severity = "info" if done["action"] in RECORD_ONLY_ACTIONS else "warning"
        self._notify(done, severity, self._summary(done, step), jobs=jobs)
        return {"outcome": "resolved", "durations_s": durations(done)}

    def _step_up(self, iid: str, now: float) -> dict[str, Any] | None:
        """The fault got worse while it was being fixed: its next step goes the way every step does.

        The engine decides it (policy, cooldown, budgets, mode), the store records it, and the
        launcher pages or starts it, exactly as for an event. None when the engine dropped the
        stronger action (a job action inside its cooldown): this step then closes as usual.
        """
        out = self.store.step_up(iid, self.policy, now)
        self.launcher.follow_up(out, self.policy, now)
        inc = out.incident
        if inc is None or out.result in ("ignored", "suppressed"):
            return None
        if out.result == "held":
            return {"outcome": f"escalation to {inc['action']} held: {inc['held']['reason']}"}
        return {"outcome": f"escalated to {inc['action']} (step {inc['step']})"}

    def _fail(self, inc: Mapping[str, Any], step: int, attempt: Attempt) -> dict[str, Any]:
        """Record a failed step and page a person, unless the incident is past failing.

        A RESOLVED incident stays RESOLVED (e.g. a close whose answer was lost, then an error in its
        retry); so does a HELD or already FAILED one. A step another execution owns is left to it.
        The answer then says what the incident is, and is not recorded (``recorded: False``): the
        step's real failure, if one comes, is still recorded when it is reported.
        """
        stage, what = _failure(attempt.extra)
        now = self.clock()

        def fail(doc: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
            owner = (doc.get("workflow") or {}).get("claimed_by")
            if doc["step"] != step:
                return f"superseded by step {doc['step']}", dict(doc)
            if doc["state"] not in _FAILABLE:
                return f"incident is {doc['state']}", dict(doc)
            if owner and attempt.execution and owner not in (attempt.execution, "unknown"):
                return "another execution owns this step", dict(doc)
            doc["state"] = State.FAILED
            doc["failure"] = {"stage": stage, "error": what, "at": now}
            doc["updated_at"] = now
            return None, dict(doc)

        why_not, done = self.store.mutate(inc["id"], fail)
        if why_not is not None:
            log.emit(
                "WARNING", "failure not recorded", incident=inc["id"], stage=stage, why=why_not, error=what
            )
            state = str(done["state"])
            return {
                "outcome": state.lower(),
                "state": state,
                "stage": stage,
                "error": what,
                "why": why_not,
                "recorded": False,
            }
        node = inc["node"]["instance"]
        where, todo = self._node_note(done, step)
        page = f"{where} Investigate ({what}); when the node is healthy, {todo}close the incident."
        self._notify(done, "critical", f"Remediation of {node} FAILED at {stage}", todo=page)
        return {"outcome": "failed", "stage": stage, "error": what}

    # -- notifications -----------------------------------------------------------------

    def _node_note(self, inc: Mapping[str, Any], step: int) -> tuple[str, str]:
        """Where the node stands in its scheduler (one sentence), and what a person does about its drain.

        Only what is true: a drain someone else set is theirs (Pitstop neither replaced nor lifts
        it), a node never fenced was not, and one already returned is back in service.
        """
        node, fence = inc["node"]["instance"], inc.get("fence") or {}
        unfence = self._recorded(inc, step, Op.UNFENCE)
        if fence.get("already_drained_by_other"):
            return (
                f"{node} stays drained by someone else: it was already {fence.get('previous_state')} with "
                f"reason '{fence.get('previous_reason')}' before Pitstop's fence, and Pitstop neither "
                "replaced nor lifts that drain.",
                "let whoever drained it return it to service, then ",
            )
        if unfence.get("left_drained"):
            return (
                f"{node} stays drained with reason '{unfence['left_drained']}', which is not Pitstop's "
                "drain for this incident, so Pitstop did not lift it.",
                "let whoever drained it return it to service, then ",
            )
        if unfence:
            return f"{node} is back in service.", ""
        if not (inc.get("timeline") or {}).get("fenced"):
            return f"{node} was not fenced by Pitstop (the remediation stopped before its fence).", ""
        reason = fence.get("reason") or f"pitstop {inc['id']}"
        return (
            f"{node} stays fenced (drained) with reason '{reason}'.",
            "resume it in the scheduler and ",
        )

    def _summary(self, inc: Mapping[str, Any], step: int) -> str:
        node = inc["node"]["instance"]
        if inc["action"] in RECORD_ONLY_ACTIONS:
            return f"{node}: {inc['reason']} No node action taken."
        where, todo = self._node_note(inc, step)
        if todo:  # a drain Pitstop did not set still holds the node
            return f"{node}: {inc['action']} done; node healthy, but {where} {inc['reason']}"
        return f"{node}: {inc['action']} done; node healthy and back in service. {inc['reason']}"

    def _notify(self, inc: Mapping[str, Any], severity: str, summary: str, **extra: Any) -> None:
        """Recorded in the outbox, then published: a failed publish is the sweep's to retry, not lost.

        Its id is fixed by the incident, its step and its state, so a retried close or fail announces once.
        """
        outbox = self.launcher.outbox
        if outbox is None:
            return
        outbox.deliver(
            {
                "id": notification_id("incident", inc.get("id"), inc.get("step"), inc.get("state")),
                "kind": "incident",
                "severity": severity,
                "summary": summary,
                "incident": {
                    k: inc.get(k)
                    for k in (
                        "id",
                        "node",
                        "cluster",
                        "kind",
                        "xid",
                        "action",
                        "state",
                        "reason",
                        "counts",
                        "failure",
                        "rejected",
                        "resume",
                        "diagnosis",
                        "validation",
                    )
                },
                "durations_s": durations(inc),
                "resume_s": resume_s(inc),
                "repair_s": repair_s(inc),
                **extra,
            }
        )
