"""The forgery matrix through the whole pipeline, on the emulators and a real Slurm.

Each case is evidence someone other than the kernel or Google can produce: a `logger` line, a
journal record without the kernel transport, an entry naming another VM or an earlier one, a
user-written system event, a look-alike log name, Slurm keywords and hostlists as names, a node of
another project, a 9 MB line, a 5,000-digit pid (a fault since issue 22, asked about on the node),
10,000 GPUs on one node. Every entry is
published straight to the events topic (past the sink filters, as if a filter were widened), so
the functions' own checks are what is tested; whether the shipped filters select it is asserted
too. For each: no Compute mutation, no change to any Slurm node or job, and the incident (or, for
an entry that is no evidence at all, ingest's error record) says why.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pitstop.core.domain import Incident
from pitstop.core.engine import MAX_GPUS, OTHER
from pitstop.local.fake_compute import CREATED_LONG_AGO
from pitstop.local.stack import PROJECT, ZONE, ClusterSpec, admin
from tests.helpers import load_fixture, system_event_entry
from tests.pipeline import XID79, Pipeline, stack_up

pytestmark = pytest.mark.emulator

NODES = 22  # each test (each parametrised case) takes its own (Pipeline.take)
AUDIT = "cloudaudit.googleapis.com%2Fsystem_event"
MALLORY = "mallory@example.com"
Case = tuple[Callable[[Pipeline], dict[str, Any]], str]


@pytest.fixture(scope="module")
def sc() -> Iterator[Pipeline]:
    with stack_up("e2e-forgery", ClusterSpec(nodes=NODES)) as stack:
        yield Pipeline(stack)


@pytest.fixture(scope="module")
def job(sc: Pipeline) -> str:
    """A gang on every node: a requeue, a drain or a signal anywhere would show on it."""
    return sc.job(sc.nodes)


# -- what an attacker can write --------------------------------------------------------------


def _text_syslog(sc: Pipeline, node: str, line: str) -> dict[str, Any]:
    """What `logger` leaves in /var/log/syslog, shipped by the Ops Agent's syslog receiver."""
    e = sc.entry(node, line)
    e["logName"] = f"projects/{PROJECT}/logs/syslog"
    e["jsonPayload"] = {"message": f"Nov 22 10:42:31 {node} mallory: {line}"}
    return e


def _journal(sc: Pipeline, node: str, transport: str, facility: str) -> dict[str, Any]:
    e = sc.entry(node, XID79)
    e["jsonPayload"].update(_TRANSPORT=transport, SYSLOG_FACILITY=facility)
    return e


def _system_event(sc: Pipeline, node: str, **proto: Any) -> dict[str, Any]:
    """The real preemption shape (tests/fixtures/system_events.yaml) naming a live VM."""
    e = system_event_entry(next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted"))
    e["resource"]["labels"].update(project_id=PROJECT, zone=ZONE, instance_id=sc.vm_id(node))
    e["protoPayload"]["resourceName"] = f"projects/{PROJECT}/zones/{ZONE}/instances/{node}"
    e["logName"] = f"projects/{PROJECT}/logs/{AUDIT}"
    e["insertId"], e["timestamp"] = uuid.uuid4().hex[:16], sc.entry(node, "")["timestamp"]
    e["protoPayload"].update(proto)
    return e


def _named(sc: Pipeline, name: str) -> dict[str, Any]:
    e = sc.entry(sc.take()[0], XID79)
    e["labels"]["compute.googleapis.com/resource_name"] = name
    e["jsonPayload"]["_HOSTNAME"] = name
    return e


def _another_vm(sc: Pipeline, node: str) -> dict[str, Any]:
    e = sc.entry(node, XID79)
    e["resource"]["labels"]["instance_id"] = sc.vm_id(sc.take()[0])  # the metadata server of another VM
    return e


def _before_the_vm(sc: Pipeline, node: str) -> dict[str, Any]:
    """A line logged two hours before the live VM of that name was created (no id to compare)."""
    e = sc.entry(node, XID79)
    del e["resource"]["labels"]["instance_id"]
    e["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(CREATED_LONG_AGO - 7200))
    return e


def _other_project(sc: Pipeline, node: str) -> dict[str, Any]:
    e = sc.entry(node, XID79)
    e["resource"]["labels"]["project_id"] = "someone-elses-project"
    e["logName"] = "projects/someone-elses-project/logs/pitstop-kernel"
    return e


# -- what each must end as -------------------------------------------------------------------


def _effects(sc: Pipeline) -> tuple[int, dict[str, str], str]:
    """Every Compute mutation so far, every Slurm node's state and reason, and the gang's jobs."""
    calls = len(admin(sc.state, "/_admin/state")["calls"])
    nodes = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T %E"], env=sc.slurm.env, capture_output=True, text=True, check=True
    ).stdout
    states = {ln.split()[0]: " ".join(ln.split()[1:]) for ln in nodes.splitlines() if ln.strip()}
    jobs = subprocess.run(
        ["squeue", "-h", "-o", "%i %T %N"], env=sc.slurm.env, capture_output=True, text=True, check=True
    ).stdout
    return calls, states, jobs


def _ingest_said(sc: Pipeline, insert_id: str, message: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for ln in (sc.stack.workdir / "ingest.log").read_text(errors="replace").splitlines():
            if insert_id in ln and message in ln:
                rec: dict[str, Any] = json.loads(ln)
                return rec
        return None

    found: dict[str, Any] = sc.wait(find, 60, f"ingest to log {message!r} for {insert_id}")
    return found


def _project(inc: Incident) -> str | None:
    """The project of the VM an incident names (None: it names no node)."""
    node = inc["node"]
    return node["project"] if node else None


def _incident_of(sc: Pipeline, node: str, done: Callable[[Incident], bool]) -> Incident:
    def find() -> Incident | None:
        return next((i for i in reversed(sc.incidents(node)) if done(i)), None)

    found: Incident = sc.wait(find, 90, f"the incident on {node}")
    return found


def _paged(sc: Pipeline, iid: str) -> None:
    sc.wait(lambda: sc.notes_for(iid), 60, f"a note for {iid}")


def _publish(sc: Pipeline, entry: dict[str, Any]) -> bool:
    """Straight to the events topic; answers whether the shipped sink filters would have sent it."""
    selected = sc.router.matches(entry)
    sc.router.pub.publish(sc.router.topic, json.dumps(entry).encode()).result(timeout=60)
    return selected


UNVERIFIED: dict[str, Case] = {
    "logger-in-text-syslog": (lambda sc: _text_syslog(sc, sc.take()[0], XID79), "text syslog"),
    "journal-by-logger": (lambda sc: _journal(sc, sc.take()[0], "syslog", "1"), "_TRANSPORT=kernel"),
    "journal-by-systemd-cat": (lambda sc: _journal(sc, sc.take()[0], "stdout", "3"), "stdout"),
}


@pytest.mark.parametrize("case", list(UNVERIFIED))
def test_unverified_evidence_is_recorded_and_paged_and_touches_nothing(
    sc: Pipeline, job: str, case: str
) -> None:
    make, words = UNVERIFIED[case]
    before = _effects(sc)
    entry = make(sc)
    node = entry["labels"]["compute.googleapis.com/resource_name"]
    _publish(sc, entry)
    inc = _incident_of(sc, node, lambda i: i["timeline"].get("detected") is not None)
    _paged(sc, inc["id"])
    assert (inc["trust"], inc["action"], inc["workflow"]) == ("unverified", "NONE", None), inc
    assert "not acted on" in inc["reason"] and words in inc["reason"], inc["reason"]
    assert _effects(sc) == before


REJECTED: dict[str, Case] = {
    "another-vms-id": (lambda sc: _another_vm(sc, sc.take()[0]), "names VM id"),
    "line-before-the-vm": (lambda sc: _before_the_vm(sc, sc.take()[0]), "earlier VM"),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_evidence_about_another_vm_is_rejected_before_any_effect(sc: Pipeline, job: str, case: str) -> None:
    """Verified kernel lines, but not of the VM that now has that name: checked live, then refused."""
    make, words = REJECTED[case]
    before = _effects(sc)
    entry = make(sc)
    node = entry["labels"]["compute.googleapis.com/resource_name"]
    assert _publish(sc, entry)  # the sink sends it: only the live check can refuse it
    inc = _incident_of(sc, node, lambda i: bool(i.get("rejected")))
    assert words in inc["rejected"]["why"], inc["rejected"]
    _paged(sc, inc["id"])
    assert inc["state"] == "RESOLVED"
    assert _effects(sc) == before


def _invalid_cases() -> dict[str, Case]:
    return {
        "user-authored-system-event": (
            lambda sc: _system_event(
                sc, sc.take()[0], authenticationInfo={"principalEmail": "mallory@example.com"}
            ),
            "not authored by Google",
        ),
        "system-event-other-service": (
            lambda sc: _system_event(sc, sc.take()[0], serviceName="mallory.example.com"),
            "serviceName",
        ),
        "lookalike-log-name": (
            lambda sc: {
                **_system_event(sc, sc.take()[0]),
                "logName": f"projects/{PROJECT}/logs/evil-{AUDIT}",
            },
            "log name must be exactly",
        ),
        "logname-of-another-project": (
            lambda sc: {
                **sc.entry(sc.take()[0], XID79),
                "logName": "projects/someone-elses-project/logs/pitstop-kernel",
            },
            "logName is in project someone-elses-project",
        ),
        "name-all": (lambda sc: _named(sc, "all"), "Slurm keyword ALL"),
        "name-ALL": (lambda sc: _named(sc, "ALL"), "Slurm keyword ALL"),
        "name-hostlist-range": (lambda sc: _named(sc, "a3-node-[000-003]"), "hostlist"),
        "name-hostlist-list": (lambda sc: _named(sc, "a3-node-001,a3-node-002"), "hostlist"),
    }


INVALID = _invalid_cases()


@pytest.mark.parametrize("case", list(INVALID))
def test_no_evidence_at_all_gets_an_error_record_and_no_incident(sc: Pipeline, job: str, case: str) -> None:
    make, words = INVALID[case]
    before, known = _effects(sc), {i["id"] for n in sc.nodes for i in sc.incidents(n)}
    entry = make(sc)
    selected = _publish(sc, entry)
    if case.startswith(("user-authored", "system-event", "lookalike")):
        assert not selected, "the system-event sink must not select it"
    rec = _ingest_said(sc, entry["insertId"], "invalid entry acknowledged")
    assert rec["severity"] == "WARNING" and words in rec["reason"], rec
    assert {i["id"] for n in sc.nodes for i in sc.incidents(n)} == known
    assert _effects(sc) == before


def test_a_node_of_another_project_with_the_same_name_is_not_ours(sc: Pipeline, job: str) -> None:
    """Our VM's name in an entry of another project (an aggregated sink, or a forged label)."""
    before = _effects(sc)
    (node,) = sc.take()
    _publish(sc, _other_project(sc, node))
    inc = _incident_of(sc, node, lambda i: _project(i) != PROJECT and bool(i.get("rejected")))
    assert f"no VM {node} in someone-elses-project" in inc["rejected"]["why"], inc["rejected"]
    _paged(sc, inc["id"])
    assert not [i for i in sc.incidents(node) if _project(i) == PROJECT]
    assert _effects(sc) == before


def test_a_nine_megabyte_line_is_cut_before_parsing(sc: Pipeline, job: str) -> None:
    """Near Pub/Sub's 10 MB message limit (Cloud Logging itself caps an entry at 256 KB)."""
    before = _effects(sc)
    (node,) = sc.take()
    entry = _text_syslog(sc, node, XID79 + " " + "A" * 9_000_000)
    _publish(sc, entry)
    inc = _incident_of(sc, node, lambda i: entry["insertId"] in json.dumps(i.get("evidence")))
    assert (inc["trust"], inc["action"], inc["workflow"]) == ("unverified", "NONE", None), inc
    assert len(json.dumps(inc)) < 64 * 1024
    assert _effects(sc) == before


def test_ten_thousand_gpus_on_one_node_keep_the_incident_bounded(sc: Pipeline, job: str) -> None:
    """Each distinct PCI address once took a field of its own (a 500 KB, 20,000-field document)."""
    before = _effects(sc)
    (node,), n = sc.take(), 10_000
    base = _text_syslog(sc, node, XID79)
    futures = []
    for i in range(n):
        e = copy.deepcopy(base)
        e["insertId"] = f"pci-{i}"
        e["jsonPayload"]["message"] = e["jsonPayload"]["message"].replace(
            "0000:a1:00", f"{i >> 8:04x}:{i & 255:02x}:00"
        )
        futures.append(sc.router.pub.publish(sc.router.topic, json.dumps(e).encode()))
    for f in futures:
        f.result(timeout=120)

    def counted() -> Incident | None:
        incs = [i for i in sc.incidents(node) if OTHER in i.get("gpus", {})]
        return incs[-1] if incs and sum(i["counts"]["events"] for i in sc.incidents(node)) >= n else None

    inc: dict[str, Any] = sc.wait(counted, 300, f"{n} lines counted on {node}")
    assert len(inc["gpus"]) == MAX_GPUS + 1  # 32 by name, the rest under "other"
    assert len(json.dumps(inc)) < 64 * 1024
    assert (inc["trust"], inc["workflow"]) == ("unverified", None)
    assert _effects(sc) == before


def _never_printed(sc: Pipeline, node: str, line: str) -> Incident:
    """A kernel-transport journal entry of ``line`` for ``node``, which its kernel never printed, and
    the incident once it stood down (not confirmed: resolved, rejected, the fence lifted)."""
    assert _publish(sc, sc.entry(node, line))  # the sink selects it: it looks like the kernel's own
    return _incident_of(sc, node, _stood_down)


def _stood_down(inc: Incident) -> bool:
    """Issue 35 (5): a fault the node check does not confirm leaves nothing: resolved as rejected."""
    return inc["state"] == "RESOLVED" and bool(inc.get("rejected"))


def test_a_verified_looking_line_the_node_never_printed_disrupts_nothing(sc: Pipeline, job: str) -> None:
    """Issue 21 (1): a journald kernel-transport entry for a live VM, with its real numeric id, written
    through the Logging API (any principal with logging.logEntries.create can). The node is fenced
    and asked through the Slurm agent; its kernel ring buffer never held the line: Pitstop's fence is
    lifted, the incident resolves as not confirmed with a page, the gang is not requeued and Compute
    is never called."""
    (node,) = sc.take()
    calls_before = len(admin(sc.state, "/_admin/state")["calls"])
    restarts = sc.restarts(job)
    inc = _never_printed(sc, node, XID79)
    try:
        _paged(sc, inc["id"])
        assert inc["trust"] == "verified" and "failure" not in inc, inc
        rec = inc["corroboration"]
        assert rec["confirmed"] is False and any("kernel ring buffer" in c for c in rec["checked"]), rec
        assert "not confirmed on the node" in inc["rejected"]["why"]
        assert len(admin(sc.state, "/_admin/state")["calls"]) == calls_before  # no label, no reset
        assert sc.restarts(job) == restarts
        assert "drain" not in sc.slurm.node_states()[node]  # Pitstop's fence lifted: nothing stays
        assert "job_requeued" not in inc["timeline"]
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=sc.slurm.env, check=False
        )


def test_a_five_thousand_digit_pid_is_a_fault_the_node_is_asked_about(sc: Pipeline, job: str) -> None:
    """Issue 22: an Xid whose code is readable is a fault whatever its pid says (left out, flagged),
    so it is no longer dropped as invalid; like any log line it is corroborated before anything is
    disrupted, and this one its node's kernel never printed."""
    (node,) = sc.take()
    before = len(admin(sc.state, "/_admin/state")["calls"]), sc.restarts(job)
    inc = _never_printed(sc, node, XID79.replace("pid='<unknown>'", "pid=" + "7" * 5000))
    try:
        assert (inc["kind"], inc["xid"], inc["trust"]) == ("gpu_xid", 79, "verified"), inc
        assert "implausible fields" in inc["reason"] and "7" * 100 not in json.dumps(inc)  # kept bounded
        assert not inc["corroboration"]["confirmed"] and inc["rejected"], inc
        assert (len(admin(sc.state, "/_admin/state")["calls"]), sc.restarts(job)) == before
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=sc.slurm.env, check=False
        )


def test_a_system_event_published_straight_to_the_topic_restarts_nothing(sc: Pipeline, job: str) -> None:
    """Issue 21 (3): anyone who may publish to the events topic (project Editors, the default Compute
    service account) posts Google's exact preemption shape for a VM that runs on. Compute is asked:
    the VM is not Spot and never stopped, so the incident stands down with a page, the gang stays."""
    (node,) = sc.take()
    calls_before = len(admin(sc.state, "/_admin/state")["calls"])
    restarts = sc.restarts(job)
    _publish(sc, _system_event(sc, node))
    inc = _incident_of(sc, node, lambda i: i["kind"] == "preemption" and _stood_down(i))
    try:
        _paged(sc, inc["id"])
        assert inc["rejected"] and not inc["corroboration"]["confirmed"], inc
        assert len(admin(sc.state, "/_admin/state")["calls"]) == calls_before
        assert sc.restarts(job) == restarts and "job_requeued" not in inc["timeline"]
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=sc.slurm.env, check=False
        )


XID31 = (
    "NVRM: Xid (PCI:0000:b5:00): 31, pid=2512125, name=python3.10, Ch 00000008, MMU Fault: ENGINE GRAPHICS"
)


def test_a_routine_xid_beside_a_forged_fault_confirms_nothing(sc: Pipeline, job: str) -> None:
    """Issue 35 (1): a kernel-transport Xid 79 entry for a healthy node (log-write rights only), and
    beside it a routine Xid 31 that user code does raise (the node's kernel really printed it, on
    another GPU). The node is asked about the Xid that chose the action (79) on its GPU only: the
    real Xid 31 line confirms nothing, the incident stands down with a page and nothing is disrupted."""
    (node,) = sc.take()
    calls_before = len(admin(sc.state, "/_admin/state")["calls"])
    restarts = sc.restarts(job)
    sc.kernel_prints(node, XID31)  # real: the kernel printed it ...
    assert _publish(sc, sc.entry(node, XID79))  # forged: ... this one it never printed
    assert _publish(sc, sc.entry(node, XID31))  # ... and the real one is logged too, absorbed
    inc = _incident_of(sc, node, _stood_down)
    try:
        _paged(sc, inc["id"])
        assert inc["action"] == "REBOOT_NODE" and inc["rejected"], inc
        assert inc["counts"].get("xid_31") == 1, inc["counts"]  # the routine line was in the episode
        rec = inc["corroboration"]
        assert rec["confirmed"] is False and "evidence" not in rec, rec
        assert any("asked for Xid 79 on 1 named GPU" in c for c in rec["checked"]), rec["checked"]
        assert len(admin(sc.state, "/_admin/state")["calls"]) == calls_before  # no label, no reset
        assert sc.restarts(job) == restarts and "job_requeued" not in inc["timeline"]
    finally:
        subprocess.run(
            ["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=sc.slurm.env, check=False
        )


def test_a_backdated_system_event_is_recorded_not_acted_on(sc: Pipeline, job: str) -> None:
    """Issue 35 (3): a publisher to the events topic sends a hostError in Google's exact shape with
    an old timestamp (before the VM was created: its creation fell in the old "around the event"
    window, and Compute confirmed it). Older than corroboration.event_max_age_s when it arrives: a
    WARNING record saying so, no incident, nothing fenced, checked or restarted."""
    (node,) = sc.take()
    calls_before = len(admin(sc.state, "/_admin/state")["calls"])
    restarts = sc.restarts(job)
    e = _system_event(sc, node, methodName="compute.instances.hostError")
    e["operation"]["producer"] = "compute.instances.hostError"
    e["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(CREATED_LONG_AGO - 120))
    assert _publish(sc, e)  # the shipped sink would select it: only its age refuses it
    rec = _ingest_said(sc, e["insertId"], "stale system event recorded, not acted on")
    assert rec["severity"] == "WARNING" and rec["reason"].startswith("stale system event"), rec
    assert rec["node"] == node
    assert not [i for i in sc.incidents(node) if i["kind"] == "host_error"]
    assert len(admin(sc.state, "/_admin/state")["calls"]) == calls_before  # Compute untouched
    assert sc.restarts(job) == restarts and "drain" not in sc.slurm.node_states()[node]
