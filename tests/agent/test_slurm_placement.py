"""The agent's view of the fabric and its placement of a requeued gang, on a real Slurm (22.05) running
topology/tree with a topology.conf written from the fake Compute's places (local/slurm.topology_conf).

Slurm facts relied on: ``scontrol show topology`` prints one ``SwitchName=... Level=... Nodes=...
[Switches=...]`` line per switch (https://slurm.schedmd.com/topology.conf.html; observed here);
``scontrol update JobId=J ReqNodeList=...`` sets a pending job's required nodes and is refused once it
runs (scontrol(1); observed); Slurm 25.11's expedited requeue
(https://slurm.schedmd.com/news.html) is reported only by a 25.11 or later.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from pitstop.agent.slurm import SlurmCommands
from pitstop.agent.slurm.access import CheckTools, SlurmAccess
from pitstop.agent.slurm.placement import Placement, parse_topology
from pitstop.core.slurm_wire import CapacityAnswer, RequeueAnswer
from pitstop.local.slurm import SlurmCluster

# b1/s1 holds the gang (p1, p2) and its spare (p4); p3 sorts before p4 but sits in another block.
PLACES = {"p1": ("b1", "s1"), "p2": ("b1", "s1"), "p3": ("b2", "s1"), "p4": ("b1", "s1")}


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="pitstop-place-")), list(PLACES), places=PLACES)
    cluster.start()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before


@pytest.fixture
def cmds(slurm: SlurmCluster, tmp_path: Path) -> Iterator[SlurmCommands]:
    yield SlurmCommands(release_requeued=True, checks=CheckTools(directory=str(tmp_path)))
    slurm.cancel_jobs()
    for n in PLACES:
        slurm._out(["scontrol", "update", f"NodeName={n}", "State=RESUME"])
    slurm.wait_idle(len(PLACES))


def _running_on(slurm: SlurmCluster, job: str, timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = slurm.job_nodes(job)
        if nodes:
            return nodes
        time.sleep(0.3)
    raise TimeoutError(f"job {job} did not run")


def _drain(slurm: SlurmCluster, node: str) -> None:
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=test"], env=slurm.env, check=True
    )


def test_capacity_says_where_each_node_sits_in_slurm_s_topology(
    slurm: SlurmCluster, cmds: SlurmCommands
) -> None:
    job = slurm.submit(2, command="sleep 600")
    assert sorted(_running_on(slurm, job)) == ["p1", "p2"]  # topology/tree: one leaf switch fits it
    _drain(slurm, "p1")
    a = cast(CapacityAnswer, cmds.execute("capacity", {"job": job, "node": "p1"}))
    assert a["enough"] is True
    assert a["idle"] == ["p3", "p4"]  # the scheduler's order: the far one first
    paths = a.get("paths") or {}
    assert paths["p1"] == ["b1-s1", "b1", "root"] and paths["p3"] == ["b2-s1", "b2", "root"]
    assert a.get("nodes") == ["p1", "p2"] and a.get("native") is None
    assert "22.05" in str(a.get("slurm_version")) and a.get("elastic") is False


def test_a_requeue_onto_nodes_pins_the_gang_there_and_a_later_requeue_is_not_held_by_it(
    slurm: SlurmCluster, cmds: SlurmCommands
) -> None:
    """Placed on its own healthy node and the spare of its sub-block (not p3, listed first); Pitstop's
    pin is remembered, so a fault on a pinned node later does not read as the owner's pin."""
    job = slurm.submit(2, command="sleep 600", exclude=["p3"])
    assert sorted(_running_on(slurm, job)) == ["p1", "p2"]
    _drain(slurm, "p1")
    a = cast(RequeueAnswer, cmds.execute("requeue", {"job": job, "onto": ["p2", "p4"]}))
    assert a.get("placed") == ["p2", "p4"] and a.get("released") is True
    assert sorted(_running_on(slurm, job)) == ["p2", "p4"]
    assert cmds.placement.pinned(job) == ["p2", "p4"]
    _drain(slurm, "p4")  # the next fault, on the node it was pinned to
    cap = cast(CapacityAnswer, cmds.execute("capacity", {"job": job, "node": "p4"}))
    assert "requires the fenced node" not in cap["why"]
    again = cast(RequeueAnswer, cmds.execute("requeue", {"job": job}))
    assert again.get("unpinned") is True and cmds.placement.pinned(job) is None


def test_an_owner_s_pin_still_holds_the_job() -> None:
    p = Placement(SlurmAccess(lambda argv: ""), tempfile.mkdtemp())
    assert not p.ours("7", {"n1", "n2"})  # Pitstop never pinned job 7
    p.remember("7", ["n2", "n1"])
    assert p.ours("7", {"n1", "n2"}) and not p.ours("7", {"n1", "n3"})


def test_topology_block_and_tree_output_are_read_leaf_first() -> None:
    tree = (
        "SwitchName=b1-s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
        "SwitchName=b1 Level=1 LinkSpeed=1 Nodes=n[1-2] Switches=b1-s[1-2]\n"
        "SwitchName=b1-s2 Level=0 LinkSpeed=1 Nodes=n3\n"
    )
    assert parse_topology(tree) == {"n1": ["b1-s1", "b1"], "n2": ["b1-s1", "b1"], "n3": ["b1-s2", "b1"]}
    block = "BlockName=nvl1 BlockIndex=0 Nodes=t[01-18] BlockSize=18\n"
    assert parse_topology(block)["t07"] == ["nvl1"]
    assert parse_topology("") == {}


@pytest.mark.parametrize(
    ("version", "requeue", "native"),
    [
        ("slurm-wlm 22.05.8", "1", None),  # the local Slurm: no expedited requeue
        ("slurm 25.05.3", "expedite", None),  # before 25.11: the word means nothing
        ("slurm 25.11.0", "1", None),  # a job that did not ask for it
        ("slurm 25.11.0", "expedite", "slurm-expedite"),
    ],
)
def test_expedited_requeue_is_reported_only_from_slurm_25_11_for_a_job_that_asks(
    version: str, requeue: str, native: str | None
) -> None:
    p = Placement(SlurmAccess(lambda argv: version if argv[1:] == ["--version"] else ""), tempfile.mkdtemp())
    assert p.native({"Requeue": requeue}) == native


def test_doctor_on_the_controller_says_what_slurm_offers(slurm: SlurmCluster) -> None:
    """The local 22.05 with topology/tree: no expedited requeue, and its leaf switches."""
    from pitstop.agent.slurm.placement import doctor

    lines = doctor(SlurmAccess())
    assert lines[0].startswith("slurm: slurm-wlm 22.05.8: no expedited requeue")
    leaves = len(set(PLACES.values()))  # a leaf switch per (block, sub-block)
    assert lines[1].startswith(f"slurm: topology of {len(PLACES)} nodes under {leaves} leaf switches")
    later = doctor(SlurmAccess(lambda argv: "slurm 25.11.1" if argv[1:] == ["--version"] else ""))
    assert "expedited requeue available" in later[0] and "no topology plugin" in later[1]
