"""The whole pipeline on one machine: one fault each, on one shared stack (injected failures:
tests/e2e/test_e2e_chaos.py, on a stack of its own).

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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pitstop.core.domain import Incident
from pitstop.local import inject
from pitstop.local.stack import ClusterSpec, Stack, WebhookRecord, webhook_records
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
