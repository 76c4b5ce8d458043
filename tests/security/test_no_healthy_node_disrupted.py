"""Issue 35's invariant: whatever a principal with no admin rights writes, no healthy node is disrupted.

A fleet whose nodes all report healthy (the probes' stand-ins: the node check through the
scheduler shows nothing, Compute shows every VM running since long before, no telemetry reading
is bad), and any sequence of inputs a non-admin can write, drawn across every channel of the
threat model (schemas/inputs.yaml): kernel-looking journal entries with any Xid, GPU, time and
transport; syslog and legacy-agent text lines; Compute system events of any kind with any
timestamp; Monitoring notifications of any policy, open or closed, for any node or job. They go
through ingest (the real parse, classify and engine, on the memory store) and every step they
start goes through actuate (the real ops, in the workflow's order) — and then:

- no disruptive effect on any node, ever: no requeue, checkpoint, stop or restart of a job, no
  reset, host report, recreate or maintenance call;
- no lasting harm: once the steps ran, no node stays fenced by Pitstop.

The converse (a real fault, which the probe shows, is remediated through the same forged noise)
is the second test. Failing examples Hypothesis finds become named tests below it.
"""

from __future__ import annotations

import copy
import functools
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from pitstop.adapters.compute import ComputeAdapter
from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import policy as policy_mod
from pitstop.core.domain import CheckSpec, GangCheckSpec
from pitstop.core.ops import Op
from pitstop.core.scheduling import (
    Capacity,
    CheckResult,
    CheckStart,
    FenceAnswer,
    GangCheckStart,
    JobInfo,
    JobRun,
    JobState,
    RequeueOutcome,
    StepRef,
    UnfenceAnswer,
)
from pitstop.local.fake_compute import FakeCompute, default_id, serve
from pitstop.services.actuate import Actuator
from pitstop.services.ingest import Ingest
from tests.helpers import (
    PROJECT,
    ZONE,
    ManualClock,
    RecordingTopic,
    alert_delivery,
    journald_entry,
    legacy_agent_entry,
    load_fixture,
    push_body,
    retarget_system_event,
    syslog_entry,
    system_event_entry,
)

NODES = ("a3-node-001", "a3-node-002", "a3-node-003", "a3-node-004")
JOB = "4242"
GPUS = tuple(f"0000:{b:02x}:00" for b in (0x04, 0x05, 0x0A, 0x0B, 0x84, 0x85, 0x8A, 0x8B))
T0 = 1_800_000_000.0
DISRUPTIVE_COMPUTE = ("reset", "reportHostAsFaulty", "recreateInstances", "performMaintenance")
# Codes across the catalog's actions: application faults, resets, reboots, replacements, the 154
# recovery forms, NVLink, and codes no rule names.
XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 121, 140, 143, 149, 154)
TELEMETRY = sorted(p.stem for p in (Path(__file__).parents[2] / "infra/monitoring/telemetry").glob("*.json"))


def smi_q(gpus: int = 8) -> str:
    """``nvidia-smi -q`` of a healthy node: every GPU attached, nothing pending."""
    blocks = [
        f"GPU 00000000:{GPUS[i][5:]}.0\n    Product Name : NVIDIA H100 80GB HBM3\n"
        "    Remapped Rows\n        Pending : No\n        Remapping Failure Occurred : No\n"
        "    Retired Pages\n        Pending Page Blacklist : No\n"
        for i in range(gpus)
    ]
    return f"Attached GPUs : {gpus}\n" + "".join(blocks)


@dataclass
class HealthyFleet:
    """The scheduler's side of every node, all healthy: a check shows nothing, and every job effect
    is recorded (the invariant counts them). One 4-node gang job runs on the fleet."""

    name: str = "slurm"
    fault: dict[str, str] = field(default_factory=dict)  # node -> a kernel line it really printed
    clock: dict[str, str] = field(default_factory=dict)  # node -> its clock read (date; /proc/uptime)
    effects: list[tuple[str, str]] = field(default_factory=list)
    fenced: set[str] = field(default_factory=set)
    run: JobRun = field(default_factory=lambda: JobRun(0, "2026-11-24T08:00:00"))

    def jobs_on(self, node: str, ref: StepRef) -> list[JobInfo]:
        return [JobInfo(JOB, JobState.RUNNING, self.run)] if node in NODES else []

    def fence(self, node: str, ref: StepRef, action: str) -> FenceAnswer:
        self.fenced.add(node)
        return FenceAnswer("MIXED", "", False, f"pitstop {ref.incident} {action}")

    def unfence(self, node: str, ref: StepRef) -> UnfenceAnswer:
        self.fenced.discard(node)
        return UnfenceAnswer(True)

    def checkpoint(self, job: str, ref: StepRef) -> str:
        self.effects.append(("checkpoint", job))
        return "SIGUSR1"

    def job_info(self, job: str, ref: StepRef) -> JobInfo:
        return JobInfo(job, JobState.RUNNING, self.run)

    def node_healthy(self, node: str, ref: StepRef) -> bool:
        return node not in self.fault

    def requeue(self, job: str, ref: StepRef, run: JobRun) -> RequeueOutcome:
        self.effects.append(("requeue", job))
        self.run = JobRun((run.restarts or 0) + 1, "2026-11-24T09:00:00")
        return RequeueOutcome(job, True, "requeued")

    def capacity(self, job: str, node: str, ref: StepRef) -> Capacity:
        return Capacity(True, "2 idle nodes", 4, 6)

    def start_check(self, node: str, check: CheckSpec, ref: StepRef) -> CheckStart:
        return CheckStart(str(check["name"]), None, "")

    def check_result(self, node: str, check: CheckSpec, ref: StepRef) -> CheckResult:
        kmsg = self.fault.get(node, "")
        read = {"clock": self.clock[node]} if node in self.clock else {}
        return CheckResult(True, {"dmesg": kmsg, "nvidia_smi_q": smi_q(), "slurm_node": "MIXED", **read})

    def start_gang_check(self, job: str, check: GangCheckSpec, ref: StepRef) -> GangCheckStart:
        return GangCheckStart(str(check["name"]), NODES)

    def gang_check_result(self, job: str, check: GangCheckSpec, ref: StepRef) -> CheckResult:
        outputs = {f"{n}:dmesg": "" for n in NODES} | {f"{n}:nvidia_smi_q": smi_q() for n in NODES}
        return CheckResult(True, outputs)

    def resume_gang(self, job: str, ref: StepRef) -> RequeueOutcome:
        self.effects.append(("resume", job))
        return RequeueOutcome(job, True, "resumed")

    def release_jobs(self, jobs: list[str], ref: StepRef) -> list[str]:
        return []


class Healthy:
    """Every telemetry reading of every node is normal (Cloud Monitoring's and Prometheus' alike)."""

    def node_values(self, project: str, rule: Any, nodes: Any, now: float) -> dict[str, float | None]:
        return {n: 0.0 for n in nodes}


class Starter:
    """Workflows' executions.create: each start is a step the harness then runs through actuate."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int]] = []

    def find(self, incident_id: str, step: int) -> str | None:
        return None

    def start(self, incident_id: str, step: int, argument: Mapping[str, Any]) -> str:
        self.steps.append((incident_id, step))
        workflow = f"projects/{PROJECT}/locations/us-central1/workflows/pitstop-remediate"
        return f"{workflow}/executions/{incident_id}-{step}"


# The workflow's branches, as workflows/remediate.yaml calls actuate (tests/local/test_workflows_runner.py
# runs the YAML itself; here the order is enough: every answer but 200 ends the step with ``fail``).
REMEDIATE = (
    Op.FENCE, Op.CORROBORATE, Op.CORROBORATION, Op.JUDGE_CORROBORATION, Op.CHECKPOINT, Op.JOBS_DONE,
    Op.RESCHEDULE_EARLY, Op.DIAGNOSE, Op.DIAGNOSIS, Op.JUDGE_DIAGNOSIS, Op.ACT, Op.OPERATION, Op.VERIFY,
    Op.VALIDATE, Op.VALIDATION, Op.REVALIDATE, Op.REVALIDATION, Op.JUDGE_VALIDATION, Op.ESCALATE,
    Op.UNFENCE, Op.RESCHEDULE, Op.RESUMED, Op.CLOSE,
)  # fmt: skip
LOCALISE = (Op.LOCALISE, Op.SWEEP, Op.LINKS, Op.LINKS_DONE, Op.CONCLUDE, Op.RESUMED, Op.CLOSE)
DRAIN_ONLY = frozenset({Op.CHECKPOINT, Op.JOBS_DONE})


@functools.cache
def _policy() -> policy_mod.Policy:
    """Enforce, one 8-node Slurm cluster, budgets wide enough that the fleet never holds."""
    wide = {"max_nodes": 8, "max_percent": 100}
    cluster = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-*"}}
    return policy_mod.from_doc(
        {
            "mode": "enforce",
            "clusters": [cluster],
            "budgets": {"cluster": wide, "zone": wide, "block": wide},
            "validation": {"enabled": False},  # not an input: the repaired node's own measurement
        }
    )


class Pitstop:
    """Ingest, the store, actuate and a workflow driver around one healthy fleet."""

    def __init__(self, compute: ComputeAdapter, fake: FakeCompute, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        if clock is None:
            self.clock.t = T0
        self.fake = fake
        self.fleet = HealthyFleet()
        self.starter = Starter()
        self.policy = _policy()
        self.store = MemoryStore()
        self.ingest = Ingest(self.policy, self.store, self.starter, RecordingTopic(), clock=self.clock)
        self.ingest.coalescer.timer = False
        self.actuator = Actuator(
            self.policy, self.store, compute, {"train": self.fleet}, RecordingTopic(), self.starter,
            clock=self.clock, telemetry=Healthy(), prometheus=Healthy(),
        )  # fmt: skip

    def deliver(self, payload: dict[str, Any], source: str | None = None) -> None:
        try:
            self.ingest.handle_payload(payload, source)
        except Exception as exc:  # a poison message is dead-lettered: that is not a disruption
            if type(exc).__name__ != "PoisonMessageError":
                raise
        self.run_steps()

    def run_steps(self) -> None:
        while self.starter.steps:
            iid, step = self.starter.steps.pop(0)
            self._run(iid, step)

    def _run(self, iid: str, step: int) -> None:
        execution = f"{iid}-{step}"

        def call(op: Op, **extra: object) -> tuple[dict[str, Any], int]:
            req = {"op": str(op), "incident": iid, "step": step, "execution": execution, "extra": extra}
            return self.actuator.handle(req)

        claimed, status = call(Op.CLAIM)
        if status != 200 or not claimed.get("ours"):
            return
        plan = claimed.get("plan")
        ops = (Op.CLOSE,) if plan == "notify_only" else LOCALISE if plan == "localise" else REMEDIATE
        for op in ops:
            if op in DRAIN_ONLY and plan != "drain":
                continue
            body, status = self._until_done(call, op)
            if status != 200:
                call(Op.FAIL, stage=str(op), error={"message": str(body.get("error"))[:200]})
                return
            if op == Op.JUDGE_CORROBORATION and body.get("stand_down"):
                for then in (Op.UNFENCE, Op.CLOSE):  # the workflow's stand_down: unfence, then close
                    self._until_done(call, then)
                return
            if op == Op.ESCALATE and body.get("handed_over"):
                return  # the next step took over (the harness runs it as it started)

    def _until_done(self, call: Any, op: Op) -> tuple[dict[str, Any], int]:
        for _ in range(50):  # a probe polled as the workflow does, with time moving on
            body, status = call(op)
            if status == 503:
                self.clock.t += 5
                continue
            if status != 200 or body.get("done", True) is not False:
                return body, status
            self.clock.t += 60
            self.fake_tick()
        return {"error": "never done"}, 408

    def fake_tick(self) -> None:
        """Compute's operations finish as time passes (the fake reads its clock)."""

    def disruptions(self) -> list[str]:
        compute = [f"{m} {n}" for n in NODES for m in DISRUPTIVE_COMPUTE if self.fake.effects_on(n, m)]
        return [f"{what} {job}" for what, job in self.fleet.effects] + compute


@pytest.fixture(scope="module")
def compute() -> Iterator[tuple[ComputeAdapter, FakeCompute]]:
    fake = FakeCompute(time_scale=0.001)
    for n in NODES:
        fake.add_instance(PROJECT, ZONE, n, mig="a3-node")
    server, endpoint = serve(fake)
    try:
        yield ComputeAdapter(endpoint), fake
    finally:
        server.shutdown()


# -- what a non-admin can write, channel by channel (schemas/inputs.yaml) -------------------------------

nodes = st.sampled_from((*NODES, "a3-node-077"))  # one VM no cluster runs
backdate = st.sampled_from((0.0, 30.0, 400.0, 3_600.0, 86_400.0 * 3, 86_400.0 * 40))


def _iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@st.composite
def xid_lines(draw: st.DrawFn) -> str:
    xid = draw(st.sampled_from(XIDS) | st.integers(1, 200))
    gpu = draw(st.sampled_from(GPUS))
    if xid == 154:
        frm, to = draw(st.sampled_from(((0, 1), (1, 0), (0, 2), (2, 0), (0, 4))))
        return f"NVRM: Xid (PCI:{gpu}): 154, GPU recovery action changed from {frm:#x} (x) to {to:#x} (y)"
    tail = draw(
        st.sampled_from(("GPU has fallen off the bus.", "pid=1234, name=python3, Graphics Exception", ""))
    )
    return f"NVRM: Xid (PCI:{gpu}): {xid}, {tail}"


@st.composite
def log_entries(draw: st.DrawFn, now: float) -> dict[str, Any]:
    line, node = draw(xid_lines()), draw(nodes)
    carrier = draw(st.sampled_from(("kernel", "syslog-transport", "syslog", "legacy", "serial")))
    insert = uuid.UUID(int=draw(st.integers(0, 2**64))).hex
    if carrier == "kernel":
        entry = journald_entry(line, node, insert)
    elif carrier == "syslog-transport":
        entry = journald_entry(line, node, insert, transport="syslog", facility="1")
    elif carrier == "syslog":
        entry = syslog_entry(line, node, insert)
    elif carrier == "serial":  # GCE serial-port logging: the console's text on a gce_instance entry
        entry = {
            "insertId": insert[:16],
            "logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
            "textPayload": f"[ 7341.112233] {line}",
            "resource": {
                "type": "gce_instance",
                "labels": {
                    "project_id": PROJECT,
                    "zone": ZONE,
                    "instance_id": default_id(PROJECT, ZONE, node),
                },
            },
            "labels": {"compute.googleapis.com/resource_name": node},
        }
    else:
        entry = legacy_agent_entry(line, node, insert)
    entry["timestamp"] = _iso(now - draw(backdate))
    return entry


SYSTEM_EVENTS = [c for c in load_fixture("system_events.yaml") if "entry" in c or "method" in c]


@st.composite
def system_events(draw: st.DrawFn, now: float) -> dict[str, Any]:
    case = draw(st.sampled_from(SYSTEM_EVENTS))
    entry = retarget_system_event(system_event_entry(copy.deepcopy(case)), draw(nodes))
    entry["timestamp"] = _iso(now - draw(backdate))
    entry["insertId"] = uuid.UUID(int=draw(st.integers(0, 2**64))).hex
    return entry


def alert(
    stem: str, state: str, started: int, incident: str, subject: str, observed: str, message_id: str
) -> tuple[dict[str, Any], str]:
    """Monitoring's notification of one telemetry policy (``subject``: the node, or a hang's job)."""
    from pitstop.local import alerting

    ended = None if state == "open" else started + 60
    if stem == "job-heartbeat":
        labels: dict[str, str] = {"cluster": "train", "job": subject}
        resource: tuple[str, dict[str, str]] = ("global", {"project_id": PROJECT})
        shown = ""
    else:
        labels, shown = {}, subject
        ids = {"project_id": PROJECT, "zone": ZONE, "instance_id": default_id(PROJECT, ZONE, shown)}
        resource = ("gce_instance", ids)
    note = alerting.notification(
        stem,
        state,
        incident_id=incident,
        project=PROJECT,
        metric_labels=labels,
        resource_type=resource[0],
        resource_labels=resource[1],
        display_name=shown,
        started_at=started,
        ended_at=ended,
        observed=observed,
    )
    delivery = alert_delivery(dict(note), message_id=message_id)
    return {"message": delivery["data"]["message"]}, str(delivery["source"])


@st.composite
def alerts(draw: st.DrawFn, now: float) -> tuple[dict[str, Any], str]:
    stem = draw(st.sampled_from(TELEMETRY))
    subject = draw(st.sampled_from((JOB, "9999")) if stem == "job-heartbeat" else nodes)
    return alert(
        stem,
        draw(st.sampled_from(("open", "closed"))),
        int(now - draw(backdate)),
        f"0.{draw(st.integers(1, 5))}",
        subject,
        draw(st.sampled_from(("0", "0.6", "1000"))),
        str(draw(st.integers(1, 10**9))),
    )


class Forgeries(RuleBasedStateMachine):
    """Inputs from every channel a non-admin can write, in any order, with time passing."""

    def __init__(self) -> None:
        super().__init__()
        self.pitstop = Pitstop(*_COMPUTE)

    @rule(data=st.data())
    def a_log_entry(self, data: st.DataObject) -> None:
        self.pitstop.deliver(push_body(data.draw(log_entries(self.pitstop.clock.t))))

    @rule(data=st.data())
    def a_system_event(self, data: st.DataObject) -> None:
        self.pitstop.deliver(push_body(data.draw(system_events(self.pitstop.clock.t))))

    @rule(data=st.data())
    def an_alert(self, data: st.DataObject) -> None:
        payload, source = data.draw(alerts(self.pitstop.clock.t))
        self.pitstop.deliver(payload, source)

    @rule(minutes=st.integers(1, 120))
    def time_passes_and_the_sweep_runs(self, minutes: int) -> None:
        from pitstop.services.sweep import Sweep

        self.pitstop.clock.t += minutes * 60
        Sweep(self.pitstop.ingest).run()
        self.pitstop.run_steps()

    @invariant()
    def no_healthy_node_is_disrupted(self) -> None:
        assert self.pitstop.disruptions() == []

    @invariant()
    def no_node_stays_fenced(self) -> None:
        assert self.pitstop.fleet.fenced == set()


_COMPUTE: tuple[ComputeAdapter, FakeCompute]


def test_no_input_a_non_admin_can_write_disrupts_a_healthy_node(
    compute: tuple[ComputeAdapter, FakeCompute],
) -> None:
    global _COMPUTE
    _COMPUTE = compute
    run_state_machine_as_test(
        Forgeries,
        settings=settings(
            max_examples=EXAMPLES, stateful_step_count=8, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )  # fmt: skip


EXAMPLES = 300
REAL_FAULT_EXAMPLES = 20

XID79 = "NVRM: Xid (PCI:{gpu}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@settings(max_examples=REAL_FAULT_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    noise=st.lists(st.data(), max_size=0),
    node=st.sampled_from(NODES),
    gpu=st.sampled_from(GPUS),
    data=st.data(),
)
def test_a_real_fault_is_remediated_whatever_was_forged_before(
    noise: list[Any], node: str, gpu: str, data: st.DataObject
) -> None:
    """The converse: forged lines first (any of them, on any node, the faulty one included), then a
    real Xid 79 which the node's kernel printed: the node is rebooted and the gang requeued once."""
    clock = ManualClock()
    clock.t = T0
    fake = FakeCompute(time_scale=0.001, clock=clock)
    for n in NODES:
        fake.add_instance(PROJECT, ZONE, n, mig="a3-node")
    server, endpoint = serve(fake)
    try:
        pitstop = Pitstop(ComputeAdapter(endpoint), fake, clock)
        for _ in range(data.draw(st.integers(0, 4), label="forged inputs")):
            kind = data.draw(st.sampled_from(("log", "system", "alert")))
            if kind == "alert":
                pitstop.deliver(*data.draw(alerts(clock.t)))
            else:
                pitstop.deliver(
                    push_body(data.draw((log_entries if kind == "log" else system_events)(clock.t)))
                )
            clock.t += 60 * data.draw(st.integers(0, 90), label="minutes after")
        before = len([e for e in pitstop.fleet.effects if e[0] == "requeue"])
        line = XID79.format(gpu=gpu)
        pitstop.fleet.fault[node] = f"<4>[  812.250000] {line}\n"  # the kernel printed it: the probe shows it
        # booted 811.25 s before now (date +%s.%N; cat /proc/uptime): the line is a second into the episode
        pitstop.fleet.clock[node] = f"{clock.t:.9f}\n811.25 6000.00\n"
        real = journald_entry(line, node, uuid.uuid4().hex)
        real["timestamp"] = _iso(clock.t)
        pitstop.deliver(push_body(real))
        assert fake.effects_on(node, "reset"), pitstop.store.query()
        assert len([e for e in pitstop.fleet.effects if e[0] == "requeue"]) == before + 1
    finally:
        server.shutdown()


# -- what the invariant test found, kept as named cases ----------------------------------------------


def test_found_a_forged_preemption_raising_a_degraded_nodes_incident_is_asked_of_compute(
    compute: tuple[ComputeAdapter, FakeCompute],
) -> None:
    """Found by the invariant test: a degraded alert opened the node's incident, then a forged
    preemption in Google's shape raised it to RESCHEDULE_JOB. The incident's kind stayed "degraded",
    so the preemption's claim was never asked of Compute and the gang was requeued. The claim that
    chose the action is what is asked now (core/corroboration.claim_kind)."""
    pitstop = Pitstop(*compute)
    now = pitstop.clock.t
    pitstop.deliver(*alert("gpu-throttle", "open", int(now), "0.1", NODES[0], "0.6", "7001"))
    preempted = next(c for c in SYSTEM_EVENTS if c["id"] == "preempted")
    entry = retarget_system_event(system_event_entry(copy.deepcopy(preempted)), NODES[0])
    entry["timestamp"], entry["insertId"] = _iso(now), uuid.uuid4().hex
    pitstop.deliver(push_body(entry))
    assert pitstop.disruptions() == [] and pitstop.fleet.fenced == set()


def test_found_a_degraded_alert_raising_an_xid_incident_needs_the_nodes_own_reading(
    compute: tuple[ComputeAdapter, FakeCompute],
) -> None:
    """Found by the invariant test: a forged Xid 13 opened the node's incident (RESTART_JOB), then a
    degraded alert raised it to DRAIN_NODE; the incident's kind stayed "gpu_xid", so the alert's claim
    was waived instead of read on the node, and the gang was checkpointed and moved. A degraded claim
    now needs the node's own reading whatever the episode began as."""
    pitstop = Pitstop(*compute)
    now = pitstop.clock.t
    line = f"NVRM: Xid (PCI:{GPUS[0]}): 13, pid=1234, name=python3, Graphics Exception"
    pitstop.deliver(push_body(journald_entry(line, NODES[0], uuid.uuid4().hex) | {"timestamp": _iso(now)}))
    pitstop.deliver(*alert("gpu-throttle", "open", int(now), "0.2", NODES[0], "0.6", "7002"))
    assert pitstop.disruptions() == [] and pitstop.fleet.fenced == set()


# Every input of the threat model (schemas/inputs.yaml) and how the invariant test writes it: a rule of
# Forgeries, or why the input is not one a non-admin's forgery reaches a disruption through.
CHANNELS: dict[str, str] = {
    "log-kernel-journal": "a_log_entry (carrier kernel)",
    "log-syslog": "a_log_entry (carriers syslog-transport, syslog, legacy)",
    "log-serial-console": "a_log_entry (carrier serial)",
    "log-gke-node-journal": "out: the GKE fleet is not in this harness (tests/e2e/test_e2e_gke*.py forge it)",
    "log-system-events": "a_system_event",
    "log-vertex": "out: a Vertex AI job is read back from Vertex AI (tests/services/test_vertex_resubmit.py)",
    "topic-events": "a_log_entry and a_system_event (delivered as the topic's push)",
    "topic-alerts": "an_alert",
    "topic-notifications": "out: notify posts and pages only (tests/services/test_notify.py)",
    "topic-dead-letters": "out: read by a person only",
    "alert-heartbeat": "an_alert (job-heartbeat, any job)",
    "alert-degraded-gce": "an_alert (the GCE telemetry policies)",
    "alert-degraded-gke": "an_alert (the GKE telemetry policies)",
    "alert-operators": "out: to people only",
    "metric-heartbeat": "an_alert: a forged series acts only through its policy's alert",
    "metric-pitstop": "out: Pitstop's own counters feed people's alerts only",
    "metric-ops-agent-dcgm": "an_alert; the node's reading is the Healthy() stand-in",
    "metric-managed-prometheus": "an_alert; the node's reading is the Healthy() stand-in",
    "metric-log-based": "out: an Xid-spike alert to people only",
    "http-ingest": "a_log_entry, a_system_event, an_alert (ingest's push handler)",
    "http-notify": "out: notify posts and pages only",
    "http-sweep": "time_passes_and_the_sweep_runs",
}


def test_the_strategies_cover_every_input_a_non_admin_can_write() -> None:
    """A new input in the threat model fails here until the invariant test writes it (or says why
    it cannot disrupt); Pitstop's own channels (kind control) and evidence are not forgeries."""
    import yaml

    model = yaml.safe_load((Path(__file__).parents[2] / "schemas/inputs.yaml").read_text())
    hints = {i["id"] for i in model["inputs"] if i["kind"] == "hint"}
    assert set(CHANNELS) == hints
    rules = {name for name in vars(Forgeries) if not name.startswith("_")}
    for channel, how in CHANNELS.items():
        named = how.split(" ", 1)[0].rstrip(":;,")
        assert how.startswith("out: ") or named in rules, (channel, how)
