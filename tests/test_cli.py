"""The `pitstop` CLI: classify (one JSON line per input line, in order, never a traceback), bench, local."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from .helpers import (
    assert_valid_event,
    cloud_event,
    load_fixture,
    ops_agent_entry,
    push_body,
    system_event_entry,
)

PITSTOP = [sys.executable, "-m", "pitstop.tools.cli"]


def _run(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(PITSTOP + args, input=stdin, capture_output=True, timeout=60, check=False)


def test_classify_mixed_stream_in_order(tmp_path: Path) -> None:
    xid = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    preempt = system_event_entry(
        next(c for c in load_fixture("system_events.yaml") if c["id"] == "preempted")
    )
    lines = [
        json.dumps(ops_agent_entry(xid)),
        "this is not json",
        json.dumps(push_body(preempt)),
        json.dumps(cloud_event(ops_agent_entry("systemd[1]: hello"))),
        json.dumps({"foo": 1}),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = _run(["classify", str(src)], b"")
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    out = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert [e["kind"] for e in out] == ["gpu_xid", "invalid", "preemption", "unrelated", "invalid"]
    assert [e["action"] for e in out] == ["REBOOT_NODE", "NONE", "RESCHEDULE_JOB", "NONE", "NONE"]
    for e in out:
        assert_valid_event(e)


def test_classify_stdin_table() -> None:
    xid = "NVRM: Xid (PCI:0000:b5:00): 13, pid=1, name=python, Graphics SM Warp Exception on (GPC 1, TPC 3)"
    proc = _run(["classify", "-", "--format", "table"], (json.dumps(ops_agent_entry(xid)) + "\n").encode())
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.decode().splitlines()
    assert rows[0].split()[:3] == ["KIND", "ACTION", "XID"]
    assert rows[1].split()[:3] == ["gpu_xid", "RESTART_JOB", "13"]


def test_missing_file_is_a_clear_error() -> None:
    proc = _run(["classify", "/nonexistent/x.jsonl"], b"")
    assert proc.returncode == 2
    assert b"Traceback" not in proc.stderr
    assert b"No such file" in proc.stderr


def test_bench_reports_both_figures() -> None:
    proc = _run(["bench", "classify", "--lines", "2000"], b"")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["lines"] == 2000
    assert result["classify_lines_per_s"] > 0
    assert result["cost_vs_json_roundtrip"] > 0
    assert set(result["mix_first_5000"]) >= {"gpu_xid", "unrelated", "preemption"}


def test_subcommands_in_help_order() -> None:
    from pitstop.tools.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices or {}) == [
        "classify",
        "bench",
        "incidents",
        "replay",
        "local",
        "deploy",
        "teardown",
        "demo",
    ]


class _Doc:
    def __init__(self, d: dict[str, Any]) -> None:
        self.d = d

    def to_dict(self) -> dict[str, Any]:
        return self.d


def test_local_status_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`local status` reads Firestore, Slurm, the fake Compute and the webhook sink (faked here)."""
    from google.cloud import firestore

    from pitstop.local import stack as st
    from pitstop.tools import cli

    incidents = [
        {
            "id": "inc-b",
            "created_at": 2,
            "node": {"instance": "a3-node-001"},
            "state": "HELD",
            "action": "REBOOT_NODE",
            "counts": {"events": 3},
            "held": {"reason": "cluster budget"},
            "timeline": {"detected": 1.0},
        },
        {
            "id": "inc-a",
            "created_at": 1,
            "node": {"instance": "a3-node-000"},
            "state": "RESOLVED",
            "action": "RESET_GPU",
            "counts": {"events": 1},
            "timeline": {"detected": 1.0, "resolved": 31.0},
        },
    ]
    collection = SimpleNamespace(stream=lambda: [_Doc(d) for d in incidents])
    monkeypatch.setattr(firestore, "Client", lambda project: SimpleNamespace(collection=lambda n: collection))
    slurm = {
        "sinfo": "a3-node-000|idle|\na3-node-001|drained|pitstop\n",
        "squeue": "7|RUNNING|a3-node-000|x\n",
    }
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: SimpleNamespace(stdout=slurm[argv[0]]))
    compute = {
        "instances": [{"name": "a3-node-000", "status": "RUNNING", "id": 7, "host": "h-1"}],
        "calls": [{"method": "POST", "path": "/zones/z/instances/a3-node-000/reset"}],
    }
    monkeypatch.setattr(st, "admin", lambda state, path: compute)
    monkeypatch.setattr(
        st, "webhook_records", lambda state: [{"body": {"text": "resolved\nnode: a3-node-000"}}]
    )
    state = st.StackState("/w", "p", {"pubsub": "127.0.0.1:1", "firestore": "127.0.0.1:2"}, {}, {}, "/s.conf")

    assert cli._local_status(state, as_json=False) == 0
    assert capsys.readouterr().out.splitlines() == [
        "INCIDENTS",
        "  inc-a a3-node-000    RESOLVED  RESET_GPU      events=1     resolved=30.0s ",
        "  inc-b a3-node-001    HELD      REBOOT_NODE    events=3     resolved=Nones held: cluster budget",
        "SLURM NODES",
        "  a3-node-000    idle         ",
        "  a3-node-001    drained      pitstop",
        "SLURM JOBS",
        "  7     RUNNING     a3-node-000",
        "INSTANCES",
        "  a3-node-000    RUNNING    id=7 host=h-1",
        "OPERATIONS RECEIVED",
        "  POST                   /zones/z/instances/a3-node-000/reset",
        "NOTIFICATIONS",
        "  resolved",
        "    node: a3-node-000",
    ]
