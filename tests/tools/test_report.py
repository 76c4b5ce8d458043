"""`pitstop report`: figures from incident documents, one self-contained and inert HTML page."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.core import checkpointing as cp
from pitstop.core import policy
from pitstop.tools import cli, replay
from pitstop.tools import report as rp
from pitstop.tools import report_checkpoints as rc
from pitstop.tools import report_model as rm
from tests.helpers import ops_agent_entry

DAY = 86400.0
END = 1_800_000_000.0  # 2027-01-15 08:00 UTC
START = END - 7 * DAY
T0 = END - 2 * DAY  # 2027-01-13 08:00 UTC: incidents on the 13th and the 14th
XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
HELD_BUDGET = {"reason": "blast-radius budget cluster-train exhausted", "scope": "cluster-train"}


def doc(iid: str, node: str, at: float, offsets: dict[str, float], **fields: Any) -> dict[str, Any]:
    """An incident document as the store keeps it (core/engine.py new_incident), with a timeline."""
    xid = fields.pop("xid", 79)
    inc: dict[str, Any] = {
        "id": iid,
        "node": {"project": "train-prod", "zone": "us-central1-a", "instance": node},
        "cluster": "train",
        "state": "RESOLVED",
        "mode": "enforce",
        "kind": "gpu_xid",
        "xid": xid,
        "action": "REBOOT_NODE",
        "reason": f"Xid {xid}",
        "escalations": [],
        "counts": {"events": 1, f"xid_{xid}": 1} if xid is not None else {"events": 1},
        "first_seen": at,
        "last_seen": at,
        "timeline": {"detected": at, **{k: at + v for k, v in offsets.items()}},
        "step": 1,
        "workflow": {"step": 1, "state": "started"},
        "held": None,
        "created_at": at + offsets.get("classified", 0.0),
    }
    inc.update(fields)
    return inc


def incidents() -> list[dict[str, Any]]:
    """Three remediations on one node (a lemon), one held, one failed, one closed by a person, one record."""
    full = {
        "classified": 0.5,
        "fenced": 2,
        "job_requeued": 2.5,
        "job_running": 60,
        "acted": 3,
        "healthy": 120,
    }
    full |= {"validated": 125, "resolved": 130}
    lemon_why = ["Xid 79 GPU_HAS_FALLEN_OFF_THE_BUS", "lemon host: 2 remediations in 7 days"]
    return [
        doc(
            "ia",
            "a3-node-001",
            T0,
            full,
            counts={"events": 3, "xid_79": 3},
            validation={
                "passed": True,
                "verdict": "pass",
                "busbw_gbps": 188.8,
                "expected_gbps": 188.9,
                "why": "ok",
            },
        ),
        doc(
            "ib",
            "a3-node-001",
            T0 + 3600,
            {"classified": 1.5, "fenced": 4, "acted": 5, "healthy": 300, "job_running": 90, "resolved": 310},
            xid=48,
            action="RESET_GPU",
            counts={"events": 20, "xid_48": 1, "xid_94": 19},
            validation=[{"passed": False, "verdict": "degraded", "busbw_gbps": 120.0, "why": "busbw short"}],
        ),
        doc(
            "ic",
            "a3-node-001",
            T0 + DAY,
            {
                "classified": 0.8,
                "fenced": 2.5,
                "acted": 6,
                "healthy": 1800,
                "job_resumed": 40,
                "resolved": 1900,
            },
            action="REPLACE_NODE",
            escalations=[{"from": "REBOOT_NODE", "to": "REPLACE_NODE", "at": T0 + DAY, "why": lemon_why}],
            diagnosis={"confirmed": True, "why": "row-remap failure on GPU 3"},
        ),
        doc(
            "id",
            "a3-node-002",
            T0 + DAY + 10,
            {"classified": 0.6},
            state="HELD",
            step=0,
            workflow=None,
            held={**HELD_BUDGET, "since": T0 + DAY + 10},
        ),
        doc(
            "ie",
            "a3-node-003",
            T0 + DAY + 20,
            {"classified": 0.4, "fenced": 3},
            xid=119,
            action="REPLACE_NODE",
            state="FAILED",
            failure={"stage": "act", "error": "reportHostAsFaulty: 403 PERMISSION_DENIED"},
        ),
        doc(
            "if",
            "a3-node-004",
            T0 + 50,
            {"classified": 2.0, "closed": 800},
            xid=None,
            kind="maintenance",
            action="DRAIN_NODE",
            step=0,
            workflow=None,
            holds=[{**HELD_BUDGET, "since": T0 + 100, "until": T0 + 700, "by": "alice"}],
            closure={"by": "alice", "at": T0 + 800, "from_state": "HELD", "unfence": True},
        ),
        doc(
            "ig",
            "a3-node-005",
            T0 + 7200,
            {"classified": 0.3, "resolved": 180},
            xid=13,
            action="NONE",
            step=0,
            workflow=None,
            counts={"events": 400, "xid_13": 400},
        ),
        doc("iold", "a3-node-009", START - 3600, {"classified": 9.0, "resolved": 99.0}),
    ]


def build(docs: list[dict[str, Any]] | None = None) -> rm.Report:
    return rm.build(
        incidents() if docs is None else docs, policy.from_doc(None), source="test", start=START, end=END
    )


# -- the figures -------------------------------------------------------------------------------


def test_counts_and_outcomes_over_the_period() -> None:
    rep = build()
    assert [r.id for r in rep.incidents] == ["ia", "if", "ib", "ig", "ic", "id", "ie"]  # iold is before START
    assert rep.by_outcome == {"remediated": 3, "recorded": 1, "closed by a person": 1, "held": 1, "failed": 1}
    assert rep.by_kind == {"gpu_xid": 6, "maintenance": 1}
    assert rep.by_action == {"REBOOT_NODE": 2, "REPLACE_NODE": 2, "RESET_GPU": 1, "DRAIN_NODE": 1, "NONE": 1}
    assert rep.per_day_kind == {"2027-01-13": {"gpu_xid": 3, "maintenance": 1}, "2027-01-14": {"gpu_xid": 3}}
    assert rep.per_day_action["2027-01-14"] == {"REBOOT_NODE": 1, "REPLACE_NODE": 2}
    assert {r.id for r in rep.needs_person} == {"id", "ie", "if"}
    assert rep.validation == {"pass": 1, "degraded": 1}


def test_times_from_each_incident_timeline() -> None:
    t = build().times
    detect = t["classified"]  # 0.3 0.4 0.5 0.6 0.8 1.5 2.0
    assert (detect.n, detect.p50, detect.p95, detect.max, detect.mean) == (7, 0.6, 2.0, 2.0, 0.871)
    assert (t["fenced"].n, t["fenced"].p50, t["fenced"].p95) == (4, 2.5, 4.0)  # 2 2.5 3 4
    assert t["job_running"].values == (60.0, 90.0)
    assert t["job_requeued"].values == (2.5, 40.0)  # an older document's job_resumed was the requeue
    assert t["validated"].values == (125.0,)
    # Only what Pitstop remediated: not the record-only burst end (180 s) nor the person's close
    mttr = t["resolved"]
    assert (mttr.n, mttr.p50, mttr.max, mttr.mean, mttr.values) == (
        3,
        310.0,
        1900.0,
        780.0,
        (130.0, 310.0, 1900.0),
    )
    assert t["healthy"].values == (120.0, 300.0, 1800.0)


def test_lemon_candidates_holds_and_xids() -> None:
    rep = build()
    lemon = rep.nodes[0]
    assert (lemon.node, lemon.incidents, lemon.node_actions, lemon.lemon, lemon.escalated_as_lemon) == (
        "a3-node-001",
        3,
        3,
        True,
        True,
    )
    assert lemon.actions == {"REBOOT_NODE": 1, "RESET_GPU": 1, "REPLACE_NODE": 1}
    assert not any(n.lemon or n.escalated_as_lemon for n in rep.nodes[1:])
    assert rep.holds == (rm.HoldRow("cluster-train", True, 2, 1, 600.0, {"alice": 1}),)
    assert [(x.xid, x.incidents, x.lines, x.nodes) for x in rep.xids] == [
        (79, 3, 5, 2),
        (13, 1, 400, 1),
        (48, 1, 1, 1),
        (119, 1, 1, 1),
        (94, 0, 19, 1),
    ]
    assert rep.xids[0].name == "GPU_HAS_FALLEN_OFF_THE_BUS" and rep.xids[0].actions == {
        "REBOOT_NODE": 2,
        "REPLACE_NODE": 1,
    }


def test_lemon_needs_its_count_within_the_window() -> None:
    def node_001(gap_d: float) -> rm.NodeRow:
        docs = [doc(f"i{n}", "a3-node-001", START + n * gap_d * DAY, {"resolved": 60}) for n in range(3)]
        return rm.build(docs, policy.from_doc(None), source="test", start=None, end=None).nodes[0]

    assert node_001(3.5).lemon  # three node actions within 7 days: the policy's lemon rule
    wide = node_001(3.6)  # 7.2 days from the first to the third
    assert wide.node_actions == 3 and not wide.lemon and not wide.escalated_as_lemon


def test_missing_fields_do_not_break_it() -> None:
    bare = [{"id": "ix", "state": "OPEN", "node": {"instance": "n1"}, "timeline": {"detected": T0}}]
    rep = build(bare)
    assert rep.by_outcome == {"in progress": 1} and rep.validation == {} and rep.xids == ()
    assert "ix" in rp.render(rep, rp.charts(rep))


# -- the page ----------------------------------------------------------------------------------


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def parse(page: str) -> Tags:
    t = Tags()
    t.feed(page)
    return t


def svgs(tags: Tags) -> dict[str, str]:
    """Chart title -> its SVG text, from the page's data: URIs."""
    prefix = "data:image/svg+xml;base64,"
    return {
        str(a["alt"]): base64.b64decode(str(a["src"])[len(prefix) :]).decode()
        for tag, a in tags.tags
        if tag == "img" and str(a.get("src")).startswith(prefix)
    }


def test_page_is_one_file_that_fetches_nothing() -> None:
    rep = build()
    page = rp.render(rep, rp.charts(rep))
    tags = parse(page)
    refs = [v for _, a in tags.tags for k, v in a.items() if k in ("src", "href", "srcset", "action", "data")]
    assert refs and all(str(v).startswith(("data:image/svg+xml;base64,", "#inc-")) for v in refs)
    assert "http://" not in page and "https://" not in page and "@import" not in page and "url(" not in page
    assert not [t for t, _ in tags.tags if t in ("link", "iframe", "object", "embed", "base", "form")]
    charts = svgs(tags)
    assert sorted(charts) == sorted(
        [
            "Incidents per day by kind",
            "Incidents per day by action",
            "Time from detection to each milestone",
            "Top Xids (incidents opened)",
            "Nodes by remediations (red: lemon candidates)",
        ]
    )
    assert all("<svg" in s for s in charts.values())
    assert "GPU_HAS_FALLEN_OFF_THE_BUS" in charts["Top Xids (incidents opened)"]  # text, not paths
    csp = next(a["content"] for t, a in tags.tags if t == "meta" and a.get("http-equiv"))
    assert "default-src 'none'" in str(csp) and len(tags.scripts) == 1
    assert 'href="#inc-ic"' in page and 'id="inc-ic"' in page  # the table links each incident's timeline


def test_page_shows_the_figures() -> None:
    rep = build()
    page = rp.render(rep, None)
    assert "Charts need matplotlib" in page and "<img" not in page
    for text in (
        "reportHostAsFaulty: 403 PERMISSION_DENIED",  # the failed one
        "closed by alice from HELD (unfenced)",
        "blast-radius budget cluster-train exhausted",
        'data-sort="1900.0">31.7 min</td>',  # ic's time to remediate
        "lemon host: 2 remediations in 7 days",
        "busbw short",
        "diagnosis confirmed a hardware fault: row-remap failure on GPU 3",
    ):
        assert text in page, text
    assert "a3-node-009" not in page  # before the period


HOSTILE_NODE = "<script>document.title='pwned'</script>"
HOSTILE_REASON = "\"><img src=x onerror=\"document.title='pwned'\"> & 'quoted'"


def hostile_report() -> rm.Report:
    docs = incidents()
    docs[0]["node"]["instance"] = HOSTILE_NODE
    docs[0]["reason"] = HOSTILE_REASON
    docs[3]["cluster"] = "</table><marquee>"
    docs[4]["failure"]["error"] = HOSTILE_REASON
    docs[5]["closure"]["by"] = "<iframe src=//evil>"
    docs[1]["id"] = 'ib" onclick="x'
    return build(docs)


def test_strings_from_incidents_are_escaped() -> None:
    rep = hostile_report()
    page = rp.render(rep, rp.charts(rep))
    tags = parse(page)
    assert len([t for t, _ in tags.tags if t == "script"]) == 1  # ours only
    assert not [t for t, _ in tags.tags if t in ("iframe", "marquee")]
    assert [a for _, a in tags.tags if any(k.startswith("on") for k in a)] == []
    assert all(a.get("src") != "x" for t, a in tags.tags if t == "img")
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=&quot;" in page and "&amp; &#x27;quoted&#x27;" in page
    assert HOSTILE_NODE not in page and "</table><marquee>" not in page
    nodes_chart = svgs(tags)["Nodes by remediations (red: lemon candidates)"]
    assert "<script" not in nodes_chart and "&lt;script&gt;" in nodes_chart  # escaped by the SVG writer


# -- the command -------------------------------------------------------------------------------


def _log(path: Path) -> None:
    """Xid 79 on three nodes within half a minute, an Xid 13 storm, a broken line."""
    entries = []
    for i in range(1, 4):
        e = ops_agent_entry(XID79, instance=f"a3-node-00{i}", insert_id=f"x79-{i}")
        e["timestamp"] = f"2027-01-15T08:00:{i * 10:02d}Z"
        entries.append(e)
    for i in range(5):
        e = ops_agent_entry(XID13, instance="a3-node-007", insert_id=f"x13-{i}")
        e["timestamp"] = f"2027-01-15T08:01:{i:02d}Z"
        entries.append(e)
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n{broken\n")


def test_from_replay_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, pol, out = tmp_path / "export.jsonl", tmp_path / "policy.yaml", tmp_path / "report.html"
    _log(log)
    cluster = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}
    pol.write_text(json.dumps({"clusters": [cluster]}))
    assert cli.main(["report", "--out", str(out), "--from-replay", str(log), "--policy", str(pol)]) == 0
    assert "4 incidents (would act 2, held 2), 2 needed a person" in capsys.readouterr().out
    page = out.read_text()
    replayed = replay.replay(replay.read_jsonl(log), policy.load(pol))
    assert [i["id"] for i in replayed["incidents"]] and all(
        f'id="inc-{i["id"]}"' in page for i in replayed["incidents"]
    )
    assert "9 log entries replayed (gpu_xid 8, invalid 1)" in page and "observe mode" in page
    assert page.count("held: blast-radius budget cluster-train exhausted") == 2 * 2  # table and timeline
    assert len(svgs(parse(page))) == 4  # no time chart: a replay measures no time after detection


def test_report_needs_out_and_one_source() -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["report", "--since", "7d"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["report", "--out", "x", "--since", "7d", "--from-replay", "y"])


@pytest.mark.emulator
def test_from_the_incident_store(
    fs_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the ingest path writes to Firestore (the emulator), read back as `pitstop incidents` does."""
    from pitstop.adapters.firestore import IncidentStore
    from pitstop.core.classify import Classifier
    from pitstop.core.timefmt import to_epoch

    for var in ("PITSTOP_FIRESTORE_DATABASE", "PITSTOP_POLICY"):
        monkeypatch.delenv(var, raising=False)
    store = IncidentStore(fs_client, "pitstop")
    now = time.time()
    entry = ops_agent_entry(XID79, instance="a3-node-042", insert_id="e2e-1")
    entry["timestamp"] = dt.datetime.fromtimestamp(now - 3600, tz=dt.UTC).isoformat().replace("+00:00", "Z")
    ev = Classifier.default().classify_bytes(json.dumps(entry).encode())
    ev["_observed_ts"] = cast(float, to_epoch(ev["observed_at"]))  # the entry has its timestamp
    opened = store.apply(ev, policy.from_doc(None), now)
    assert opened.result == "opened" and opened.incident is not None
    old = doc("iold", "a3-node-099", now - 30 * DAY, {"classified": 1.0})
    store.collections.incidents.document("iold").set(old)
    out = tmp_path / "store.html"
    assert cli.main(["report", "--out", str(out), "--since", "7d", "--project", fs_client.project]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    assert f'id="inc-{opened.incident["id"]}"' in page and "a3-node-042" in page
    assert "iold" not in page and "a3-node-099" not in page
    assert f"Firestore project {fs_client.project}" in page


# -- checkpoint advice -------------------------------------------------------------------------

HOUR = 3600.0
CKPT_COST = 300.0  # seconds each checkpoint took to write
EVERY = 3 * HOUR  # between the ends of two checkpoints


def ckpt_series(job: str, nodes: str, n: int, first: float = START + DAY) -> rc.Series:
    """A job's checkpoint series as Monitoring lists it: (end of each checkpoint, its write time);
    the writes take 300, 240 and 900 s in turn (their median: CKPT_COST)."""
    writes = (CKPT_COST, 240.0, 900.0)
    labels = {"cluster": "train", "job": job, "nodes": nodes}
    return rc.Series(labels, [(first + i * EVERY, writes[i % 3]) for i in range(n)])


def advised(
    series: list[rc.Series], docs: list[dict[str, Any]] | None = None, fleet: int | None = 100
) -> rm.Report:
    return rp.with_checkpoints(build(docs), policy.from_doc(None), lambda s, e: series, fleet)


def test_checkpoint_advice_from_the_periods_interruptions_and_the_jobs_series() -> None:
    rep = advised([ckpt_series("4242", "16", 9), ckpt_series("77", "2", 9)])
    a = rep.checkpoints
    assert a is not None and not a.rate.default
    # 6 incidents took a node out (ig was recorded): 6 over 100 nodes x 168 h -> a node's MTBF 2,800 h
    assert a.rate.interruptions == 6 and a.rate.node_hours == 100 * 168
    # 2 measured resumes, fewer than moves.min_history: the policy's restart cost
    assert a.restart_s == 600 and not a.restart_measured
    big = next(j for j in a.jobs if j.job == "4242")
    assert (big.nodes, big.checkpoints, big.cost_s, big.hours) == (16, 9, CKPT_COST, 24.0)
    # the job's MTBF: 2,800 h / 16 = 175 h; its interval of work: 3 h less the 5 min write
    assert big.advice == cp.advise(2800 * HOUR, 16, CKPT_COST, 600.0, EVERY - CKPT_COST)
    assert big.advice.mtbf_s == pytest.approx(175 * HOUR)
    assert big.advice.young_s == pytest.approx((2 * 300 * 175 * HOUR) ** 0.5)  # 19,442 s = 5.4 h
    # docs/report.md's example: every 5.3 h of work, goodput 96.9 % instead of 96.3 %
    assert big.advice.advised_s / HOUR == pytest.approx(5.35, abs=0.005)
    assert (big.advice.goodput_actual, big.advice.goodput_advised) == pytest.approx((0.963, 0.969), abs=5e-4)
    gain = big.advice.goodput_advised - cast(float, big.advice.goodput_actual)
    assert gain > 0 and big.gpu_hours_gained == pytest.approx(16 * 8 * 24.0 * gain)
    assert [j.job for j in a.jobs] == ["4242", "77"]  # the most to gain first


def test_checkpoint_advice_uses_the_labelled_default_with_no_interruption() -> None:
    quiet = [d for d in incidents() if d["id"] == "ig"]  # recorded only: nothing taken out
    rep = advised([ckpt_series("4242", "16", 9)], quiet)
    a = rep.checkpoints
    assert a is not None and a.rate.default and a.rate.interruptions == 0
    assert a.rate.per_node_hour == pytest.approx(3.79 / 1000 / 24)  # the policy's, per node-hour
    assert "DEFAULT 3.79 interruptions per 1,000 node-days" in rp.render(rep, None)


def test_checkpoint_advice_edges() -> None:
    few = ckpt_series("few", "4", 2)  # one interval: the cost is measured, the interval not yet
    bad = ckpt_series("bad", "many", 9)
    none = rc.Series({"cluster": "train", "job": "neg", "nodes": "4"}, [(START + DAY, -1.0)])
    rep = advised([few, bad, none], fleet=None)
    a = rep.checkpoints
    assert a is not None and not a.fleet_nodes_given
    assert a.fleet_nodes == 8  # no --fleet-nodes: the nodes seen (8 with incidents, 4 in the jobs)
    (row,) = a.jobs
    assert row.job == "few" and row.advice.actual_s is None and row.gpu_hours_gained is None
    assert any("train/bad" in x for x in a.skipped) and any("train/neg" in x for x in a.skipped)
    page = rp.render(rep, None)
    assert "8 nodes seen (--fleet-nodes" in page and "train/bad" in page


def test_checkpoint_advice_on_the_page() -> None:
    rep = advised([ckpt_series("4242", "16", 9)])
    page = rp.render(rep, None)
    section = page.split("Checkpoint advice")[1].split("<h2>")[0]
    j = cast(rc.Advice, rep.checkpoints).jobs[0]
    assert (
        ">4242<" in section
        and rp.secs(j.advice.advised_s) in section
        and rp.secs(EVERY - CKPT_COST) in section
    )
    assert f"{100 * cast(float, j.advice.goodput_actual):.1f} %" in section
    assert f"{cast(float, j.gpu_hours_gained):,.1f}" in section
    assert "6 interruptions over 16,800 node-hours of 100 nodes" in section


def test_checkpoint_series_unreadable_is_said() -> None:
    def broken(start: float, end: float) -> list[rc.Series]:
        raise ConnectionError("monitoring down")

    rep = rp.with_checkpoints(build(), policy.from_doc(None), broken, 100)
    assert rep.checkpoints is None
    assert "checkpoint series unreadable: ConnectionError: monitoring down" in rp.render(rep, None)


@pytest.mark.emulator
def test_checkpoint_advice_from_the_store_and_monitoring(
    fs_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The incident store (the emulator) and the jobs' checkpoint series in the Monitoring stand-in,
    written with the real client as docs/telemetry.md's snippet writes them, read back by the CLI."""
    from google.cloud import monitoring_v3

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.local import trainer
    from pitstop.local.fake_monitoring import FakeMonitoring
    from pitstop.local.fake_monitoring import serve as serve_monitoring

    for var in ("PITSTOP_FIRESTORE_DATABASE", "PITSTOP_POLICY"):
        monkeypatch.delenv(var, raising=False)
    now = time.time()
    store = IncidentStore(fs_client, "pitstop")
    for d in incidents():  # moved into the last week
        moved = {**d, "timeline": {k: v - END + now for k, v in d["timeline"].items()}}
        store.collections.incidents.document(d["id"]).set(moved)
    server, endpoint = serve_monitoring(FakeMonitoring())
    try:
        client = trainer.heartbeat_client(endpoint)
        for i in range(9):
            series = monitoring_v3.TimeSeries()
            series.metric.type, series.resource.type = (
                "custom.googleapis.com/pitstop/job/checkpoint",
                "global",
            )
            series.metric.labels.update({"cluster": "train", "job": "4242", "nodes": "16"})
            end = {"seconds": int(now - 2 * DAY + i * EVERY)}
            series.points = [
                monitoring_v3.Point({"interval": {"end_time": end}, "value": {"double_value": CKPT_COST}})
            ]
            client.create_time_series(name=f"projects/{fs_client.project}", time_series=[series])
        monkeypatch.setenv("PITSTOP_MONITORING_ENDPOINT", endpoint)
        out = tmp_path / "advice.html"
        argv = [
            "report",
            "--out",
            str(out),
            "--since",
            "7d",
            "--project",
            fs_client.project,
            "--fleet-nodes",
            "100",
        ]
        assert cli.main(argv) == 0
    finally:
        server.stop(0)
    section = out.read_text().split("Checkpoint advice")[1].split("<h2>")[0]
    assert ">4242<" in section and "16,800 node-hours of 100 nodes" in section
    assert rp.secs(EVERY - CKPT_COST) in section and rp.secs(CKPT_COST) in section


# -- in a browser ------------------------------------------------------------------------------

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium(tmp_path: Path, page: Path, *flags: str) -> str:
    assert BROWSER
    argv = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
    # no network at all: the page must not need it, and this machine refuses it anyway
    argv += [
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
    ]
    argv += [f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", *flags, page.as_uri()]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_renders_in_a_browser(tmp_path: Path) -> None:
    """Headless Chromium draws the charts and the known incident; the tables sort; nothing injected runs."""
    from PIL import Image

    rep = hostile_report()
    html_text = rp.render(rep, rp.charts(rep))
    page = tmp_path / "report.html"
    page.write_text(html_text)
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2600")
    img = Image.open(shot).convert("RGB")
    colours: list[tuple[int, tuple[int, int, int]]] = img.getcolors(maxcolors=1 << 24) or []  # type: ignore[assignment]
    blue = sum(n for n, (r, g, b) in colours if abs(r - 31) < 12 and abs(g - 119) < 12 and abs(b - 180) < 12)
    assert blue > 5000, blue  # matplotlib's first colour: the bars of the per-day charts are drawn
    # The DOM after load, with a probe: the CSP of a copy is relaxed for it (the original's blocks it).
    probe = """<script>addEventListener("load", function () {
      var imgs = Array.from(document.querySelectorAll("img.chart"));
      document.body.dataset.charts = imgs.filter(function (i) { return i.naturalWidth > 100; }).length;
      var th = Array.from(document.querySelectorAll("th")).find(function (h) {
        return h.textContent === "remediate";
      });
      th.click(); th.click();
      var body = th.closest("table").tBodies[0];
      document.body.dataset.first = body.rows[0].cells[0].textContent;
      document.body.dataset.title = document.title;
    });</script></body>"""
    probed = tmp_path / "probed.html"
    relaxed = re.sub(r"script-src '[^']*'", "script-src 'unsafe-inline'", html_text, count=1)
    probed.write_text(relaxed.replace("</body>", probe))
    dom = _chromium(tmp_path, probed, "--dump-dom")
    assert 'data-charts="5"' in dom  # every chart decoded and laid out
    assert 'data-first="ic"' in dom  # sorted by time to remediate, longest first (1900 s)
    assert 'data-title="Pitstop report:' in dom and "pwned" not in dom.split("<body")[0]
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # shown as text
    # An injected script would not run even if escaping failed: only the page's own script may.
    injected = tmp_path / "injected.html"
    injected.write_text(html_text.replace("<h1>", "<script>document.title='pwned'</script><h1>", 1))
    assert "<title>Pitstop report:" in _chromium(tmp_path, injected, "--dump-dom")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
