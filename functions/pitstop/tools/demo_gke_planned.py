"""The degraded-node scenarios on GKE (issue 24): the peers read from Managed Service for Prometheus.

As pitstop.tools.demo_planned on Slurm, but on the GKE stack: a JobSet member's GPU stand-in
throttles, the Monitoring stand-in opens the throttle policy's alert after its (scaled) window,
ingest opens a ``degraded`` incident, and the workflow holds the node against the JobSet's other
nodes (the pods' nodes, from the fake API server) through the PromQL query API stand-in
(local/fake_prometheus.py, dcgm-exporter's DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) with the real
HTTP client. A straggler alone: cordoned, its pod evicted with its grace period (the checkpoint),
the JobSet restarted once onto the spare, the node diagnosed and repaired by its finding. A whole
gang throttling alike: nothing moved, the fences lifted, a person paged.
"""

from __future__ import annotations

import time
from typing import Any

from pitstop.core.timeline import durations
from pitstop.local.gke_stack import NAMESPACE, Watch
from pitstop.tools.demo_planned import POWER_CAPPED, STRAGGLER, TIMEOUT_S, note_text
from pitstop.tools.demo_stage import GkeStage, Result


def straggler_spare(sc: GkeStage, bad: str | None = None) -> Result:
    """A thermally throttled JobSet member among unthrottled peers: moved at its checkpoint onto the
    spare; the node check shows its hardware thermal slowdown (the finding): host reported faulty.

    On GKE the checkpoint is the pod's eviction with its grace period, and the JobSet's own failure
    policy restarts the gang at once (onto the spare, the node being cordoned); Pitstop's requeue
    then finds it already moved and does not restart it again. ``resume_s``: from the alert's open
    (the incident's ``detected``) to the gang seen running in full off the node. ``bad``: by default
    the fourth node from the end (the demo's first free one; the last two are the partner and spare)."""
    bad = bad or sc.nodes[-4]
    g = sc.gang("gke-straggler", [bad, sc.partner], [sc.spare])
    watch = Watch(sc.kube.url, f"/api/v1/namespaces/{NAMESPACE}/pods")
    since = time.time()
    try:
        sc.gpu_state(bad, STRAGGLER)
        sc.wait(lambda: [i for i in sc.incidents(bad) if i["created_at"] >= since], TIMEOUT_S, "the incident")
        where = sc.moved(g, [bad])
        running_at = time.time()
        inc = sc.finished(bad, timeout=TIMEOUT_S)
        restarts = sc.restarts(g.name)
    finally:
        watch.stop()
        sc.gpu_state(bad, None)
        sc.done_with(g)
    evicted = sc.evictions(watch.events, bad)
    peers, resume = inc.get("corroboration") or {}, inc.get("resume") or {}
    steps = [(e["from"], e["to"]) for e in inc.get("escalations", [])]
    r = sc.timed(Result("gke_straggler_spare", False, "", durations(inc), inc["id"]), inc)
    r.resume_s = round(running_at - float(inc["timeline"]["detected"]), 1)
    r.passed = bool(
        inc["state"] == "RESOLVED"
        and inc["kind"] == "degraded"
        and peers.get("verdict") == "move"
        and peers.get("source") == "prometheus"
        and len(evicted) == 1
        and sorted(where) == sorted([sc.partner, sc.spare])
        and restarts == 1
        and ("DRAIN_NODE", "REPLACE_NODE") in steps
        and len(sc.calls("report_host_as_faulty", bad)) == 1
    )
    r.detail = (
        f"throttle on {bad} of JobSet {g.name}: {peers.get('why')}; {len(evicted)} pod evicted, the JobSet"
        f" restarted {restarts}x onto {','.join(where)} {r.resume_s} s after the alert opened; diagnosis: "
        f"{(inc.get('diagnosis') or {}).get('why')}; node repaired in {r.repair_s} s"
    )
    r.facts = {"peers": peers, "resume": resume, "steps": steps, "moved_to": where, "evicted": evicted,
               "restarts": restarts}  # fmt: skip
    return r


def gang_wide_throttle(sc: GkeStage, members: list[str] | None = None) -> Result:
    """Every member of the JobSet throttles alike (its own power cap): no move, no repair, a page.
    ``members``: by default the third node from the end and the partner (neither is repaired)."""
    members = members or [sc.nodes[-3], sc.partner]
    g = sc.gang("gke-capped", members, [])
    try:
        for n in members:
            sc.gpu_state(n, POWER_CAPPED)
        incs = [sc.finished(n, timeout=TIMEOUT_S) for n in members]
        back = {n: sc.node_back(n) for n in members}
        restarts, where = sc.restarts(g.name), sc.placed(g.name)
        texts = [note_text(sc, str(i["id"])) for i in incs]  # notify delivers after the incident resolved
    finally:
        for n in members:
            sc.gpu_state(n, None)
        sc.done_with(g)
    peers: list[dict[str, Any]] = [i.get("corroboration") or {} for i in incs]
    r = Result("gke_gang_wide_throttle", False, "", durations(incs[0]), incs[0]["id"])
    r.passed = bool(
        all(i["state"] == "RESOLVED" for i in incs)
        and all(p.get("verdict") == "gang_wide" and p.get("source") == "prometheus" for p in peers)
        and not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs)
        and restarts == 0
        and sorted(where) == sorted(members)
        and all(back.values())
        and all("NOT moved" in t for t in texts)
    )
    r.detail = f"JobSet {g.name} on {','.join(members)}: {peers[0].get('why')}"
    r.facts = {"peers": peers, "back": back, "restarts": restarts, "texts": texts, "placed": where}
    return r
