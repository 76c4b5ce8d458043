"""The pipeline actions the e2e tests drive on a running local Slurm stack (pitstop.local.stack).

The tests' own, beside the demo's (tools/demo.py): a change to a demo scenario, or to how the demo
drives the stack, cannot break a test of the pipeline. Built from the stand-ins' own pieces (the
sink's Router, the fake Compute's admin API, the webhook's records) and tests/helpers.py.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.cloud import firestore

from pitstop.local.gke_stack import wait_for
from pitstop.local.stack import PROJECT, ZONE, Router, Stack, admin, emulator_env, webhook_records

from .helpers import gce_resource, journald_entry

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FINAL_STATES = ("RESOLVED", "FAILED")


class Pipeline:
    """Log entries in (through the sink's filter and Pub/Sub); incidents, Compute calls, Slurm jobs
    and notes out."""

    def __init__(self, stack: Stack) -> None:
        assert stack.state is not None and stack.slurm is not None
        self.stack, self.state, self.slurm = stack, stack.state, stack.slurm
        self.router = Router(self.state)
        with emulator_env(self.state.endpoints):
            self.db = firestore.Client(project=PROJECT)
        self.nodes: list[str] = self.state.cluster["node_names"]

    # -- what goes in -----------------------------------------------------------------------------

    def vm_id(self, node: str) -> str:
        """The live VM's numeric id, as the logging agent on it reports it (a recreate changes it)."""
        live = admin(self.state, "/_admin/state")["instances"]
        return next(str(i["id"]) for i in live if i["name"] == node)

    def entry(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        """The kernel's journal record of ``line`` on ``node``, as the Ops Agent ships it, logged now."""
        vm = gce_resource(node, PROJECT, ZONE, self.vm_id(node))
        e = journald_entry(line, node, insert_id or uuid.uuid4().hex[:16], project=PROJECT, resource=vm)
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        e["timestamp"] = e["receiveTimestamp"] = stamp
        return e

    def fault(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        """A real driver fault: the node's kernel prints it (its ring buffer keeps it until the VM
        boots again), the logging agent ships it."""
        printed = {"project": PROJECT, "zone": ZONE, "instance": node, "msg": line, "facility": 0}
        admin(self.state, "/_admin/kmsg", printed)
        e = self.entry(node, line, insert_id)
        self.router.publish(e)
        return e

    # -- what comes out ---------------------------------------------------------------------------

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(cond, timeout, what)

    def incidents(self, node: str) -> list[dict[str, Any]]:
        """The node's incidents, oldest first."""
        docs = (d.to_dict() or {} for d in self.db.collection("pitstop_incidents").stream())
        return sorted((d for d in docs if d and d["node"]["instance"] == node), key=lambda d: d["created_at"])

    def finished(self, node: str, timeout: float = 90.0) -> dict[str, Any]:
        """The node's latest incident once it is resolved or failed."""

        def last_final() -> dict[str, Any] | None:
            incs = self.incidents(node)
            return incs[-1] if incs and incs[-1]["state"] in FINAL_STATES else None

        found: dict[str, Any] = self.wait(last_final, timeout, f"the incident on {node} to finish")
        return found

    def calls(self, method: str, node: str) -> list[dict[str, Any]]:
        """The fake Compute's recorded calls of ``method`` on the node's instance."""
        recorded = admin(self.state, "/_admin/state")["calls"]
        return [c for c in recorded if c["method"] == method and f"/instances/{node}/" in c["path"]]

    def notes_for(self, iid: str) -> list[dict[str, Any]]:
        """What the webhook received about an incident."""
        return [w for w in webhook_records(self.state) if iid in w["body"]["text"]]

    def settle(self) -> None:
        """Wait until no blast-radius slot is held or recent, so one test does not spend the next
        one's budget."""
        policy = json.loads(Path(self.state.workdir, "policy.yaml").read_text())
        window = float(policy["budgets"]["window_s"])

        def held(slot: dict[str, Any]) -> bool:
            return bool(slot.get("active")) or time.time() - float(slot["at"]) < window

        def free() -> bool:
            budgets = (d.to_dict() or {} for d in self.db.collection("pitstop_budgets").stream())
            return not any(held(s) for b in budgets for s in b.get("slots", {}).values())

        self.wait(free, window + 120, "the blast-radius window to clear")

    # -- Slurm ------------------------------------------------------------------------------------

    def _slurm(self, *argv: str, check: bool = False) -> str:
        done = subprocess.run(
            list(argv),
            env=self.slurm.env,
            capture_output=True,
            text=True,
            check=check,
            cwd=self.slurm.workdir,
        )
        return done.stdout.strip()

    def job(self, nodes: list[str], script: str | None = None) -> str:
        """A requeueable gang pinned to ``nodes``, once it runs."""
        pinned = ["-w", ",".join(nodes), "-N", str(len(nodes))]
        head = ["sbatch", "--parsable", "--requeue", "-J", "train", "-o", "/dev/null", *pinned]
        job = self._slurm(*head, "--wrap", script or "sleep 3600", check=True)

        def running() -> bool:
            return any(j["id"] == job and j["state"] == "RUNNING" for j in self.slurm.jobs())

        self.wait(running, 30, f"job {job} to run")
        return job

    def restarts(self, job: str) -> int:
        """How often Slurm restarted the job (-1: it does not know the job)."""
        fields = self._slurm("scontrol", "show", "job", "-o", job).split()
        return next((int(t.split("=", 1)[1]) for t in fields if t.startswith("Restarts=")), -1)
