"""The demo scenarios the runner (tools/demo_runner.py) cannot express as one fault on one node.

Each step makes its scenario's moves and returns what it observed; what must be observed, and the
result's line, are in schemas/demo-scenarios.yaml as for every scenario. Why each needs code:

- duplicate_storm: two different lines, one delivered 20 times under one insertId;
- blast_radius: one fault more than the budget allows, judged across every incident and page;
- poison: bytes no sink sends, read back from the dead-letter subscription;
- gang_wide_throttle: every node of a job degrades alike, one incident each, judged together;
- hang_bad_node, hang_software: a training job's heartbeat stops (chaos), a hang incident then
  a culprit's; the second hangs twice;
- gke_two_members: two faulty members of one JobSet; gke_pdb: a PodDisruptionBudget and the
  incident closed with --unfence after; gke_serial: the same line on two nodes, one confirmed;
- gke_straggler_spare, gke_gang_wide_throttle (issue 24): a degraded JobSet member, its peers read
  from the PromQL stand-in; the gang moves when the incident opens, before it ends (the straggler),
  or a whole JobSet degrades alike (one incident per member, judged together).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pitstop.local import chaos, inject, realtime
from pitstop.local.gke_drive import evictions
from pitstop.local.gke_stack import JOBSET_LABEL, NAMESPACE, Watch, node_summary
from pitstop.local.heartbeats import beating_again, beats, hang_ended
from pitstop.local.stack import HEARTBEAT_EVERY_S, HEARTBEAT_MIN_POINTS, WebhookRecord, webhook_records
from pitstop.plugins.channels.pagerduty.local import PATH as PAGERDUTY_PATH
from pitstop.tools.demo_runner import GKE_PARTNER, GKE_SPARE, XID_LINES, Runner, Seen, incident_obs
from pitstop.tools.demo_stage import Observations, Stage

if TYPE_CHECKING:
    from pitstop.core.domain import Incident, Measurement
    from pitstop.core.policy_types import Budgets

XID79, XID48, XID94, XID13 = (XID_LINES[x] for x in (79, 48, 94, 13))
HANG_GANG = 4  # the hung training job's nodes (the pool has one spare more)
STRAGGLER = {"throttle": 0.6, "throttle_reason": "thermal"}  # HW thermal slowdown: the finding
POWER_CAPPED = {"throttle": 0.5, "throttle_reason": "power"}  # the job's own power cap: every node alike


def duplicate_storm(st: Stage) -> Seen:
    node = st.nodes[6]
    dup = st.entry(node, XID48, insert_id="dup-48-" + uuid.uuid4().hex[:6])
    burst = [st.entry(node, XID94) for _ in range(500)]  # logged within moments; delivered after
    inject.kernel_prints(st.state, node, XID48)
    inject.kernel_prints(st.state, node, XID94)
    for _ in range(20):
        st.router.publish(dup)
    for e in burst:
        st.router.publish(e)
    inc = st.finished(node)
    time.sleep(3)
    obs = {
        **incident_obs(inc),
        "incidents": len(st.node_incidents(node)),
        "resets": len(st.calls("reset", node)),
    }
    return Seen(inc, {**obs, "xid_48": inc["counts"].get("xid_48", 0)})


def blast_radius(st: Stage) -> Seen:
    pol_budgets = _budgets(st)
    b = pol_budgets["cluster"]
    cap = min(b["max_nodes"], max(1, math.ceil(len(st.nodes) * b["max_percent"] / 100)))
    targets = st.nodes[: cap + 1]  # one more than the budget allows, whatever the cluster size
    before, t0 = len(webhook_records(st.state)), time.monotonic()
    pd_before = len(webhook_records(st.state, PAGERDUTY_PATH))

    def xid79s(n: str) -> tuple[str | None, int]:
        last = st.node_incidents(n)[-1:]
        return (last[0]["id"], last[0]["counts"].get("xid_79", 0)) if last else (None, 0)

    seen_before = {n: xid79s(n) for n in targets}
    for n in targets:
        st.fault(n, XID79)
    incs = _settled(st, targets, lambda n: xid79s(n) != seen_before[n])
    # Held by the budget, now or earlier: the window slides (8 s locally) and the sweep then
    # releases a held incident, which may end before all five are seen settled.
    held = [i for i in incs if i["state"] == "HELD" or i.get("holds")]
    done = [i for i in incs if i["state"] == "RESOLVED" and not i.get("holds")]

    def paged() -> tuple[list[Any], list[Any]]:
        pages = [w for w in webhook_records(st.state)[before:] if "blast-radius budget" in w["body"]["text"]]
        # the same page on the second channel: a PagerDuty alert triggered (one per page)
        alerts = [
            w["body"]
            for w in webhook_records(st.state, PAGERDUTY_PATH)[pd_before:]
            if w["body"]["event_action"] == "trigger"
            and "blast-radius budget" in w["body"]["payload"]["summary"]
        ]
        return pages, alerts

    def on_both() -> bool:
        pages, alerts = paged()
        return bool(pages) and len(pages) == len(alerts)

    # the two sinks deliver independently: wait until both carried the page (or time out)
    with contextlib.suppress(TimeoutError):
        st.wait(on_both, 30, "the page on both sinks")
    pages, alerts = paged()
    # One page per budget window while incidents are held (engine.try_claim's paged_until): a
    # slow machine whose remediations outlast the 8 s window sees a reminder, never one per try.
    windows = 1 + int((time.monotonic() - t0) / float(pol_budgets["window_s"]))
    obs: Observations = {
        "targets": len(targets),
        "nodes": len(st.nodes),
        "done": len(done),
        "held": len(held),
    }
    obs.update(max_percent=b["max_percent"], pages=len(pages), alerts=len(alerts))
    obs.update(remediated_within_budget=len(done) == cap, rest_held=len(held) == len(targets) - cap)
    obs["paged_once_per_window"] = 1 <= len(pages) == len(alerts) <= windows
    return Seen(done[0] if done else None, obs)


def _budgets(st: Stage) -> Budgets:
    import json

    # the stack's policy, as pitstop.local wrote it from a checked one
    budgets: Budgets = json.loads(Path(st.state.workdir, "policy.yaml").read_text())["budgets"]
    return budgets


def _settled(st: Stage, targets: list[str], took: Callable[[str], bool]) -> list[Incident]:
    """Each node's last incident once it has taken the fault and settled (resolved, held or failed)."""

    def settled() -> list[Incident] | None:
        out = []
        for n in targets:  # each node's episode has taken this Xid 79 (a new incident or a raised one)
            last = st.node_incidents(n)[-1:]
            if not last or not took(n) or last[0]["state"] not in ("RESOLVED", "HELD", "FAILED"):
                return None
            out.append(last[0])
        return out

    try:
        incs = st.wait(settled, 120, f"all {len(targets)} incidents to settle")
    except TimeoutError:
        seen = [
            (n, i["state"], i["action"], i.get("held"), i.get("failure"))
            for n in targets
            for i in st.node_incidents(n)[-1:]
        ]
        raise TimeoutError(f"incidents did not settle: {seen}") from None
    return incs


def poison(st: Stage) -> Seen:
    dead, flowed = inject.poison_beside(st, st.nodes[6], XID13)
    attempts = dead[0].message.attributes.get("CloudPubSubDeadLetterSourceDeliveryCount")
    restart = [i for i in flowed if i["action"] == "RESTART_JOB"]
    obs = {"attempts": attempts, "incident": flowed[-1]["id"], "good_event_flowed": bool(restart)}
    return Seen(flowed[-1], {**obs, "dead_lettered": dead[0].message.data == inject.POISON})


def _unfence_outcome(inc: Incident) -> str | None:
    """What the scheduler answered when a person's close asked it to take the node back."""
    closure = inc.get("closure")
    unfence = closure.get("unfence") if closure else None
    return unfence["outcome"] if isinstance(unfence, dict) else None


def gang_wide_throttle(st: Stage) -> Seen:
    """Every node of the job throttles alike (its own power cap): no move, no repair, a page."""
    runner = Runner(st, {})
    job, held, _ = runner.job({"among": [-12, -10], "size": 2, "checkpoint": True})
    assert job is not None
    for n in held:
        st.stack.set_gpu_state(n, {"throttle": 0.5, "throttle_reason": "power"})  # the job's own power cap
    incs = [st.finished(n, timeout=240.0) for n in held]
    drained = {n: "drain" in st.slurm.node_states().get(n, "") for n in held}
    # notify delivers after the incident resolved: wait for each one's note, not read it at once
    texts = [_note_text(st, str(i["id"])) for i in incs]
    obs: Observations = {"job": job, "held": ",".join(held), "drained": drained, "texts": texts}
    obs["why"] = (incs[0].get("corroboration") or {}).get("why")
    obs["all_resolved"] = all(i["state"] == "RESOLVED" for i in incs)
    obs["all_gang_wide"] = all((i.get("corroboration") or {}).get("verdict") == "gang_wide" for i in incs)
    obs["none_acted"] = not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs)
    obs.update(restarts=st.slurm.restarts(job), none_drained=not any(drained.values()))
    obs["all_not_moved"] = all("NOT moved" in t for t in texts)
    for n in held:
        st.stack.set_gpu_state(n, None)
    st.slurm.cancel(job)
    return Seen(incs[0], obs)


def _note_text(st: Stage, iid: str) -> str:
    """What the webhook said about an incident, once notify delivered it (after it resolved)."""
    notes = st.wait(lambda: st.notes_for(iid), 30, "the notification")
    return " ".join(str(x["body"].get("text")) for x in notes)


# -- a hung job: localised, then back to training ------------------------------------------------


def _training(st: Stage) -> tuple[str, list[str]]:
    """A training run (it writes the job heartbeat) on HANG_GANG of the hang pool, beating: nodes
    8-12, between the first scenarios' eight and the degraded-node ones."""
    pool = st.nodes[8 : 9 + HANG_GANG]
    job = st.stack.submit_training(HANG_GANG, exclude=[n for n in st.nodes if n not in pool])
    held: list[str] = st.wait(lambda: st.slurm.job_nodes(job), 60, f"job {job} to run")
    st.wait(lambda: beats(st.stack, job) > HEARTBEAT_MIN_POINTS, 60, f"job {job} to beat")  # established
    return job, held


def _hung(st: Stage, job: str) -> tuple[float, float]:
    """When the job stopped beating (now) and when it beat again (a new run training)."""
    stopped = time.time()
    time.sleep(2 * HEARTBEAT_EVERY_S)  # a beat already on its way is not the new run's
    return stopped, beating_again(st.stack, job, st.wait, 300)


def hang_bad_node(st: Stage) -> Seen:
    """A hang with one bad link and a spare: the node checks find nothing, the ring's NCCL test
    finds the node with an NVLink down, the culprit gets its own incident (fenced, rebooted; its
    validation measures it still slow, its diagnostic finds the link down, its host is replaced)
    and the gang trains again on the spare at once; resume_s from the last heartbeat to the
    first beat of the new run."""
    job, held = _training(st)
    bad = held[1]
    chaos.apply(st.stack, "hang", "link", node=bad)
    stopped, training = _hung(st, job)
    hang = hang_ended(st.db, job, st.wait)
    loc = hang.get("localisation") or {}
    culprit = st.finished(bad, timeout=240)
    now_on = st.slurm.job_nodes(job)
    times = realtime.breakdown(stopped, hang, culprit, training, st.stack.alert_scale)
    obs: Observations = {"job": job, "held": ",".join(held), "bad": bad, "gang": len(held)}
    obs.update(culprits=loc.get("culprits"), culprit=culprit["id"], culprit_action=culprit["action"])
    obs.update(now_on=",".join(now_on), **times)
    obs["hang_resolved"] = hang["state"] == "RESOLVED"
    obs["culprit_named"] = loc.get("culprits") == [bad]
    obs["culprits_incident"] = (loc.get("incidents") or {}).get(bad) == culprit["id"]
    obs["culprit_remediated"] = (culprit["kind"], culprit["state"]) == ("localised", "RESOLVED")
    obs["sweep_then_links"] = times["rounds"] == ["sweep", "links"]
    obs["restarted_once"] = st.slurm.restarts(job) == 1
    obs["onto_the_spare"] = bad not in now_on and len(now_on) == HANG_GANG
    st.slurm.cancel(job)
    return Seen(culprit, obs, resume_s=times["real_s"])


def hang_software(st: Stage) -> Seen:
    """A hang with no bad node: every node and ring link checked, nothing found. Nothing on its
    nodes says a restart would help (issue 35 (2): a restart needs a culprit's evidence), so the
    gang is left as it is and a person is paged with what was checked."""
    job, held = _training(st)
    chaos.apply(st.stack, "hang")
    first = hang_ended(st.db, job, st.wait)
    loc = first.get("localisation") or {}

    def paged() -> list[WebhookRecord]:
        return [w for w in st.notes_for(first["id"]) if "no culprit fenced" in w["body"]["text"]]

    pages = st.wait(paged, 30, "the page")
    text = pages[0]["body"]["text"] if pages else ""
    running = [j for j in st.slurm.jobs() if j["id"] == job and j["state"] == "RUNNING"]
    obs: Observations = {"job": job, "gang": len(held), "pages": len(pages), "first": loc, "page": text}
    obs["nothing_found"] = loc.get("outcome") == "nothing_found"
    obs["sweep_then_links"] = [x.get("kind") for x in loc.get("rounds", [])] == ["sweep", "links"]
    obs["not_restarted"] = st.slurm.restarts(job) == 0 and "job_requeued" not in first["timeline"]
    obs["paged_with_every_node"] = all(n in text for n in held)
    obs["left_for_a_person"] = bool(running)
    st.slurm.cancel(job)
    chaos.apply(st.stack, "clear")
    return Seen(first, obs)


# -- GKE -----------------------------------------------------------------------------------------


def gke_two_members(st: Stage) -> Seen:
    gangs = st.gangs
    assert gangs is not None
    a, b = st.nodes[1], st.nodes[2]
    g = gangs.gang("pair", [a, b], [st.nodes[GKE_PARTNER], st.nodes[GKE_SPARE]])
    try:
        for n in (a, b):
            gangs.device_plugin_xid(n, 79)
        for n in (a, b):
            st.router.publish(st.k8s_entry(n, XID79))
        incs = [st.finished(a), st.finished(b)]
        where = gangs.moved(g, [a, b])
        back, restarts = [gangs.node_back(n) for n in (a, b)], gangs.restarts(g.name)
    finally:
        gangs.done_with(g)
    obs: Observations = {"a": a, "b": b, "incidents": len(incs), "moved_to": ",".join(where)}
    obs.update(resets=[len(st.calls("reset", n)) for n in (a, b)], restarts=restarts, all_back=all(back))
    obs["all_resolved_rebooted"] = all(
        i["state"] == "RESOLVED" and i["action"] == "REBOOT_NODE" for i in incs
    )
    return Seen(incs[0], obs)


def gke_pdb(st: Stage) -> Seen:
    gangs = st.gangs
    assert gangs is not None
    bad, pdb = st.nodes[5], "train-pdb"
    g = gangs.gang("pdb", [bad, st.nodes[GKE_PARTNER]], [st.nodes[GKE_SPARE]])
    gangs.kube.create_pdb(pdb, {JOBSET_LABEL: g.name}, min_available=2)
    try:
        st.router.publish(inject.maintenance(st.state, bad))
        inc = st.finished(bad, timeout=120)
        held = node_summary(gangs.kube.node(bad))
        stayed, restarts = bad in gangs.placed(g.name), gangs.restarts(g.name)
        closed = inject.close_with_unfence(st.state, st.db, inc["id"], "demo")
        back = gangs.node_back(bad)
    finally:
        gangs.kube.delete_pdb(pdb)
        gangs.done_with(g)
    why = str(failure["error"] if (failure := inc.get("failure")) else "")
    obs: Observations = {"state": inc["state"], "pdb": pdb, "why": why[:160], "bad": bad}
    obs.update(names_the_pdb=f"PodDisruptionBudget {pdb}" in why, fenced_while_failed=held["fenced"])
    obs.update(
        pod_stayed=stayed, restarts=restarts, perform_maintenance=len(st.calls("perform_maintenance", bad))
    )
    obs.update(closed=closed.get("state"), back=back)
    obs["unfence"] = _unfence_outcome(closed)
    return Seen(inc, obs)


def gke_serial(st: Stage) -> Seen:
    """The serial console's word alone is recorded; with the device plugin's condition it is acted on."""
    gangs = st.gangs
    assert gangs is not None
    forged, bad = st.nodes[7], st.nodes[8]
    st.router.publish(st.serial_entry(forged, XID79))
    st.wait(lambda: st.node_incidents(forged), 30, f"the record of {forged}'s line")
    g = gangs.gang("serial", [bad, st.nodes[GKE_PARTNER]], [st.nodes[GKE_SPARE]])
    try:
        gangs.device_plugin_xid(bad, 79)
        st.router.publish(st.serial_entry(bad, XID79))
        inc = st.finished(bad)
        where = gangs.moved(g, [bad])
        back, restarts = gangs.node_back(bad), gangs.restarts(g.name)
    finally:
        gangs.done_with(g)
    lone = st.node_incidents(forged)[-1]
    untouched = not st.calls("reset", forged) and not node_summary(gangs.kube.node(forged))["fenced"]
    obs: Observations = {
        "forged": forged,
        "bad": bad,
        "lone_action": lone["action"],
        "lone_trust": lone["trust"],
    }
    obs.update(
        lone=f"{lone['trust']} {lone['action']}",
        untouched=untouched,
        verified=f"{inc['trust']} {inc['action']}",
    )
    obs.update(
        state=inc["state"],
        action=inc["action"],
        trust=inc["trust"],
        cluster=node.get("cluster") if (node := inc["node"]) else None,
    )
    obs.update(resets=len(st.calls("reset", bad)), restarts=restarts, moved_to=",".join(where), back=back)
    return Seen(inc, obs)


def gke_straggler_spare(st: Stage) -> Seen:
    """A thermally throttled JobSet member among unthrottled peers (read through the PromQL stand-in):
    moved at its checkpoint onto the spare; the node check shows its hardware thermal slowdown (the
    finding): host reported faulty.

    On GKE the checkpoint is the pod's eviction with its grace period, and the JobSet's own failure
    policy restarts the gang at once (onto the spare, the node being cordoned); Pitstop's requeue
    then finds it already moved and does not restart it again. ``resume_s``: from the alert's open
    (the incident's ``detected``) to the gang seen running in full off the node. The node: 9
    (tools/demo.py GKE_NODES)."""
    gangs = st.gangs
    assert gangs is not None
    bad, partner, spare = st.nodes[9], st.nodes[GKE_PARTNER], st.nodes[GKE_SPARE]
    g = gangs.gang("gke-straggler", [bad, partner], [spare])
    watch = Watch(gangs.kube.url, f"/api/v1/namespaces/{NAMESPACE}/pods")
    since = time.time()
    try:
        st.stack.set_gpu_state(bad, STRAGGLER)
        st.wait(
            lambda: [i for i in st.node_incidents(bad) if i["created_at"] >= since], 240.0, "the incident"
        )
        where = gangs.moved(g, [bad])
        running_at = time.time()
        inc = st.finished(bad, timeout=240.0)
        restarts = gangs.restarts(g.name)
    finally:
        events = watch.stop()
        st.stack.set_gpu_state(bad, None)
        gangs.done_with(g)
    obs = {
        **incident_obs(inc),
        "bad": bad,
        "jobset": g.name,
        "restarts": restarts,
        "moved_to": ",".join(where),
    }
    obs.update(evicted=len(evictions(events, bad)), reports=len(st.calls("report_host_as_faulty", bad)))
    obs.update(peers_source=(inc.get("corroboration") or {}).get("source"))
    obs["onto_partner_and_spare"] = sorted(where) == sorted([partner, spare])
    return Seen(inc, obs, resume_s=round(running_at - float(inc["timeline"]["detected"]), 1))


def gke_gang_wide_throttle(st: Stage) -> Seen:
    """Every member of the JobSet throttles alike (its own power cap): no move, no repair, a page.
    The members: node 10 and the partner (neither is repaired)."""
    gangs = st.gangs
    assert gangs is not None
    members = [st.nodes[10], st.nodes[GKE_PARTNER]]
    g = gangs.gang("gke-capped", members, [])
    try:
        for n in members:
            st.stack.set_gpu_state(n, POWER_CAPPED)
        incs = [st.finished(n, timeout=240.0) for n in members]
        back = {n: gangs.node_back(n) for n in members}
        restarts, where = gangs.restarts(g.name), gangs.placed(g.name)
        texts = [_note_text(st, str(i["id"])) for i in incs]  # notify delivers after the incident resolved
    finally:
        for n in members:
            st.stack.set_gpu_state(n, None)
        gangs.done_with(g)
    peers: list[Measurement] = [i.get("corroboration") or {} for i in incs]
    obs: Observations = {"jobset": g.name, "members": ",".join(members), "why": peers[0].get("why")}
    obs["all_resolved"] = all(i["state"] == "RESOLVED" for i in incs)
    obs["all_gang_wide"] = all(p.get("verdict") == "gang_wide" for p in peers)
    obs["all_from_prometheus"] = all(p.get("source") == "prometheus" for p in peers)
    obs["none_acted"] = not any(i["timeline"].get("acted") or i["timeline"].get("job_requeued") for i in incs)
    obs.update(restarts=restarts, stayed=sorted(where) == sorted(members), all_back=all(back.values()))
    obs["all_not_moved"] = all("NOT moved" in t for t in texts)
    return Seen(incs[0], obs)


STEPS: dict[str, Callable[[Stage], Seen]] = {
    "duplicate_storm": duplicate_storm,
    "blast_radius": blast_radius,
    "poison": poison,
    "gang_wide_throttle": gang_wide_throttle,
    "hang_bad_node": hang_bad_node,
    "hang_software": hang_software,
    "gke_two_members": gke_two_members,
    "gke_pdb": gke_pdb,
    "gke_serial": gke_serial,
    "gke_straggler_spare": gke_straggler_spare,
    "gke_gang_wide_throttle": gke_gang_wide_throttle,
}
