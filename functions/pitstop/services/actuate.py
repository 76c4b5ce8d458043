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
from pitstop.core.actions import RANK
from pitstop.core.policy import Policy
from pitstop.core.timeline import durations

MUTATING = ("fence", "checkpoint", "act", "unfence", "reschedule", "close", "fail")
PROBES = ("jobs_done", "operation", "verify")
CHECKPOINT_MARGIN_S = 300.0
CHECKPOINT_DEFAULT_WAIT_S = 600.0


def plan_for(action: str) -> str:
    if action in ("NONE", "RESTART_JOB"):
        return "notify_only"
    if action == "DRAIN_NODE":
        return "drain"
    return "remediate"


class Actuator:
    def __init__(
        self,
        policy: Policy,
        store: IncidentStore,
        compute: ComputeAdapter,
        schedulers: Mapping[str, Scheduler],
        notifier: Any | None,
        starter: Any | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy, self.store, self.compute, self.schedulers = policy, store, compute, schedulers
        self.notifier, self.starter, self.clock = notifier, starter, clock

    # -- entry -----------------------------------------------------------------------

    def handle(self, req: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        op, iid, step = req.get("op"), req.get("incident"), req.get("step")
        if op not in ("claim", *MUTATING, *PROBES) or not isinstance(iid, str) or not isinstance(step, int):
            return {"error": "request needs op (known), incident (string) and step (integer)"}, 400
        try:
            inc = self.store.get(iid)
            if inc is None:
                return {"error": f"no incident {iid}"}, 404
            if op in MUTATING:
                key = f"{step}-{op}"
                done = self.store.step_record(iid, key)
                if done is not None:
                    return {**done["result"], "replayed": True}, 200
                if inc["step"] != step:  # a newer step owns the incident: this execution only winds down
                    return {"outcome": "superseded", "current_step": inc["step"], "operation": None}, 200
                result = getattr(self, f"_{op}")(inc, step, req.get("extra") or {})
                self.store.put_step_record(iid, key, {"result": result, "at": self.clock()})
                return result, 200
            if op == "claim":
                return self._claim(inc, step, str(req.get("execution") or "")), 200
            result = getattr(self, f"_{op}")(inc, step)
            return result, 200
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
        self, iid: str, state: str | None, milestone: str | None = None, **fields: Any
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

    # -- operations ------------------------------------------------------------------

    def _claim(self, inc: Mapping[str, Any], step: int, execution: str) -> dict[str, Any]:
        def claim(doc: dict[str, Any]) -> tuple[bool, str]:
            if doc["step"] != step:
                return False, f"superseded by step {doc['step']}"
            if doc["state"] in ("RESOLVED", "FAILED", "HELD"):
                return False, f"incident is {doc['state']}"
            wf = doc.get("workflow") or {}
            owner = wf.get("claimed_by")
            if owner and execution and owner != execution:
                return False, "another execution owns this step"
            wf["claimed_by"] = execution or owner or "unknown"
            wf["state"] = "started"
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
        self._set_state(inc["id"], "FENCED", "fenced", jobs=jobs)
        return {"fenced": node, "jobs": [j["id"] for j in jobs]}

    def _jobs(self, inc: Mapping[str, Any], step: int) -> list[str]:
        rec = self.store.step_record(inc["id"], f"{step}-fence") or {}
        return list((rec.get("result") or {}).get("jobs", []))

    def _checkpoint(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        cluster = self.policy.cluster_for(inc["node"])
        signal = ((cluster.raw.get("slurm") or {}).get("checkpoint_signal") if cluster else None) or "SIGUSR1"
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        jobs = self._jobs(inc, step)
        for job in jobs:
            sched.checkpoint(job, signal, ctx)
        start = (inc.get("maintenance") or {}).get("window_start")
        from pitstop.services.ingest import to_epoch

        ws = to_epoch(start)
        wait = CHECKPOINT_DEFAULT_WAIT_S if ws is None else max(0.0, ws - self.clock() - CHECKPOINT_MARGIN_S)
        return {"signalled": jobs, "signal": signal, "wait_s": min(wait, CHECKPOINT_DEFAULT_WAIT_S)}

    def _jobs_done(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        sched, ctx = self._scheduler(inc), self._ctx(inc, step)
        running = [j for j in self._jobs(inc, step) if sched.job_running(j, ctx)]
        return {"done": not running, "running": running}

    def _act(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        p, z, i = self._node(inc)
        action = inc["action"]
        before = self.compute.get(p, z, i)
        topo = (before.get("resource_status") or {}).get("physical_host_topology") or {}
        if topo.get("block"):  # from now on this node also counts against its reservation block's budget
            self.store.set_node_fields(
                inc["node_key"], {"block": f"{topo.get('cluster', '')}/{topo['block']}"}
            )
        record: dict[str, Any] = {
            "operation": None,
            "method": "none",
            "before": {
                "id": before.get("id"),
                "host": (before.get("resource_status") or {}).get("physical_host"),
                "status": before.get("status"),
            },
        }
        if action in ("RESET_GPU", "REBOOT_NODE"):
            record.update(method="reset", operation=self.compute.reset(p, z, i))
        elif action == "REPLACE_NODE":
            ok, why = self.compute.report_eligible(before)
            if ok:
                behavior = "UNRECOVERABLE_GPU_ERROR" if inc.get("xid") is not None else "PERFORMANCE"
                record.update(
                    method="reportHostAsFaulty",
                    behavior=behavior,
                    operation=self.compute.report_host_as_faulty(p, z, i, behavior, self._evidence(inc)),
                )
            else:
                mig = self.compute.mig_of(before) or self._policy_mig(inc)
                if mig is None:
                    raise ActuatorError(
                        409, f"cannot replace {i}: {why}, and it is not in a managed instance group", False
                    )
                record.update(
                    method="recreateInstances",
                    mig=mig,
                    why_not_report=why,
                    operation=self.compute.recreate(p, z, mig, i),
                )
        elif action == "DRAIN_NODE":
            maint = (before.get("resource_status") or {}).get("upcoming_maintenance") or {}
            if maint.get("can_reschedule"):
                record.update(
                    method="performMaintenance", operation=self.compute.perform_maintenance(p, z, i)
                )
            else:
                record.update(method="wait_for_platform")
        self._set_state(inc["id"], "ACTING", "acted")
        log.emit(
            "INFO",
            "remediation action taken",
            incident=inc["id"],
            node=i,
            action=action,
            method=record["method"],
            operation=record["operation"],
        )
        return record

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
        rec = self.store.step_record(inc["id"], f"{step}-act") or {}
        act = rec.get("result") or {}
        if not act.get("operation"):
            return {"done": True}
        p, z, _ = self._node(inc)
        st = self.compute.operation(p, z, act["operation"])
        if st["error"]:
            raise ActuatorError(409, f"{act['method']} operation failed: {st['error']}", False)
        return {"done": st["done"]}

    def _verify(self, inc: Mapping[str, Any], step: int) -> dict[str, Any]:
        p, z, i = self._node(inc)
        act = (self.store.step_record(inc["id"], f"{step}-act") or {}).get("result") or {}
        before = act.get("before") or {}
        cur = self.compute.get(p, z, i)
        vm_ok = cur.get("status") == "RUNNING"
        host = (cur.get("resource_status") or {}).get("physical_host")
        if act.get("method") == "reportHostAsFaulty":
            vm_ok = vm_ok and host != before.get("host")  # back up on a healthy host
        elif act.get("method") == "recreateInstances":
            vm_ok = vm_ok and cur.get("id") != before.get("id")  # the replacement, not the old VM
        sched_ok = vm_ok and self._scheduler(inc).node_healthy(i, self._ctx(inc, step))
        if inc["state"] != "VERIFYING" or (vm_ok and sched_ok):
            self._set_state(inc["id"], "VERIFYING", "healthy" if vm_ok and sched_ok else None)
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
            finished_ok = state == "COMPLETED" and plan_for(inc["action"]) == "drain"
            if state in ("PENDING", "CANCELLED", "UNKNOWN") or (state == "COMPLETED" and not finished_ok):
                skipped.append({"job": job, "why": f"job is {state}"})
                continue
            key = f"{inc.get('cluster') or 'none'}-{job}"
            if not self.store.mark_job_requeue(key, inc["id"], now, self.policy.cooldown_s("RESCHEDULE_JOB")):
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
            return self._step_up(fresh, escalate, now)

        def resolve(doc: dict[str, Any]) -> dict[str, Any]:
            doc["state"] = "RESOLVED"
            doc["timeline"].setdefault("notified", now)
            doc["timeline"]["resolved"] = now
            doc["updated_at"] = now
            return doc

        done = self.store.mutate(inc["id"], resolve)
        self.store.release_budget(done)
        jobs = [j["id"] for j in done.get("jobs", [])] if isinstance(done.get("jobs"), list) else []
        self._notify(
            done,
            "info" if done["action"] in ("NONE", "RESTART_JOB") else "warning",
            self._summary(done),
            jobs=jobs,
        )
        return {"outcome": "resolved", "durations_s": durations(done)}

    def _step_up(self, inc: dict[str, Any], action: str, now: float) -> dict[str, Any]:
        """The fault got worse while it was being fixed: same incident, next step, stronger action."""

        def up(doc: dict[str, Any]) -> int:
            doc["escalations"].append(
                {
                    "from": doc["action"],
                    "to": action,
                    "at": now,
                    "why": ["a stronger fault arrived during remediation"],
                }
            )
            doc["action"], doc["escalate_to"], doc["state"] = action, None, "OPEN"
            doc["step"] += 1
            doc["workflow"] = {"step": doc["step"], "state": "pending", "lease_until": 0, "execution": None}
            return int(doc["step"])

        new_step = self.store.mutate(inc["id"], up)
        if self.starter is not None:
            from pitstop.services.ingest import workflow_argument

            lease = self.store.lease_start(inc["id"], new_step, now)
            if lease is not None:
                name = self.starter.start(inc["id"], new_step, workflow_argument(lease, new_step))
                self.store.record_started(inc["id"], new_step, name, now)
        return {"outcome": f"escalated to {action} (step {new_step})"}

    def _fail(self, inc: Mapping[str, Any], step: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        stage = str(extra.get("stage", "?"))
        err = extra.get("error")
        message = err.get("message") if isinstance(err, dict) else str(err)
        body = err.get("body") if isinstance(err, dict) else None
        detail = body.get("error") if isinstance(body, dict) else None
        what = f"{stage} failed: {detail or message}"[:500]
        done = self._set_state(
            inc["id"], "FAILED", None, failure={"stage": stage, "error": what, "at": self.clock()}
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
        if inc["action"] in ("NONE", "RESTART_JOB"):
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
