"""Localising a hung job on a real Slurm of 16 nodes: the agent's gang checks (steps of the job
itself, on every node at once) and core/localise's verdicts on what they return.

A real slurmctld with sixteen slurmd (pitstop.local.slurm), the agent's SlurmCommands in this
process (its check runner a real child process, every tool a real ``srun --jobid --overlap``); the
GPU tools are the stand-ins, reading the per-node outcomes of PITSTOP_GPU_STATE.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from pitstop.agent.slurm import CheckTools, CommandRefusedError, SlurmCommands, run_subprocess
from pitstop.core import localise
from pitstop.core.catalog import default_xid_policy
from pitstop.core.domain import CheckRun, LocaliseConfig
from pitstop.core.slurm_wire import CheckProgress
from pitstop.local.slurm import SlurmCluster

NODES = [f"lc-{i:02d}" for i in range(16)]
INCIDENT = "ilocaliz23"
HUNG, SLOW = "lc-11", "lc-05"
NODE_XIDS = localise.node_fault_xids(default_xid_policy())
CFG = cast(LocaliseConfig, {"tool_timeout_s": 60, "link_timeout_s": 120, "link_bytes": 64 << 20})
TOOLS = CheckTools(
    nvidia_smi=(sys.executable, "-m", "pitstop.local.gpu_tools.nvidia_smi"),
    dmesg=(sys.executable, "-m", "pitstop.local.gpu_tools.dmesg"),
    all_gather_perf=(sys.executable, "-m", "pitstop.local.gpu_tools.all_gather_perf"),
)


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitstop-localise-slurm-")), NODES).start()
    state = cluster.workdir / "gpu-state.json"
    # a GPU stuck mid-collective on one node, a link at a fifth of its speed on another
    state.write_text(json.dumps({HUNG: {"hung": True, "dcgm": "fail"}, SLOW: {"busbw": 38.0}}))
    keys = ("SLURM_CONF", "PITSTOP_GPU_STATE", "PITSTOP_NODE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({"SLURM_CONF": str(cluster.conf), "PITSTOP_GPU_STATE": str(state)})
    os.environ.pop("PITSTOP_NODE", None)  # the stand-ins learn their node from Slurm
    try:
        yield cluster
    finally:
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def cmds(slurm: SlurmCluster) -> Iterator[SlurmCommands]:
    c = SlurmCommands(
        run_subprocess, checks=dataclasses.replace(TOOLS, directory=str(slurm.workdir / "checks"))
    )
    yield c
    for runner in c.runners.children:
        runner.kill()
        runner.wait()


@pytest.fixture(scope="module")
def job(slurm: SlurmCluster) -> str:
    """The hung training job: a gang on all sixteen nodes."""
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", "-N", str(len(NODES)), "--wrap", "sleep 900"],
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
        cwd=slurm.workdir,
    ).stdout.strip()
    deadline = time.monotonic() + 90
    while not any(j["id"] == out and j["state"] == "RUNNING" for j in slurm.jobs()):
        assert time.monotonic() < deadline, "the gang did not start"
        time.sleep(0.5)
    return out


def run(cmds: SlurmCommands, spec: dict[str, Any], timeout: float = 240.0) -> CheckProgress:
    """Start a gang check and poll it until done, as actuate's workflow does (the nodes are the
    agent's to find: the adapter does not send them)."""
    spec = {k: v for k, v in spec.items() if k != "nodes"}
    started = cmds.start_gang_check(spec)
    assert cmds.start_gang_check(spec) == started  # a start delivered again answers the same
    deadline = time.monotonic() + timeout
    while True:
        res = cmds.gang_check_result({"name": spec["name"], "job": spec["job"]})
        if res["done"]:
            return res
        assert time.monotonic() < deadline, f"gang check not done: {res.get('phase')}"
        time.sleep(1.0)


def test_the_sweep_finds_the_stuck_gpu_among_16_nodes_and_changes_nothing(
    slurm: SlurmCluster, cmds: SlurmCommands, job: str
) -> None:
    spec: dict[str, Any] = {**localise.sweep_spec(INCIDENT, 1, job, [], CFG)}
    res = run(cmds, spec)
    assert res["nodes"] == NODES and res["error"] is None
    assert set(res["outputs"]) == {
        localise.output_key(t, n) for n in NODES for t in ("dmesg", "nvidia_smi_q")
    }
    verdict = localise.judge_sweep(res["nodes"], cast(CheckRun, res), 25, NODE_XIDS)
    assert verdict.culprits == (HUNG,) and "7 of 8 GPUs visible" in verdict.findings[HUNG][0]
    # beside the job: no drain, no reservation, the gang still running on its sixteen nodes
    assert all(j["state"] == "RUNNING" for j in slurm.jobs() if j["id"] == job)
    assert "ReservationName" not in slurm._out(["scontrol", "show", "reservation", "-o"])
    assert "drain" not in " ".join(slurm.node_states().values()).lower()


def test_the_ring_test_finds_the_slow_link_among_16_nodes(cmds: SlurmCommands, job: str) -> None:
    spec: dict[str, Any] = {**localise.links_spec(INCIDENT, 2, job, NODES, CFG), "gpus": 8}
    assert len(spec["pairs"]) == len(NODES)  # ring neighbours, not n²
    res = run(cmds, spec)
    pairs = [localise.split_pair(p) for p in spec["pairs"]]
    verdict = localise.judge_links(pairs, cast(CheckRun, res), 0.7, 25)
    assert verdict.culprits == (SLOW,)
    assert verdict.measured[f"lc-04+{SLOW}"] == pytest.approx(38.0)


def test_a_gang_check_names_only_the_jobs_own_nodes(cmds: SlurmCommands, job: str) -> None:
    spec: dict[str, Any] = {
        **localise.links_spec(INCIDENT, 3, job, NODES, CFG),
        "gpus": 8,
        "pairs": ["lc-01+elsewhere"],
    }
    spec.pop("nodes")
    with pytest.raises(CommandRefusedError, match="outside job"):
        cmds.start_gang_check(spec)
    with pytest.raises(CommandRefusedError, match="two distinct"):
        cmds.start_gang_check({**spec, "pairs": ["lc-01+lc-01"]})
    with pytest.raises(CommandRefusedError, match=r"not known|COMPLETED|CANCELLED"):
        cmds.start_gang_check(
            {k: v for k, v in localise.sweep_spec(INCIDENT, 4, "99999", [], CFG).items() if k != "nodes"}
        )
