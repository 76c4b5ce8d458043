"""The whole pipeline on one machine: the fault scenarios, plus fault injection, on one shared stack.

Sink router -> Pub/Sub emulator push -> ingest (functions-framework) -> Firestore emulator ->
Workflows runner -> actuate -> fake Compute + real Slurm via the agent -> notify -> webhook,
with the sweep called by the scheduler stand-in every minute, as in production.

Node use: each test takes nodes no other test was given (Pipeline.take; a node's action
cooldowns and lemon history outlast this module), in file order; the preemption test takes the
stack's one Spot VM. The scenarios are this module's own (tests/pipeline.py drives the
stack); `make demo` runs its own.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.domain import Incident
from pitstop.local import inject
from pitstop.local.stack import PROJECT, ClusterSpec, Stack, WebhookRecord, admin, webhook_records
from pitstop.plugins.channels.pagerduty.local import PATH as PAGERDUTY_PATH
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


def spec() -> ClusterSpec:
    """40 nodes, each test takes its own (Pipeline.take); the fourth a Spot VM (Compute confirms a
    preemption only of a Spot VM)."""
    s = ClusterSpec(nodes=40)
    s.spot = [s.node_names[3]]
    return s


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with stack_up("e2e", spec()) as stack:
        yield stack


@pytest.fixture(scope="module")
def sc(stack: Stack) -> Pipeline:
    """The pipeline actions the tests drive (tests/pipeline.py)."""
    return Pipeline(stack)


# -- one fault each ------------------------------------------------------------------------------


def test_xid79_on_a_running_gang_reboots_the_node_and_requeues_the_gang_once(sc: Pipeline) -> None:
    sc.settle()
    a, b = sc.take(2)
    job = sc.job([a, b])
    sc.fault(a, XID79)
    inc = sc.finished(a)
    notes = sc.wait(lambda: sc.notes_for(inc["id"]), 30, "the notification")
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert len(sc.calls("reset", a)) == 1
    assert sc.restarts(job) == 1  # requeued once, as a whole
    assert not sc.drained(a)  # back in service
    assert len(notes) == 1


def test_an_xid13_storm_is_one_application_fault_and_no_node_action(sc: Pipeline) -> None:
    (node,) = sc.take()
    for e in [sc.entry(node, XID13) for _ in range(300)]:
        sc.router.publish(e)
    inc = sc.finished(node)
    sc.all_counted(node, "xid_13", 300)  # every straggler of the storm delivered: none opened another
    notes = sc.wait(lambda: sc.notes_for(inc["id"]), 30, "the notification")
    assert len(sc.incidents(node)) == 1
    assert sc.counted(node, "xid_13") == 300
    assert inc["action"] == "RESTART_JOB"
    assert not inc["timeline"].get("fenced") and not sc.calls("reset", node)
    assert not sc.drained(node)
    assert len(notes) == 1  # to the job owner


def test_a_spot_preemption_is_rescheduled_on_the_recreated_vm(sc: Pipeline) -> None:
    sc.settle()
    (a,), (b,) = sc.take(spot=True), sc.take()
    job = sc.job([a, b])
    before = inject.instance(sc.state, a)["id"]
    sc.router.publish(inject.preempt(sc.state, a))
    inc = sc.finished(a)
    after = inject.instance(sc.state, a)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "RESCHEDULE_JOB")
    assert after["id"] != before and after["status"] == "RUNNING"  # the MIG recreated it
    assert sc.restarts(job) >= 1
    assert not sc.drained(a)


def test_upcoming_maintenance_checkpoints_and_drains_before_the_window(sc: Pipeline) -> None:
    from pitstop.core.timefmt import to_epoch

    sc.settle()
    (node,) = sc.take()
    marker = sc.slurm.workdir / f"checkpoint-{uuid.uuid4().hex[:6]}"
    job = sc.job([node], f"trap 'touch {marker}; exit 0' USR1; sleep 3600 & wait")
    entry = inject.maintenance(sc.state, node)
    sc.router.publish(entry)
    inc = sc.finished(node, timeout=120)
    window = to_epoch(entry["protoPayload"]["metadata"]["windowStartTime"]) or 0
    assert (inc["state"], inc["action"]) == ("RESOLVED", "DRAIN_NODE")
    assert marker.exists()  # the job checkpointed on SIGUSR1
    assert (inc["timeline"].get("fenced") or 1e18) < window  # drained before the window
    assert len(sc.calls("perform_maintenance", node)) == 1
    assert sc.restarts(job) >= 1
    assert not sc.drained(node)  # resumed


def test_a_duplicate_storm_is_one_incident_and_one_reset(sc: Pipeline) -> None:
    sc.settle()
    (node,) = sc.take()
    dup = sc.entry(node, XID48, insert_id="dup-48-" + uuid.uuid4().hex[:6])
    burst = [sc.entry(node, XID94) for _ in range(500)]  # logged within moments; delivered after
    sc.kernel_prints(node, XID48)
    sc.kernel_prints(node, XID94)
    for _ in range(20):
        sc.router.publish(dup)
    for e in burst:
        sc.router.publish(e)
    inc = sc.finished(node)
    sc.all_counted(node, "xid_94", 500)  # every straggler of the storm delivered: none opened another
    assert (inc["state"], inc["action"]) == ("RESOLVED", "RESET_GPU")
    assert len(sc.calls("reset", node)) == 1
    assert len(sc.incidents(node)) == 1
    assert sc.counted(node, "xid_48") == 1  # the 20 copies of one line count once
    assert sc.counted(node, "xid_94") == 500


def test_a_lemon_host_is_replaced_once_the_diagnostic_confirms_it(sc: Pipeline) -> None:
    sc.settle()
    (node,) = sc.take()
    inject.lemon_history(sc.db, node)
    sc.gpu_state(node, {"nvlink_down": [2]})  # what the diagnostic on the fenced node finds
    sc.fault(node, XID48)
    inc = sc.finished(node, timeout=120)
    reports = sc.calls("report_host_as_faulty", node)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REPLACE_NODE")
    assert len(reports) == 1 and not sc.calls("reset", node)
    assert (inc.get("diagnosis") or {}).get("confirmed") is True


def test_the_blast_radius_budget_holds_the_fault_beyond_it_and_pages_once(sc: Pipeline) -> None:
    sc.settle()
    budgets = json.loads(Path(sc.state.workdir, "policy.yaml").read_text())["budgets"]
    b = budgets["cluster"]
    cap = min(b["max_nodes"], max(1, math.ceil(len(sc.nodes) * b["max_percent"] / 100)))
    targets = sc.take(cap + 1)  # one more than the budget allows
    before, pd_before, t0 = (
        len(webhook_records(sc.state)),
        len(webhook_records(sc.state, PAGERDUTY_PATH)),
        time.monotonic(),
    )
    last_before = {n: _last_xid79(sc, n) for n in targets}
    for n in targets:
        sc.fault(n, XID79)

    def settled() -> list[Incident] | None:
        out = []
        for n in targets:  # each node's episode has taken this Xid 79 (a new incident or a raised one)
            last = sc.incidents(n)[-1:]
            if (
                not last
                or _last_xid79(sc, n) == last_before[n]
                or last[0]["state"] not in ("RESOLVED", "HELD", "FAILED")
            ):
                return None
            out.append(last[0])
        return out

    incs: list[dict[str, Any]] = sc.wait(settled, 120, f"all {len(targets)} incidents to settle")
    # held by the budget, now or earlier (the window slides and the sweep releases a held incident)
    held = [i for i in incs if i["state"] == "HELD" or i.get("holds")]
    done = [i for i in incs if i["state"] == "RESOLVED" and not i.get("holds")]
    assert len(done) == cap and len(held) == len(targets) - cap, incs

    def pages() -> list[WebhookRecord]:
        return [w for w in webhook_records(sc.state)[before:] if "blast-radius budget" in w["body"]["text"]]

    def alerts() -> list[WebhookRecord]:  # the same page on the second channel: a PagerDuty trigger
        sent = webhook_records(sc.state, PAGERDUTY_PATH)[pd_before:]
        return [
            w
            for w in sent
            if w["body"]["event_action"] == "trigger"
            and "blast-radius budget" in w["body"]["payload"]["summary"]
        ]

    sc.wait(lambda: pages() and len(alerts()) == len(pages()), 30, "the page on both channels")
    # one page per budget window while incidents are held (engine.try_claim's paged_until), never one per try
    windows = 1 + int((time.monotonic() - t0) / float(budgets["window_s"]))
    assert 1 <= len(pages()) == len(alerts()) <= windows


def _last_xid79(sc: Pipeline, node: str) -> tuple[str | None, int]:
    last = sc.incidents(node)[-1:]
    return (last[0]["id"], last[0]["counts"].get("xid_79", 0)) if last else (None, 0)


def test_a_poison_message_is_dead_lettered_and_the_event_beside_it_flows(sc: Pipeline) -> None:
    dead, flowed = inject.poison_beside(sc, sc.take()[0], XID13)
    assert dead[0].message.data == inject.POISON
    assert [i for i in flowed if i["action"] == "RESTART_JOB"]


# -- back to training at once; diagnose; validate --------------------------------------------------------


def test_xid79_with_a_spare_the_gang_runs_again_before_the_node_is_back(sc: Pipeline) -> None:
    sc.settle()
    job, held = sc.job_among(2, sc.take(3))
    bad = held[0]
    sc.fault(bad, XID79)
    inc = sc.finished(bad, timeout=150)
    now_on = sc.slurm.job_nodes(job)
    resume_s, repair_s = sc.resume_and_repair(inc)
    sc.slurm.cancel(job)
    assert inc["state"] == "RESOLVED"
    assert (inc.get("resume") or {}).get("mode") == "early", inc
    assert sc.restarts(job) == 1
    assert bad not in now_on and len(now_on) == 2, now_on
    assert resume_s is not None and repair_s is not None and resume_s < repair_s, (resume_s, repair_s)
    val = inc.get("validation") or {}
    assert val.get("passed") and val.get("busbw_gbps") == 190.0, val


def test_a_lemon_with_a_spare_resumes_within_a_minute_while_the_host_report_takes_ten(sc: Pipeline) -> None:
    sc.settle()
    job, held = sc.job_among(2, sc.take(3))
    bad = held[0]
    inject.lemon_history(sc.db, bad)
    sc.gpu_state(bad, {"remap": "failure", "remap_gpu": 1})  # what the diagnostic will find
    sc.fault(bad, XID48)
    inc = sc.finished(bad, timeout=180)
    reports = sc.calls("report_host_as_faulty", bad)
    now_on = sc.slurm.job_nodes(job)
    resume_s, repair_s = sc.resume_and_repair(inc)
    sc.slurm.cancel(job)
    diagnosis = inc.get("diagnosis") or {}
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REPLACE_NODE")
    assert diagnosis.get("confirmed"), diagnosis
    assert "row" in diagnosis["why"].lower() or "remap" in diagnosis["why"].lower(), diagnosis
    assert len(reports) == 1 and "diagnostic" in reports[0]["body"]["faultReasons"][0]["description"]
    assert (inc.get("resume") or {}).get("mode") == "early" and bad not in now_on, (inc, now_on)
    assert (inc.get("validation") or {}).get("passed"), inc
    assert resume_s is not None and resume_s <= 60, resume_s
    assert repair_s is not None and repair_s >= 600, repair_s


def test_a_reset_node_that_fails_validation_is_replaced_once_the_diagnostic_confirms_it(sc: Pipeline) -> None:
    sc.settle()
    (node,) = sc.take()
    sc.gpu_state(node, {"busbw": 120, "nvlink_down": [3]})  # an NVLink link down
    sc.fault(node, XID79)
    inc = sc.finished(node, timeout=180)
    failed = [m for m in inc.get("measured", []) if m.get("kind") == "validate" and not m.get("passed")]
    assert inc["state"] == "RESOLVED"
    assert ("REBOOT_NODE", "REPLACE_NODE") in [(e["from"], e["to"]) for e in inc.get("escalations", [])]
    assert len(sc.calls("reset", node)) == 1 and len(sc.calls("report_host_as_faulty", node)) == 1
    assert failed and failed[0].get("busbw_gbps") == 120.0, inc.get("measured")
    peers = failed[0].get("nccl_peers") or []  # measured against two different peers, each degraded
    assert len({p.get("peer") for p in peers}) == 2, peers
    assert all(p.get("verdict") == "degraded" for p in peers), peers
    assert (inc.get("validation") or {}).get("passed"), inc  # the new host
    assert (inc.get("diagnosis") or {}).get("confirmed") is True


def test_a_replace_the_diagnostic_does_not_confirm_steps_down_to_a_reboot(sc: Pipeline) -> None:
    sc.settle()
    (node,) = sc.take()
    inject.lemon_history(sc.db, node)
    sc.fault(node, XID48)
    inc = sc.finished(node, timeout=150)
    assert (inc["state"], inc["action"]) == ("RESOLVED", "REBOOT_NODE")
    assert (inc.get("diagnosis") or {}).get("confirmed") is False
    assert len(sc.calls("reset", node)) == 1 and not sc.calls("report_host_as_faulty", node)
    assert (inc.get("validation") or {}).get("passed"), inc


def test_with_no_spare_the_gang_is_requeued_once_the_node_is_back_and_the_incident_says_why(
    sc: Pipeline,
) -> None:
    sc.settle()
    job, held = sc.job_among(2, sc.take(2))
    bad = held[0]
    sc.fault(bad, XID79)
    inc = sc.finished(bad, timeout=150)
    restarts = sc.restarts(job)
    sc.slurm.cancel(job)
    tl, resume = inc["timeline"], inc.get("resume") or {}
    waiting = resume.get("waiting") or []
    assert inc["state"] == "RESOLVED" and resume.get("mode") == "after_repair", inc
    assert waiting and "not enough healthy capacity" in waiting[0]["why"], resume
    # requeued once the node was repaired (to free it for its validation), running once it was back
    assert tl.get("job_requeued", 0) >= (tl.get("healthy") or 1e18), tl
    assert tl.get("job_running", 0) >= (tl.get("validated") or 1e18), tl
    assert restarts == 1


# -- faults in the pipeline itself -------------------------------------------------------------------


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
