"""The actuate service: every side effect of a remediation, one idempotent operation at a time.

The workflow calls ``{op, incident, step, execution}``. Mutating operations record their
outcome under the incident (``steps/<step>-<op>``) and replay it when called again, so a
retried call or a re-run execution never resets a node twice. Read-only probes (operation
status, verification, job state) are not recorded. Answers: 200 with a JSON body; 429/503
for transient trouble (the workflow retries); 4xx for a final refusal (the workflow fails
the incident and leaves the node fenced).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.scheduler import NoScheduler, Scheduler
from pitstop.core.actions import RANK, RECORD_ONLY_ACTIONS, Action
from pitstop.core.ops import MUTATING_OPS, Op, Plan, plan_for, step_key
from pitstop.core.policy import Policy
from pitstop.core.states import UNCLAIMABLE_STATES, RunState, State
from pitstop.core.timeline import durations
from pitstop.services.ingest import to_epoch
from pitstop.services.launch import Launcher, Publisher, Starter

CHECKPOINT_MARGIN_S = 300.0
CHECKPOINT_DEFAULT_WAIT_S = 600.0


_OP_VALUES = frozenset(o.value for o in Op)


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
    ) -> None:
        self.policy, self.store, self.compute, self.schedulers = policy, store, compute, schedulers
        self.notifier, self.clock = notifier, clock
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
            return {"error": exc.message, "retryable": exc.retryable}, exc.status
        except (gexc.GoogleAPICallError, gexc.RetryError, ValueError) as exc:
            # Firestore or Pub/Sub trouble on our side (an outage, a contended transaction): the
            # workflow retries 503 with backoff, and recorded steps make the retry safe.
            log.emit(
                "WARNING",
                "actuate: backing service unavailable, asking for a retry",
                op=op,
                incident=iid,
                step=step,
                error=str(exc)[:300],
            )
            return {"error": f"backing service unavailable: {str(exc)[:200]}", "retryable": True}, 503

    def _run(self, op: Op, iid: str, step: int, req: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        inc = self.store.get(iid)
        if inc is None:
            return {"error": f"no incident {iid}"}, 404
        if op in MUTATING_OPS:
            return self._once(op, inc, step, req.get("extra") or {}), 200
        if op == Op.CLAIM:
            return self._claim(inc, step, str(req.get("execution") or "")), 200
        result: dict[str, Any] = getattr(self, f"_{op}")(inc, step)  # a probe: asked again, answered fresh
        return result, 200

    def _once(self, op: Op, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Run an effect once per step: a retried call or a re-run execution gets the recorded result."""
        key = step_key(step, op)
        done = self.store.step_record(inc["id"], key)
        if done is not None:
            return {**done["result"], "replayed": True}
        if inc["step"] != step:  # a newer step owns the incident: this execution only winds down
            return {"outcome": "superseded", "current_step": inc["step"], "operation": None}
        result: dict[str, Any] = getattr(self, f"_{op}")(inc, step, extra)
        self.store.put_step_record(inc["id"], key, {"result": result, "at": self.clock()})
        return result

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

    def _label(self, inc: Mapping[str, Any], state: str | None) -> None:
        """Mark the VM's Pitstop state in labels (best effort: a label is a courtesy, not a control)."""
        p, z, i = self._node(inc)
        try:
            self.compute.set_labels(
                p, z, i, {"pitstop-state": state, "pitstop-incident": inc["id"] if state else None}
            )
        except ActuatorError as exc:
            log.emit("WARNING", "could not label instance", incident=inc["id"], error=exc.message)

    def _recorded(self, inc: Mapping[str, Any], step: int, op: Op) -> dict[str, Any]:
        """The result an earlier op of this step recorded (empty if it has not run)."""
        rec = self.store.step_record(inc["id"], step_key(step, op)) or {}
        return dict(rec.get("result") or {})

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
        return {"ours": ours, "why": why, "plan": plan_for(inc["action"]), "action": inc["action"]}

    def _fence(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        sched, node = self._scheduler(inc), inc["node"]["instance"]
        ctx = self._ctx(inc, step)
        jobs = sched.jobs_on(node, ctx)
        sched.fence(node, inc["id"], inc["action"], ctx)
        self._label(inc, "fenced")
        self._set_state(inc["id"], State.FENCED, "fenced", jobs=jobs)
        return {"fenced": node, "jobs": [j["id"] for j in jobs]}

    def _jobs(self, inc: Mapping[str, Any], step: int) -> list[str]:
        return list(self._recorded(inc, step, Op.FENCE).get("jobs", []))

    def _checkpoint(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
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

    def _act(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Take the incident's action on the VM; what it was before is kept for verify."""
        p, z, i = self._node(inc)
        before = self.compute.get(p, z, i)
        self._learn_block(inc, before)
        record: dict[str, Any] = {
            "operation": None,
            "method": "none",
            "before": {
                "id": before.get("id"),
                "host": (before.get("resource_status") or {}).get("physical_host"),
                "status": before.get("status"),
            },
        }
        record.update(self._compute_call(inc, before))
        self._set_state(inc["id"], State.ACTING, "acted")
        log.emit(
            "INFO",
            "remediation action taken",
            incident=inc["id"],
            node=i,
            action=inc["action"],
            method=record["method"],
            operation=record["operation"],
        )
        return record

    def _learn_block(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> None:
        """From now on this node also counts against its reservation block's budget."""
        topo = (before.get("resource_status") or {}).get("physical_host_topology") or {}
        if topo.get("block"):
            self.store.set_node_fields(
                inc["node_key"], {"block": f"{topo.get('cluster', '')}/{topo['block']}"}
            )

    def _compute_call(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
        """The Compute Engine call for the action: its method and the operation to wait for."""
        p, z, i = self._node(inc)
        action = inc["action"]
        if action in (Action.RESET_GPU, Action.REBOOT_NODE):
            return {"method": "reset", "operation": self.compute.reset(p, z, i)}
        if action == Action.REPLACE_NODE:
            return self._replace(inc, before)
        if action == Action.DRAIN_NODE:
            maint = (before.get("resource_status") or {}).get("upcoming_maintenance") or {}
            if maint.get("can_reschedule"):
                return {
                    "method": "performMaintenance",
                    "operation": self.compute.perform_maintenance(p, z, i),
                }
            return {"method": "wait_for_platform"}
        return {}

    def _replace(self, inc: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
        """Report the host faulty where Compute allows it (reservation-bound VMs), else recreate the VM."""
        p, z, i = self._node(inc)
        ok, why = self.compute.report_eligible(before)
        if ok:
            behavior = "UNRECOVERABLE_GPU_ERROR" if inc.get("xid") is not None else "PERFORMANCE"
            return {
                "method": "reportHostAsFaulty",
                "behavior": behavior,
                "operation": self.compute.report_host_as_faulty(p, z, i, behavior, self._evidence(inc)),
            }
        mig = self.compute.mig_of(before) or self._policy_mig(inc)
        if mig is None:
            raise ActuatorError(
                409, f"cannot replace {i}: {why}, and it is not in a managed instance group", False
            )
        return {
            "method": "recreateInstances",
            "mig": mig,
            "why_not_report": why,
            "operation": self.compute.recreate(p, z, mig, i),
        }

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
        return f"pitstop {inc['id']}: {counts} on GPU {gpus or 'n/a'}{'; ' + why if why else ''}"[:256]

    def _operation(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        act = self._recorded(inc, step, Op.ACT)
        if not act.get("operation"):
            return {"done": True}
        p, z, _ = self._node(inc)
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
        if inc["state"] != State.VERIFYING or (vm_ok and sched_ok):
            self._set_state(inc["id"], State.VERIFYING, "healthy" if vm_ok and sched_ok else None)
        return {"done": vm_ok and sched_ok, "vm": cur.get("status"), "scheduler_ok": sched_ok}

    def _unfence(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        self._scheduler(inc).unfence(inc["node"]["instance"], self._ctx(inc, step))
        self._label(inc, None)
        return {"unfenced": inc["node"]["instance"]}

    def _reschedule(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        now = self.clock()
        requeued, skipped = [], []
        for job in self._jobs(inc, step):
            state = sched.job_state(job, ctx)
            # After a checkpoint request a job exits on purpose: it must come back. Otherwise a job
            # that completed, was cancelled, or is already pending again is left alone.
            finished_ok = state == "COMPLETED" and plan_for(inc["action"]) == Plan.DRAIN
            if state in ("PENDING", "CANCELLED", "UNKNOWN") or (state == "COMPLETED" and not finished_ok):
                skipped.append({"job": job, "why": f"job is {state}"})
                continue
            key = f"{inc.get('cluster') or 'none'}-{job}"
            if not self.store.mark_job_requeue(
                key, inc["id"], now, self.policy.cooldown_s(Action.RESCHEDULE_JOB)
            ):
                skipped.append({"job": job, "why": "its gang was just requeued by another incident"})
                continue
            sched.requeue(job, ctx)
            requeued.append(job)
        self._set_state(inc["id"], None, "job_resumed")
        return {"requeued": requeued, "skipped": skipped}

    def _close(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        now = self.clock()
        fresh = self.store.get(inc["id"]) or dict(inc)
        escalate = fresh.get("escalate_to")
        if escalate and RANK[escalate] > RANK[fresh["action"]]:
            stepped = self._step_up(inc["id"], now)
            if stepped is not None:
                return stepped
        return self._resolve(inc["id"], now)

    def _resolve(self, iid: str, now: float) -> dict[str, Any]:
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
        self._notify(done, severity, self._summary(done), jobs=jobs)
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

    def _fail(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        stage = str(extra.get("stage", "?"))
        err = extra.get("error")
        message = err.get("message") if isinstance(err, dict) else str(err)
        body = err.get("body") if isinstance(err, dict) else None
        detail = body.get("error") if isinstance(body, dict) else None
        what = f"{stage} failed: {detail or message}"[:500]
        done = self._set_state(
            inc["id"], State.FAILED, None, failure={"stage": stage, "error": what, "at": self.clock()}
        )
        node = inc["node"]["instance"]
        todo = (
            f"{node} stays fenced (drained) with reason 'pitstop {inc['id']}'. Investigate ({what}); "
            f"when the "
            f"node is healthy, resume it in the scheduler and close the incident."
        )
        self._notify(done, "critical", f"Remediation of {node} FAILED at {stage}", todo=todo)
        return {"outcome": "failed", "stage": stage, "error": what}

    # -- notifications -----------------------------------------------------------------

    @staticmethod
    def _summary(inc: Mapping[str, Any]) -> str:
        node = inc["node"]["instance"]
        if inc["action"] in RECORD_ONLY_ACTIONS:
            return f"{node}: {inc['reason']} No node action taken."
        return f"{node}: {inc['action']} done; node healthy and back in service. {inc['reason']}"

    def _notify(self, inc: Mapping[str, Any], severity: str, summary: str, **extra: Any) -> None:
        if self.notifier is None:
            return
        self.notifier.publish(
            {
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
                    )
                },
                "durations_s": durations(inc),
                **extra,
            }
        )
