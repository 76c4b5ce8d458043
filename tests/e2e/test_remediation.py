"""The remediation workflow end to end: runner + actuate (functions-framework) + fake Compute + real Slurm.

One test per action and per failure path of issue 4. Time is scaled: the fake Compute's
operations take ~1 % of their real duration and the workflow's sleeps ~20 %.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import json
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from google.api_core import exceptions as gexc
from google.cloud import firestore
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient
from werkzeug.serving import make_server

from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.pubsub import Notifier
from pitstop.adapters.step_records import FirestoreStepStore
from pitstop.agent.slurm import Agent, CheckTools, Ledger, ResultsTopic, SlurmCommands
from pitstop.core import engine, policy
from pitstop.core.answers import WorkflowArgument
from pitstop.core.domain import Remediation
from pitstop.core.ops import Op
from pitstop.local import executions_server, gpu_tools
from pitstop.local.compute_shapes import Call
from pitstop.local.fake_compute import FakeCompute, serve
from pitstop.local.slurm import SlurmCluster
from pitstop.local.workflows_runner import runner_for
from pitstop.services.actuate import Actuator, registry
from pitstop.services.actuate.context import Step
from pitstop.services.ingest import Ingest
from pitstop.services.launch import workflow_argument
from tests.helpers import PROJECT, hand_edit, ops_agent_entry

ROOT = Path(__file__).resolve().parents[2]
NODES = [f"a3-node-{i:03d}" for i in range(4)]
ZONE = "us-central1-a"
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:1b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU"
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitstop-slurm-")), NODES).start()
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()


def _stand_in_tools(directory: Path) -> CheckTools:
    """Checks run the GPU stand-ins (real output formats; every GPU healthy here)."""

    def tool(name: str) -> tuple[str, ...]:
        return (sys.executable, "-m", f"pitstop.local.gpu_tools.{name}")

    return CheckTools(
        nvidia_smi=tool("nvidia_smi"),
        dcgmi=tool("dcgmi"),
        dmesg=tool("dmesg"),
        clock=tool("clock"),
        all_gather_perf=tool("all_gather_perf"),
        directory=str(directory),
        fabric_root=str(Path(gpu_tools.__file__).parent / "fabric"),  # the fabric's NCCL profiles, stand-ins
    )


class World:
    """Everything one scenario needs, on a project of its own."""

    def __init__(self, slurm: SlurmCluster, tmp: Path, **policy_over: Any) -> None:
        self.project = f"rem-{uuid.uuid4().hex[:8]}"
        self.slurm = slurm
        # what the GPU tools report per host (set_gpu_state); the checks' stand-ins read this file
        self.gpu_state = tmp / f"{self.project}-gpu-state.json"
        self.compute = FakeCompute(time_scale=0.01, gpu_state_path=self.gpu_state)
        for n in NODES[:3]:  # the fault entries name helpers.PROJECT; documents live in self.project
            self.compute.add_instance(PROJECT, ZONE, n, mig="a3-node")
        # the last node is a Spot VM: not eligible for reportHostAsFaulty
        self.compute.add_instance(
            PROJECT, ZONE, NODES[3], machine_type="a3-highgpu-8g", provisioning="SPOT", mig="a3-node"
        )
        self.compute_srv, compute_ep = serve(self.compute)
        pol_doc: dict[str, Any] = {
            "mode": "enforce",
            "clusters": [
                {
                    "name": "train",
                    "scheduler": "slurm",
                    "size": 8,
                    "match": {"name_pattern": "a3-*"},
                    "slurm": {"checkpoint_signal": "SIGUSR1"},
                }
            ],
            "budgets": {
                "cluster": {"max_nodes": 8, "max_percent": 100},
                "zone": {"max_nodes": 8, "max_percent": 100},
            },
            "cooldowns": {"RESCHEDULE_JOB": 0},
        }
        pol_doc.update(policy_over)
        self.policy_file = tmp / f"{self.project}.yaml"
        self.policy_file.write_text(json.dumps(pol_doc))
        self.policy = policy.load(self.policy_file)
        pub, self.sub = PublisherClient(), SubscriberClient()
        self._wire_pubsub(pub)
        self.db = firestore.Client(project=self.project)
        self.agent = Agent(
            SlurmCommands(release_requeued=True, checks=_stand_in_tools(tmp / f"{self.project}-checks")),
            Ledger(tmp / f"{self.project}-ledger.sqlite"),
            ResultsTopic(pub.topic_path(self.project, "pitstop-slurm-train-results")),
        )
        self.stop = threading.Event()
        threading.Thread(
            target=self.agent.serve,
            args=(self.sub.subscription_path(self.project, "agent"), self.stop),
            daemon=True,
        ).start()
        # actuate under functions-framework, over real HTTP; the runner calls it
        from functions_framework import create_app

        app = create_app("actuate", str(ROOT / "functions" / "main.py"), "http")  # type: ignore[no-untyped-call]
        served = sys.modules["main"]  # the module functions-framework loaded: its actuator serves HTTP
        self.http = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{self.http.server_port}/"
        self.executions = executions_server.ExecutionsService(
            runner_for(
                str(ROOT / "workflows" / "remediate.yaml"),
                {
                    "PITSTOP_ACTUATE_URL": url,
                    "PITSTOP_POLL_S": "2",
                    "PITSTOP_OP_TIMEOUT_S": "120",
                    "PITSTOP_VERIFY_TIMEOUT_S": "40",
                    "PITSTOP_CHECK_TIMEOUT_S": "600",
                    "PITSTOP_RESUME_WAIT_S": "100",
                },
                time_scale=0.1,
            )
        )
        self.grpc, port = executions_server.serve(self.executions)
        os.environ.update(
            {
                "GOOGLE_CLOUD_PROJECT": self.project,
                "PITSTOP_POLICY": str(self.policy_file),
                "PITSTOP_COMPUTE_ENDPOINT": compute_ep,
                "PITSTOP_WORKFLOWS_ENDPOINT": f"127.0.0.1:{port}",
                "PITSTOP_GPU_STATE": str(self.gpu_state),
            }
        )
        served._actuator.cache_clear()
        self.actuator: Actuator = served._actuator()  # the very instance actuate's HTTP requests reach
        self.store = IncidentStore(self.db)
        self.ingest = Ingest(
            self.policy,
            self.store,
            self.actuator.starter,  # the same Workflows client
            Notifier(self.project, "pitstop-notifications"),
        )
        self.n = 0

    def _wire_pubsub(self, pub: PublisherClient) -> None:
        """The topics and pull subscriptions deploy creates for cluster train, and the notes tap."""
        for t in ("pitstop-notifications", "pitstop-slurm-train", "pitstop-slurm-train-results"):
            pub.create_topic(name=pub.topic_path(self.project, t))
        # the agent answers on its results topic; actuate pulls this subscription into Firestore
        self.sub.create_subscription(
            request={
                "name": self.sub.subscription_path(self.project, "pitstop-slurm-train-results-actuate"),
                "topic": pub.topic_path(self.project, "pitstop-slurm-train-results"),
                "enable_message_ordering": True,
            }
        )
        for name, topic in (("agent", "pitstop-slurm-train"), ("notes", "pitstop-notifications")):
            self.sub.create_subscription(
                name=self.sub.subscription_path(self.project, name), topic=pub.topic_path(self.project, topic)
            )

    def fault(self, line: str, node: str) -> engine.Outcome:
        """A real fault: the node's kernel prints the line (corroboration reads it), then it is logged."""
        self.n += 1
        self.compute.kernel_line(PROJECT, ZONE, node, line, 0)
        return self.ingest.handle_payload(
            ops_agent_entry(line, instance=node, insert_id=f"{self.project}-{self.n}")
        )

    def event(self, entry: object) -> engine.Outcome:
        return self.ingest.handle_payload(entry)

    def wait(self, iid: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            inc: Any = (
                self.store.get(iid) if self.executions.records and self.executions.wait_all(0.2) else None
            )
            if (
                inc is not None
                and (
                    inc["state"] in ("RESOLVED", "FAILED")
                    or (inc["state"] == "OPEN" and inc["workflow"]["state"] == "pending")
                )
                and self.executions.wait_all(0.1)
            ):
                return cast(dict[str, Any], inc)  # what the tests read, as a plain document
            time.sleep(0.2)
        execs = [
            (r.execution.state, r.execution.result, r.execution.error.payload)
            for r in self.executions.records.values()
        ]
        raise TimeoutError(f"{iid}: executions {execs}; incident {self.store.get(iid)}")

    def notes(self) -> list[dict[str, Any]]:
        resp = self.sub.pull(
            subscription=self.sub.subscription_path(self.project, "notes"), max_messages=50, timeout=10
        )
        if resp.received_messages:
            self.sub.acknowledge(
                subscription=self.sub.subscription_path(self.project, "notes"),
                ack_ids=[m.ack_id for m in resp.received_messages],
            )
        return [json.loads(m.message.data) for m in resp.received_messages]

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.compute.calls if c["method"] == method]

    def close(self) -> None:
        self.stop.set()
        self.http.shutdown()
        self.grpc.stop(0)
        self.compute_srv.shutdown()
        for n in NODES:  # leave Slurm as found
            self.slurm._out(["scontrol", "update", f"NodeName={n}", "State=RESUME"])
        self.slurm._out(["scancel", "--full", "-u", "root"])


@pytest.fixture
def world(firestore_host: str, pubsub_host: str, slurm: SlurmCluster, tmp_path: Path) -> Iterator[World]:
    w = World(slurm, tmp_path)
    try:
        yield w
    finally:
        w.close()


def _job_on(slurm: SlurmCluster, nodes: int = 2) -> str:
    job = slurm.submit(nodes, name="train-gang")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any(j["id"] == job and j["state"] == "RUNNING" for j in slurm.jobs()):
            return job
        time.sleep(0.3)
    raise TimeoutError(f"job {job} did not start: {slurm.jobs()}")


def test_reboot_node_requeues_the_gang_once(world: World) -> None:
    job = _job_on(world.slurm)
    node = next(j for j in world.slurm.jobs() if j["id"] == job)["nodes"]
    target = "a3-node-000" if "000" in node else NODES[0]
    out = world.fault(XID79, target)
    assert out.result == "opened"
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len(world.calls("reset")) == 1
    tl = inc["timeline"]
    assert (
        tl["detected"] <= tl["classified"] <= tl["fenced"] <= tl["acted"] <= tl["healthy"] <= tl["resolved"]
    )
    assert "job_requeued" in tl
    steps = {
        d.id: d.to_dict()
        for d in world.db.collection("pitstop_incidents").document(inc["id"]).collection("steps").stream()
    }
    # idle nodes to spare: the gang moved right after the fence, once; the late reschedule finds it moved on
    assert [r["job"] for r in steps["1-reschedule_early"]["result"]["requeued"]] == [job]
    assert steps["1-reschedule"]["result"]["requeued"] == []
    assert tl["fenced"] <= tl["job_requeued"] <= tl["acted"]
    assert tl["job_running"] >= tl["job_requeued"]
    assert inc["validation"]["passed"] is True
    assert "drain" not in world.slurm.node_states()[target]  # resumed
    notes = world.notes()
    assert any(n["kind"] == "incident" and n["incident"]["state"] == "RESOLVED" for n in notes)


def test_reset_gpu_for_xid48(world: World) -> None:
    out = world.fault(XID48, "a3-node-001")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED" and inc["action"] == "RESET_GPU"
    assert len(world.calls("reset")) == 1
    node = world.store.records.node(inc["node_key"])
    assert node is not None and node["block"] == "c1/block-1"  # learned from Compute: block budgets apply now


def test_fault_worsening_during_remediation_steps_up(world: World) -> None:
    # the first step is decided in observe mode, so no execution runs it and the test controls the order
    world.compute.kernel_line(PROJECT, ZONE, "a3-node-002", XID48, 0)
    out = world.ingest.store.apply(
        {
            **world.ingest.classifier.classify(
                ops_agent_entry(XID48, instance="a3-node-002", insert_id="w1")
            ),
            "_observed_ts": time.time(),
        },
        policy.from_doc({**world.policy.doc, "mode": "observe"}),
        time.time(),
    )
    assert out.incident is not None and out.incident["action"] == "RESET_GPU"
    iid = out.incident["id"]
    hand_edit(world.store, iid, lambda d: d.update({"escalate_to": "REBOOT_NODE", "state": "VERIFYING"}))
    body, status = world.actuator.handle({"op": "close", "incident": iid, "step": 1})
    assert status == 200 and body["outcome"] == "escalated to REBOOT_NODE (step 2)"
    inc = world.wait(iid)
    assert inc["state"] == "RESOLVED" and inc["action"] == "REBOOT_NODE" and inc["step"] == 2
    assert len(world.calls("reset")) == 1
    assert inc["escalations"][-1]["why"] == ["a stronger fault arrived during remediation"]


def test_lemon_host_is_reported_faulty(world: World) -> None:
    key = engine.node_key({"project": PROJECT, "zone": ZONE, "instance": "a3-node-002", "instance_id": None})
    now = time.time()
    world.store.records.put_node(
        key,
        {
            **engine.new_node(
                {"project": PROJECT, "zone": ZONE, "instance": "a3-node-002", "instance_id": None}
            ),
            "remediations": cast(  # records of an older shape: no ``mode``
                list[Remediation],
                [{"at": now - d * 86400, "action": "RESET_GPU", "incident": f"o{d}"} for d in (1, 2, 5)],
            ),
        },
    )
    # the diagnostic on the fenced node finds a row-remap failure on GPU 1: the replacement is confirmed
    world.compute.set_gpu_state(PROJECT, ZONE, "a3-node-002", {"remap": "failure", "remap_gpu": 1})
    out = world.fault(XID48, "a3-node-002")
    assert out.incident is not None and out.incident["action"] == "REPLACE_NODE"
    inc = world.wait(out.incident["id"])
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert inc["diagnosis"]["confirmed"] is True and inc["validation"]["passed"] is True  # on the new host
    reports = world.calls("report_host_as_faulty")
    assert len(reports) == 1
    assert "diagnostic confirms" in reports[0]["body"]["faultReasons"][0]["description"]
    body = reports[0]["body"]
    assert body["disruptionSchedule"] == "IMMEDIATE"
    assert body["faultReasons"][0]["behavior"] == "UNRECOVERABLE_GPU_ERROR"
    assert (
        "Xid 48" in body["faultReasons"][0]["description"]
        and "lemon" in body["faultReasons"][0]["description"]
    )


def test_a_gpu_still_lost_after_the_reboot_is_diagnosed_and_replaced(world: World) -> None:
    """Issue 35, the other way: Xid 79 and the GPU does not come back after the reboot (the commonest
    hard failure). The validation's own GPU count speaks before the all_gather (which has no rows to
    judge on 7 GPUs): a hardware finding, so the node steps up to REPLACE_NODE, the diagnostic
    confirms it, and the host is reported faulty; it no longer ends FAILED with the node neither
    diagnosed nor replaced."""
    node = NODES[1]
    world.compute.set_gpu_state(PROJECT, ZONE, node, {"gpus": 7})  # on this host: a reboot keeps it lost
    out = world.fault(XID79, node)
    assert out.incident is not None and out.incident["action"] == "REBOOT_NODE"
    inc = world.wait(out.incident["id"], timeout=180)
    assert inc["state"] == "RESOLVED", (inc.get("failure"), inc.get("validation"))
    assert inc["action"] == "REPLACE_NODE" and inc["step"] == 2, inc["escalations"]
    first = next(m for m in inc["measured"] if m["kind"] == "validate")
    assert first["verdict"] == "gpus_missing" and first["next"] == "REPLACE_NODE", first
    assert first["evidence"]["probe"] == "validation" and "7 of 8 GPUs" in first["evidence"]["what"]
    assert inc["diagnosis"]["confirmed"] is True and "7 of 8 GPUs visible" in inc["diagnosis"]["why"]
    assert len(world.calls("reset")) == 1  # the reboot, once
    reports = world.calls("report_host_as_faulty")
    assert len(reports) == 1 and "7 of 8 GPUs" in reports[0]["body"]["faultReasons"][0]["description"]
    assert inc["validation"]["passed"] is True  # measured again on the new host


def test_replace_falls_back_to_mig_recreate_when_not_reservation_bound(world: World) -> None:
    clf_over = policy.from_doc(
        {
            "mode": "enforce",
            "xid_overrides": {"79": "REPLACE_NODE"},
            "clusters": world.policy.doc["clusters"],
            "budgets": world.policy.doc["budgets"],
        }
    )
    world.ingest.policy = clf_over
    world.ingest.coalescer.policy = clf_over
    from pitstop.core.classify import Classifier

    world.ingest.classifier = Classifier(clf_over.xids, world.ingest.classifier.system_events)
    world.compute.set_gpu_state(PROJECT, ZONE, NODES[3], {"gpus": 7})  # the diagnostic sees a GPU gone
    out = world.fault(XID79, NODES[3])
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert world.calls("report_host_as_faulty") == []
    assert len(world.calls("recreate")) == 1
    act = world.store.steps(inc["id"]).read("1-act")
    assert act is not None and act.record["result"]["method"] == "recreateInstances"
    assert "reservation-bound" in act.record["result"]["why_not_report"]


def test_maintenance_checkpoints_then_drains_and_performs_maintenance(world: World) -> None:
    job = _job_on(world.slurm, 1)
    node = next(j for j in world.slurm.jobs() if j["id"] == job)["nodes"]
    entry = world.compute.schedule_maintenance(PROJECT, ZONE, node, starts_in_s=310)
    out = world.event(entry)
    assert out.incident is not None and out.incident["action"] == "DRAIN_NODE"
    inc = world.wait(out.incident["id"], timeout=120)
    assert inc["state"] == "RESOLVED", inc.get("failure")
    got = world.store.steps(inc["id"]).read("1-checkpoint")
    ck = got.record if got is not None else {}
    assert ck["result"]["signalled"] == [job] and ck["result"]["signal"] == "SIGUSR1"
    assert len(world.calls("perform_maintenance")) == 1


def test_restart_job_only_notifies(world: World) -> None:
    out = world.fault(XID13, "a3-node-003")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED" and inc["action"] == "RESTART_JOB"
    assert world.compute.calls == []
    assert "fenced" not in inc["timeline"]
    assert world.slurm.node_states()["a3-node-003"].startswith("idle")


def test_transient_503_is_retried(world: World) -> None:
    world.compute.inject("reset", 503, "backendError", count=2)
    out = world.fault(XID79, "a3-node-001")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len(world.calls("reset")) == 3  # two refused, one taken; the node was reset once


def test_rate_limit_is_backed_off(world: World) -> None:
    world.compute.inject("reset", 403, "rateLimitExceeded", count=1)
    out = world.fault(XID79, "a3-node-001")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len(world.calls("reset")) == 2


def test_permission_denied_fails_and_node_stays_fenced(world: World) -> None:
    world.compute.inject("reset", 403, "forbidden", count=1)
    out = world.fault(XID79, "a3-node-002")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "FAILED"
    assert inc["failure"]["stage"] == "act" and "403" in inc["failure"]["error"]
    assert len(world.calls("reset")) == 1
    assert "drain" in world.slurm.node_states()["a3-node-002"]
    assert any(n["severity"] == "critical" and "stays fenced" in n.get("todo", "") for n in world.notes())


def test_node_never_healthy_fails_after_timeout(world: World) -> None:
    # the node's slurmd does not come back after the reboot, so slurmctld keeps it DOWN
    world.slurm.stop_node("a3-node-001")
    try:
        world.slurm._out(["scontrol", "update", "NodeName=a3-node-001", "State=DOWN", "Reason=no-slurmd"])
        out = world.fault(XID79, "a3-node-001")
        inc = world.wait(out.incident["id"], timeout=120)  # type: ignore[index]
        assert inc["state"] == "FAILED" and inc["failure"]["stage"] == "verify", inc.get("failure")
        assert "gave up waiting for verify" in inc["failure"]["error"]
        assert len(world.calls("reset")) == 1
        assert "drain" in world.slurm.node_states()["a3-node-001"]  # never returned to service
    finally:
        world.slurm.start_node("a3-node-001")
        world.slurm._out(["scontrol", "update", "NodeName=a3-node-001", "State=RESUME"])
        world.slurm.wait_idle(len(NODES))


def test_duplicate_execution_does_not_reset_twice(world: World) -> None:
    out = world.fault(XID79, "a3-node-000")
    assert out.incident is not None
    iid = out.incident["id"]
    # a second execution of the same step (e.g. a re-run by hand)
    assert world.actuator.starter is not None
    world.actuator.starter.start(iid, 1, workflow_argument(out.incident, 1))
    inc = world.wait(iid)
    assert inc["state"] == "RESOLVED"
    assert len(world.calls("reset")) == 1
    results = [
        json.loads(r.execution.result) for r in world.executions.records.values() if r.execution.result
    ]
    assert sorted(r["outcome"] for r in results) == ["resolved", "stale"]


# -- exactly once, never stuck (issue "Exactly once, never stuck") -------------------------------


class DropFirstAnswer:
    """WSGI middleware: the first call of one op runs (its effect happens), then its answer is lost."""

    def __init__(self, app: Any, op: str) -> None:
        self.app, self.op, self.dropped = app, op, 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(raw)
        if self.dropped or json.loads(raw or b"{}").get("op") != self.op:
            return self.app(environ, start_response)
        self.dropped += 1
        list(self.app(environ, lambda *a, **k: lambda data: None))  # actuate runs the op
        environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)  # ... and the connection drops
        start_response("500 INTERNAL SERVER ERROR", [("Content-Length", "0")])
        return [b""]


def _steps(world: World, iid: str) -> dict[str, dict[str, Any]]:
    coll = world.db.collection("pitstop_incidents").document(iid).collection("steps")
    return {d.id: d.to_dict() or {} for d in coll.stream()}


def _requeued(world: World, iid: str) -> list[str]:
    """Every job an incident requeued: early, to free the node for a check, or once the node was back."""
    steps = _steps(world, iid)
    out: list[str] = []
    for key in sorted(steps):
        result = steps[key].get("result") or {}
        moved = result.get("requeued_to_free", []) if key.endswith(("-diagnose", "-validate")) else []
        if key.endswith(("-reschedule_early", "-reschedule")):
            moved = result.get("requeued", [])
        out += [r["job"] if isinstance(r, dict) else str(r) for r in moved]
    return out


def _restarts(world: World, job: str) -> int:
    out = world.slurm._out(["scontrol", "show", "job", "-o", job]).splitlines()[0]
    return int(next(t for t in out.split() if t.startswith("Restarts=")).split("=", 1)[1])


def _observed_incident(world: World, line: str, node: str) -> str:
    """An incident decided in observe mode: no execution runs its step until the test starts one."""
    world.compute.kernel_line(PROJECT, ZONE, node, line, 0)  # a real fault: the node's kernel printed it
    ev = world.ingest.classifier.classify(ops_agent_entry(line, instance=node, insert_id=uuid.uuid4().hex))
    out = world.ingest.store.apply(
        {**ev, "_observed_ts": time.time()},
        policy.from_doc({**world.policy.doc, "mode": "observe"}),
        time.time(),
    )
    assert out.incident is not None and out.incident["step"] == 1
    return str(out.incident["id"])


def test_a_result_lost_after_the_reset_does_not_reset_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[str] = []
    update_held = FirestoreStepStore.update_held

    def flaky_update(self: FirestoreStepStore, key: str, token: str, fields: Any) -> bool:
        if key == "1-act" and fields.get("state") == "done" and not lost:  # the write after the reset
            lost.append(key)
            raise gexc.ServiceUnavailable("firestore: unavailable")  # type: ignore[no-untyped-call]
        return update_held(self, key, token, fields)

    monkeypatch.setattr(FirestoreStepStore, "update_held", flaky_update)
    out = world.fault(XID79, "a3-node-001")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert lost and inc["state"] == "RESOLVED", inc.get("failure")
    assert len(world.compute.effects_on("a3-node-001", "reset")) == 1
    assert len(world.calls("reset")) == 2  # asked again, under the same request id, and ignored


def test_an_answer_lost_after_the_effect_is_asked_again(world: World) -> None:
    world.http.app = DropFirstAnswer(world.http.app, "act")
    out = world.fault(XID79, "a3-node-000")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert world.http.app.dropped == 1
    assert len(world.compute.effects_on("a3-node-000", "reset")) == 1


def test_a_publish_timeout_at_close_keeps_the_incident_resolved(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    notifier = world.actuator.notifier
    assert notifier is not None
    publish = notifier.publish
    timed_out: list[str] = []

    def slow_publish(notification: Any) -> str:
        if notification.get("kind") == "incident" and not timed_out:
            timed_out.append(notification["summary"])
            raise concurrent.futures.TimeoutError()  # what the publish future's result(timeout=30) raises
        return str(publish(notification))

    monkeypatch.setattr(notifier, "publish", slow_publish)
    out = world.fault(XID79, "a3-node-002")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert timed_out and inc["state"] == "RESOLVED", inc.get("failure")
    assert "failure" not in inc
    assert not [n for n in world.notes() if n.get("severity") == "critical"]  # no false page


def test_a_failing_claim_fails_the_incident_with_a_page(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = registry.OPS[Op.CLAIM]
    broken: list[int] = []

    def broken_claim(s: Step) -> Any:
        if not broken:
            broken.append(1)
            raise RuntimeError("a bug in claim")  # functions-framework answers 500
        return claim.handler(s)

    monkeypatch.setitem(registry.OPS, Op.CLAIM, dataclasses.replace(claim, run=broken_claim))
    out = world.fault(XID79, "a3-node-001")
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "FAILED" and inc["failure"]["stage"] == "claim"
    (page,) = [n for n in world.notes() if n.get("severity") == "critical"]
    assert "was not fenced" in page["todo"]
    assert world.calls("reset") == [] and "drain" not in world.slurm.node_states()["a3-node-001"]


def test_a_failure_that_cannot_be_recorded_ends_the_execution_in_error(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("Firestore is gone")

    for op in (Op.CLAIM, Op.FAIL):
        monkeypatch.setitem(registry.OPS, op, dataclasses.replace(registry.OPS[op], run=broken))
    out = world.fault(XID79, "a3-node-001")
    assert out.incident is not None
    assert world.executions.wait_all(90)
    (rec,) = world.executions.records.values()
    assert rec.execution.state == rec.execution.State.FAILED  # the watchdog finds it
    error = json.loads(rec.execution.error.payload)
    assert error["tags"] == ["UnrecordedFailure"] and error["stage"] == "claim"
    assert error["error"]["code"] == 500 and error["record_error"]["code"] == 500


def test_an_escalation_is_decided_before_the_node_returns_to_slurm(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job_on(world.slurm)
    node = world.slurm._out(
        ["scontrol", "show", "hostnames", next(j for j in world.slurm.jobs() if j["id"] == job)["nodes"]]
    ).split()[0]
    verify = registry.OPS[Op.VERIFY]
    worse: list[str] = []

    def fault_gets_worse(s: Step) -> Any:
        if s.step == 1 and not worse:  # a stronger fault arrives while step 1 is being verified
            worse.append(s.iid)
            hand_edit(world.store, s.iid, lambda d: d.update({"escalate_to": "REBOOT_NODE"}))
        return verify.handler(s)

    monkeypatch.setitem(registry.OPS, Op.VERIFY, dataclasses.replace(verify, run=fault_gets_worse))
    out = world.fault(XID48, node)
    assert out.incident is not None and out.incident["action"] == "RESET_GPU"
    iid = out.incident["id"]
    inc = world.wait(iid, timeout=150)
    assert inc["state"] == "RESOLVED" and inc["step"] == 2 and inc["action"] == "REBOOT_NODE"
    steps = _steps(world, iid)
    assert steps["1-escalate"]["result"]["handed_over"] is True
    assert "1-unfence" not in steps and "1-reschedule" not in steps
    resumes = [d.id for d in world.db.collection("pitstop_slurm_results").stream() if "-resume-" in d.id]
    assert resumes and all(r.startswith(f"{iid}-2-") for r in resumes)  # never back in Slurm at step 1
    assert _requeued(world, iid) == [job]  # the gang moves once (right after step 1's fence: a spare is idle)
    assert len(world.compute.effects_on(node, "reset")) == 2


def test_a_gang_whose_members_finish_apart_is_requeued_once(world: World) -> None:
    job = _job_on(world.slurm)
    first, second = world.slurm._out(
        ["scontrol", "show", "hostnames", next(j for j in world.slurm.jobs() if j["id"] == job)["nodes"]]
    ).split()[:2]
    # both members fail in the same run; the second one's remediation is slow (a host report)
    late = _observed_incident(world, XID79, second)
    body, status = world.actuator.handle({"op": "fence", "incident": late, "step": 1})
    assert status == 200 and body["jobs"] == [job]
    out = world.fault(XID79, first)
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "RESOLVED" and _requeued(world, inc["id"]) == [job]
    deadline = time.monotonic() + 60  # the gang runs again, elsewhere
    while not any(j["id"] == job and j["state"] == "RUNNING" for j in world.slurm.jobs()):
        assert time.monotonic() < deadline, world.slurm._out(["scontrol", "show", "job", "-o", job])
        # no help from here: the agent lifts Slurm's ~120 s BeginTime hold once the requeued job is PENDING
        time.sleep(0.5)
    assert world.actuator.starter is not None
    world.actuator.starter.start(
        late, 1, cast(WorkflowArgument, {"incident_id": late, "step": 1})
    )  # what it reads
    inc = world.wait(late)
    assert inc["state"] == "RESOLVED", inc.get("failure")
    result = _steps(world, late)["1-reschedule"]["result"]
    assert result["requeued"] == [] and "moved on since the fence" in result["skipped"][0]["why"]
    assert _restarts(world, job) == 1


def test_a_node_someone_else_drained_stays_drained_and_the_note_says_so(world: World) -> None:
    """The admin's drain is never lifted, not even for a check: Pitstop cannot look at the node, so it
    confirms nothing, touches nothing (no reset) and pages, saying the node stays drained by them."""
    node, reason = "a3-node-002", "admin: bad DIMM, ticket 42"
    world.slurm._out(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    out = world.fault(XID79, node)
    inc = world.wait(out.incident["id"])  # type: ignore[index]
    assert inc["state"] == "FAILED" and inc["failure"]["stage"] == "corroborate", inc.get("failure")
    assert "not fenced by Pitstop" in inc["failure"]["error"] and world.calls("reset") == []
    info = world.slurm._out(["scontrol", "show", "node", "-o", node])
    assert "DRAIN" in info and reason in info  # still drained, with the admin's reason
    (note,) = [n for n in world.notes() if n["kind"] == "incident" and n["incident"]["state"] == "FAILED"]
    text = note["todo"]
    assert "back in service" not in text and "stays fenced" not in text
    assert "stays drained by someone else" in text and reason in text
    assert inc["fence"]["already_drained_by_other"] is True and inc["fence"]["previous_reason"] == reason
    assert _steps(world, inc["id"])["1-fence"]["result"]["fence"]["previous_reason"] == reason


# -- the live VM must be the one the evidence names (core/trust.py vm_identity_problem) --------


def _rejected(world: World, out: engine.Outcome, node: str) -> dict[str, Any]:
    assert out.result == "opened" and out.incident is not None
    inc = world.wait(out.incident["id"])
    assert inc["state"] == "RESOLVED" and "fenced" not in inc["timeline"], inc
    assert world.calls("reset") == [] and world.calls("set_labels") == []
    assert "drain" not in world.slurm.node_states()[node]
    notes = [n for n in world.notes() if n["kind"] == "incident"]
    assert any("rejected, nothing done" in n["summary"] for n in notes), notes
    return inc


def test_evidence_naming_another_vm_id_is_rejected_before_the_fence(world: World) -> None:
    """The entry's resource.labels.instance_id comes from the VM's metadata server, not from the line."""
    world.n += 1
    entry = ops_agent_entry(XID79, instance="a3-node-001", insert_id=f"{world.project}-{world.n}")
    entry["resource"]["labels"]["instance_id"] = "4400000000000000001"
    inc = _rejected(world, world.event(entry), "a3-node-001")
    assert "names VM id 4400000000000000001" in inc["rejected"]["why"]


def test_evidence_older_than_the_live_vm_is_rejected(world: World) -> None:
    """Compute's creationTimestamp (docs: Instance resource) is later than the line: an earlier VM's fault."""
    inst = world.compute.instances[f"projects/{PROJECT}/zones/{ZONE}/instances/a3-node-002"]
    inst.created = time.time() + 3600  # the VM of that name was created after the line was logged
    world.n += 1
    entry = ops_agent_entry(XID79, instance="a3-node-002", insert_id=f"{world.project}-{world.n}")
    del entry["resource"]["labels"]["instance_id"]  # as on GKE's k8s_node entries: no id to compare
    inc = _rejected(world, world.event(entry), "a3-node-002")
    assert "created" in inc["rejected"]["why"] and "earlier VM" in inc["rejected"]["why"]
