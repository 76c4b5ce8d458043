"""Capacity for an early requeue, and diagnose / validate runs on a fenced node, on a real Slurm.

A real slurmctld with four slurmd (pitstop.local.slurm) and the agent's SlurmCommands in this
process (its check runners are real child processes, its job steps real sruns); the GPU tools are
the stand-ins of pitstop.local.gpu_tools, reading per-node outcomes that an in-process fake
Compute writes through its admin API (``/_admin/gpu_state``). One test goes the whole way through
SlurmAgentClient, Pub/Sub and Firestore (the emulators), as actuate does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from google.cloud import firestore
from google.cloud.pubsub_v1 import SubscriberClient

from pitstop.adapters.slurm import ResultsMerger, SlurmAgentClient
from pitstop.agent.slurm import (
    Agent,
    CheckTools,
    CommandRefusedError,
    Ledger,
    ResultsTopic,
    SlurmCommands,
    check_steps,
    commands_for,
    is_transient,
    parse_args,
    parse_node,
    run_subprocess,
)
from pitstop.agent.slurm.records import CheckState
from pitstop.core import checks as core_checks
from pitstop.core import policy as policy_mod
from pitstop.core import ring_buffer
from pitstop.core.checks import check_name
from pitstop.core.diagnose import parse_nvidia_smi_q, parse_nvlink_status
from pitstop.core.domain import CheckSpec
from pitstop.core.scheduling import StepRef
from pitstop.core.slurm_wire import CheckProgress, CheckStarted, drain_reason
from pitstop.core.validation import NcclResult, default_validation_table, parse_all_gather, parse_dcgm_diag
from pitstop.local import gpu_tools, stack
from pitstop.local.fake_compute import DURATIONS, FakeCompute
from pitstop.local.slurm import SlurmCluster
from tests.agent.test_agent import Loopback

NODES = ["ck-0", "ck-1", "ck-2", "ck-3"]
INCIDENT = "iqrstuvw23"
PROJECT, ZONE = "p-checks", "us-central1-a"
TOOLS = CheckTools(
    nvidia_smi=(sys.executable, "-m", "pitstop.local.gpu_tools.nvidia_smi"),
    dcgmi=(sys.executable, "-m", "pitstop.local.gpu_tools.dcgmi"),
    dmesg=(sys.executable, "-m", "pitstop.local.gpu_tools.dmesg"),
    clock=(sys.executable, "-m", "pitstop.local.gpu_tools.clock"),
    all_gather_perf=(sys.executable, "-m", "pitstop.local.gpu_tools.all_gather_perf"),
    fabric_root=str(Path(gpu_tools.__file__).parent / "fabric"),  # the stand-in profiles
)
MEGA = default_validation_table().machine_types["a3-megagpu-8g"]


# -- the cluster, the fake Compute, the agent's commands -----------------------------------------


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitstop-checks-slurm-")), NODES).start()
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PITSTOP_GPU_STATE", "PITSTOP_NODE")}
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ.pop("PITSTOP_NODE", None)  # the stand-ins must learn their node from Slurm
    try:
        yield cluster
    finally:
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def compute(tmp_path: Path) -> Iterator[FakeCompute]:
    """A fake Compute whose VMs are the Slurm nodes; the GPU stand-ins read the file it writes."""
    path = tmp_path / "gpu-state.json"
    path.write_text('{"ck-1": {"gpus": 1}}')  # left over from an earlier run: replaced at start
    fake = FakeCompute(time_scale=0.001, gpu_state_path=path)
    for n in NODES:
        fake.add_instance(PROJECT, ZONE, n, mig="ck")
    before = os.environ.get("PITSTOP_GPU_STATE")
    os.environ["PITSTOP_GPU_STATE"] = str(path)  # the agent's environment, inherited by its job steps
    yield fake
    if before is None:
        os.environ.pop("PITSTOP_GPU_STATE", None)
    else:
        os.environ["PITSTOP_GPU_STATE"] = before


def gpu_state(fake: FakeCompute, node: str, state: Any) -> Any:
    code, body = fake.dispatch(
        "POST", "/_admin/gpu_state", {"project": PROJECT, "zone": ZONE, "instance": node, "state": state}
    )
    assert code == 200, body
    return body


class Recorder:
    """The agent's Slurm runner, recording every command line it runs."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str:
        self.argvs.append(list(argv))
        return run_subprocess(argv)

    def mutating(self) -> list[list[str]]:
        reads = (("sinfo",), ("squeue",), ("scontrol", "show"), ("scontrol", "--version"))
        return [a for a in self.argvs if not any(tuple(a[: len(r)]) == r for r in reads)]


@pytest.fixture
def cmds(
    slurm: SlurmCluster, compute: FakeCompute, tmp_path: Path
) -> Iterator[tuple[SlurmCommands, Recorder]]:
    rec = Recorder()
    c = SlurmCommands(rec, checks=dataclasses.replace(TOOLS, directory=str(tmp_path / "checks")))
    yield c, rec
    # back to four idle nodes, no reservations, no jobs (and no runner of a failed test finishing late)
    for runner in c.runners.children:
        runner.kill()
        runner.wait()
    slurm._out(["scancel", "--full", "--quiet", "-u", "root"])
    for line in slurm._out(["scontrol", "show", "reservation", "-o"]).splitlines():
        if line.startswith("ReservationName="):
            slurm._out(["scontrol", "delete", line.split()[0]])
    _wait(lambda: not slurm.jobs(), "jobs gone")
    for n in NODES:
        slurm._out(["scontrol", "update", f"NodeName={n}", "State=RESUME"])
    slurm.wait_idle(len(NODES))


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def sbatch(slurm: SlurmCluster, *args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", *args],
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
        cwd=slurm.workdir,
    ).stdout
    return out.strip().split(";")[0]


def running(slurm: SlurmCluster, job: str) -> list[str]:
    """The nodes of a job once it runs."""
    _wait(lambda: any(j["id"] == job and j["state"] == "RUNNING" for j in slurm.jobs()), f"job {job} running")
    nodelist = next(j["nodes"] for j in slurm.jobs() if j["id"] == job)
    return slurm._out(["scontrol", "show", "hostnames", nodelist]).split()


def node(slurm: SlurmCluster, name: str) -> tuple[str, str]:
    info = parse_node(slurm._out(["scontrol", "show", "node", "-o", name]), name)
    return info.state, info.reason


def reserve_for_team(slurm: SlurmCluster, name: str) -> None:
    """Someone's reservation of one node (not Pitstop's): its nodes are no capacity for others."""
    argv = ["scontrol", "create", "reservation", "ReservationName=team", "Users=root", f"Nodes={name}"]
    slurm._out([*argv, "StartTime=now", "Duration=60"])


def reservations(slurm: SlurmCluster) -> list[str]:
    out = slurm._out(["scontrol", "show", "reservation", "-o"])
    return [
        line.split()[0].split("=", 1)[1] for line in out.splitlines() if line.startswith("ReservationName=")
    ]


def fence(c: SlurmCommands, name: str, action: str = "REPLACE_NODE") -> str:
    c.drain({"node": name, "incident": INCIDENT, "action": action})
    return drain_reason(INCIDENT, action)


def spec(kind: str, name: str, step: int = 3, **over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "node": name,
        "name": check_name(INCIDENT, step, kind),
        "kind": kind,
        "incident": INCIDENT,
        "dcgm_level": 1 if kind == "diagnose" else 2,
        "gpus": 8,
    }
    if kind == "validate":
        args |= {"message_bytes": 8 << 30, "peer": True}
    return args | over


def probe(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in ("node", "name", "kind", "incident")}


def result(c: SlurmCommands, args: dict[str, Any], timeout: float = 90.0) -> CheckProgress:
    deadline = time.monotonic() + timeout
    while True:
        res = c.check_result(probe(args))
        if res["done"] or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


def busbw(nccl: NcclResult) -> float:
    """The bus bandwidth at the largest message (8 GiB), as validation reads it."""
    row = nccl.row_at(8 << 30)
    assert row is not None, nccl
    return row.busbw


def holder_jobs(slurm: SlurmCluster, name: str) -> list[str]:
    """Every job of this name Slurm still knows (running or ended)."""
    out = slurm._out(["squeue", "-h", "--states=all", "-n", name, "-o", "%i"])
    return out.split()


# -- capacity --------------------------------------------------------------------------------


@pytest.mark.parametrize("reserve", [False, True])
def test_capacity_counts_idle_healthy_unreserved_nodes_and_the_jobs_own(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], reserve: bool
) -> None:
    c, _ = cmds
    job = sbatch(slurm, "-N", "2", "--requeue", "--wrap", "sleep 600")
    own = running(slurm, job)
    fenced, other = own
    fence(c, fenced)
    idle = sorted(set(NODES) - set(own))
    if reserve:  # someone's reservation on one idle node: not capacity for this job
        reserve_for_team(slurm, idle[0])
        assert reservations(slurm) == ["team"]
    cap = c.capacity({"job": job, "node": fenced})
    want_idle = idle[1:] if reserve else idle
    assert cap["idle"] == want_idle and cap["own"] == [other]
    assert (cap["need"], cap["free"], cap["enough"]) == (2, len(want_idle) + 1, True)
    n = len(want_idle)
    assert (
        cap["why"]
        == f"{n} idle healthy node{'' if n == 1 else 's'} in partition gpu + 1 of the job's own; needs 2"
    )


def test_capacity_is_short_when_the_other_nodes_are_busy_drained_or_reserved(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, _ = cmds
    job = sbatch(slurm, "-N", "3", "--requeue", "--wrap", "sleep 600")
    own = running(slurm, job)
    (spare,) = set(NODES) - set(own)
    fence(c, own[0])
    assert c.capacity({"job": job, "node": own[0]})["enough"] is True  # the spare + two of its own
    slurm._out(["scontrol", "update", f"NodeName={own[1]}", "State=DRAIN", "Reason=admin: fan"])
    reserve_for_team(slurm, spare)
    cap = c.capacity({"job": job, "node": own[0]})
    assert (cap["enough"], cap["need"], cap["free"]) == (False, 3, 1)
    assert cap["why"] == "0 idle healthy nodes in partition gpu + 1 of the job's own; needs 3"
    slurm._out(["scontrol", "delete", "ReservationName=team"])
    assert c.capacity({"job": job, "node": own[0]})["free"] == 2  # the spare counts again

    busy = sbatch(slurm, "-N", "1", "-w", spare, "--wrap", "sleep 600")
    running(slurm, busy)
    assert c.capacity({"job": job, "node": own[0]})["free"] == 1  # a busy node is no capacity


def test_capacity_of_a_job_that_is_unknown_or_not_running(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, rec = cmds
    unknown = c.capacity({"job": "4000000", "node": "ck-0"})
    assert unknown == {
        "job": "4000000",
        "state": "UNKNOWN",
        "enough": False,
        "need": None,
        "free": None,
        "why": "job 4000000 is not known to Slurm: nothing to requeue",
    }
    held = sbatch(slurm, "-N", "2", "--hold", "--wrap", "sleep 600")
    cap = c.capacity({"job": held, "node": "ck-0"})
    assert cap["enough"] is False and cap["free"] == 3 and cap["need"] == 2
    assert cap["why"].startswith(f"job {held} is already pending")
    assert rec.mutating() == []  # a probe changes nothing


# -- diagnose and validate on the fenced node ---------------------------------------------------


def test_diagnose_runs_on_the_drained_node_and_leaves_it_drained_as_before(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], compute: FakeCompute
) -> None:
    c, _ = cmds
    target = "ck-2"
    # only ck-2's host is bad: a GPU off the bus, NVLinks down on GPU 5; the other nodes are healthy
    gpu_state(compute, target, {"gpus": 7, "nvlink_down": [5]})
    reason = fence(c, target)
    args = spec("diagnose", target)
    started = c.start_check(args)
    assert started == {"started": args["name"], "peer": None, "note": "", "job": started["job"]}
    # while it runs the node is out of other jobs' reach: one pinned to it waits (drained again after)
    intruder = sbatch(slurm, "-N", "1", "-w", target, "--wrap", "sleep 5")
    res = result(c, args)
    assert res["done"] is True and res["error"] is None and res["peer"] is None
    out = res["outputs"]
    assert set(out) == {"nvidia_smi_q", "nvlink", "dcgm"}
    smi = parse_nvidia_smi_q(out["nvidia_smi_q"])
    assert (smi.attached, len(smi.gpus), len(smi.lost)) == (8, 7, 1)  # ck-2's GPUs, not another node's
    assert parse_nvlink_status(out["nvlink"]).active[5] == 12
    assert parse_dcgm_diag(out["dcgm"]).verdict == "pass"
    assert res["exit_codes"] == {"nvidia_smi_q": 0, "nvlink": 0, "dcgm": 0}
    # the fence as it was: drained with Pitstop's reason; the reservation and the job gone
    assert node(slurm, target) == ("IDLE+DRAIN", reason)
    assert res["restored"] == {"state": "IDLE+DRAIN", "reason": reason}
    assert reservations(slurm) == []
    assert not slurm._out(["squeue", "-h", "-n", args["name"]]).strip()
    assert next(j for j in slurm.jobs() if j["id"] == intruder)["state"] == "PENDING"


def test_validate_with_a_peer_measures_the_degraded_host(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], compute: FakeCompute
) -> None:
    c, _ = cmds
    target = "ck-1"
    assert gpu_state(compute, target, "degraded")["state"] == {"busbw": 120.0}
    reason = fence(c, target, "REBOOT_NODE")
    args = spec("validate", target)
    started = c.start_check(args)
    peer = started["peer"]
    assert peer in set(NODES) - {target} and started["note"] == ""
    res = result(c, args)
    assert res["done"] and res["error"] is None and res["peer"] == peer
    assert set(res["outputs"]) == {"nvidia_smi_q", "dcgm", "nccl"}
    nccl = parse_all_gather(res["outputs"]["nccl"])
    assert nccl.ok and busbw(nccl) == 120.0  # the ring runs at the degraded node's speed
    assert {target, peer} <= set(res["outputs"]["nccl"].split())  # ranks on both nodes
    assert parse_dcgm_diag(res["outputs"]["dcgm"]).verdict == "pass"
    assert node(slurm, target) == ("IDLE+DRAIN", reason)
    assert node(slurm, peer)[0] == "IDLE" and reservations(slurm) == []

    # the host is reported faulty: the VM comes back on a new host, and the same run measures it healthy
    compute.dispatch(
        "POST",
        f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{target}/reportHostAsFaulty"
        f"?requestId={uuid.uuid4()}",
        {"disruptionSchedule": "IMMEDIATE", "faultReasons": [{"behavior": "PERFORMANCE"}]},
    )
    time.sleep((DURATIONS["report"] + DURATIONS["report_restart"]) * compute.scale + 0.2)
    compute.dispatch("GET", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{target}", {})
    again = spec("validate", target, step=4)
    c.start_check(again)
    assert busbw(parse_all_gather(result(c, again)["outputs"]["nccl"])) == 190.0


def _fabric_spec(kind: str, target: str, step: int, **over: Any) -> dict[str, Any]:
    assert MEGA.fabric is not None
    base = spec("validate", target, step=step, fabric=MEGA.fabric.as_spec())
    if kind == "revalidate":
        base |= {"kind": "revalidate", "name": check_name(INCIDENT, step, "revalidate")}
    return base | over


def _judged(first: CheckProgress, second: CheckProgress | None = None) -> core_checks.ValidationVerdict:
    """The results as actuate judges them (core/checks), on a3-megagpu-8g after a reboot."""
    pol = policy_mod.from_doc({})
    table = core_checks.table_for(pol)
    v = core_checks.judge_validation("REBOOT_NODE", "a3-megagpu-8g", first, pol, table)  # type: ignore[arg-type]
    if second is None:
        return v
    return core_checks.judge_second_peer("REBOOT_NODE", "a3-megagpu-8g", v, second, pol, table)  # type: ignore[arg-type]


def test_a_shortfall_is_measured_again_against_another_peer_under_the_fabrics_setup(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], compute: FakeCompute
) -> None:
    """Issue 21 (5): the degraded host is short against two different peers, each run with the
    fabric's NCCL setup (8 ranks per node, -g 1, the TCPXO profile sourced): a hardware finding."""
    c, _ = cmds
    target = "ck-1"
    gpu_state(compute, target, "degraded")
    reason = fence(c, target, "REBOOT_NODE")
    first = _fabric_spec("validate", target, step=8)
    peer1 = c.start_check(first)["peer"]
    res1 = result(c, first)
    assert res1["done"] and res1["error"] is None, res1
    assert set(res1["outputs"]) == {"nvidia_smi_q", "dcgm", "nccl", "nccl_setup"}
    nccl = parse_all_gather(res1["outputs"]["nccl"])
    assert nccl.gpus_per_rank == 1 and busbw(nccl) == 120.0
    st = json.loads((Path(c.checks.directory) / first["name"] / "state.json").read_text())
    (srun,) = [argv for key, argv, _ in check_steps(st) if key == "nccl"]  # what the runner ran
    assert "--ntasks=16" in srun and "--ntasks-per-node=8" in srun and srun[srun.index("-g") + 1] == "1"
    assert "NCCL_LIB_DIR=/var/lib/tcpxo/lib64" in srun and "NCCL_FASTRAK_CTRL_DEV=enp0s12" in srun
    assert srun[srun.index("pitstop-nccl") + 1].endswith("/fabric/var/lib/tcpxo/lib64/nccl-env-profile.sh")
    v1 = _judged(res1)
    assert v1.wants_second_peer and v1.next == "PAGE"

    second = _fabric_spec("revalidate", target, step=8, exclude_peers=[peer1])
    peer2 = c.start_check(second)["peer"]
    assert peer2 not in (None, peer1, target)
    res2 = result(c, second)
    assert (
        res2["done"] and res2["error"] is None and set(res2["outputs"]) == {"nccl", "nccl_setup"}
    )  # no DCGM
    v = _judged(res1, res2)
    assert v.next == "REPLACE_NODE" and v.record(1.0)["hardware_fault"] is True
    assert [p["peer"] for p in v.peers] == [peer1, peer2] and f"against {peer2}" in v.validation.why
    assert node(slurm, target) == ("IDLE+DRAIN", reason) and reservations(slurm) == []


def test_a_shortfall_that_is_the_first_peers_returns_the_node_naming_that_peer(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], compute: FakeCompute
) -> None:
    """The first peer (the first idle node, ck-0) is the slow one: short against it, full speed
    against another; the repaired node returns and ck-0 is named as suspect, no REPLACE."""
    c, _ = cmds
    target = "ck-2"
    gpu_state(compute, "ck-0", "degraded")
    fence(c, target, "REBOOT_NODE")
    first = _fabric_spec("validate", target, step=9)
    assert c.start_check(first)["peer"] == "ck-0"
    res1 = result(c, first)
    assert busbw(parse_all_gather(res1["outputs"]["nccl"])) == 120.0
    second = _fabric_spec("revalidate", target, step=9, exclude_peers=["ck-0"])
    assert c.start_check(second)["peer"] not in (None, "ck-0", target)
    v = _judged(res1, result(c, second))
    assert v.next == "RETURN_TO_SERVICE" and v.validation.passed
    assert "ck-0 or the path to it is suspect" in v.note and v.record(1.0)["hardware_fault"] is False


def test_a_shortfall_with_no_second_peer_free_pages(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], compute: FakeCompute
) -> None:
    c, _ = cmds
    target = "ck-3"
    gpu_state(compute, target, "degraded")
    fence(c, target, "REBOOT_NODE")
    first = _fabric_spec("validate", target, step=10)
    peer1 = c.start_check(first)["peer"]
    res1 = result(c, first)
    busy = sbatch(slurm, "-N", "2", "-x", f"{target},{peer1}", "--wrap", "sleep 600")
    running(slurm, busy)  # every other node is taken
    second = _fabric_spec("revalidate", target, step=10, exclude_peers=[peer1])
    assert c.start_check(second)["peer"] is None
    res2 = result(c, second)
    assert res2["done"] and "nccl" not in res2["outputs"]
    v = _judged(res1, res2)
    assert v.next == "PAGE" and "no second healthy peer" in v.validation.why


def test_a_fabric_setup_the_agent_cannot_trust_is_refused(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, rec = cmds
    assert MEGA.fabric is not None
    good = MEGA.fabric.as_spec()
    bad_setups = [
        {**good, "env": {**good["env"], "LD_PRELOAD": "/tmp/x.so"}},
        {**good, "profile": "/var/lib/../../tmp/evil.sh"},
        {**good, "profile": "/var/lib/tcpxo/lib64/nccl-env-profile.sh; rm -rf /"},
        {**good, "ranks_per_node": 3},
        {**good, "env": {**good["env"], "NCCL_SOCKET_IFNAME": "eth0 $(reboot)"}},
        {**{k: v for k, v in good.items() if k != "name"}},
        "GPUDirect-TCPXO",
    ]
    fence(c, "ck-0", "REBOOT_NODE")
    for i, bad in enumerate(bad_setups):
        with pytest.raises(CommandRefusedError, match="fabric"):
            c.start_check(_fabric_spec("validate", "ck-0", step=20 + i, fabric=bad))
    with pytest.raises(CommandRefusedError, match="exclude_peers"):
        c.start_check(_fabric_spec("revalidate", "ck-0", step=30, exclude_peers=["ck-1; true"]))
    assert not [a for a in rec.mutating() if a[:2] != ["scontrol", "update"]]  # nothing but the fence


def test_validate_without_an_idle_peer_runs_dcgm_alone_and_says_why(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, _ = cmds
    target = "ck-3"
    reason = fence(c, target)
    busy = sbatch(slurm, "-N", "3", "-x", target, "--wrap", "sleep 600")
    running(slurm, busy)
    args = spec("validate", target, step=6)
    started = c.start_check(args)
    assert started["peer"] is None
    assert started["note"] == "no idle unreserved peer in partition gpu: no NCCL test"
    res = result(c, args)
    assert res["done"] and res["peer"] is None and res["note"] == started["note"]
    assert (
        set(res["outputs"]) == {"nvidia_smi_q", "dcgm"}
        and parse_dcgm_diag(res["outputs"]["dcgm"]).verdict == "pass"
    )
    assert node(slurm, target) == ("IDLE+DRAIN", reason) and reservations(slurm) == []


def test_a_start_delivered_again_starts_no_second_job(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, _ = cmds
    target = "ck-0"
    fence(c, target)
    args = spec("diagnose", target, step=7)
    answers: list[CheckStarted] = []
    threads = [threading.Thread(target=lambda: answers.append(c.start_check(args))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 3 and len({a["job"] for a in answers}) == 1
    # another agent process (no memory of the first) finds the same check
    other = SlurmCommands(checks=c.checks)
    assert other.start_check(args) == answers[0]
    assert result(c, args)["done"]
    assert c.start_check(args) == answers[0]  # also once it is over: nothing starts again
    assert holder_jobs(slurm, args["name"]) == [answers[0]["job"]]
    assert reservations(slurm) == [] and "DRAIN" in node(slurm, target)[0]


def test_a_runner_that_died_is_started_again(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], tmp_path: Path
) -> None:
    plain, rec = cmds
    slow = tmp_path / "slow-dcgmi"
    slow.write_text(f'#!/bin/sh\nsleep 3\nexec {sys.executable} -m pitstop.local.gpu_tools.dcgmi "$@"\n')
    slow.chmod(0o755)
    c = SlurmCommands(rec, checks=dataclasses.replace(plain.checks, dcgmi=(str(slow),)))
    try:
        target = "ck-1"
        reason = fence(c, target)
        args = spec("diagnose", target, step=8)
        c.start_check(args)
        (runner,) = c.runners.children
        time.sleep(1.0)
        runner.kill()  # as an agent restart under systemd would
        runner.wait()
        assert c.check_result(probe(args))["phase"] == "runner started again"
        res = result(c, args)
        assert res["done"] and res["error"] is None
        assert parse_dcgm_diag(res["outputs"]["dcgm"]).verdict == "pass"
        assert node(slurm, target) == ("IDLE+DRAIN", reason) and reservations(slurm) == []
    finally:
        for left in c.runners.children:  # the fixture ends only its own agent's runners
            left.kill()
            left.wait()


def test_a_start_that_fails_midway_puts_the_fence_back_and_a_retry_starts_afresh(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, rec = cmds
    target = "ck-3"
    reason = fence(c, target)
    args = spec("validate", target, step=11)

    def refusing(argv: list[str]) -> str:
        if argv[0] == "sbatch":
            raise RuntimeError("sbatch exited 1: sbatch: error: Batch job submission failed: Invalid account")
        return rec(argv)

    c.slurm.run = refusing
    with pytest.raises(RuntimeError, match="Invalid account"):
        c.start_check(args)
    assert ["scontrol", "update", f"NodeName={target}", "State=RESUME"] in rec.argvs  # it got that far
    assert reservations(slurm) == [] and node(slurm, target)[1] == reason
    # (a resumed node reads NOT_RESPONDING until slurmctld's next ping of it answers)
    _wait(lambda: node(slurm, target) == ("IDLE+DRAIN", reason), "drained again, responding")
    with pytest.raises(CommandRefusedError, match="did not start"):
        c.check_result(probe(args))
    c.slurm.run = rec
    started = c.start_check(args)
    assert started["job"] and started["peer"]
    assert result(c, args)["done"] and node(slurm, target) == ("IDLE+DRAIN", reason)


def test_a_check_needs_pitstops_own_fence_and_an_idle_node(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder]
) -> None:
    c, rec = cmds
    slurm._out(["scontrol", "update", "NodeName=ck-2", "State=DRAIN", "Reason=admin: bad DIMM"])
    for name in ("ck-2", "ck-3"):  # someone else's drain; no drain at all
        with pytest.raises(CommandRefusedError, match="not fenced by Pitstop"):
            c.start_check(spec("diagnose", name, step=9))
    assert node(slurm, "ck-2") == ("IDLE+DRAIN", "admin: bad DIMM") and node(slurm, "ck-3")[0] == "IDLE"
    job = sbatch(slurm, "-N", "1", "-w", "ck-1", "--wrap", "sleep 600")
    running(slurm, job)
    fence(c, "ck-1")
    with pytest.raises(RuntimeError, match="needs it idle") as busy:
        c.start_check(spec("diagnose", "ck-1", step=9))
    assert is_transient(busy.value)  # retried once the gang has moved
    assert reservations(slurm) == []
    assert [a for a in rec.mutating() if a[:2] != ["scontrol", "update"]] == []
    with pytest.raises(CommandRefusedError, match="no check"):
        c.check_result(probe(spec("diagnose", "ck-3", step=10)))


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("node all", {"node": "all"}),
    ("node ALL", {"node": "ALL"}),
    ("a node list", {"node": "ck-0,ck-1"}),
    ("a host range", {"node": "ck-[0-3]"}),
    ("not in sinfo", {"node": "ck-9"}),
    ("a name of another incident", {"name": "pitstop-iaaaaaaaaa-3-diagnose"}),
    ("a name of another kind", {"kind": "validate"}),
    ("a path", {"name": "../../etc"}),
    ("a reservation list", {"name": "pitstop-iqrstuvw23-3-diagnose,root_1"}),
    ("a DCGM level out of range", {"dcgm_level": 9}),
    ("a GPU count as text", {"gpus": "8"}),
    ("a GPU count as a bool", {"gpus": True}),
    ("an unknown argument", {"cmd": "rm -rf /"}),
    ("an incident in the wrong shape", {"incident": "iQRSTUVW23"}),
]


@pytest.mark.parametrize(("why", "over"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_check_arguments_are_refused_before_slurm_is_touched(
    slurm: SlurmCluster, cmds: tuple[SlurmCommands, Recorder], why: str, over: dict[str, Any]
) -> None:
    c, rec = cmds
    fence(c, "ck-0")
    rec.argvs.clear()
    for op in ("start_check", "check_result"):
        args = spec("diagnose", "ck-0") | over
        with pytest.raises(CommandRefusedError):
            c.execute(op, args if op == "start_check" else {k: args[k] for k in probe(args)} | over)
    assert rec.mutating() == [] and reservations(slurm) == []
    assert all(a[0] == "sinfo" for a in rec.argvs)  # at most the node list was read
    assert not (Path(c.checks.directory) / "pitstop-iqrstuvw23-3-diagnose").exists()
    with pytest.raises(CommandRefusedError):
        c.execute("capacity", {"job": "1", "node": over.get("node", "ck-0,ck-1")})


def test_node_named_all_is_refused_even_if_slurm_lists_it() -> None:
    c = SlurmCommands(lambda argv: "all\nck-0\n" if argv[0] == "sinfo" else "")
    for op in ("node_state", "jobs_on_node", "start_check"):
        with pytest.raises(CommandRefusedError):
            c.execute(op, {"node": "all"} if op != "start_check" else spec("diagnose", "all"))


# -- through actuate's adapter: Pub/Sub, the agent's ledger, Firestore ---------------------------


@pytest.mark.emulator
def test_the_scheduler_adapter_runs_a_validation_once(
    slurm: SlurmCluster,
    cmds: tuple[SlurmCommands, Recorder],
    compute: FakeCompute,
    pubsub_host: str,
    fs_client: firestore.Client,
    tmp_path: Path,
) -> None:
    c, _ = cmds
    project = f"t-{uuid.uuid4().hex[:10]}"
    out = ResultsTopic(f"projects/{project}/topics/pitstop-slurm-train-results")
    out.publisher.create_topic(name=out.topic)
    sub = SubscriberClient()
    path = sub.subscription_path(project, "pitstop-slurm-train-results-actuate")
    sub.create_subscription(request={"name": path, "topic": out.topic, "enable_message_ordering": True})
    results = fs_client.collection("pitstop_slurm_results")
    pub = Loopback(Agent(c, Ledger(tmp_path / "ledger.sqlite"), out))
    sched = SlurmAgentClient(pub, "t", results, wait_s=30, merger=ResultsMerger(sub, path, results))
    ctx = StepRef(INCIDENT, 5)

    job = sbatch(slurm, "-N", "2", "--requeue", "--wrap", "sleep 600")
    target, _ = running(slurm, job)
    gpu_state(compute, target, "degraded")
    sched.fence(target, ctx, "RESET_GPU")
    cap = sched.capacity(job, target, ctx)
    assert cap["enough"] is True and cap["need"] == 2 and cap["free"] == 3
    sched.requeue(job, ctx)
    _wait(lambda: target not in slurm._out(["squeue", "-h", "-j", job, "-o", "%N"]), "gang off the node")

    check = cast(CheckSpec, {k: v for k, v in spec("validate", target, step=5).items() if k != "node"})
    first = sched.start_check(target, check, ctx)
    again = sched.start_check(target, check, ctx)  # actuate retried: the same command, the same run
    assert again == first and first["started"] == check["name"] and first["peer"]
    assert [p["op"] for p in pub.published].count("start_check") == 1
    deadline = time.monotonic() + 90
    res = sched.check_result(target, check, ctx)
    while not res["done"] and time.monotonic() < deadline:
        time.sleep(1.0)
        res = sched.check_result(target, check, ctx)
    assert res["done"] and res["peer"] == first["peer"]
    assert busbw(parse_all_gather(res["outputs"]["nccl"])) == 120.0
    assert node(slurm, target) == ("IDLE+DRAIN", drain_reason(INCIDENT, "RESET_GPU"))
    assert holder_jobs(slurm, check["name"]) == [first["job"]]
    sub.close()


# -- pieces: the tool command lines, the agent's flags, the stack's stand-ins --------------------


def test_each_tool_runs_as_a_step_of_the_holder_job() -> None:
    st: CheckState = {
        "kind": "validate",
        "job": "42",
        "node": "a3-node-007",
        "peer": "a3-node-001",
        "gpus": 8,
        "dcgm_level": 2,
        "message_bytes": 8 << 30,
        "tools": {
            "nvidia_smi": ["nvidia-smi"],
            "dcgmi": ["dcgmi"],
            "all_gather_perf": ["/opt/nccl-tests/all_gather_perf"],
            "srun_mpi": "pmix",
            "gres": "gpu",
        },
    }
    (smi, sargv, _), (dcgm, dargv, _), (nccl, nargv, _) = check_steps(st)
    head = ["srun", "--jobid=42", "--overlap", "--chdir=/tmp", "--quiet", "--gres=gpu:8"]
    # the GPU count first (issue 35: a node short of GPUs is a finding the NCCL test cannot make)
    assert (smi, sargv[sargv.index("--") + 1 :]) == ("nvidia_smi_q", ["nvidia-smi", "-q"])
    assert (dcgm, dargv) == (
        "dcgm",
        [*head, "--nodes=1", "--ntasks=1", "--nodelist=a3-node-007", "--", "dcgmi", "diag", "-r", "2", "-j"],
    )
    assert (nccl, nargv) == (
        "nccl",
        [
            *head,
            *("--mpi=pmix", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"),
            *("--nodelist=a3-node-007,a3-node-001", "--", "/opt/nccl-tests/all_gather_perf"),
            *("-b", str(1 << 30), "-e", str(8 << 30), "-f", "2", "-g", "8"),
        ],
    )
    diag = check_steps({**st, "kind": "diagnose", "dcgm_level": 1})
    assert [k for k, _, _ in diag] == ["nvidia_smi_q", "nvlink", "dcgm"]
    assert [a[a.index("--") + 1 :] for _, a, _ in diag][:2] == [
        ["nvidia-smi", "-q"],
        ["nvidia-smi", "nvlink", "--status"],
    ]
    assert [k for k, _, _ in check_steps({**st, "peer": None})] == ["nvidia_smi_q", "dcgm"]
    assert [k for k, _, _ in check_steps({**st, "kind": "revalidate"})] == ["nccl"]
    corr = check_steps({**st, "kind": "corroborate", "borrowed": True})
    assert [k for k, _, _ in corr] == ["dmesg", "clock", "nvidia_smi_q"]
    clock = corr[1][1]  # the node's clock, read in the same check as its ring buffer (issue 35 (1))
    assert clock[clock.index("--") + 1 :] == ["/bin/sh", "-c", "date +%s.%N; cat /proc/uptime"]


def test_a_corroboration_beside_a_running_job_asks_for_the_nodes_gpus_explicitly() -> None:
    """Issue 35 (11): the read-only tools run as a step of the job already on the node; without
    --gres that step gets none of an exclusive job's GPUs, and nvidia-smi saw fewer or none."""
    st: CheckState = {
        "kind": "corroborate",
        "job": "9001",
        "node": "a3-node-007",
        "borrowed": True,
        "gpus": 8,
        "tools": {
            "nvidia_smi": ["nvidia-smi"],
            "dmesg": ["dmesg"],
            "dcgmi": ["dcgmi"],
            "all_gather_perf": ["all_gather_perf"],
            "srun_mpi": None,
            "gres": "gpu",
        },
    }
    steps = {key: argv for key, argv, _ in check_steps(st)}
    head = ["srun", "--jobid=9001", "--overlap", "--chdir=/tmp", "--quiet", "--gres=gpu:8"]
    assert steps["nvidia_smi_q"] == [
        *head,
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=a3-node-007",
        "--",
        "nvidia-smi",
        "-q",
    ]
    assert steps["dmesg"][: len(head)] == head


def test_agent_flags_and_the_local_stacks_stand_ins(tmp_path: Path) -> None:
    base = ["--subscription", "s", "--results-topic", "r"]
    assert commands_for(parse_args(base)).checks == CheckTools()
    local = commands_for(parse_args([*base, *stack.gpu_tool_flags(), "--check-dir", str(tmp_path)])).checks
    assert local.directory == str(tmp_path)
    state = json.dumps({"ck-7": {"gpus": 6}})
    env = {**os.environ, "PITSTOP_GPU_STATE": state, "PITSTOP_NODE": "ck-7"}
    out = subprocess.run([*local.nvidia_smi, "-q"], env=env, capture_output=True, text=True, check=False)
    assert len(parse_nvidia_smi_q(out.stdout).gpus) == 6
    real = subprocess.run(list(CheckTools().clock), capture_output=True, text=True, check=True)
    assert ring_buffer.parse_boot_clock(real.stdout) is not None  # what a node's own tools print
    booted = json.dumps({"ck-7": {"boot": time.time() - 3600.0}})
    env = {**os.environ, "PITSTOP_GPU_STATE": booted, "PITSTOP_NODE": "ck-7"}
    out = subprocess.run([*local.clock], env=env, capture_output=True, text=True, check=True)
    assert abs((ring_buffer.parse_boot_clock(out.stdout) or 0.0) - (time.time() - 3600.0)) < 60
    for bad in (["--srun-mpi", "pmix;rm"], ["--check-gres", "gpu:8"], ["--dcgmi", ""]):
        with pytest.raises(SystemExit):
            commands_for(parse_args([*base, *bad]))


# -- the fake Compute's per-host GPU outcomes ---------------------------------------------------


def test_the_gpu_stand_ins_of_an_a4x_vm_see_its_four_gpus(tmp_path: Path) -> None:
    """An A4X VM has 4 GB200 GPUs (guestAccelerators, fake_compute.ACCELERATORS): its stand-ins
    count 4 on a healthy host as on a faulty one, where an A3's count the default 8."""
    path = tmp_path / "gpu.json"
    fake = FakeCompute(gpu_state_path=path)
    fake.add_instance(PROJECT, ZONE, "tray-1", "a4x-highgpu-4g")
    fake.add_instance(PROJECT, ZONE, "a3-1")
    assert fake.gpu_states() == {"tray-1": {"total_gpus": 4}}
    code, _ = fake.dispatch(
        "POST",
        "/_admin/gpu_state",
        {"project": PROJECT, "zone": ZONE, "instance": "tray-1", "state": "degraded"},
    )
    assert code == 200 and fake.gpu_states() == {"tray-1": {"total_gpus": 4, "busbw": 120.0}}
    assert json.loads(path.read_text()) == fake.gpu_states()


def test_gpu_state_follows_the_host_a_vm_runs_on(tmp_path: Path) -> None:
    now = [1000.0]
    path = tmp_path / "gpu.json"
    path.write_text('{"vm-1": {"busbw": 1}}')
    fake = FakeCompute(time_scale=0.01, clock=lambda: now[0], gpu_state_path=path)
    assert json.loads(path.read_text()) == {}  # an earlier run's file says nothing about these hosts
    for n in ("vm-1", "vm-2"):
        fake.add_instance(PROJECT, ZONE, n, mig="grp")

    def post(p: str, body: dict[str, Any]) -> tuple[int, Any]:
        return fake.dispatch("POST", p, body)

    def admin(name: str, state: Any) -> tuple[int, Any]:
        return post("/_admin/gpu_state", {"project": PROJECT, "zone": ZONE, "instance": name, "state": state})

    def vm(name: str, method: str, body: dict[str, Any] | None = None) -> None:
        base = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}"
        p = (
            f"{base}/instanceGroupManagers/grp/recreateInstances"
            if method == "recreate"
            else f"{base}/instances/{name}/{method}"
        )
        code, ans = post(f"{p}?requestId={uuid.uuid4()}", body or {})
        assert code == 200, ans

    def written() -> Any:
        fake.dispatch("GET", f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/vm-1", {})
        return json.loads(path.read_text())

    assert admin("vm-1", "degraded")[0] == 200
    assert written() == {"vm-1": {"busbw": 120.0}}
    vm("vm-1", "reset")  # same host: still degraded
    now[0] += DURATIONS["reset"] * 0.01 + 1
    assert written() == {"vm-1": {"busbw": 120.0}}
    vm("vm-1", "reportHostAsFaulty", {"disruptionSchedule": "IMMEDIATE", "faultReasons": [{"behavior": "X"}]})
    assert written() == {"vm-1": {"busbw": 120.0}}  # the report runs while the VM stays on its host
    now[0] += (DURATIONS["report"] + DURATIONS["report_restart"]) * 0.01 + 1
    assert written() == {}  # moved to a healthy host
    code, body = admin("vm-2", {"gpus": 7, "nvlink_down": [3]})
    assert code == 200 and body["state"] == {"gpus": 7, "nvlink_down": [3]}
    assert written() == {"vm-2": {"gpus": 7, "nvlink_down": [3]}}
    assert next(i for i in fake.snapshot()["instances"] if i["name"] == "vm-2")["gpu_state"] == body["state"]
    vm("vm-2", "recreate", {"instances": [f"zones/{ZONE}/instances/vm-2"]})
    now[0] += DURATIONS["recreate"] * 0.01 + 1
    assert written() == {}
    admin("vm-1", {"dcgm": "fail"})
    assert admin("vm-1", None)[0] == 200 and written() == {}  # cleared
    for bad in ({"busbw": "fast"}, {"gpus": -1}, {"dcgm": "maybe"}, {"rm": 1}, "melted", 7):
        code, body = admin("vm-1", bad)
        assert code == 400 and "bad GPU state" in body["error"]["message"], bad
    assert post("/_admin/gpu_state", {"project": PROJECT, "zone": ZONE, "instance": "vm-1"})[0] == 400
    assert admin("vm-9", "degraded")[0] == 404
    assert written() == {}


def test_without_a_state_file_the_fake_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PITSTOP_GPU_STATE", raising=False)
    fake = FakeCompute()
    fake.add_instance(PROJECT, ZONE, "vm-1")
    code, _ = fake.dispatch(
        "POST",
        "/_admin/gpu_state",
        {"project": PROJECT, "zone": ZONE, "instance": "vm-1", "state": "degraded"},
    )
    assert code == 200 and fake.gpu_states() == {"vm-1": {"busbw": 120.0}} and fake.gpu_state_path is None
    monkeypatch.setenv("PITSTOP_GPU_STATE", str(tmp_path / "from-env.json"))
    assert FakeCompute().gpu_state_path == str(tmp_path / "from-env.json")
    assert json.loads((tmp_path / "from-env.json").read_text()) == {}
