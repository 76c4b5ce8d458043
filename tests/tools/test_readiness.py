"""`pitstop report --readiness` on the demo's faults recorded in observe mode: the real classifier and
engine decide each one into the memory store over ten days, as the functions would have; the report
says what enforce would have done with each, its evidence, its jobs and the GPU-hours at stake, and
checks the README's criteria for enforce."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import control, policy
from pitstop.core.aggregate import CloseByPerson
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.services.sweep import close_bursts
from pitstop.tools import cli
from pitstop.tools import readiness as rd
from tests.helpers import (
    hand_edit,
    load_fixture,
    ops_agent_entry,
    retarget_system_event,
    syslog_entry,
    system_event_entry,
)

DAY = 86400.0
NOW = 1_800_000_000.0
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
TRAIN = {"name": "train", "scheduler": "slurm", "size": 33, "match": {"name_pattern": "a3-node-*"}}
POLICY = policy.from_doc({"mode": "observe", "clusters": [TRAIN], "budgets": {"cluster": {"max_nodes": 2}}})
CLF = Classifier.default()


def _at(e: FaultEvent, at: float) -> FaultEvent:
    e["_observed_ts"] = at
    return e


def xid(line: str, node: str, at: float, syslog: bool = False) -> FaultEvent:
    make = syslog_entry if syslog else ops_agent_entry
    return _at(CLF.classify(make(line, instance=node, insert_id=uuid.uuid4().hex)), at)


def system(case: str, node: str, at: float) -> FaultEvent:
    c = next(c for c in load_fixture("system_events.yaml") if c["id"] == case)
    entry = retarget_system_event(system_event_entry(c), node)
    entry["insertId"] = uuid.uuid4().hex
    return _at(CLF.classify(entry), at)


class History:
    """The demo's faults (schemas/demo-scenarios.yaml), each decided in observe mode when it came."""

    def __init__(self, pol: policy.Policy = POLICY) -> None:
        self.store, self.pol = MemoryStore(), pol
        self.ids: dict[str, str] = {}

    def fault(self, name: str, ev: FaultEvent, pol: policy.Policy | None = None) -> None:
        at = float(ev["_observed_ts"])
        out = self.store.apply(ev, pol or self.pol, at)
        if out.incident is not None:
            self.ids.setdefault(name, out.incident["id"])
        close_bursts(self.store, at + 1)  # the sweep ends the bursts of earlier episodes

    def demo(self) -> History:
        self.fault("xid79", xid(XID79, "a3-node-000", NOW - 9 * DAY))
        for n in range(300):  # the storm: one application fault
            self.fault("xid13", xid(XID13, "a3-node-002", NOW - 8 * DAY + n * 0.01))
        self.fault("preemption", system("preempted", "a3-node-003", NOW - 7 * DAY))
        self.fault("maintenance", system("upcoming-maintenance-pending", "a3-node-005", NOW - 6 * DAY))
        for i, node in enumerate(("a3-node-020", "a3-node-021", "a3-node-022")):  # beyond the budget of 2
            self.fault(f"blast{i}", xid(XID79, node, NOW - 5 * DAY + i))
        self.fault("syslog", xid(XID79, "a3-node-009", NOW - 4 * DAY, syslog=True))  # no journald config
        doc, _ = control.silence(None, "node", "a3-node-010", 3600, {"by": "alice", "at": NOW - 3 * DAY,
                                                                      "reason": "firmware roll"})  # fmt: skip
        self.fault(
            "silenced",
            xid(XID79, "a3-node-010", NOW - 3 * DAY + 60),
            self.pol.with_control(control.Control.of(doc)),
        )
        held = self.ids["blast2"]  # a person closed the held one two hours after it was detected
        detected = cast(Any, self.store.get(held))["timeline"]["detected"]
        self.store.decide(held, CloseByPerson("bob", unfence=False), None, detected + 2 * 3600)
        close_bursts(self.store, NOW)
        return self

    def report(self, days: float = 14, **kw: Any) -> rd.Readiness:
        return rd.build(self.store.query(), self.pol, NOW, days, **kw)


@pytest.fixture(scope="module")
def history() -> History:
    return History().demo()


def rows(r: rd.Readiness) -> dict[str, rd.Would]:
    return {w.id: w for c in r.clusters for w in c.incidents}


def test_each_incident_says_what_enforce_would_have_done_with_its_evidence(history: History) -> None:
    got = rows(history.report())
    by = {name: got[iid] for name, iid in history.ids.items()}
    assert len(got) == len(set(history.ids.values())) == 9
    x79 = by["xid79"]
    assert x79.enforce == "REBOOT_NODE (remediate)" and "act: instances.reset" in x79.steps
    assert x79.evidence == "the kernel's own journal line (verified)"
    assert x79.checked.startswith("not checked (observe mode runs no node check)") and "Xid 79" in x79.checked
    assert by["xid13"].checked == "no check: nothing on the node would be disrupted"
    assert x79.jobs.startswith("the jobs on a3-node-000 then: not read in observe mode")
    assert (
        "GPU-hours" not in x79.hours_why and x79.gpus == 8 and x79.gpu_hours is None
    )  # ended, no one closed it
    assert by["xid13"].enforce == "RESTART_JOB: the job's owner is told, nothing on the node"
    assert by["xid13"].jobs == "none" and by["xid13"].gpus is None
    pre = by["preemption"]
    assert pre.evidence == "a Compute Engine system event (preemption)"
    assert "instances.get" in pre.checked and "a Spot VM stopped, restarted or recreated since" in pre.checked
    assert (
        by["maintenance"].enforce == "DRAIN_NODE (drain)"
        and "upcomingMaintenance" in by["maintenance"].checked
    )
    assert by["blast1"].enforce.startswith("REBOOT_NODE") and by["blast2"].outcome == "closed by a person"
    assert by["blast2"].enforce == "held, not started; bob closed it"  # the budget of two nodes held it
    assert by["blast2"].gpu_hours == 16.0 and by["blast2"].hours_why == "until bob closed it"  # 8 GPUs x 2 h
    assert by["syslog"].evidence.startswith(
        "text syslog only (unverified): enforce would only record and page"
    )
    assert by["syslog"].enforce == "nothing: a record"  # the engine lowered it: a forged line starts nothing
    assert (
        by["silenced"].enforce.startswith("nothing: silenced (node a3-node-010")
        and "firmware roll" in by["silenced"].enforce
    )


def test_the_readme_criteria_are_checked(history: History) -> None:
    (train,) = history.report().clusters
    c = {x.n: x for x in train.criteria}
    assert [x.n for x in train.criteria] == [1, 2, 3, 4, 5]
    assert c[1].status == "fail" and "a3-node-009" in c[1].finding  # its Xids came as text syslog
    assert c[2].status == "check" and "judge each of the" in c[2].finding
    assert c[3].status == "pass"
    assert c[4].status == "check" and "pitstop-slurm-agent" in c[4].finding
    assert c[5].status == "check" and not train.ready
    short = {x.n: x for x in history.report(days=3).clusters[0].criteria}
    assert short[2].status == "fail" and "covers 3 days" in short[2].finding


def test_a_failed_incident_or_an_unpublished_page_fails_criterion_3() -> None:
    h = History()
    h.fault("a", xid(XID79, "a3-node-000", NOW - DAY))
    hand_edit(
        h.store,
        h.ids["a"],
        lambda d: d.update({"state": "FAILED", "failure": {"stage": "fence", "error": "x"}}),
    )
    (train,) = h.report().clusters
    assert [x.status for x in train.criteria if x.n == 3] == ["fail"]
    (quiet,) = History().report(unsent={"train": 2}).clusters
    assert next(x for x in quiet.criteria if x.n == 3).finding == "2 page(s) still unpublished after 15 min"


def test_a_cluster_already_enforced_in_the_period_was_not_observed() -> None:
    h = History(policy.from_doc({"mode": "enforce", "clusters": [TRAIN]}))
    h.fault("a", xid(XID79, "a3-node-000", NOW - DAY))
    (train,) = h.report().clusters
    assert next(x for x in train.criteria if x.n == 2).status == "fail"


def test_the_text_lists_every_incident_and_each_criterion(history: History) -> None:
    text = rd.render(history.report())
    assert all(iid in text for iid in history.ids.values())
    assert "criteria for enforce (README, quickstart step 9): NOT READY" in text
    assert "1. FAIL " in text and "3. PASS " in text and "16 GPU-hours at stake where known" in text
    doc = rd.to_json(history.report())
    assert doc["ready"] is False and json.dumps(doc)


@pytest.mark.emulator
def test_report_readiness_reads_the_store_and_the_control(
    fs_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pitstop report --readiness` on Firestore (the emulator): the incidents ingest wrote in observe
    mode, the control's changes of the period, and exit 1 while a criterion fails."""
    from pitstop.adapters.firestore import IncidentStore
    from pitstop.adapters.firestore_control import FirestoreControl

    pol_file = tmp_path / "policy.yaml"
    pol_file.write_text(json.dumps({"mode": "observe", "clusters": [TRAIN]}))
    monkeypatch.setenv("PITSTOP_POLICY", str(pol_file))
    monkeypatch.delenv("PITSTOP_FIRESTORE_DATABASE", raising=False)
    now = time.time()
    e = xid(XID79, "a3-node-042", now - DAY)
    opened = IncidentStore(fs_client, "pitstop").apply(e, policy.load(pol_file), now - DAY)
    assert opened.incident is not None
    FirestoreControl(fs_client).change_control(
        lambda d: control.pause(d, None, {"by": "carol", "at": now, "reason": "r"})
    )
    rc = cli.main(["report", "--readiness", "--days", "7", "--project", fs_client.project])
    out = capsys.readouterr().out
    assert rc == 0 and opened.incident["id"] in out and "REBOOT_NODE (remediate)" in out
    assert "PAUSED: everything, by carol" in out and "pause   everything" in out
    rc = cli.main(["report", "--readiness", "--days", "3", "--json", "--project", fs_client.project])
    assert rc == 1 and json.loads(capsys.readouterr().out)["ready"] is False
    page = tmp_path / "week.html"  # the page shows the control too: what is in force, who changed it
    assert cli.main(["report", "--out", str(page), "--since", "7d", "--project", fs_client.project]) == 0
    html = page.read_text()
    assert "Runtime control: pauses, cluster modes, silences" in html
    assert "PAUSED: everything, by carol" in html
