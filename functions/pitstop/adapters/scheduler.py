"""The scheduler side of a remediation, behind one interface (Slurm today; GKE can follow).

The workflow never knows which scheduler a cluster runs: actuate maps the incident's
cluster to an adapter with these operations. A GKE adapter would cordon (fence), evict
honouring PDBs (checkpoint), and restart the JobSet or Kueue workload (requeue).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from pitstop.adapters.errors import ActuatorError

COMMAND_DEADLINE_S = 300.0


class Scheduler(Protocol):
    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]: ...
    def fence(self, node: str, incident: str, action: str, ctx: str) -> None: ...
    def checkpoint(self, job: str, signal: str, ctx: str) -> None: ...
    def job_running(self, job: str, ctx: str) -> bool: ...
    def job_state(self, job: str, ctx: str) -> str: ...
    def node_healthy(self, node: str, ctx: str) -> bool: ...
    def unfence(self, node: str, ctx: str) -> None: ...
    def requeue(self, job: str, ctx: str) -> None: ...


class NoScheduler:
    """Nodes outside any scheduler: nothing to fence, no jobs, healthy when the VM is."""

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]:
        return []

    def fence(self, node: str, incident: str, action: str, ctx: str) -> None:
        return None

    def checkpoint(self, job: str, signal: str, ctx: str) -> None:
        return None

    def job_running(self, job: str, ctx: str) -> bool:
        return False

    def job_state(self, job: str, ctx: str) -> str:
        return "UNKNOWN"

    def node_healthy(self, node: str, ctx: str) -> bool:
        return True

    def unfence(self, node: str, ctx: str) -> None:
        return None

    def requeue(self, job: str, ctx: str) -> None:
        return None


class SlurmScheduler:
    """Commands to the cluster's pitstop-slurm-agent over Pub/Sub; results read back from Firestore.

    Command ids are deterministic per (context, operation, arguments), so a retried actuate
    call waits for the same command instead of sending another; read-only probes add a
    time bucket so each poll sees fresh state.
    """

    def __init__(
        self,
        publisher: Any,
        topic: str,
        results: Any,
        wait_s: float = 20.0,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.publisher, self.topic, self.results = publisher, topic, results
        self.wait_s, self.clock, self.sleep = wait_s, clock, sleep

    def _call(self, op: str, args: dict[str, Any], ctx: str, fresh: bool = False) -> Any:
        digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:8]
        cid = f"{ctx}-{op}-{digest}".lower().replace("_", "-")
        if fresh:
            cid += f"-{int(self.clock() // 2)}"
        ref = self.results.document(cid)
        snap = ref.get()
        if not snap.exists:
            now = self.clock()
            cmd = {"id": cid, "op": op, "args": args, "issued_at": now, "deadline": now + COMMAND_DEADLINE_S}
            self.publisher.publish(self.topic, json.dumps(cmd).encode(), op=op).result(timeout=30)
            deadline = self.clock() + self.wait_s
            while not snap.exists and self.clock() < deadline:
                self.sleep(0.2)
                snap = ref.get()
            if not snap.exists:
                raise ActuatorError(503, f"slurm agent has not answered {op} yet", True)
        res = snap.to_dict() or {}
        if not res.get("ok"):
            raise ActuatorError(
                409 if res.get("refused") else 502, f"slurm {op}: {res.get('error')}", not res.get("refused")
            )
        return res.get("result")

    def jobs_on(self, node: str, ctx: str) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self._call("jobs_on_node", {"node": node}, ctx)
        return jobs

    def fence(self, node: str, incident: str, action: str, ctx: str) -> None:
        self._call("drain", {"node": node, "incident": incident, "action": action}, ctx)

    def checkpoint(self, job: str, signal: str, ctx: str) -> None:
        self._call("signal", {"job": job, "signal": signal}, ctx)

    def job_state(self, job: str, ctx: str) -> str:
        return str(self._call("job_state", {"job": job}, ctx, fresh=True)["state"])

    def job_running(self, job: str, ctx: str) -> bool:
        return self.job_state(job, ctx) in ("RUNNING", "COMPLETING", "SUSPENDED")

    def node_healthy(self, node: str, ctx: str) -> bool:
        state = str(self._call("node_state", {"node": node}, ctx, fresh=True)["state"])
        # "*" marks a node whose slurmd does not respond (e.g. IDLE*+DRAIN).
        return "*" not in state and not any(b in state for b in ("DOWN", "NOT_RESPONDING", "FAIL", "UNKNOWN"))

    def unfence(self, node: str, ctx: str) -> None:
        self._call("resume", {"node": node}, ctx)

    def requeue(self, job: str, ctx: str) -> None:
        self._call("requeue", {"job": job}, ctx)
