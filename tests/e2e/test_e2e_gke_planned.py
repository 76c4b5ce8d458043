"""A degraded GKE node's planned move on the whole local GKE stack (issue 24), as
tests/e2e/test_e2e_planned.py is on Slurm.

One JobSet member's GPU stand-in throttles; the Monitoring stand-in opens the throttle policy's
alert after its (scaled) window; ingest opens a ``degraded`` incident; actuate holds the node
against the JobSet's other nodes (the pods' nodes, from the fake API server) read through the
Managed Service for Prometheus stand-in (local/fake_prometheus.py) with the real HTTP client:
dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, reduced and compared in core. A straggler
alone is fenced (Pitstop's taint), its pod evicted with its grace period (the checkpoint), the
JobSet restarted once onto the spare, the node repaired by its finding; a gang throttling alike is
not moved, its fences are
lifted and a person is paged. The scenarios are this module's own (tests/pipeline.py drives the
stack), not the demo's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pitstop.adapters.prometheus import PromQLReader
from pitstop.core import degraded
from pitstop.core.domain import Measurement
from pitstop.local import chaos
from pitstop.local.gke_drive import POD_GRACE_S, evictions
from pitstop.local.gke_stack import NAMESPACE, Watch
from pitstop.local.stack import PROJECT, ClusterSpec
from tests.pipeline import GkePipeline, stack_up

pytestmark = pytest.mark.emulator
POL = degraded.default_policy()
STRAGGLER = {"throttle": 0.6, "throttle_reason": "thermal"}  # HW thermal slowdown: the finding
POWER_CAPPED = {"throttle": 0.5, "throttle_reason": "power"}  # the job's own power cap: every node alike
TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def sc() -> Iterator[GkePipeline]:
    # seven nodes, each test takes its own: a straggler, its partner and the spare; two that throttle
    # alike; a straggler and a degrading node the chaos verbs make
    with stack_up("gke-planned", ClusterSpec.gke(7), compute_scale=0.03) as stack:
        yield GkePipeline(stack)


def test_a_straggler_alone_is_moved_at_its_checkpoint_onto_the_spare(sc: GkePipeline) -> None:
    sc.settle()
    bad, partner, spare = sc.take(3)
    g = sc.gangs.gang("gke-straggler", [bad, partner], [spare])
    watch = Watch(sc.kube.url, f"/api/v1/namespaces/{NAMESPACE}/pods")
    since = time.time()
    try:
        sc.gpu_state(bad, STRAGGLER)
        sc.wait(lambda: [i for i in sc.incidents(bad) if i["created_at"] >= since], TIMEOUT_S, "the incident")
        where = sc.gangs.moved(g, [bad])
        running_at = time.time()
        inc = sc.finished(bad, timeout=TIMEOUT_S)
        restarts = sc.gangs.restarts(g.name)
    finally:
        events = watch.stop()
        sc.gpu_state(bad, None)
        sc.gangs.done_with(g)
    peers = inc.get("corroboration") or {}
    _, repair_s = sc.resume_and_repair(inc)
    resume_s = running_at - float(inc["timeline"]["detected"])  # the alert's open to the gang moved
    assert (inc["state"], inc["kind"]) == ("RESOLVED", "degraded"), inc
    assert peers["source"] == "prometheus" and peers["verdict"] == "move", peers
    assert peers["node_value"] == pytest.approx(0.6, abs=0.05), peers
    assert peers["peers"] == {partner: 0.0}, peers  # the JobSet's other node, read through PromQL
    assert [e["grace"] for e in evictions(events, bad)] == [POD_GRACE_S]  # the checkpoint: SIGTERM, grace
    # the JobSet restarted once at that checkpoint, off the fenced node onto the spare (its failure
    # policy restarts it on the eviction; Pitstop's own requeue finds it moved and adds none)
    assert sorted(where) == sorted([partner, spare]) and restarts == 1, where
    escalations = [(e["from"], e["to"]) for e in inc.get("escalations", [])]
    assert ("DRAIN_NODE", "REPLACE_NODE") in escalations, escalations  # the finding: HW thermal slowdown
    assert len(sc.calls("report_host_as_faulty", bad)) == 1
    assert repair_s is not None and resume_s < repair_s, (resume_s, repair_s)


def test_a_gang_throttling_alike_is_not_moved_and_a_person_is_paged(sc: GkePipeline) -> None:
    sc.settle()
    members = sc.take(2)
    g = sc.gangs.gang("gke-capped", members, [])
    try:
        for n in members:
            sc.gpu_state(n, POWER_CAPPED)
        incs = [sc.finished(n, timeout=TIMEOUT_S) for n in members]
        back = {n: sc.gangs.node_back(n) for n in members}
        restarts, where = sc.gangs.restarts(g.name), sc.gangs.placed(g.name)
        texts = [_note_text(sc, i["id"]) for i in incs]  # notify delivers after the incident resolved
    finally:
        for n in members:
            sc.gpu_state(n, None)
        sc.gangs.done_with(g)
    peers: list[Measurement] = [i.get("corroboration") or {} for i in incs]
    assert all(i["state"] == "RESOLVED" for i in incs), incs
    assert all(p.get("verdict") == "gang_wide" and p.get("source") == "prometheus" for p in peers), peers
    assert not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs), incs
    assert restarts == 0 and sorted(where) == sorted(members), where  # nothing moved
    assert all(back.values()), back  # Pitstop's taints were lifted
    assert all("NOT moved" in t for t in texts), texts  # a page per node


def _note_text(sc: GkePipeline, iid: str) -> str:
    notes: list[dict[str, Any]] = sc.wait(lambda: sc.notes_for(iid), 30, "the notification")
    return " ".join(str(x["body"].get("text")) for x in notes)


def test_chaos_straggler_and_degrading_show_in_the_prometheus_stand_in(sc: GkePipeline) -> None:
    """`pitstop local chaos straggler|degrading --node N` on the GKE stack: what actuate's PromQL
    reader then reads (healed again within the alert's window, so no incident opens)."""
    slow, failing = sc.take(2)
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
