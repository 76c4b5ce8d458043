"""The running stack as the demo's scenarios see it, and what each scenario reports.

``Stage`` drives a local stack (Slurm or GKE) through the stand-ins' own doors: log entries in
through the sink's Router, faults through pitstop.local.inject, Slurm jobs through SlurmCluster,
JobSets through pitstop.local.gke_drive; incidents, Compute calls and notes out. The scenarios
themselves are data (schemas/demo-scenarios.yaml) run by tools/demo_runner.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pitstop.local import inject, realtime
from pitstop.local.compute_shapes import Call, LogResource
from pitstop.local.gke_drive import Gangs
from pitstop.local.gke_stack import ATTEMPT_LABEL, jobset_summary, node_summary, wait_for
from pitstop.local.slurm import SlurmCluster
from pitstop.local.stack import PROJECT, ZONE, Stack, WebhookRecord, admin, webhook_records

if TYPE_CHECKING:
    from pitstop.core.domain import Incident

T = TypeVar("T")
# A scenario's observations by name: its expectations and its line read them (schemas/demo-scenarios.yaml),
# so which names there are is the scenarios' data, not a shape of the code's.
Observations = dict[str, object]
# A LogEntry as Cloud Logging's JSON carries it: built here, published unread (the sink router's filters
# and ingest check it).
LogEntry = dict[str, object]


@dataclass
class Result:
    name: str
    passed: bool
    detail: str
    timeline: dict[str, float | None] = field(default_factory=dict)
    incident: str | None = None
    facts: Observations = field(default_factory=dict)  # what was observed, one by one
    resume_s: float | None = None  # detected -> the gang running again, real-time equivalent
    repair_s: float | None = None  # acted -> the node healthy (validated), real-time equivalent


def stamp() -> str:
    """Now, as Cloud Logging writes a LogEntry's timestamp (RFC 3339, microseconds, UTC)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int((now % 1) * 1e6):06d}Z"


class Stage(inject.Driver):
    """What every scenario needs of a running stack: entries in, incidents, calls and notes out."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        self.latencies: list[float] = []
        self._ids: dict[str, str] = {}
        self._ids_at = -1e9
        self.gangs = (
            Gangs(self.state.endpoints["kube"], self.wait) if "kube" in self.state.endpoints else None
        )

    @property
    def slurm(self) -> SlurmCluster:
        assert self.stack.slurm is not None, "a Slurm stack's scenario"
        return self.stack.slurm

    # -- what goes in --------------------------------------------------------------------------

    def entry(self, node: str, line: str, insert_id: str | None = None) -> LogEntry:
        """What Pitstop's Ops Agent config (infra/ops-agent/) ships: the kernel's own journal record,
        whose _TRANSPORT journald sets (verified evidence; text syslog would only be recorded)."""
        return {
            "insertId": insert_id or uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/pitstop-kernel",
            "timestamp": stamp(),
            "jsonPayload": {
                "MESSAGE": line,
                "_TRANSPORT": "kernel",
                "SYSLOG_FACILITY": "0",
                "_HOSTNAME": node,
            },
            "resource": self.vm_resource(node),
            "labels": {"compute.googleapis.com/resource_name": node},
        }

    def vm_resource(self, node: str) -> LogResource:
        labels = {"instance_id": self.vm_id(node), "project_id": PROJECT, "zone": ZONE}
        return {"type": "gce_instance", "labels": labels}

    def k8s_entry(self, node: str, line: str, location: str = ZONE) -> LogEntry:
        """A kernel line as GKE's node-journal log ships it: a k8s_node entry with the journal record
        (``_TRANSPORT=kernel``: verified); ``location`` is the cluster's (a region for a regional one)."""
        payload = {"MESSAGE": line, "_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3"}
        labels = {"project_id": PROJECT, "location": location, "cluster_name": self.state.cluster["name"]}
        return {
            "insertId": uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/node-journal",
            "timestamp": stamp(),
            "jsonPayload": {**payload, "_HOSTNAME": node},
            "resource": {"type": "k8s_node", "labels": {**labels, "node_name": node}},
        }

    def serial_entry(self, node: str, line: str) -> LogEntry:
        """A kernel line as GCE serial-port logging ships it (the GKE node's usual route): the console's
        text on a gce_instance entry, which anyone on the VM could have written (unverified)."""
        return {
            "insertId": uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
            "timestamp": stamp(),
            "textPayload": f"[ 7341.112233] {line}",
            "resource": self.vm_resource(node),
            "labels": {"compute.googleapis.com/resource_name": node},
        }

    def fault(self, node: str, line: str, insert_id: str | None = None) -> LogEntry:
        """A real driver fault on ``node``: the kernel prints it, the logging agent ships it."""
        inject.kernel_prints(self.state, node, line)
        entry = self.entry(node, line, insert_id)
        self.router.publish(entry)
        return entry

    def vm_id(self, node: str) -> str:
        """The live VM's numeric id, as the logging agent on it would report it (a recreate changes it)."""
        now = time.monotonic()
        if now - self._ids_at > 1.0:
            self._ids = {i["name"]: str(i["id"]) for i in admin(self.state, "/_admin/state")["instances"]}
            self._ids_at = now
        return self._ids[node]

    # -- what comes out ------------------------------------------------------------------------

    def node_incidents(self, node: str) -> list[Incident]:
        """The node's incidents, oldest first, with storm counts' shards summed."""
        from pitstop.adapters.firestore import IncidentStore

        docs = IncidentStore(self.db).query()
        return [d for d in docs if (n := d.get("node")) and n["instance"] == node]  # a hang's: no node

    def incidents(self, node: str) -> list[Incident]:
        """node_incidents, as the stand-ins' drivers take them (pitstop.local.inject.Drives)."""
        return self.node_incidents(node)

    def wait(self, cond: Callable[[], T | None], timeout: float, what: str) -> T:
        """``cond``'s first truthy answer, asked every half second."""
        try:
            found: T = wait_for(cond, timeout, what, every=0.5)
            return found
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}{self.state_on_timeout()}") from None

    def state_on_timeout(self) -> str:
        """What a timed-out wait adds to its error on a GKE stack: the JobSets, pods and nodes seen."""
        if self.gangs is None:
            return ""
        kube = self.gangs.kube
        try:
            listed = kube.pods()
            pods = [
                {
                    "pod": p["metadata"]["name"],
                    "node": p["spec"].get("nodeName"),
                    "phase": (p.get("status") or {}).get("phase"),
                    "attempt": p["metadata"].get("labels", {}).get(ATTEMPT_LABEL),
                    "deleting": bool(p["metadata"].get("deletionTimestamp")),
                }
                for p in listed
            ]
            jobsets = [jobset_summary(js, listed) for js in kube.jobsets()]
            seen = {"jobsets": jobsets, "pods": pods, "nodes": [node_summary(n) for n in kube.nodes()]}
        except (OSError, KeyError, ValueError) as exc:
            return f" (state unreadable: {exc})"
        return f"; seen: {json.dumps(seen, default=str)}"

    def finished(self, node: str, timeout: float = 90.0) -> Incident:
        def done() -> Incident | None:
            incs = self.node_incidents(node)
            return incs[-1] if incs and incs[-1]["state"] in ("RESOLVED", "FAILED") else None

        inc = self.wait(done, timeout, f"the incident on {node} to finish")
        tl = inc["timeline"]
        if tl.get("fenced"):
            self.latencies.append(tl["fenced"] - tl["detected"])
        return inc

    def calls(self, method: str, node: str) -> list[Call]:
        return [
            c
            for c in admin(self.state, "/_admin/state")["calls"]
            if c["method"] == method and f"/instances/{node}/" in c["path"]
        ]

    def notes_for(self, iid: str) -> list[WebhookRecord]:
        records = webhook_records(self.state)
        return [w for w in records if iid in w["body"]["text"]]

    def window_s(self) -> float:
        """The blast-radius budget's window (the stack's policy)."""
        return float(json.loads(Path(self.state.workdir, "policy.yaml").read_text())["budgets"]["window_s"])

    def settle(self) -> None:
        """Let the blast-radius window slide so scenarios do not spend each other's budget."""
        window = self.window_s()

        def clear() -> bool:
            now = time.time()
            return all(
                not any(
                    s.get("active") or now - s["at"] < window
                    for s in (d.to_dict() or {}).get("slots", {}).values()
                )
                for d in self.db.collection("pitstop_budgets").stream()
            )

        self.wait(clear, window + 120, "the blast-radius window to clear")

    # -- times ---------------------------------------------------------------------------------

    def timed(self, r: Result, inc: Incident) -> Result:
        """The scenario's result with its resume_s and repair_s (pitstop.local.realtime)."""
        effects = admin(self.state, "/_admin/state")["effects"]
        resume, repair = realtime.resume_and_repair(inc, effects, self.stack.compute_scale)
        if resume is not None:
            r.resume_s = resume
        r.repair_s = repair
        return r

    def with_times(self, r: Result) -> Result:
        """A scenario's result with resume_s and repair_s from its incident (as it is now)."""
        if r.incident is None or (r.resume_s is not None and r.repair_s is not None):
            return r
        from pitstop.adapters.firestore import IncidentStore

        inc = IncidentStore(self.db).get(r.incident)
        return self.timed(r, inc) if inc and inc.get("node") else r  # a hung job's: its scenario times it
