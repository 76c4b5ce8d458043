"""`pitstop replay`: past entries through the engine in observe mode, from a file or Cloud Logging."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from pitstop.core import policy, sinks
from pitstop.tools import replay
from tests.fake_logging import FakeLogging
from tests.helpers import load_fixture, ops_agent_entry, system_event_entry

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"
)
CLUSTER = {"name": "train", "scheduler": "slurm", "size": 8, "match": {"name_pattern": "a3-node-*"}}


def _entry(line: str, node: str, n: int, second: int) -> dict[str, Any]:
    e = ops_agent_entry(line, instance=node, insert_id=f"{node}-{n}")
    e["timestamp"] = f"2027-01-15T08:{second // 60:02d}:{second % 60:02d}Z"
    return e


def history() -> list[dict[str, Any]]:
    """XID 79 on five nodes within a minute, an XID 13 storm, a preemption, noise and garbage."""
    out = [_entry(XID79, f"a3-node-00{i}", i, i * 10) for i in range(1, 6)]
    out += [_entry(XID13, "a3-node-007", 100 + i, 5 + i) for i in range(40)]
    pre = system_event_entry(next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted"))
    pre["protoPayload"]["resourceName"] = "projects/train-prod/zones/us-central1-a/instances/a3-node-008"
    pre["resource"]["labels"].update({"project_id": "train-prod", "zone": "us-central1-a"})
    pre["logName"] = "projects/train-prod/logs/cloudaudit.googleapis.com%2Fsystem_event"
    pre["timestamp"] = "2027-01-15T08:00:30Z"
    out.append(pre)
    out.append(ops_agent_entry("systemd[1]: Started Session 1."))
    return out


def test_replay_reports_what_would_have_happened() -> None:
    items = [{"_payload": e} for e in history()] + [{"_invalid": "malformed JSON: x"}]
    report = replay.replay(items, policy.from_doc({"mode": "enforce", "clusters": [CLUSTER]}))
    t = report["totals"]
    assert report["by_kind"]["gpu_xid"] == 45
    assert report["by_kind"]["invalid"] == 1 and report["by_kind"]["unrelated"] == 1
    assert t["incidents"] == 7  # five 79s, one 13 storm, one preemption
    assert t["by_action"] == {"REBOOT_NODE": 5, "RESTART_JOB": 1, "RESCHEDULE_JOB": 1}
    assert t["held_by_budget"] == 4  # 10 % of 8 nodes: one reboot per 30 minutes
    assert t["would_start"] == 3
    storm = next(i for i in report["incidents"] if i["node"] == "a3-node-007")
    assert storm["events"] == 40


def test_replay_jsonl_cli(tmp_path: Path) -> None:
    src = tmp_path / "export.jsonl"
    src.write_text("\n".join(json.dumps(e) for e in history()) + "\n{broken\n")
    pol = tmp_path / "policy.yaml"
    pol.write_text(
        yaml.safe_dump({"clusters": [CLUSTER], "budgets": {"cluster": {"max_nodes": 2, "max_percent": 50}}})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop.tools.cli", "replay", str(src), "--policy", str(pol), "--json"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["totals"]["held_by_budget"] == 3
    assert report["by_kind"]["invalid"] == 1


def test_bad_policy_fails_loudly(tmp_path: Path) -> None:
    pol = tmp_path / "policy.yaml"
    pol.write_text(yaml.safe_dump({"budgets": {"cluster": {"max_nodes": -1, "max_percent": 10}}}))
    src = tmp_path / "e.jsonl"
    src.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop.tools.cli", "replay", str(src), "--policy", str(pol)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert b"budgets/cluster/max_nodes" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_replay_from_cloud_logging_uses_the_sink_filters() -> None:
    fake = FakeLogging(history(), page_size=4)
    try:
        items = list(
            replay.cloud_logging_entries("train-prod", 6 * 3600, 1_800_000_000.0, endpoint=fake.endpoint)
        )
    finally:
        fake.close()
    assert len(items) == len(history())
    assert len(fake.requests) == -(-len(items) // 4) > 1  # every page fetched
    flt = fake.requests[0]["filter"]
    for f in sinks.sink_filters().values():
        assert f in flt
    assert 'timestamp >= "2027-01-15T02:00:00Z"' in flt
    assert fake.requests[0]["resourceNames"] == ["projects/train-prod"]
    report = replay.replay(items, policy.from_doc({"clusters": [CLUSTER]}))
    assert report["totals"]["incidents"] == 7
    assert report["by_kind"]["preemption"] == 1
