"""The `pitstop` CLI: classify (one JSON line per input line, in order, never a traceback), bench, local."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers import (
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
    assert result["every_line_distinct"]["classify_lines_per_s"] > 0
    assert isinstance(result["targets_met"], bool)
    # one run over every envelope and every form the parser reads
    envelopes = {"envelope:bare", "envelope:push", "envelope:cloudevent"}
    assert set(result["mix"]) == envelopes | {
        "form:xid",
        "form:other_form",
        "form:noise",
        "form:system_event",
    }
    assert set(result["mix_first_5000"]) >= {"gpu_xid", "nvswitch_sxid", "unrelated", "preemption"}


def _bench_ingest(firestore_host: str, *flags: str) -> list[dict[str, Any]]:
    import os

    env = {**os.environ, "FIRESTORE_EMULATOR_HOST": firestore_host}
    proc = subprocess.run(
        [*PITSTOP, "bench", "ingest", *flags], capture_output=True, timeout=600, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs: list[dict[str, Any]] = json.loads(proc.stdout)["runs"]
    return runs


@pytest.mark.emulator
def test_bench_ingest_runs_each_storm_through_each_instance_count(firestore_host: str) -> None:
    """`bench ingest` deploys N separate instances per run and reports what the issue asks for."""
    flags = ["--storms", "300x4,40x20", "--instances", "1,2", "--concurrency", "3", "--retry-scale", "0.01"]
    runs = _bench_ingest(firestore_host, *flags)
    assert [(r["lines"], r["nodes"], r["instances"]) for r in runs] == [
        (300, 4, 1),
        (300, 4, 2),
        (40, 20, 1),
        (40, 20, 2),
    ]
    for run in runs:
        assert run["instances_reporting"] == run["instances"]  # each a process of its own, each counted
        assert len(run["peak_mib_by_instance"]) == run["instances"]
        assert all(mib > 0 for mib in run["peak_mib_by_instance"])  # each instance sampled
        assert run["worker_hwm_mib_max"] > 30  # an interpreter with main loaded, as it reported
        assert run["incidents"] == run["nodes"]
        assert run["every_line_counted"] and run["lines_counted"] == run["lines"], run
        assert run["duplicate_starts"] == 0 and run["starts_per_step_max"] == 1
        ops = run["firestore_reads"] + run["firestore_writes"]
        assert run["store_ops_per_line"] == round(ops / run["lines"], 4)
        assert run["deliveries"] >= run["lines"] and run["dead_lettered"] == 0
        # the race's cost on its own: each refused commit carried writes, counted in ops too
        assert (
            run["refused_commit_writes"]
            >= run["refused_commits"]
            == sum(n for k, n in run["commits"].items() if k.startswith("refused"))
        )
        assert any(k.startswith("committed ") for k in run["commits"])  # each incident opened once
        assert sum(run["ops_by_site"].values()) == ops  # every operation has its call site
        # requests: a query is one however many documents it bills; a commit one for its writes
        queries = sum(n for k, n in run["calls"].items() if k.startswith("query:"))
        billed = sum(n for k, n in run["ops_by_collection"].items() if k.startswith("query:"))
        assert 0 < queries <= billed and 0 < run["calls"]["commit"] <= run["firestore_writes"]
        # where the CPU went: the emulator (found by its port) and the instances both worked
        cpu = run["cpu_s"]
        assert cpu["emulator"] > 0 and cpu["instances"] > 0 and cpu["cores_busy"] > 0


@pytest.mark.emulator
def test_bench_ingest_redelivers_what_was_not_answered_in_time(firestore_host: str) -> None:
    """An ack deadline no answer meets: every delivery is redelivered until the subscription
    dead-letters it. Each step is still started once and each incident opened once (a decision is
    made late too: its dedup record makes it once); a line is counted at most once, and a line
    whose every delivery reached its count in memory past the deadline (as the instance measures
    it, from arrival) is left to the dead-letter topic, not counted."""
    flags = ["--storms", "60x2", "--instances", "1", "--concurrency", "2", "--ack-deadline", "0.001"]
    (run,) = _bench_ingest(firestore_host, *flags, "--retry-scale", "0.01")
    assert run["timed_out"] > 0 and run["deliveries"] > run["lines"]
    assert run["deliveries"] == run["answers"].get("200", 0) + run["timed_out"] + run["refused"]
    assert run["incidents"] == run["nodes"] and run["duplicate_starts"] == 0
    assert run["lines_counted"] <= run["lines"], run  # none twice
    assert run["lines_counted"] + run["dead_lettered"] >= run["lines"], run  # each counted or kept


def test_bench_peak_memory_covers_only_the_phase_after_its_reset() -> None:
    """A peak reached before the storm (here a 256 MiB buffer, freed) is not the storm's peak."""
    from pitstop.tools import bench

    rss = bench._rss_mib()  # a pytest worker's own, which other tests have grown
    buf = bytearray(256 * 2**20)  # zero-filled: every page touched
    del buf
    assert bench._peak_rss_mib(False) >= rss + 250
    assert bench._reset_peak_rss()
    assert bench._peak_rss_mib(True) < max(rss, bench._rss_mib()) + 128


def test_bench_simulate_reports_one_run_and_a_sweep() -> None:
    """The simulate bench's JSON at a tiny size: one comparison and a fleet-size sweep, timed."""
    args = ["simulate", "--bench", "--nodes", "128", "--days", "10", "--sweep", "nodes=64,128"]
    proc = _run(args, b"")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["benchmark"] == "simulate"
    assert result["rate"] == "llama3" and result["days"] == 10
    assert result["strategies"] == [
        "manual", "gke", "nvsentinel", "pitstop", "pitstop+tel", "pitstop-topology", "pitstop-cost",
    ]  # fmt: skip
    assert result["cpus"] >= 1
    single, sweep = result["single"], result["sweep"]
    assert single["nodes"] == 128 and single["target_s"] == 30
    assert single["faults_handled"] >= single["trace_faults"] >= 0
    assert sweep["nodes"] == [64, 128] and sweep["runs"] == 2 and sweep["target_s"] == 300
    for figures in (single, sweep):
        assert isinstance(figures["wall_s"], float) and isinstance(figures["cpu_s"], float)


def test_subcommands_in_help_order() -> None:
    from pitstop.tools.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices or {}) == [
        "classify",
        "bench",
        "incidents",
        "pause",
        "resume",
        "mode",
        "silence",
        "replay",
        "local",
        "deploy",
        "teardown",
        "demo",
        "doctor",
        "simulate",
        "report",
    ]


class _Doc:
    def __init__(self, d: dict[str, Any], doc_id: str = "") -> None:
        self.d, self.id = d, doc_id

    def to_dict(self) -> dict[str, Any]:
        return self.d


def _fake_stack(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`local status`'s sources, faked: Firestore, Slurm, the fake Compute and the webhook sink."""
    from google.cloud import firestore

    from pitstop.local import stack as st

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
    results: dict[
        str, dict[str, Any]
    ] = {  # the agent's result documents, by command id (<incident>-<step>-<op>-<digest>)
        "inc-a-1-jobs-on-node-0a1b2c3d": {"op": "jobs_on_node", "state": "done", "result": []},
        "inc-a-1-drain-1a2b3c4d": {"op": "drain", "state": "done", "result": {"reason": "pitstop inc-a R"}},
        "inc-a-1-resume-2a2b3c4d": {"op": "resume", "state": "done", "result": {"resumed": True}},
        "inc-b-1-drain-3a2b3c4d": {
            "op": "drain",
            "state": "done",
            "result": {"reason": None, "already_drained_by_other": True},
        },
    }
    collections = {
        "pitstop_incidents": SimpleNamespace(stream=lambda: [_Doc(d) for d in incidents]),
        "pitstop_slurm_results": SimpleNamespace(stream=lambda: [_Doc(d, k) for k, d in results.items()]),
    }
    monkeypatch.setattr(
        firestore, "Client", lambda project: SimpleNamespace(collection=lambda n: collections[n])
    )
    slurm = {
        "sinfo": "a3-node-000|idle|\na3-node-001|drained|pitstop\n",
        "squeue": "7|RUNNING|a3-node-000|x\n",
    }
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: SimpleNamespace(stdout=slurm[argv[0]]))
    path = "/zones/z/instances/a3-node-000/reset"
    compute = {
        "instances": [{"name": "a3-node-000", "status": "RUNNING", "id": 7, "host": "h-1"}],
        "calls": [{"method": "POST", "path": path}],
        "effects": [
            {"method": "reset", "instances": ["a3-node-000"], "at": 5.0},
            {"method": "set_labels", "instances": ["a3-node-000"], "at": 4.0},  # a label: not an effect
            {"method": "reset", "instances": ["a3-node-001"], "at": 0.5},  # before inc-b: not its effect
        ],
    }
    monkeypatch.setattr(st, "admin", lambda state, path: compute)
    monkeypatch.setattr(
        st, "webhook_records", lambda state: [{"body": {"text": "resolved\nnode: a3-node-000"}}]
    )
    cluster = st.ClusterRecord(
        nodes=0,
        prefix="n",
        spot=[],
        machine_type="m",
        mig="n",
        name="c",
        scheduler="slurm",
        jobset_nodes=0,
        node_names=[],
    )
    return st.StackState(
        "/w", "p", {"pubsub": "127.0.0.1:1", "firestore": "127.0.0.1:2"}, {}, cluster, "/s.conf"
    )


def test_local_status_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`local status` reads Firestore, Slurm, the fake Compute and the webhook sink (faked here)."""
    from pitstop.tools.cli import local as cli_local

    state = _fake_stack(monkeypatch)
    assert cli_local.local_status(state, as_json=False) == 0
    assert capsys.readouterr().out.splitlines() == [
        "INCIDENTS",
        "  inc-a a3-node-000    RESOLVED  RESET_GPU      events=1     effects=reset:1,drain:1,resume:1     "
        "resolved=30.0s ",
        "  inc-b a3-node-001    HELD      REBOOT_NODE    events=3     effects=-                            "
        "resolved=Nones held: cluster budget",
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


def test_local_status_json_reports_effects_per_incident(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pitstop.tools.cli import local as cli_local

    state = _fake_stack(monkeypatch)
    assert cli_local.local_status(state, as_json=True) == 0
    report = json.loads(capsys.readouterr().out)
    by_id = {i["id"]: i for i in report["incidents"]}
    assert by_id["inc-a"]["state"] == "RESOLVED"
    assert by_id["inc-a"]["action"] == "RESET_GPU"
    assert by_id["inc-a"]["effects"] == {"compute": {"reset": 1}, "slurm": {"drain": 1, "resume": 1}}
    assert by_id["inc-b"]["effects"] == {"compute": {}, "slurm": {}}
    assert report["chaos"] is None  # no controller endpoint in this stack


def test_effects_belong_to_the_incident_that_caused_them() -> None:
    """A late retry after an incident closed still counts against it, until the node's next incident."""
    from pitstop.local.effects import by_incident

    incs = [
        {"id": "iaaaaaaaa1", "node": {"instance": "n1"}, "created_at": 10.0},
        {"id": "iaaaaaaaa2", "node": {"instance": "n1"}, "created_at": 100.0},
        {"id": "iaaaaaaaa3", "node": {"instance": "n2"}, "created_at": 50.0},
    ]
    effects = [
        {"method": "reset", "instances": ["n1"], "at": 11.0},
        {"method": "reset", "instances": ["n1"], "at": 99.0},  # after the first closed: still the first's
        {"method": "report_host_as_faulty", "instances": ["n1"], "at": 101.0},
        {"method": "recreate", "instances": ["n2", "n3"], "at": 51.0},
        {"method": "reset", "instances": ["n2"], "at": 49.0},  # before any incident on n2
    ]
    results: dict[str, dict[str, Any]] = {
        "iaaaaaaaa2-1-requeue-00000000": {"op": "requeue", "state": "done", "result": {"requeued": "7"}},
        "iaaaaaaaa2-2-requeue-11111111": {
            "op": "requeue",
            "state": "done",
            "result": {"already_pending": True},
        },
        "iaaaaaaaa2-1-signal-22222222": {"op": "signal", "state": "failed", "result": None},
    }
    assert by_incident(incs, effects, results) == {
        "iaaaaaaaa1": {"compute": {"reset": 2}, "slurm": {}},
        "iaaaaaaaa2": {"compute": {"report_host_as_faulty": 1}, "slurm": {"requeue": 1}},
        "iaaaaaaaa3": {"compute": {"recreate": 1}, "slurm": {}},
    }


def test_local_chaos_options_parse() -> None:
    from pitstop.tools.cli import build_parser

    args = build_parser().parse_args(
        [
            "local",
            "chaos",
            "compute-error",
            "503",
            "--times",
            "2",
            "--node",
            "a3-node-001",
            "--method",
            "reset",
        ]
    )
    assert (args.action, args.path, args.arg, args.times, args.node, args.method) == (
        "chaos",
        "compute-error",
        "503",
        2,
        "a3-node-001",
        "reset",
    )
    up = build_parser().parse_args(["local", "up", "--sweep-interval", "5"])
    assert up.sweep_interval == 5.0


def test_chaos_flags_are_used_up_per_node_and_method(tmp_path: Path) -> None:
    """`local chaos actuate-crash-after-effect --times 2 --node n1 --method reset`, as the wrapper sees it."""
    from pitstop.local import chaos

    chaos.arm_flag(tmp_path, "actuate-crash-after-effect", 2, "n1", "reset")
    assert not chaos.take_flag(tmp_path, "actuate-crash-after-effect", "n2", "reset")
    assert not chaos.take_flag(tmp_path, "actuate-crash-after-effect", "n1", "set_labels")
    assert chaos.take_flag(tmp_path, "actuate-crash-after-effect", "n1", "reset")
    assert chaos.armed_flags(tmp_path)["actuate-crash-after-effect"]["left"] == 1
    assert chaos.take_flag(tmp_path, "actuate-crash-after-effect", "n1", "reset")
    assert not chaos.take_flag(tmp_path, "actuate-crash-after-effect", "n1", "reset")
    assert chaos.armed_flags(tmp_path) == {}
    chaos.arm_flag(tmp_path, "publish-timeout", 1, None, None)  # no filter: any call
    assert chaos.take_flag(tmp_path, "publish-timeout", "anything")


def test_fake_compute_armed_fault_answers_with_computes_error_body() -> None:
    """`local chaos compute-error 503 --node a`: only a's next mutating call fails, as Compute would."""
    from pitstop.local.fake_compute import FakeCompute

    fake = FakeCompute()
    for name in ("a", "b"):
        fake.add_instance("p", "z", name)
    code, body = fake.dispatch("POST", "/_admin/faults", {"code": 503, "times": 1, "node": "a"})
    assert code == 200 and isinstance(body, dict) and body["armed"][0]["left"] == 1
    base = "/compute/v1/projects/p/zones/z/instances"
    assert fake.dispatch("GET", f"{base}/a", {})[0] == 200  # reads are not armed
    assert fake.dispatch("POST", f"{base}/b/reset", {})[0] == 200  # another VM
    code, body = fake.dispatch("POST", f"{base}/a/reset", {})
    assert code == 503
    assert body == {
        "error": {
            "code": 503,
            "message": "Backend Error",
            "errors": [{"message": "Backend Error", "domain": "global", "reason": "backendError"}],
        }
    }
    assert fake.dispatch("POST", f"{base}/a/reset", {})[0] == 200  # used up
    assert [e["instances"] for e in fake.effects] == [["b"], ["a"]]
    code, body = fake.dispatch("POST", "/_admin/faults", {"code": 403, "node": "a", "method": "set_labels"})
    assert isinstance(body, dict) and body["armed"] == [
        {"method": "set_labels", "code": 403, "reason": "rateLimitExceeded", "left": 1, "node": "a"}
    ]
    assert fake.dispatch("POST", "/_admin/faults", {"code": 418})[0] == 400  # no default body: name a reason


def test_demo_only_help_names_every_scenario_key_and_each_key_picks_a_stack() -> None:
    """`pitstop demo --only KEY` runs the scenarios the data file lists under that key, on the
    stack each names: the help lists every key, and every key is one scenario's."""
    import argparse
    import re

    from pitstop.tools import cli, demo

    parser: Any = cli.build_parser()
    sub: Any = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices["demo"]._actions if "--only" in a.option_strings)
    named = re.findall(r"[a-z0-9_]+", str(action.help).split("(")[0])
    scenarios = demo.scenarios()
    assert named == [s["key"] for s in scenarios]
    assert {s["stack"] for s in scenarios} == {"slurm", "gke", "vertex"}


def test_demo_scenarios_data_is_checked_on_load(tmp_path: Path) -> None:
    """A scenario file that breaks its schema, repeats a key or names a step the code lacks is
    refused with the offending place named, before any stack starts."""
    import yaml

    from pitstop.core.resources import DataFileError, schema_dir
    from pitstop.tools import demo_runner
    from pitstop.tools.demo_steps import STEPS

    doc = yaml.safe_load((schema_dir() / "demo-scenarios.yaml").read_text())
    cases: dict[str, Callable[[dict[str, Any]], None]] = {
        "stack": lambda d: d["scenarios"][0].update(stack="lsf"),
        "fault": lambda d: d["scenarios"][0].update(fault={"xid": 79, "colour": "red"}),
        "expect": lambda d: d["scenarios"][0].update(expect={}),
        "repeated": lambda d: d["scenarios"].append(dict(d["scenarios"][0])),
        "no such step": lambda d: d["scenarios"][4].update(step="juggle"),
    }
    for why, spoil in cases.items():
        bad = yaml.safe_load(yaml.safe_dump(doc))
        spoil(bad)
        path = tmp_path / f"{why}.yaml"
        path.write_text(yaml.safe_dump(bad))
        with pytest.raises(DataFileError) as err:
            demo_runner.load(STEPS, path)
        assert str(path) in str(err.value), why
    assert len(demo_runner.load(STEPS)) == len(doc["scenarios"])


def test_demo_expectations_each_fail_on_their_own() -> None:
    """Equality, a bound or a substring/item: an observation that misses one is named."""
    from pitstop.tools.demo_runner import Expectation, unmet

    expect: dict[str, Expectation] = {
        "state": "RESOLVED",
        "restarts": {"min": 1},
        "resume_s": {"max": 60},
        "steps": {"has": "A->B"},
    }
    met = {"state": "RESOLVED", "restarts": 1, "resume_s": 12.5, "steps": ["A->B"]}
    assert unmet(expect, met) == []
    assert unmet(expect, {**met, "state": "FAILED"}) == ["state"]
    assert unmet(expect, {**met, "restarts": 0}) == ["restarts"]
    assert unmet(expect, {**met, "resume_s": None}) == ["resume_s"]  # never measured is not within
    assert unmet(expect, {**met, "steps": ["B->A"]}) == ["steps"]


def test_kubernetes_effects_go_to_the_incident_whose_taint_it_is_or_by_node_and_time() -> None:
    from pitstop.local.effects import by_incident, compact

    incs = [
        {"id": "ia", "node": {"instance": "n1"}, "created_at": 10.0},
        {"id": "ib", "node": {"instance": "n2"}, "created_at": 12.0},
    ]
    kube = [
        {"method": "cordon", "node": "n1", "at": 11.0},
        {"method": "taint", "node": "n1", "value": "ia", "at": 11.0},
        {"method": "taint", "node": "n2", "value": "ib", "at": 13.0},
        {"method": "evict", "node": "n1", "pod": "default/p0", "at": 14.0},
        {"method": "evict", "node": "n1", "pod": "default/old", "at": 9.0},  # before its incident
        {"method": "untaint", "node": "n1", "value": "ia", "at": 20.0},
        {"method": "uncordon", "node": "n1", "at": 20.0},
    ]
    got = by_incident(incs, [{"method": "reset", "instances": ["n1"], "at": 15.0}], {}, kube)
    assert got["ia"]["kube"] == {"cordon": 1, "taint": 1, "evict": 1, "untaint": 1, "uncordon": 1}
    assert got["ib"]["kube"] == {"taint": 1}
    assert compact(got["ia"]) == "reset:1,cordon:1,taint:1,evict:1,untaint:1,uncordon:1"
    assert "kube" not in by_incident(incs, [], {})["ia"]  # a Slurm stack has no Kubernetes side


@pytest.mark.parametrize(
    ("verb", "own", "others"),
    [
        (
            "up",
            ["--nodes", "--scheduler", "--job-nodes", "--sweep-interval"],
            ["--times", "--at-rate", "--json"],
        ),
        ("chaos", ["--times", "--node", "--method"], ["--nodes", "--at-rate", "--sweep-interval"]),
        ("inject", ["--at-rate"], ["--times", "--nodes", "--json"]),
        ("status", ["--json"], ["--times", "--nodes", "--at-rate"]),
        ("down", ["--workdir"], ["--times", "--nodes", "--json"]),
    ],
)
def test_each_local_sub_verb_lists_only_its_own_flags(
    verb: str, own: list[str], others: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`pitstop local up -h` once listed `--times` (chaos's) beside `up`: one parser per sub-verb."""
    from pitstop.tools.cli import main

    with pytest.raises(SystemExit):
        main(["local", verb, "-h"])
    text = capsys.readouterr().out
    assert all(f in text for f in own), text
    assert not [f for f in others if f in text], text
