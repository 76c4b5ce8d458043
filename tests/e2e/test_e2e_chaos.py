"""The pipeline under injected failure, on its own stack: a Compute API answering 503 or rate
limits, the webhook down, Firestore restarted mid-incident, actuate dying after its effect, the
agent away, gang members far apart, a publish timing out at close, hostile or fatal lines on a gang.

Each test takes nodes no other test was given (Pipeline.take) and the module's stack is its own, so
these long waits run beside tests/e2e/test_e2e.py (one fault each) instead of after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.domain import Incident
from pitstop.local.stack import PROJECT, ClusterSpec, Stack, admin, webhook_records
from tests.pipeline import XID79, Pipeline, stack_up

XID48 = (
    "NVRM: Xid (PCI:0000:1b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error "
    "(DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0."
)
XID94 = (
    "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
)
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
    "(GPC 1, TPC 3, SM 0): Out Of Range Address"
)

pytestmark = pytest.mark.emulator


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with stack_up("e2e-chaos", ClusterSpec(nodes=20)) as stack:
        yield stack


@pytest.fixture(scope="module")
def sc(stack: Stack) -> Pipeline:
    """The pipeline actions the tests drive (tests/pipeline.py)."""
    return Pipeline(stack)


def _fault(sc: Pipeline, node: str) -> Incident:
    sc.settle()
    sc.fault(node, XID79)
    return sc.finished(node)


def test_actuate_answering_503_twice_is_retried(sc: Pipeline) -> None:
    (node,) = sc.take()
    admin(sc.state, "/_admin/inject", {"method": "reset", "code": 503, "reason": "backendError", "count": 2})
    inc = _fault(sc, node)
    assert inc["state"] == "RESOLVED"
    assert len(sc.calls("reset", node)) == 3


def test_compute_rate_limit_is_backed_off(sc: Pipeline) -> None:
    (node,) = sc.take()
    admin(
        sc.state,
        "/_admin/inject",
        {"method": "reset", "code": 403, "reason": "rateLimitExceeded", "count": 1},
    )
    inc = _fault(sc, node)
    assert inc["state"] == "RESOLVED"
    assert len(sc.calls("reset", node)) == 2


def test_webhook_down_does_not_block_remediation(sc: Pipeline) -> None:
    (node,) = sc.take()
    hook = sc.state.endpoints["webhook"].rsplit("/", 1)[0]
    urllib.request.urlopen(urllib.request.Request(hook + "/_down", data=b"{}", method="POST"), timeout=5)
    try:
        inc = _fault(sc, node)
        assert inc["state"] == "RESOLVED"  # remediation finished while the webhook was down
        refused = Path(sc.state.workdir, "webhook-refused.jsonl")
        sc.wait(
            lambda: refused.exists() and str(inc["id"]) in refused.read_text(),
            60,
            "a delivery the webhook refused",
        )
        assert not sc.notes_for(str(inc["id"]))  # tried while down, and so not delivered
    finally:
        urllib.request.urlopen(urllib.request.Request(hook + "/_up", data=b"{}", method="POST"), timeout=5)
    notes = sc.wait(lambda: sc.notes_for(str(inc["id"])), 60, "the notification after the webhook returned")
    assert len(notes) == 1
    metrics = [json.loads(x) for x in Path(sc.state.workdir, "metrics.jsonl").read_text().splitlines()]
    assert any(m["type"].endswith("/incidents_resolved") for m in metrics)
    assert any(m["type"].endswith("/time_to_remediate_s") for m in metrics)
    assert webhook_records(sc.state)


def test_firestore_restarted_mid_incident_completes_exactly_once(sc: Pipeline) -> None:
    (node,) = sc.take()
    sc.settle()
    sc.fault(node, XID79)
    sc.wait(
        lambda: [i for i in sc.incidents(node) if i["state"] in ("FENCED", "ACTING", "VERIFYING")],
        60,
        "the incident to be under way",
    )
    sc.stack.restart_firestore(down_s=3.0)  # every function and the agent lose Firestore for a while
    inc = sc.wait(
        lambda: next((i for i in sc.incidents(node)[-1:] if i["state"] in ("RESOLVED", "FAILED")), None),
        180,
        "the incident to finish after the restart",
    )
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len([i for i in sc.incidents(node) if i["action"] in ("REBOOT_NODE", "REPLACE_NODE")]) == 1
    # A call whose answer was lost to the outage may be made again, always under its request id,
    # which Compute (the fake, as the real API) answers with the first operation: one effect.
    calls = sc.calls("reset", node) + sc.calls("report_host_as_faulty", node)
    assert len({c["request_id"] for c in calls}) == 1 and calls[0]["request_id"], calls
    assert len(_effects(sc, node, "reset")) + len(_effects(sc, node, "report_host_as_faulty")) == 1


# -- chaos: the failures `pitstop local chaos` rehearses ------------------------------------------


# These wait through outages and virtual minutes by design (and the first may also start the stack).
LONG = pytest.mark.timeout(1200)


def _local(sc: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    """`pitstop local ...` against this module's stack, from another process, as a user runs it."""
    argv = [sys.executable, "-m", "pitstop.tools.cli", "local", *args, "--workdir", sc.state.workdir]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)


def _chaos(sc: Pipeline, *args: str) -> None:
    proc = _local(sc, "chaos", *args)
    assert proc.returncode == 0, proc.stderr


def _reported(sc: Pipeline, iid: str) -> dict[str, Any]:
    """The incident as `pitstop local status --json` reports it (state, action, effects)."""
    proc = _local(sc, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    found: dict[str, Any] = next(i for i in json.loads(proc.stdout)["incidents"] if i["id"] == iid)
    return found


def _effects(sc: Pipeline, node: str, method: str) -> list[dict[str, Any]]:
    """What the fake Compute did to the VM (a request id seen before is not a second effect)."""
    return [
        e
        for e in admin(sc.state, "/_admin/state")["effects"]
        if e["method"] == method and node in e["instances"]
    ]


def _executions_done(sc: Pipeline, iid: str) -> bool:
    from google.cloud.workflows import executions_v1

    from pitstop.adapters.workflows import make_client

    client = make_client(sc.state.endpoints["executions"])
    parent = client.workflow_path(PROJECT, "us-central1", "pitstop-remediate")
    found = list(
        client.list_executions(request={"parent": parent, "filter": f'labels.pitstop-incident="{iid}"'})
    )
    return bool(found) and all(e.state != executions_v1.Execution.State.ACTIVE for e in found)


def _ended(sc: Pipeline, node: str, timeout: float) -> Incident:
    """The node's last incident once it is RESOLVED or FAILED and no execution of it still runs."""

    def ended() -> Incident | None:
        last = sc.incidents(node)[-1:]
        if not last or last[0]["state"] not in ("RESOLVED", "FAILED"):
            return None
        return sc.incidents(node)[-1] if _executions_done(sc, last[0]["id"]) else None

    inc: Incident = sc.wait(ended, timeout, f"the incident on {node} to end")
    return inc


def _settle(sc: Pipeline) -> None:
    """``sc.settle()``, except for the slots of FAILED incidents: a failed remediation keeps its node
    fenced and its budget slot until a person closes it, so one failed test must not stall the next."""
    window = float(json.loads(Path(sc.state.workdir, "policy.yaml").read_text())["budgets"]["window_s"])

    def clear() -> bool:
        now = time.time()
        live = {
            iid
            for d in sc.db.collection("pitstop_budgets").stream()
            for iid, slot in ((d.to_dict() or {}).get("slots") or {}).items()
            if slot.get("active") or now - slot["at"] < window
        }
        failed = {
            d.id
            for d in sc.db.collection("pitstop_incidents").stream()
            if (d.to_dict() or {}).get("state") == "FAILED"
        }
        return live <= failed

    sc.wait(clear, window + 120, "the blast-radius window to clear")


@LONG
def test_actuate_dying_after_a_reset_resets_exactly_once(sc: Pipeline) -> None:
    """actuate resets the VM and its instance dies before answering; the retry must not reset again."""
    (node,) = sc.take()
    assert sc.stack.controller is not None
    restarts = sc.stack.controller.restarts["actuate"]
    _settle(sc)
    _chaos(sc, "actuate-crash-after-effect", "--node", node, "--method", "reset")
    sc.fault(node, XID79)
    inc = _ended(sc, node, 300)
    assert sc.stack.controller.restarts["actuate"] > restarts, "actuate never died: the fault did not fire"
    assert len(_effects(sc, node, "reset")) == 1
    assert inc["state"] == "RESOLVED", inc.get("failure")
    reported = _reported(sc, inc["id"])
    assert (reported["state"], reported["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert reported["effects"]["compute"] == {"reset": 1}
    assert reported["effects"]["slurm"].get("drain") == 1


# The agent's outage, in real seconds. What it models: the Slurm controller's agent is away for the
# first two minutes of an incident, so fence cannot drain. actuate waits up to 20 s (real) for each
# command's answer, then asks the workflow to retry (503); the workflow's backoff (2, 4, 8 ... 60 s,
# 8 retries) runs at the stack's workflow time scale (x0.1), so locally the retry budget is about
# 9 x 20 s + 24 s = 204 s against about 7 min in production: two real minutes here use more of the
# budget than two minutes would in production, so a shorter real outage would model less, not more.
AGENT_OUTAGE_S = 120.0


@LONG
def test_agent_down_for_two_minutes_then_back_resolves(sc: Pipeline) -> None:
    (node,) = sc.take()
    _settle(sc)
    _chaos(sc, "agent-down")
    try:
        sc.fault(node, XID79)
        sc.wait(lambda: sc.incidents(node), 60, "the incident to open")
        time.sleep(AGENT_OUTAGE_S)  # the outage itself (what is modelled), not a claim about speed
        during = sc.incidents(node)[-1]
        assert during["state"] not in ("FENCED", "ACTING", "VERIFYING", "RESOLVED"), (
            "drained without an agent"
        )
    finally:
        _chaos(sc, "agent-up")
    inc = _ended(sc, node, 300)
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len(_effects(sc, node, "reset")) == 1
    assert "drain" not in sc.slurm.node_states().get(node, "")


def _scontrol(sc: Pipeline, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=sc.slurm.env, check=True, capture_output=True)


def _gang(sc: Pipeline, members: list[str], spare: str) -> str:
    """A two-node job on ``members`` that may move to ``spare`` (and nowhere else) when requeued.

    Its script ignores the checkpoint signal, so a drain's checkpoint wait runs its full length.
    The spare is held (drained, as someone else would) until the job runs, so it starts on the members.
    """
    others = [n for n in sc.nodes if n not in (*members, spare)]
    _scontrol(sc, "update", f"NodeName={spare}", "State=DRAIN", "Reason=e2e-hold")
    try:
        argv = ["sbatch", "--parsable", "--requeue", "-J", "gang", "-o", "/dev/null", "-N", "2"]
        argv += ["-x", ",".join(others), "--wrap", "trap '' USR1; sleep 3600"]
        job = subprocess.run(
            argv, env=sc.slurm.env, capture_output=True, text=True, check=True, cwd=sc.slurm.workdir
        ).stdout.strip()
        sc.wait(lambda: _job(sc, job).get("state") == "RUNNING", 30, f"job {job} to run")
    finally:
        _scontrol(sc, "update", f"NodeName={spare}", "State=RESUME")
    return job


def _job(sc: Pipeline, job: str) -> dict[str, str]:
    return next((j for j in sc.slurm.jobs() if j["id"] == job), {})


def _job_nodes(sc: Pipeline, job: str) -> set[str]:
    argv = ["scontrol", "show", "hostnames", _job(sc, job).get("nodes", "")]
    return set(
        subprocess.run(argv, env=sc.slurm.env, capture_output=True, text=True, check=True).stdout.split()
    )


@LONG
def test_gang_members_remediated_ten_minutes_apart_requeue_the_job_once(sc: Pipeline) -> None:
    """One gang run, two members hit: the run is requeued once, not once per member.

    a gets an upcoming-maintenance notice: its drain checkpoints the job and waits for it to leave
    a (up to ten minutes of the workflow's virtual time; the script ignores the signal). Meanwhile
    b hits Xid 79: its reboot finishes first and requeues the gang, which restarts on b and the
    spare. a's remediation then goes on and reaches its own reschedule, either while the gang
    waits to restart or once it runs again; in both orders the run a fenced was already requeued,
    so a must not requeue it again (a gang moves once per fault, keyed by the job's run, not by a
    timer or by which member finished first).
    """
    a, b, spare = sc.take(3)
    _settle(sc)
    job = _gang(sc, [a, b], spare)
    assert _job_nodes(sc, job) == {a, b}
    notice = admin(
        sc.state,
        "/_admin/maintenance",
        {"project": PROJECT, "zone": "us-central1-a", "instance": a, "starts_in_s": 900},
    )
    sc.router.publish(notice)
    sc.wait(lambda: [i for i in sc.incidents(a) if i["state"] == "FENCED"], 60, f"{a} to be fenced")
    sc.fault(b, XID79)
    inc_b = _ended(sc, b, 180)
    assert inc_b["state"] == "RESOLVED", inc_b.get("failure")
    assert sc.restarts(job) == 1
    sc.wait(lambda: _job(sc, job).get("state") == "RUNNING", 180, "the gang to run again")
    assert len(_job_nodes(sc, job)) == 2  # on healthy nodes: a too, if its maintenance already ended
    inc_a = _ended(sc, a, 600)
    assert inc_a["state"] == "RESOLVED", inc_a.get("failure")
    assert inc_a["action"] == "DRAIN_NODE"
    assert sc.restarts(job) == 1, "the restarted gang was requeued again"
    assert _reported(sc, inc_b["id"])["effects"]["slurm"].get("requeue") == 1
    assert "requeue" not in _reported(sc, inc_a["id"])["effects"]["slurm"]


def _outbox_sent(sc: Pipeline, iid: str) -> bool:
    """Every outbox entry about the incident reached the topic (the sweep has none left to re-send)."""
    entries = [d.to_dict() or {} for d in sc.db.collection("pitstop_outbox").stream()]
    mine = [e for e in entries if iid in json.dumps(e.get("notification"), default=str)]
    return bool(mine) and all(e.get("sent") for e in mine)


@LONG
def test_publish_timeout_at_close_keeps_the_incident_resolved(sc: Pipeline) -> None:
    """The resolution notice's publish times out after the incident was resolved: it stays RESOLVED,
    and the notice still goes out once."""
    (node,) = sc.take()
    _settle(sc)
    _chaos(sc, "publish-timeout", "--node", node)
    sc.fault(node, XID79)
    inc = _ended(sc, node, 180)
    assert not (sc.stack.chaos_dir / "publish-timeout.json").exists(), "the publish never timed out"
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert len(_effects(sc, node, "reset")) == 1
    sc.wait(lambda: _outbox_sent(sc, str(inc["id"])), 180, "the resolution notice re-sent by the sweep")
    notes = sc.wait(lambda: sc.notes_for(inc["id"]), 60, "the resolution notice delivered")
    assert len(notes) == 1  # every entry sent: nothing left for the sweep to send again
    assert "FAILED" not in notes[0]["body"]["text"]
    assert sc.incidents(node)[-1]["state"] == "RESOLVED"


# -- driver lines a stricter parser once dropped (issue 22), through the whole pipeline -------------

# A journald Xid 79 whose pid is beyond Linux's PID_MAX_LIMIT: the fault stands, the pid is left out.
XID79_ODD_PID = "NVRM: Xid (PCI:0000:a1:00): 79, pid=15822503, name=python3, GPU has fallen off the bus."
# A fatal NVSwitch error as the NVSwitch driver prints it (Fabric Manager user guide: reset the node).
SXID_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error"


def _gang_fault(sc: Pipeline, members: list[str], spare: str, line: str) -> tuple[str, Incident]:
    """A two-node gang runs on ``members``; the kernel of the first logs ``line``. The gang's job and
    the first member's incident once it ended."""
    _settle(sc)
    job = _gang(sc, members, spare)
    assert _job_nodes(sc, job) == set(members)
    sc.fault(members[0], line)  # the kernel prints it (what corroboration reads), the agent ships it
    return job, _ended(sc, members[0], 300)


@LONG
def test_xid79_with_an_eight_digit_pid_on_a_running_gang_is_remediated(sc: Pipeline) -> None:
    a, b, spare = sc.take(3)
    job, inc = _gang_fault(sc, [a, b], spare, XID79_ODD_PID)
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert (inc["kind"], inc["xid"], inc["action"]) == ("gpu_xid", 79, "REBOOT_NODE")
    assert "implausible fields" in inc["reason"]
    assert (inc.get("corroboration") or {}).get("confirmed") is True, inc.get("corroboration")
    assert len(_effects(sc, a, "reset")) == 1
    assert sc.restarts(job) == 1
    assert _reported(sc, inc["id"])["effects"]["slurm"].get("requeue") == 1
    sc.wait(lambda: _job(sc, job).get("state") == "RUNNING", 180, "the gang to run again")
    assert len(_job_nodes(sc, job)) == 2 and sc.restarts(job) == 1


@LONG
def test_a_fatal_sxid_on_a_gang_member_fences_the_node_and_restarts_the_gang_once(sc: Pipeline) -> None:
    a, b, spare = sc.take(3)
    job, inc = _gang_fault(sc, [a, b], spare, SXID_FATAL)
    assert inc["state"] == "RESOLVED", inc.get("failure")
    assert (inc["kind"], inc["xid"], inc["action"]) == ("nvswitch_sxid", None, "REBOOT_NODE")
    assert inc["timeline"].get("fenced") and inc["counts"] == {"events": 1, "sxid_24007": 1}
    proof = inc.get("corroboration") or {}  # the node's own ring buffer holds the SXid: believed
    assert proof.get("confirmed") is True and "SXid 24007" in proof.get("why", ""), proof
    reported = _reported(sc, inc["id"])
    assert reported["effects"]["slurm"].get("drain") == 1 and reported["effects"]["slurm"].get("requeue") == 1
    assert len(_effects(sc, a, "reset")) == 1
    sc.wait(lambda: _job(sc, job).get("state") == "RUNNING", 180, "the gang to run again")
    assert sc.restarts(job) == 1, "the gang was restarted more than once"
