"""A degraded GKE node's planned move on the whole local GKE stack (issue 24), as
tests/e2e/test_e2e_planned.py is on Slurm.

One JobSet member's GPU stand-in throttles; the Monitoring stand-in opens the throttle policy's
alert after its (scaled) window; ingest opens a ``degraded`` incident; actuate holds the node
against the JobSet's other nodes (the pods' nodes, from the fake API server) read through the
Managed Service for Prometheus stand-in (local/fake_prometheus.py) with the real HTTP client:
dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, reduced and compared in core. A straggler alone
is cordoned, its pod evicted with its grace period (the checkpoint), the JobSet restarted once onto
the spare, the node repaired by its finding; a gang throttling alike is not moved, its fences are
lifted and a person is paged. Each is a demo scenario (pitstop.tools.demo_gke_planned).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.adapters.prometheus import PromQLReader
from pitstop.core import degraded
from pitstop.local import chaos
from pitstop.local.stack import PROJECT, ClusterSpec, Stack
from pitstop.tools import demo_gke_planned
from pitstop.tools.demo import GKE_COMPUTE_SCALE, POD_GRACE_S, GkeScenarios

pytestmark = pytest.mark.emulator
POL = degraded.default_policy()


@pytest.fixture(scope="module")
def sc() -> Iterator[GkeScenarios]:
    # five nodes: a straggler, two that throttle alike, the partner and the spare
    stack = Stack(
        Path(tempfile.mkdtemp(prefix="pitstop-gke-planned-")),
        ClusterSpec.gke(5),
        compute_scale=GKE_COMPUTE_SCALE,
    )
    try:
        stack.up()
        yield GkeScenarios(stack)
    except BaseException:
        for name in ("ingest", "actuate", "executions", "kube", "prometheus", "monitoring"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log ---\n" + "\n".join(log.read_text().splitlines()[-30:]))
        raise
    finally:
        stack.down()


def test_a_straggler_alone_is_moved_at_its_checkpoint_onto_the_spare(sc: GkeScenarios) -> None:
    sc.settle()
    bad = sc.nodes[0]
    r = demo_gke_planned.straggler_spare(sc, bad)
    f = r.facts
    print(r.detail, json.dumps(f, default=str))
    peers = f["peers"]
    assert peers["source"] == "prometheus" and peers["verdict"] == "move", r.detail
    assert peers["node_value"] == pytest.approx(0.6, abs=0.05), r.detail
    assert peers["peers"] == {sc.partner: 0.0}, r.detail  # the JobSet's other node, read through PromQL
    assert [e["grace"] for e in f["evicted"]] == [POD_GRACE_S], r.detail  # the checkpoint: SIGTERM, grace
    # the JobSet restarted once at that checkpoint, off the cordoned node onto the spare (its failure
    # policy restarts it on the eviction; Pitstop's own requeue finds it moved and adds none)
    assert sorted(f["moved_to"]) == sorted([sc.partner, sc.spare]) and f["restarts"] == 1, r.detail
    assert ("DRAIN_NODE", "REPLACE_NODE") in f["steps"], r.detail  # the finding: HW thermal slowdown
    assert r.resume_s is not None and r.repair_s is not None and r.resume_s < r.repair_s, r.detail
    assert r.passed, r.detail


def test_a_gang_throttling_alike_is_not_moved_and_a_person_is_paged(sc: GkeScenarios) -> None:
    sc.settle()
    members = sc.nodes[1:3]
    r = demo_gke_planned.gang_wide_throttle(sc, members)
    f = r.facts
    print(r.detail, json.dumps(f, default=str))
    assert all(p["verdict"] == "gang_wide" and p["source"] == "prometheus" for p in f["peers"]), r.detail
    assert f["restarts"] == 0 and sorted(f["placed"]) == sorted(members), r.detail  # nothing moved
    assert all(f["back"].values()), r.detail  # the cordons and taints were lifted
    assert all("NOT moved" in t for t in f["texts"]), f["texts"]  # a page per node
    assert r.passed, r.detail


def test_chaos_straggler_and_degrading_show_in_the_prometheus_stand_in(sc: GkeScenarios) -> None:
    """`pitstop local chaos straggler|degrading --node N` on the GKE stack: what actuate's PromQL
    reader then reads (healed again within the alert's window, so no incident opens)."""
    slow, failing = sc.nodes[1], sc.nodes[2]
    reader = PromQLReader(sc.stack.endpoints["prometheus"])
    chaos.apply(sc.stack, "straggler", node=slow)
    chaos.apply(sc.stack, "degrading", node=failing)
    try:
        now = time.time()
        throttle = reader.node_values(PROJECT, POL.prometheus["throttle"], [slow, failing], now)
        ecc = reader.node_values(PROJECT, POL.prometheus["ecc"], [slow, failing], now)
    finally:
        for n in (slow, failing):
            chaos.apply(sc.stack, "heal", node=n)
    assert throttle[slow] == pytest.approx(0.6, abs=0.05) and throttle[failing] == 0.0
    assert ecc == {slow: 0.0, failing: 40.0}  # the preset's 40 correctable errors an hour
