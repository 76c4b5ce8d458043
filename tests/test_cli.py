"""`pitstop classify`: one JSON line out per input line, in order, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
