"""The pipeline actions the e2e tests drive on a running local stack (pitstop.local.stack).

The tests' own, beside the demo's (tools/demo_runner.py): a change to a demo scenario, or to how
the demo drives the stack, cannot break a test of the pipeline. Built from the stand-ins' own
moves (the sink's Router, the fake Compute's admin API through pitstop.local.inject, Slurm's
commands through SlurmCluster, JobSets through pitstop.local.gke_drive, the webhook's records)
and tests/helpers.py; every scenario and its checks are the tests' own.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pitstop.adapters.firestore import IncidentStore
from pitstop.core.domain import Incident
from pitstop.local import inject, realtime
from pitstop.local.gke_drive import Gangs
from pitstop.local.gke_stack import wait_for
from pitstop.local.stack import (
    PROJECT,
    ZONE,
    ClusterSpec,
    Stack,
    WebhookRecord,
    admin,
    webhook_records,
)

from .helpers import gce_resource, gke_journal_entry, journald_entry

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FINAL_STATES = ("RESOLVED", "FAILED")
LOGS = (
    "ingest",
    "actuate",
    "notify",
    "sweep",
    "executions",
    "slurm-agent",
    "monitoring",
    "kube",
    "prometheus",
)


def print_logs(stack: Stack, lines: int = 20) -> None:
    """The stack's log tails, so a failure in CI says what each process did."""
    for name in LOGS:
        log = stack.workdir / f"{name}.log"
        if log.exists():
            print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-lines:]))


@contextlib.contextmanager
def stack_up(prefix: str, spec: ClusterSpec, **options: Any) -> Iterator[Stack]:
    """A whole local stack in a fresh directory for one test module (``options``: Stack's own, e.g.
    compute_scale, policy_over), its log tails printed if bringing it up or a test fails, always
    brought down."""
    import tempfile

    stack = Stack(Path(tempfile.mkdtemp(prefix=f"pitstop-{prefix}-")), spec, **options)
    try:
        stack.up()
        yield stack
    except BaseException:
        print_logs(stack)
        raise
    finally:
        stack.down()


class StackPipeline(inject.Driver):
    """Log entries in (through the sink's filter and Pub/Sub); incidents, Compute calls and notes out."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        self._given: set[str] = set()

    def take(self, k: int = 1, spot: bool = False) -> list[str]:
        """``k`` nodes no other test of the module was given (a Spot VM only when asked for), so each
        test's incidents, fences, cooldowns and lemon history are its own whatever ran before it."""
        spots = set(self.state.cluster.get("spot") or [])
        free = [n for n in self.nodes if n not in self._given and (n in spots) == spot]
        if len(free) < k:
            kind = "Spot " if spot else ""
            raise RuntimeError(
                f"{len(free)} unused {kind}nodes left, the test wants {k}: grow the module's stack"
            )
        self._given.update(free[:k])
        return free[:k]

    def keep(self, nodes: list[str]) -> None:
        """Nodes the module shares between its tests on purpose (a healthy gang partner, a spare):
        never handed out by ``take``."""
        self._given.update(nodes)

    # -- what goes in -----------------------------------------------------------------------------

    def vm_id(self, node: str) -> str:
        """The live VM's numeric id, as the logging agent on it reports it (a recreate changes it)."""
        return str(inject.instance(self.state, node)["id"])

    @staticmethod
    def now_stamp() -> str:
        """Now, as Cloud Logging writes a LogEntry's timestamp (RFC 3339, microseconds, UTC)."""
        now = time.time()
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"

    def entry(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        """The kernel's journal record of ``line`` on ``node``, as the Ops Agent ships it, logged now."""
        vm = gce_resource(node, PROJECT, ZONE, self.vm_id(node))
        e = journald_entry(line, node, insert_id or uuid.uuid4().hex[:16], project=PROJECT, resource=vm)
        e["timestamp"] = e["receiveTimestamp"] = self.now_stamp()
        return e

    def kernel_prints(self, node: str, line: str, facility: int = 0) -> None:
        inject.kernel_prints(self.state, node, line, facility)

    def fault(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        """A real driver fault: the node's kernel prints it (its ring buffer keeps it until the VM
        boots again), the logging agent ships it."""
        self.kernel_prints(node, line)
        e = self.entry(node, line, insert_id)
        self.router.publish(e)
        return e

    def gpu_state(self, node: str, state: dict[str, Any] | None) -> None:
        """What the GPU tools (and the Monitoring stand-in) will report on the node's current host."""
        self.stack.set_gpu_state(node, state)

    # -- what comes out ---------------------------------------------------------------------------

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_for(cond, timeout, what)

    def incidents(self, node: str) -> list[Incident]:
        """The node's incidents, oldest first (a hung job's incident names no node), read through the
        store so that storm counts' per-instance shards are summed as Pitstop reads them."""
        docs = (d.to_dict() or {} for d in self.db.collection("pitstop_incidents").stream())
        ids = [d["id"] for d in docs if d and (d.get("node") or {}).get("instance") == node]
        store = IncidentStore(self.db)
        mine = [inc for inc in map(store.get, ids) if inc is not None]
        return sorted(mine, key=lambda d: d["created_at"])

    def counted(self, node: str, key: str) -> int:
        """How many lines of ``key`` (e.g. ``xid_13``) the node's incidents have counted: a storm is
        fully delivered once this reaches the number of distinct lines published."""
        return sum(int((inc.get("counts") or {}).get(key, 0)) for inc in self.incidents(node))

    def all_counted(self, node: str, key: str, lines: int, timeout: float = 60.0) -> None:
        """Wait until every distinct line of a storm was delivered and counted, so that what a test
        then asserts is absent (a second incident, a second action) had every chance to happen."""
        self.wait(lambda: self.counted(node, key) >= lines, timeout, f"{lines} {key} lines on {node} counted")

    def finished(self, node: str, timeout: float = 90.0) -> Incident:
        """The node's latest incident once it is resolved or failed."""

        def last_final() -> Incident | None:
            incs = self.incidents(node)
            return incs[-1] if incs and incs[-1]["state"] in FINAL_STATES else None

        found: Incident = self.wait(last_final, timeout, f"the incident on {node} to finish")
        return found

    def calls(self, method: str, node: str) -> list[dict[str, Any]]:
        """The fake Compute's recorded calls of ``method`` on the node's instance."""
        recorded = admin(self.state, "/_admin/state")["calls"]
        return [c for c in recorded if c["method"] == method and f"/instances/{node}/" in c["path"]]

    def notes_for(self, iid: str) -> list[WebhookRecord]:
        """What the webhook received about an incident."""
        return [w for w in webhook_records(self.state) if iid in w["body"]["text"]]

    def resume_and_repair(self, inc: Incident) -> tuple[float | None, float | None]:
        """(resume_s, repair_s) of a finished incident, real-time equivalent (pitstop.local.realtime)."""
        effects = admin(self.state, "/_admin/state")["effects"]
        return realtime.resume_and_repair(inc, effects, self.stack.compute_scale)

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


class Pipeline(StackPipeline):
    """A Slurm stack's pipeline: StackPipeline plus its jobs."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        assert stack.slurm is not None
        self.slurm = stack.slurm

    def job(self, nodes: list[str], script: str | None = None) -> str:
        """A requeueable gang pinned to ``nodes``, once it runs."""
        job = self.slurm.submit_on(nodes, script or "sleep 3600")

        def running() -> bool:
            return any(j["id"] == job and j["state"] == "RUNNING" for j in self.slurm.jobs())

        self.wait(running, 30, f"job {job} to run")
        return job

    def job_among(
        self, size: int, candidates: list[str], script: str = "sleep 3600"
    ) -> tuple[str, list[str]]:
        """A gang of ``size`` Slurm may place on any of ``candidates`` (a requeue may move it to
        another of them): the job and, once it runs, its nodes."""
        others = [n for n in self.nodes if n not in candidates]
        job = self.slurm.submit(size, command=script, exclude=others)
        held: list[str] = self.wait(lambda: self.slurm.job_nodes(job), 30, f"job {job} to run")
        return job, held

    def restarts(self, job: str) -> int:
        """How often Slurm restarted the job (-1: it does not know the job)."""
        return self.slurm.restarts(job)

    def drained(self, node: str) -> bool:
        return "drain" in self.slurm.node_states().get(node, "")


class GkePipeline(StackPipeline):
    """A GKE stack's pipeline: StackPipeline plus its JobSets (pitstop.local.gke_drive)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        assert "kube" in self.state.endpoints, "not a GKE stack"
        self.gangs = Gangs(self.state.endpoints["kube"], self.wait)
        self.kube = self.gangs.kube

    def k8s_entry(self, node: str, line: str, location: str = ZONE) -> dict[str, Any]:
        """A kernel line as GKE's node-journal log ships it, logged now; ``location`` is the
        cluster's (a region for a regional cluster)."""
        e = gke_journal_entry(line, node, uuid.uuid4().hex[:16])
        e["logName"] = f"projects/{PROJECT}/logs/node-journal"
        e["resource"]["labels"].update(
            project_id=PROJECT, location=location, cluster_name=self.state.cluster["name"]
        )
        e["timestamp"] = self.now_stamp()
        return e

    def serial_entry(self, node: str, line: str) -> dict[str, Any]:
        """A kernel line as GCE serial-port logging ships it: the console's text on a gce_instance
        entry, which anyone on the VM could have written (unverified)."""
        return {
            "insertId": uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
            "timestamp": self.now_stamp(),
            "textPayload": f"[ 7341.112233] {line}",
            "resource": gce_resource(node, PROJECT, ZONE, self.vm_id(node)),
            "labels": {"compute.googleapis.com/resource_name": node},
        }
