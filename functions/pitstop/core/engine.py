"""The incident engine's judgement, as pure functions over plain documents.

The store (adapters/firestore.py) reads the node, its latest incident and the budget documents inside
one Firestore transaction, calls :func:`apply_event`, and writes back what it returns.
Keeping the judgement pure makes every rule testable without a database and lets
``pitstop replay`` run the very same code against past logs.

Documents (all times are epoch seconds; their shapes are core/domain.py's TypedDicts):
- node: NodeDoc ``{node, latest_incident, remediations: [{at, action, incident}], last_action_at}``
- incident: Incident, made by :func:`new_incident`
- budget: Budget ``{scope, slots: {incident_id: {at, active}}, paged_until}``

One decision's context (the node document, the budgets, the policy, the time, the Outcome being
built, the cluster's size, whether a person forces it) travels as one frozen :class:`Decision`.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import sys
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast, get_args

from pitstop.core import alerts, control, lifecycle, localise, trust, vertex
from pitstop.core.actions import JOB_ACTIONS, NODE_ACTIONS, RANK, RECORD_ONLY_ACTIONS, Action, higher
from pitstop.core.answers import Notification
from pitstop.core.catalog import SXID_KIND, TIE_PRIMARY, TIE_RECOVERY
from pitstop.core.domain import (
    AlertRef,
    Budget,
    Deltas,
    Draft,
    EventDetail,
    EventSummary,
    FaultEvent,
    GpuCounts,
    Held,
    Incident,
    JobRef,
    Maintenance,
    Milestone,
    NodeDoc,
    NodeRef,
    Place,
    Remediation,
    Slot,
)
from pitstop.core.ids import block_scope as block_scope  # the budget id of a block (re-exported)
from pitstop.core.policy import Cluster, Policy
from pitstop.core.states import ACTIVE_STATES, OPEN_STATES, UNCLAIMABLE_STATES, RunState, State

MAX_EVIDENCE = 10
MAX_HISTORY = 50
# Delivery keys an incident remembers, so any instance can spot a redelivery of a line that was
# only counted in memory (lines that went through a transaction have their dedup record). A storm
# turns them over within a second whatever the number, and every merge reads and writes the
# incident whole: 1000 keys cost ~20 ms of client CPU per merge, 256 about 9 ms.
MAX_RECENT_KEYS = 256
MAX_DELTA_KEYS = 64  # ... and that one node's counts buffered in memory carry (bounded instance memory)
# Distinct GPUs, and distinct Xid codes (per incident and per GPU), an incident counts by name;
# the rest are counted under OTHER. Forged lines cannot grow a document toward Firestore's
# 1 MiB / 40,000-index-entry limits.
MAX_GPUS = 32
MAX_XIDS = 32
OTHER = "other"
TIMELINE_KEYS: tuple[Milestone, ...] = get_args(Milestone)


def node_key(node: NodeRef) -> str:
    """Document id for a node: validated names only, so it is safe as a path segment."""
    return f"{node['project']}.{node['zone']}.{node['instance']}".replace(":", "~")


def job_key(job: JobRef) -> str:
    """Document id for a job's episodes (a hung job): validated names, '/' and ':' made path-safe.

    A project id is at least 6 characters, so no node key starts with ``job.``.
    """
    return f"job.{job['project']}.{job['cluster']}.{job['job']}".replace(":", "~").replace("/", "~")


# What names a subject (a node, or a job for a job-level signal): an event, an incident or a node document.
Subject = FaultEvent | Incident | NodeDoc


def subject_key(doc: Subject) -> str:
    """Where an event's (or incident's, or node document's) episodes are kept: its node's key,
    or its job's for a job-level signal, which names a ``job`` and no ``node``."""
    job = doc.get("job")
    if doc.get("node") is None and isinstance(job, Mapping):
        return job_key(job)
    return node_key(cast(NodeRef, doc["node"]))  # a subject without a job names its node


def subject_name(inc: FaultEvent | Incident) -> str:
    """How a person knows the subject: the node's name, or ``job J of cluster C``."""
    job = inc.get("job")
    if inc.get("node") is None and isinstance(job, Mapping):
        return f"job {job['job']} of cluster {job['cluster']}"
    return str(cast(NodeRef, inc["node"])["instance"])  # a subject without a job names its node


def cluster_of(policy: Policy, doc: FaultEvent | Incident) -> Cluster | None:
    """The configured cluster an event's (or incident's) subject belongs to."""
    job = doc.get("job")
    if doc.get("node") is None and isinstance(job, Mapping):
        return policy.cluster_named(str(job["cluster"]))
    return policy.cluster_for(cast(NodeRef, doc["node"]))  # a subject without a job names its node


def incident_id(key: str, trigger: str) -> str:
    """Short (10 chars, Slurm shows 20 of a reason) and deterministic for its triggering event."""
    digest = hashlib.sha256(f"{key}|{trigger}".encode()).digest()
    return "i" + base64.b32encode(digest).decode().lower()[:9]


def event_key(ev: FaultEvent) -> str:
    """The idempotency key of a delivery: LogEntry insertId (with its log), else the message id."""
    src = ev["source"]
    ident = src.get("insert_id") or src.get("message_id") or repr(sorted(_detail(ev).items()))
    return hashlib.sha256(f"{src.get('log_name')}|{ident}".encode()).hexdigest()[:32]


def _detail(ev: FaultEvent) -> EventDetail:
    """The event's kind-specific facts (schemas/fault_event ``detail``); {} for an event without."""
    return ev.get("detail", {})


def _pci(ev: FaultEvent) -> str | None:
    """The PCI address of the GPU the event names, if it names one."""
    gpu = ev.get("gpu")
    return gpu.get("pci") if gpu else None


def summary(ev: FaultEvent) -> EventSummary:
    """What an incident keeps of one event (evidence for humans and the host report)."""
    d = _detail(ev)
    return {
        "kind": ev["kind"],
        "xid": ev["xid"],
        "action": ev["action"],
        "gpu": _pci(ev),
        "observed_at": ev.get("observed_at"),
        "insert_id": ev["source"].get("insert_id"),
        # One string per rule, not per line: a storm buffers thousands of these (see count_into).
        "reason": sys.intern(str(ev["reason"])),
        "message": str(d.get("message") or d.get("status_message") or "")[:200],
    }


# What one event (or a release, or a step-up) did. Only returned and compared, never stored.
Result = Literal[
    "duplicate",  # this delivery was folded in before
    "late",  # answered past its ack deadline: left to Pub/Sub's redelivery (services/coalesce.py)
    "ignored",  # nothing to remember
    "absorbed",  # counted into the node's open incident
    "opened",  # a new incident
    "raised",  # the incident's action went up
    "held",  # a human or a budget must let it go on
    "suppressed",  # a job action inside its cooldown: dropped quietly
    "released",  # a held incident goes on
    "still_held",  # ... or does not yet
    "closed",  # a person ended the incident
    "failed",  # the watchdog found its execution dead or overrunning
    "joined",  # the incident counts against its node's reservation block from now on
    "ended",  # its alerts closed before anything was done: the episode ended
    "reopened",  # ... and one of them opened again within the flap window: the same episode goes on
    # a workflow run's and a step's commands (core/aggregate.py)
    "refused",  # the command's precondition did not hold: nothing changed (``refused`` says why)
    "leased",  # a starter leased the step's start
    "started",  # ... and recorded the execution it started
    "start_refused",  # Workflows refused the start: counted
    "claimed",  # an execution took the step
    "rejected",  # the evidence names another VM: resolved, nothing done
    "fenced",
    "acting",
    "verifying",
    "changed",  # a step's record of what it found or did
    "resolved",
]


@dataclass
class Outcome:
    """What one event did; the documents in it are what the store must persist."""

    result: Result
    incident: Incident | None = None
    closed: Incident | None = None  # a previous record-only incident whose burst ended
    node: NodeDoc | None = None
    budgets: dict[str, Budget] = field(default_factory=dict)
    start_step: int | None = None  # a workflow execution is due for this incident step
    page: str | None = None  # a human must be paged, with this reason
    coalesced: bool = False  # absorbed in memory only; the store was not written
    duplicate_of: str | None = None  # a duplicate delivery: the incident its first delivery touched
    refused: str | None = None  # why a command's precondition did not hold (result ``refused``)
    notices: list[Notification] = field(default_factory=list)  # recorded in the outbox with the decision
    release_slots: bool = False  # the incident ended: its blast-radius slots are let go (core/aggregate)


# What counting works on: an incident, or the in-memory deltas of one (services/coalesce.py).
Counted = Draft | Deltas


def as_incident(doc: Mapping[str, object]) -> Draft:
    """A stored incident document as the engine works on it: a copy (the caller's stays as it was)."""
    # The edge: a document the store read (its writers wrote Incidents) is one from here on.
    return cast(Draft, copy.deepcopy(dict(doc)))


def copy_node(node_doc: NodeDoc | None, inc: Incident) -> NodeDoc:
    """The subject's node document to change (a copy), or a new one for it."""
    return copy.deepcopy(node_doc) if node_doc is not None else new_node(inc["node"], inc.get("job"))


def new_node(node: NodeRef | None, job: JobRef | None = None) -> NodeDoc:
    """A node's document, or a job's (``node`` None) for job-level episodes."""
    if node is None and job is not None:
        return {
            "node": None,
            "job": job.copy(),
            "latest_incident": None,
            "remediations": [],
            "last_action_at": {},
        }
    copied = node.copy() if node is not None else None
    return {"node": copied, "latest_incident": None, "remediations": [], "last_action_at": {}}


def new_incident(iid: str, ev: FaultEvent, cluster: Cluster | None, policy: Policy, now: float) -> Draft:
    detected = ev.get("_observed_ts") or now
    inc: Draft = {
        "id": iid,
        "node_key": subject_key(ev),
        "node": node.copy() if (node := ev.get("node")) is not None else None,
        "cluster": cluster.name if cluster else None,
        "scheduler": cluster.scheduler if cluster else "none",
        "state": State.OPEN,
        "mode": policy.mode_for(cluster.name if cluster else None),
        "kind": ev["kind"],
        "xid": ev["xid"],
        "proposed_action": ev["action"],
        "action": ev["action"],
        "reason": ev["reason"],
        "escalations": [],
        "counts": {"events": 0},
        "gpus": {},
        "evidence": [],
        "first_seen": detected,
        "last_seen": detected,
        "burst_until": detected + policy.window("burst_silence_s"),
        "timeline": {"detected": detected, "classified": now},
        "step": 0,
        "workflow": None,
        "held": None,
        "budget_scopes": [],
        "escalate_to": None,
        "trust": _trust_of(ev),
        "created_at": now,
        "updated_at": now,
    }
    job = ev.get("job")
    if ev.get("node") is None and job:
        inc["job"] = job.copy()
    if ev["kind"] == "maintenance":
        d = _detail(ev)
        inc["maintenance"] = Maintenance(
            window_start=d.get("window_start"),
            window_end=d.get("window_end"),
            maintenance_status=d.get("maintenance_status"),
        )
    return inc


def remember_keys(inc: Counted, keys: list[str], limit: int = MAX_RECENT_KEYS) -> None:
    """Append delivery keys, keeping the newest ``limit`` (in place: a storm appends often)."""
    kept = inc.setdefault("recent_keys", [])
    kept.extend(keys)
    if len(kept) > limit:
        del kept[: len(kept) - limit]


def bounded_key(table: Mapping[str, object], key: str, limit: int) -> str:
    """``key`` if the table already has it or has room for it (``limit`` keys by name); else the
    shared OTHER bucket. OTHER takes no name's room: summed count shards may bring it before the
    table is full, and the sum must name as many as one merge in any order would."""
    if key in table or key == OTHER:
        return key
    named = len(table) - (OTHER in table)
    return key if named < limit else OTHER


def _xid_key(ev: FaultEvent) -> str:
    if ev["xid"] is not None:
        return f"xid_{ev['xid']}"
    if ev["kind"] == SXID_KIND:
        return f"sxid_{ev.get('detail', {}).get('sxid')}"
    return str(ev["kind"])


def _tie(g: GpuCounts, ev: FaultEvent, tie: str, ts: float, tie_s: float) -> None:
    """How a line relates to the GPU's other lines (xid-policy ``tie``): a secondary naming its
    primary Xid seen on this GPU within ``tie_s``, or the driver's current recovery verdict."""
    d = _detail(ev)
    if tie == TIE_PRIMARY:
        primary = d.get("primary_xid")
        if primary is not None and str(primary) in g["xids"] and ts - g.get("last_seen", ts) <= tie_s:
            g.setdefault("secondary", {})[str(ev["xid"])] = primary
    elif tie == TIE_RECOVERY:
        g["recovery_to"] = d.get("recovery_to")


def _count_gpu(inc: Counted, ev: FaultEvent, pci: str, ts: float, policy: Policy) -> None:
    """Per-GPU counts: at most MAX_GPUS GPUs and MAX_XIDS codes each by name, the rest under OTHER."""
    gk = bounded_key(inc["gpus"], pci.replace(":", "_"), MAX_GPUS)
    g = inc["gpus"].setdefault(gk, {"pci": pci if gk != OTHER else OTHER, "first_seen": ts, "xids": {}})
    if ev["xid"] is not None:
        xid = bounded_key(g["xids"], str(ev["xid"]), MAX_XIDS)
        g["xids"][xid] = g["xids"].get(xid, 0) + 1
        tie = policy.xids.rule(ev["xid"]).tie
        if tie is not None and gk != OTHER:
            _tie(g, ev, tie, ts, policy.window("tie_s"))
    g["last_seen"] = ts


def _count(
    inc: Counted,
    ev: FaultEvent,
    ts: float,
    policy: Policy,
    keys: int = MAX_RECENT_KEYS,
    evidence: int = MAX_EVIDENCE,
) -> None:
    remember_keys(inc, [event_key(ev)], keys)
    counts = inc["counts"]
    counts["events"] = counts.get("events", 0) + 1
    key = bounded_key(counts, _xid_key(ev), MAX_XIDS + 1)  # + "events"
    counts[key] = counts.get(key, 0) + 1
    pci = _pci(ev)
    if pci:
        _count_gpu(inc, ev, pci, ts, policy)
    if len(inc["evidence"]) < evidence:
        inc["evidence"].append(summary(ev))
    inc["last_seen"] = max(inc["last_seen"], ts)


def _lemon(action: str, d: Decision) -> str | None:
    """Why the node is a lemon (too many remediations and recorded strikes lately), or None."""
    node_doc, now = d.node_doc, d.now
    lemon = d.policy.doc["lemon"]
    window = lemon["window_d"] * 86400
    acted = [
        r
        for r in node_doc.get("remediations", [])
        if r.get("action") in NODE_ACTIONS and now - r["at"] <= window
    ]
    # A strike counts only once a node check confirmed it: a strike is recorded from a log line
    # alone (an episode that takes no action runs no check), and anyone who writes log entries
    # could make a healthy node a lemon, and its next routine fault a host report (issue 35, 7).
    strikes = [
        s for s in node_doc.get("strikes", []) if s.get("confirmed") is True and now - s["at"] <= window
    ]
    if len(acted) + len(strikes) < lemon["remediations"] or action == Action.REPLACE_NODE:
        return None
    also = f" and {len(strikes)} recorded fault episodes" if strikes else ""
    return f"lemon host: {len(acted)} remediations{also} in {lemon['window_d']} days"


def _repeated(kind: str | None, history: list[Remediation], d: Decision) -> tuple[str, str] | None:
    """(action, why) when the node was remediated for this kind of fault within its policy's repeat window."""
    now = d.now
    repeat = d.policy.xids.repeat_for(kind) if kind else None
    if repeat is None:
        return None
    prior = [r for r in history if r.get("kind") == kind and now - r["at"] <= repeat.within_h * 3600]
    if not prior:
        return None
    last = max(prior, key=lambda r: r["at"])
    return repeat.action, f"{repeat.reason} ({int((now - last['at']) // 60)} min after {last['action']})"


def escalate(proposed: str, d: Decision, kind: str | None = None) -> tuple[str, list[str]]:
    """Ladder, repeat and lemon rules: a repeat offender gets a stronger action, never a weaker one."""
    if proposed not in NODE_ACTIONS or proposed == Action.DRAIN_NODE:
        return proposed, []
    policy, now = d.policy, d.now
    why: list[str] = []
    action = proposed
    history = [r for r in d.node_doc.get("remediations", []) if r.get("action") in NODE_ACTIONS]
    lemon = _lemon(action, d)
    if lemon is not None:
        why.append(lemon)
        action = Action.REPLACE_NODE
    repeated = _repeated(kind, history, d)
    if repeated is not None and RANK[repeated[0]] > RANK[action]:
        action, reason = repeated
        why.append(reason)
    steps: Sequence[str] = policy.doc["ladder"]["steps"]
    window = policy.doc["ladder"]["window_h"] * 3600
    last = max((r for r in history if now - r["at"] <= window), key=lambda r: r["at"], default=None)
    if last is not None and last["action"] in steps and action in steps:
        nxt = steps[min(steps.index(last["action"]) + 1, len(steps) - 1)]
        if RANK[nxt] > RANK[action]:
            why.append(f"faulted again {int((now - last['at']) // 60)} min after {last['action']}")
            action = nxt
    return action, why


def cooldown_left(action: str, d: Decision) -> float:
    last = d.node_doc.get("last_action_at", {}).get(action)
    if last is None:
        return 0.0
    return max(0.0, float(last) + d.policy.cooldown_s(action) - d.now)


def budget_scopes(inc: Incident, node_doc: NodeDoc) -> list[tuple[str, str]]:
    """(scope kind, document id) for every budget an incident counts against."""
    scopes = [("zone", f"zone-{node['zone']}")] if (node := inc.get("node")) else []
    if inc.get("cluster"):
        scopes.insert(0, ("cluster", f"cluster-{inc['cluster']}"))
    block = node_doc.get("block")
    if block:
        scopes.append(("block", block_scope(str(block))))
    return scopes


def _live_slots(budget: Budget, policy: Policy, now: float) -> dict[str, Slot]:
    window = policy.budget_window_s
    return {k: s for k, s in budget.get("slots", {}).items() if s.get("active") or now - s["at"] < window}


def try_claim(inc: Incident, d: Decision) -> tuple[dict[str, Budget], str | None, str | None]:
    """Claim one slot in every scope, or none. Returns (budget docs to write, failed scope, page reason)."""
    return _claim_in(budget_scopes(inc, d.node_doc), inc, d)


def _claim_in(
    scopes: list[tuple[str, str]], inc: Incident, d: Decision
) -> tuple[dict[str, Budget], str | None, str | None]:
    out: dict[str, Budget] = {}
    policy, now = d.policy, d.now
    for kind, doc_id in scopes:
        empty: Budget = {"scope": doc_id, "slots": {}, "paged_until": 0}
        b = copy.deepcopy(d.budgets.get(doc_id) or empty)
        slots = _live_slots(b, policy, now)
        cap = policy.budget_cap(kind, d.cluster_size if kind == "cluster" else None)
        if inc["id"] not in slots and len(slots) >= cap and not d.force:
            page = None
            if b.get("paged_until", 0) <= now:
                b["paged_until"] = now + policy.budget_window_s
                page = (
                    f"blast-radius budget {doc_id} exhausted: {len(slots)} of {cap} nodes in "
                    f"remediation within {int(policy.budget_window_s)} s or left fenced by a failed "
                    "incident no person has closed yet; holding new incidents"
                )
            b["slots"] = slots
            # Written only when it pages (paged_until: one page per window, the write conditioned
            # on the budget as read). A hold that pages nobody changes nothing a reader needs, and
            # its write made every hold of a storm contend on this one document (the holds of 60
            # nodes at once, decided by 10 instances: most commits refused and decided again); a
            # hold decided on a budget that a release has just freed is retried by the sweep.
            return ({doc_id: b} if page else {}), doc_id, page
        slots[inc["id"]] = {"at": now, "active": True}
        b["slots"] = slots
        out[doc_id] = b
    return out, None, None


def release_slots(budgets: Budgets, iid: str) -> dict[str, Budget]:
    """Mark an incident's slots inactive; they still count until the window slides past them."""
    out: dict[str, Budget] = {}
    for doc_id, b in budgets.items():
        if b and iid in b.get("slots", {}):
            nb = copy.deepcopy(b)
            nb["slots"][iid]["active"] = False
            out[doc_id] = nb
    return out


def drop_slots(budgets: Budgets, iid: str) -> dict[str, Budget]:
    """Remove an incident's slots outright: nothing was done to the node (a fault the node did not
    confirm), so they must not count on through the window as a released one does."""
    out: dict[str, Budget] = {}
    for doc_id, b in budgets.items():
        if b and iid in b.get("slots", {}):
            nb = copy.deepcopy(b)
            del nb["slots"][iid]
            out[doc_id] = nb
    return out


def absorbs(latest: Incident | None, ev: FaultEvent, ts: float) -> bool:
    """Does this event belong to the node's latest incident (same fault episode)?"""
    if latest is None:
        return False
    if latest["state"] in OPEN_STATES:
        return True
    if latest["state"] != State.RESOLVED:
        return False
    ended = latest.get("alert_ended")
    if ended and alerts.is_alert(ev) and ts < float(ended["flap_until"]):
        return True  # its alert closed before anything was done and opens (or closes) again: flapping
    closure = latest.get("closure")
    if closure:  # closed by a person: only lines logged before that are late lines of its episode
        return ts <= float(closure["at"])
    resolved = latest["timeline"].get("resolved") or 0
    plan = latest.get("localise")
    localised = plan is not None and plan.get("run") is True  # a hung job Pitstop acted on
    if (
        (latest["action"] in RECORD_ONLY_ACTIONS and not localised)
        or latest.get("mode") == "observe"
        or latest.get("silenced")
    ):
        # Record-only episodes end with the burst (3 minutes of silence); a stronger line of the
        # same burst (delivered late: push delivery is unordered) reopens the episode.
        return ts < float(latest["burst_until"])
    # A node action's (or a localised hang's) incident absorbs lines logged before it was resolved
    # (late deliveries): a hang of the restarted run is a new episode.
    return ts <= resolved


def _record_remediation(node_doc: NodeDoc, inc: Incident, now: float) -> None:
    node_doc.setdefault("remediations", []).append(
        {"at": now, "action": inc["action"], "incident": inc["id"], "mode": inc["mode"], "kind": inc["kind"]}
    )
    node_doc["remediations"] = node_doc["remediations"][-MAX_HISTORY:]
    node_doc.setdefault("last_action_at", {})[inc["action"]] = now


def counts_toward_lemon(ev: FaultEvent) -> bool:
    """An event whose episode is recorded and counted toward the node's lemon tally though it asks
    for no action (a non-fatal NVSwitch error: xid-policy ``sxid.non_fatal``)."""
    return bool(_detail(ev).get("counts_toward_lemon"))


def _record_strike(node_doc: NodeDoc, inc: Incident, now: float) -> None:
    """One recorded fault episode that took no action, for the lemon rule (kept apart from the
    remediations so the ladder and cooldowns never see it)."""
    node_doc.setdefault("strikes", []).append({"at": now, "incident": inc["id"], "kind": inc["kind"]})
    node_doc["strikes"] = node_doc["strikes"][-MAX_HISTORY:]


def _cluster_size(policy: Policy, doc: FaultEvent | Incident) -> int | None:
    cluster = cluster_of(policy, doc)
    return cluster.size if cluster else None


# The budget documents a decision reads, by id (None: not written yet).
Budgets = Mapping[str, Budget | None]


@dataclass(frozen=True)
class Decision:
    """What one decision works on besides the incident: the node's document, the budgets as they
    stand, the policy, the cluster's size, the time, the Outcome being built, and whether a person
    forces it past its budget (an operator's release). The documents in it change in place; the
    context itself does not."""

    node_doc: NodeDoc
    budgets: Budgets
    policy: Policy
    now: float
    out: Outcome
    cluster_size: int | None = None
    force: bool = False

    @classmethod
    def on(cls, inc: Incident, node_doc: NodeDoc, budgets: Budgets, policy: Policy,
           now: float, out: Outcome, force: bool = False) -> Decision:  # fmt: skip
        return cls(node_doc, budgets, policy, now, out, _cluster_size(policy, inc), force)


def _hold(inc: Draft, d: Decision, held: Held, page: str | None) -> None:
    """Stop here until a person (or, for a budget, the sweep) lets the incident go on."""
    lifecycle.move(inc, State.HELD, "held")
    inc["held"] = held
    d.out.result, d.out.page = "held", page


def _cooled_down(inc: Draft, d: Decision) -> bool:
    """False if the action ran on this node too recently: a job action is dropped, a node action held."""
    action = inc["action"]
    left = cooldown_left(action, d)
    if left <= 0:
        return True
    if action in JOB_ACTIONS:
        lifecycle.move(inc, State.RESOLVED, "suppressed inside its cooldown")
        inc["timeline"]["resolved"] = d.now
        inc["reason"] = (
            f"{inc['reason']} [suppressed: {action} ran on this node {int(left)} s before cooldown end]"
        )
        d.out.result = "suppressed"
        return False
    held: Held = {"reason": f"cooldown: {action} again within {int(left)} s", "since": d.now}
    _hold(inc, d, held, f"incident {inc['id']}: {action} repeated inside its cooldown; needs a human")
    return False


def _claimed(inc: Draft, d: Decision) -> bool:
    """A node action needs a slot in every blast-radius budget it counts against, or it is held."""
    claims, failed, page = try_claim(inc, d)
    d.out.budgets.update(claims)
    if failed is not None:
        held: Held = {"reason": f"blast-radius budget {failed} exhausted", "scope": failed, "since": d.now}
        _hold(inc, d, held, page)
        return False
    inc["budget_scopes"] = sorted({*inc.get("budget_scopes", []), *claims})  # a block it left still counts
    return True


def _schedule(inc: Draft, d: Decision) -> None:
    """Decide the next workflow step. It is started after the store commits this decision."""
    inc["step"] += 1
    inc["mode"] = d.policy.mode_for(inc["cluster"])  # the cluster's mode now (core/control.py)
    _record_remediation(d.node_doc, inc, d.now)
    if inc["mode"] == "enforce":
        inc["workflow"] = {
            "step": inc["step"],
            "state": RunState.PENDING,
            "lease_until": 0,
            "execution": None,
        }
        d.out.start_step = inc["step"]
    else:
        inc["workflow"] = {
            "step": inc["step"],
            "state": RunState.OBSERVE,
            "would_start": True,
            "execution": None,
        }


def _decide_start(inc: Draft, d: Decision) -> None:
    """Given a (new, raised, released or stepped-up) action: hold it, suppress it, or schedule a step.

    Every workflow step is decided here, so policy, cooldowns, budgets and the mode apply to
    each one alike, whoever asks.
    """
    action = inc["action"]
    if action == Action.NONE or _controlled(inc, d):
        return
    if not d.policy.enabled(action):
        held: Held = {"reason": f"action {action} is not enabled by policy", "since": d.now}
        _hold(inc, d, held, f"incident {inc['id']}: {action} needs a human (not enabled by policy)")
        return
    if not _cooled_down(inc, d):
        return
    if action in NODE_ACTIONS and not _claimed(inc, d):
        return
    _schedule(inc, d)


def _controlled(inc: Draft, d: Decision) -> bool:
    """Whether the runtime control (core/control.py) keeps the step from starting. A new episode
    under a silence is recorded and paged, never acted on (it ends with its burst); a paused one
    (in enforce mode), or a silenced one already worked on (its node fenced), is held with a page
    until the control lets it go (the sweep releases it)."""
    c, block = d.policy.control, d.node_doc.get("block")
    what = f"incident {inc['id']}: {subject_name(inc)}: {inc['action']}"
    s = c.silence(inc, d.now, block)
    if s is not None and inc["step"] == 0:
        inc["silenced"] = control.silenced(s)
        d.out.page = f"{what} not acted on, {control.silence_text(s)}"
        return True
    inc.pop("silenced", None)  # acted on from here: it is no longer a silenced episode
    hold = c.hold(inc, d.now, d.policy.enforces(inc["cluster"]), block)
    if hold is None:
        return False
    held: Held = {"reason": hold.why, "since": d.now, "control": hold.kind}
    after = "`pitstop resume`" if hold.kind == "pause" else "the silence ends"
    _hold(inc, d, held, f"{what} held, {hold.why}; it goes on once {after}")
    return True


def _end_burst(latest: Draft | None, budgets: Budgets, ts: float, out: Outcome) -> Budgets:
    """Close the latest incident if its burst is over; the budgets as they stand after that."""
    if latest is None or not close_if_burst_over(latest, ts):
        return budgets
    out.closed = latest
    out.budgets.update(
        release_slots({d: budgets.get(d) for d in latest.get("budget_scopes", [])}, latest["id"])
    )
    return ChainMap(out.budgets, budgets)  # type: ignore[arg-type]


def _raise(latest: Draft, ev: FaultEvent, d: Decision) -> None:
    """A stronger verdict for an open episode: act on it now, or leave it for the running workflow."""
    if latest["state"] == State.RESOLVED:  # a record-only episode that turns out to be worse
        lifecycle.move(latest, State.OPEN, "reopened by a stronger line of its burst")
        latest["timeline"].pop("resolved", None)
    proposed = higher(latest["proposed_action"], ev["action"])
    action, why = escalate(proposed, d, latest["kind"])
    action, lowered = _capped(latest, action, d.policy)
    why += lowered
    latest["proposed_action"] = proposed
    if latest["state"] in (State.OPEN, State.HELD):
        latest["escalations"].append(
            {"from": latest["action"], "to": action, "at": d.now, "why": [ev["reason"], *why]}
        )
        latest["action"], latest["reason"] = action, ev["reason"]
        d.out.result = "raised"
        if latest["state"] == State.OPEN or (latest["held"] or {}).get("scope") is None:
            lifecycle.move(latest, State.OPEN, "raised")
            latest["held"] = None
            _decide_start(latest, d)
    elif latest["state"] in ACTIVE_STATES:
        latest["escalate_to"] = higher(latest.get("escalate_to") or Action.NONE, action)
        d.out.result = "raised"
    # FAILED stays with its human; the higher verdict is kept as evidence.


def _absorb(latest: Draft, ev: FaultEvent, ts: float, d: Decision) -> Outcome:
    """Count an event into the node's episode; a stronger one raises the episode's action, and the
    driver's word that every GPU of a waiting episode recovered is paged (it ends nothing)."""
    recovered_before = _driver_recovered(latest)
    _count(latest, ev, ts, d.policy)
    if ends_recovery(ev, d.policy) and not recovered_before and _driver_recovered(latest):
        # A log line is a hint, not evidence: the driver's word that its GPUs recovered ends nothing
        # on its own (anyone who can write a log entry can write it). A person learns of it; a
        # waiting step still runs its node check, which decides (issue 35, 6).
        d.out.page = (
            f"incident {latest['id']}: a log line says the driver recovered every GPU of "
            f"{subject_name(latest)} (Xid 154 to 0x0); not acted on: the node check decides, "
            "or close the incident once you confirmed it"
        )
    if _trust_of(ev) == trust.VERIFIED:
        latest["trust"] = trust.VERIFIED
    latest["burst_until"] = max(latest["burst_until"], ts + d.policy.window("burst_silence_s"))
    latest["updated_at"] = d.now
    d.out.incident, d.out.result, d.out.closed = latest, "absorbed", None
    if alerts.is_alert(ev) and _alert_changes(latest, ev, ts, d):
        return d.out
    if RANK[ev["action"]] > RANK[latest["action"]] and not latest.get("closure"):
        _raise(latest, ev, d)
    return d.out


# -- episodes of Monitoring alerts (core/alerts.py): an open starts one, its close may end it ----

MAX_ALERTS = 16  # alert incidents an episode tracks by id (a node's several policies, a flapping one)


def _note_alert(inc: Draft, ev: FaultEvent, ts: float) -> None:
    """Record the alert incident an event opens or closes on the episode (a late open after its
    close changes nothing: push delivery is unordered)."""
    a = ev["detail"]["alert"]
    refs = inc.setdefault("alerts", [])
    ref = next((r for r in refs if r["id"] == a["incident_id"]), None)
    if ref is None:
        if len(refs) >= MAX_ALERTS:
            return
        ref = AlertRef(id=a["incident_id"], state=a["state"], policy=a["policy"], signal=a["signal"],
                       symptom=a.get("symptom"), opened_at=None, closed_at=None)  # fmt: skip
        refs.append(ref)
    if a["state"] == "closed":
        ref["state"], ref["closed_at"] = "closed", ts
    elif ref["opened_at"] is None:
        ref["opened_at"] = ts


def alert_started(inc: Incident) -> bool:
    """The episode is its alerts' alone: opened by one, and nothing but alerts counted into it (an
    Xid episode that also absorbed an alert is not ended by that alert's close)."""
    alert_kinds = set(alerts.SIGNALS)
    return inc["kind"] in alert_kinds and set(inc["counts"]) <= {"events", *alert_kinds}


def untouched(inc: Incident) -> bool:
    """Nothing was done for the episode yet: no execution started on it (OPEN), or it waits (HELD)."""
    started = (inc.get("workflow") or {}).get("state") == RunState.STARTED
    return inc["state"] == State.HELD or (inc["state"] == State.OPEN and not started)


def forget_remediation(node_doc: NodeDoc, iid: str) -> None:
    """An episode that ended before anything was done leaves no remediation behind (cooldowns, ladder)."""
    mine = [r for r in node_doc.get("remediations", []) if r.get("incident") == iid]
    kept = [r for r in node_doc.get("remediations", []) if r.get("incident") != iid]
    node_doc["remediations"] = kept
    last = node_doc.setdefault("last_action_at", {})
    for r in mine:
        if last.get(r["action"]) == r["at"]:
            earlier = [k["at"] for k in kept if k["action"] == r["action"]]
            if earlier:
                last[r["action"]] = max(earlier)
            else:
                last.pop(r["action"], None)


def _alert_changes(inc: Draft, ev: FaultEvent, ts: float, d: Decision) -> bool:
    """An alert's open or close, absorbed into its episode: whether it ended or reopened it."""
    _note_alert(inc, ev, ts)
    ended = inc.get("alert_ended")
    if ev["detail"]["alert"]["state"] == "open":
        if inc["state"] != State.RESOLVED or not ended:
            return False
        lifecycle.move(inc, State.OPEN, "its alert opened again (flapping)")
        inc["timeline"].pop("resolved", None)
        inc.pop("alert_ended", None)
        d.out.result = "reopened"
        _decide_start(inc, d)
        return True
    refs = inc.get("alerts") or []
    if inc["state"] == State.RESOLVED or not untouched(inc) or not alert_started(inc):
        return False  # remediation under way, or other evidence in it: the close is only recorded
    if any(r["state"] != "closed" for r in refs):
        return False  # another of its alerts is still open
    lifecycle.move(inc, State.RESOLVED, "its alerts closed before anything was done")
    inc["timeline"]["resolved"] = d.now
    inc["held"] = None
    inc["alert_ended"] = {"at": d.now, "flap_until": ts + d.policy.window("alert_flap_s")}
    d.out.budgets.update(own_slots(inc, d.budgets))
    forget_remediation(d.node_doc, inc["id"])
    plan = inc.get("localise")
    if d.node_doc.get("localised_at") == (plan.get("at") if plan else None):
        d.node_doc.pop("localised_at", None)  # nothing was localised: the window is not spent
    d.out.result = "ended"
    return True


def ends_recovery(ev: FaultEvent, policy: Policy) -> bool:
    """The driver's recovery verdict back to 0 (None) for a GPU (Xid 154: xid-policy ``tie: recovery``)."""
    xid = ev.get("xid")
    return (
        xid is not None and _detail(ev).get("recovery_to") == 0 and policy.xids.rule(xid).tie == TIE_RECOVERY
    )


def _driver_recovered(inc: Incident) -> bool:
    """Every line of an episode that is not under way was about a GPU whose driver now says no
    recovery is needed: each GPU it counted has a recovery verdict, and every verdict is 0."""
    wf_state = (inc.get("workflow") or {}).get("state")
    waiting = inc["state"] == State.HELD or (
        inc["state"] == State.OPEN and wf_state in (None, RunState.OBSERVE)
    )
    gpus = inc["gpus"].values()
    if not waiting or not gpus or OTHER in inc["gpus"]:
        return False
    per_gpu = sum(sum(g["xids"].values()) for g in gpus)
    return per_gpu == inc["counts"].get("events") and all(g.get("recovery_to") == 0 for g in gpus)


def _open(ev: FaultEvent, ts: float, trigger: str, d: Decision) -> Outcome:
    """A new episode on the node: a new incident, escalated by the node's history."""
    cluster = cluster_of(d.policy, ev)
    inc = new_incident(incident_id(subject_key(ev), trigger), ev, cluster, d.policy, d.now)
    action, why = escalate(ev["action"], d, ev["kind"])
    action, lowered = _capped(inc, action, d.policy)
    why += lowered
    if why:
        inc["escalations"].append({"from": ev["action"], "to": action, "at": d.now, "why": why})
        inc["action"] = action
        inc["reason"] = f"{ev['reason']} [escalated to {action}: {'; '.join(why)}]"
    _count(inc, ev, ts, d.policy)
    if alerts.is_alert(ev):
        _note_alert(inc, ev, ts)
    d.node_doc["latest_incident"] = inc["id"]
    if counts_toward_lemon(ev):
        _record_strike(d.node_doc, inc, d.now)
    d.out.incident, d.out.result = inc, "opened"
    _decide_start(inc, replace(d, cluster_size=cluster.size if cluster else None))
    if ev["kind"] == "hang" and inc.get("workflow") and inc["scheduler"] != vertex.SCHEDULER:
        _plan_localisation(inc, d)  # a Vertex AI job has no nodes of Pitstop's to check
    return d.out


def _plan_localisation(inc: Draft, d: Decision) -> None:
    """A hung job's step localises it first, once per job per window (core/localise.py): decided
    here, on the job's document, in the transaction that opens the incident."""
    p = localise.plan(d.node_doc, d.policy.localise, d.policy.window("hang_localise_s"), d.now)
    inc["localise"] = p.doc(d.now)
    if p.run and d.policy.enforces(inc["cluster"]):
        d.node_doc["localised_at"] = d.now
    elif p.page and d.out.page is None:
        d.out.page = f"incident {inc['id']}: {subject_name(inc)} hung; {p.why}"


def _trust_of(ev: FaultEvent) -> str:
    src = ev.get("source")
    return (
        trust.VERIFIED
        if isinstance(src, Mapping) and src.get("trust") == trust.VERIFIED
        else trust.UNVERIFIED
    )


def believed(ev: FaultEvent, policy: Policy) -> tuple[FaultEvent, trust.TrustDecision]:
    """The event as far as its evidence may be believed: its action lowered to what it may start."""
    td = trust.decide(ev, policy)
    if not td.lowered:
        return ev, td
    return {**ev, "action": td.action, "reason": f"{ev['reason']} [{td.reason}]"}, td


def _capped(inc: Incident, action: str, policy: Policy) -> tuple[str, list[str]]:
    """History may raise an action; for an episode without verified evidence only as far as trust allows."""
    if inc.get("trust") == trust.VERIFIED or inc["kind"] in trust.READ_BACK_KINDS:
        return action, []
    td = trust.allowed_action(trust.UNVERIFIED, action, policy.trust_text_syslog)
    return td.action, [td.reason] if td.lowered else []


def apply_event(
    ev: FaultEvent,
    node_doc: NodeDoc | None,
    latest: Incident | None,
    budgets: Budgets,
    policy: Policy,
    now: float,
    trigger: str,
) -> Outcome:
    """Fold one classified event into the node's state. ``ev['_observed_ts']`` is its log time."""
    ts = float(ev.get("_observed_ts") or now)
    node_doc = copy.deepcopy(node_doc) if node_doc else new_node(ev.get("node"), ev.get("job"))
    latest = as_incident(latest) if latest else None
    out = Outcome("ignored", node=node_doc)
    budgets = _end_burst(latest, budgets, ts, out)
    ev, td = believed(ev, policy)
    d = Decision(node_doc, budgets, policy, now, out, _cluster_size(policy, ev))
    if latest is not None and absorbs(latest, ev, ts):
        return _absorb(latest, ev, ts, d)
    if ev["action"] == Action.NONE and not td.lowered and not counts_toward_lemon(ev):
        return out  # nothing to remember: no open episode and nothing to do
    out = _open(ev, ts, trigger, d)
    if td.lowered and out.page is None and out.incident is not None:
        out.page = f"incident {out.incident['id']}: {td.reason}"  # once per episode: absorbs are quiet
    return out


def end_burst(inc: Incident, budgets: Budgets, burst_until: float, now: float) -> Outcome:
    """Resolve a record-only or observe-mode episode whose burst is over (the periodic sweep).

    ``burst_until``: the burst as every count shard says (the listed view summed them), which
    may run past the incident's own."""
    doc = as_incident(inc)
    doc["burst_until"] = max(float(doc["burst_until"]), burst_until)
    if not close_if_burst_over(doc, now):
        return Outcome("ignored", incident=as_incident(inc))
    return Outcome("resolved", incident=doc, budgets=own_slots(doc, budgets))


def close_if_burst_over(inc: Draft, now: float) -> bool:
    """Record-only and observe-mode incidents resolve when their burst ends; an alert's episode
    lasts while its alert is open (an alert sends no lines while it holds: its close ends it)."""
    if inc["state"] != State.OPEN or now < inc["burst_until"]:
        return False
    if any(a.get("state") == "open" for a in inc.get("alerts") or ()):
        return False
    if (
        inc["action"] in RECORD_ONLY_ACTIONS
        and inc.get("workflow")
        and (inc.get("workflow") or {}).get("state") != RunState.OBSERVE
    ):
        return False  # a real workflow owns it
    recorded_only = inc.get("mode") == "observe" or inc.get("silenced")  # a silenced one is recorded only
    if inc["action"] not in RECORD_ONLY_ACTIONS and not recorded_only:
        return False
    lifecycle.move(inc, State.RESOLVED, "its burst ended")
    inc["timeline"]["resolved"] = now
    inc["updated_at"] = now
    return True


def _merge_gpu(inc: Counted, gk: str, g: GpuCounts) -> None:
    key = bounded_key(inc["gpus"], gk, MAX_GPUS)
    pci = g["pci"] if key != OTHER else OTHER
    cur = inc["gpus"].setdefault(key, {"pci": pci, "first_seen": g["first_seen"], "xids": {}})
    for x, n in g["xids"].items():
        xk = bounded_key(cur["xids"], x, MAX_XIDS)
        cur["xids"][xk] = cur["xids"].get(xk, 0) + n
    cur["last_seen"] = max(cur.get("last_seen", 0), g.get("last_seen", 0))
    if key != OTHER:
        if "recovery_to" in g:
            cur["recovery_to"] = g["recovery_to"]
        if "secondary" in g:
            cur["secondary"] = g["secondary"]


def add_deltas(inc: Counted, deltas: Deltas) -> None:
    """Add coalesced counts to an incident, or to other deltas (same bounds as :func:`apply_event`)."""
    remember_keys(inc, list(deltas.get("recent_keys", [])))
    for k, n in deltas["counts"].items():
        key = bounded_key(inc["counts"], k, MAX_XIDS + 1)
        inc["counts"][key] = inc["counts"].get(key, 0) + n
    for gk, g in deltas["gpus"].items():
        _merge_gpu(inc, gk, g)
    room = evidence_room(inc)
    if room > 0:
        inc["evidence"].extend(deltas["evidence"][:room])
    inc["last_seen"] = max(inc["last_seen"], deltas["last_seen"])


def merge_deltas(inc: Draft, deltas: Deltas, policy: Policy) -> None:
    """Add coalesced counts (built with the same counting as :func:`apply_event`) to an incident."""
    add_deltas(inc, deltas)
    inc["burst_until"] = max(inc["burst_until"], deltas["last_seen"] + policy.window("burst_silence_s"))


def empty_deltas() -> Deltas:
    return {"counts": {}, "gpus": {}, "evidence": [], "last_seen": 0.0}


def count_into(
    deltas: Deltas,
    ev: FaultEvent,
    ts: float,
    policy: Policy,
    evidence_room: int = MAX_EVIDENCE,
) -> None:
    """Count an event into in-memory deltas; they keep fewer delivery keys than an incident does,
    and only as much evidence as the incident still has room for (a merge drops the rest)."""
    _count(deltas, ev, ts, policy, MAX_DELTA_KEYS, min(evidence_room, MAX_EVIDENCE))


def evidence_room(inc: Incident | Deltas) -> int:
    """How many more evidence summaries an incident keeps (it keeps its first MAX_EVIDENCE)."""
    return max(0, MAX_EVIDENCE - len(inc.get("evidence") or ()))


def release_held(
    inc: Incident,
    node_doc: NodeDoc,
    budgets: Budgets,
    policy: Policy,
    now: float,
    by: str,
    force: bool,
) -> Outcome:
    """Give a HELD incident another try (the sweep) or release it (an operator, past the budget)."""
    if inc["state"] != State.HELD:
        return Outcome("ignored", incident=as_incident(inc))
    inc, node_doc = as_incident(inc), copy.deepcopy(node_doc)
    out = Outcome("released", incident=inc, node=node_doc)
    held: Held = inc.get("held") or {}
    lifecycle.move(inc, State.OPEN, f"released by {by}")
    inc["held"] = None
    if force:
        inc.setdefault("escalations", []).append(
            {"from": inc["action"], "to": inc["action"], "at": now, "why": [f"released by {by}"]}
        )
        # An operator's release is the human decision the hold asked for: past budget and cooldown.
        node_doc.get("last_action_at", {}).pop(inc["action"], None)
    _decide_start(inc, Decision.on(inc, node_doc, budgets, policy, now, out, force))
    now_held = inc["held"]
    if inc["state"] == State.HELD and now_held is not None:
        now_held["since"] = held.get("since", now)
        out.result = "held" if out.page else "still_held"
    else:  # the hold is over: what held it, and for how long, stays on the incident
        ended: Held = {**held, "until": now, "by": by}
        inc["holds"] = [*inc.get("holds", []), ended][-MAX_HISTORY:]
    inc["updated_at"] = now
    return out


def step_up(
    inc: Incident,
    node_doc: NodeDoc,
    budgets: Budgets,
    policy: Policy,
    now: float,
) -> Outcome:
    """The fault got worse while it was being fixed: same incident, stronger action, next step.

    The stronger action (``escalate_to``, kept while a workflow worked on the node) is decided
    like any other: it may be held (policy, cooldown, budget), dropped, or only observed.
    """
    action = inc.get("escalate_to")
    if not action or RANK[action] <= RANK[inc["action"]] or inc["state"] in UNCLAIMABLE_STATES:
        return Outcome("ignored", incident=as_incident(inc))  # an ended, failed or held one is not stepped up
    inc, node_doc = as_incident(inc), copy.deepcopy(node_doc)
    out = Outcome("raised", incident=inc, node=node_doc)
    why = list(inc.get("escalate_why") or ["a stronger fault arrived during remediation"])
    inc["escalations"].append({"from": inc["action"], "to": action, "at": now, "why": why})
    lifecycle.move(inc, State.OPEN, "stepped up")
    inc["action"], inc["escalate_to"] = action, None
    inc.pop("escalate_why", None)
    _decide_start(inc, Decision.on(inc, node_doc, budgets, policy, now, out))
    inc["updated_at"] = now
    return out


# -- how every incident ends: a person closes it, or the watchdog fails it --------------------

# A person may end these: an incident that waits (HELD), has failed (FAILED), or has no execution
# working on the node (OPEN). A fenced, acting or verifying one belongs to its execution, which
# ends it, or which the watchdog fails once it dies or overruns.
CLOSABLE_STATES = frozenset({State.OPEN, State.HELD, State.FAILED})
# States the watchdog checks, when a started execution owns the step.
WATCHED_STATES = ACTIVE_STATES | {State.OPEN}


def own_slots(inc: Incident, budgets: Budgets) -> dict[str, Budget]:
    """The incident's blast-radius slots let go: they count on only until the window slides past."""
    return release_slots({d: budgets.get(d) for d in inc.get("budget_scopes", [])}, inc["id"])


def closable(inc: Incident) -> bool:
    """Whether a person may close the incident now (an OPEN one whose execution started is its own)."""
    started = (inc.get("workflow") or {}).get("state") == RunState.STARTED
    return inc["state"] in CLOSABLE_STATES and not (inc["state"] == State.OPEN and started)


def close_by_person(
    inc: Incident,
    node_doc: NodeDoc,
    budgets: Budgets,
    by: str,
    now: float,
    unfence: bool,
) -> Outcome:
    """A person ends an incident: RESOLVED, with who and when (``closure``) and timeline ``closed``.

    Its budget slots are let go. Lines logged before the close are still counted on it (late
    deliveries); a fault after it opens a new incident. ``unfence`` records that the person asked
    for the node to be returned to service (the caller sends that request).
    """
    if not closable(inc):
        return Outcome("ignored", incident=as_incident(inc))
    inc, node_doc = as_incident(inc), copy.deepcopy(node_doc)
    inc["closure"] = {"by": by, "at": now, "from_state": str(inc["state"]), "unfence": unfence}
    lifecycle.move(inc, State.RESOLVED, f"closed by {by}")
    inc["held"], inc["escalate_to"] = None, None
    inc["timeline"]["closed"] = now
    inc["budget_released_at"] = now
    inc["updated_at"] = now
    return Outcome("closed", incident=inc, node=node_doc, budgets=own_slots(inc, budgets))


def watched_execution(inc: Incident) -> str | None:
    """The execution that owns the incident's current step, if one was started and it is watched."""
    wf = inc.get("workflow") or {}
    if inc.get("state") not in WATCHED_STATES or wf.get("state") != RunState.STARTED:
        return None
    name = wf.get("execution")
    owner = wf.get("claimed_by")
    if name and owner and owner != "unknown" and not str(name).endswith("/" + str(owner)):
        # another execution of this step claimed it (the Workflows execution id, not its full name)
        return f"{str(name).rsplit('/', 1)[0]}/{owner}" if "/" not in str(owner) else str(owner)
    return str(name) if name else None


def fail_stuck(
    inc: Incident,
    node_doc: NodeDoc,
    budgets: Budgets,
    execution: str,
    why: str,
    now: float,
) -> Outcome:
    """The watchdog's verdict: the step's execution died or overran. FAILED, a page.

    Only if the incident is still where the watchdog saw it (same state family, step and
    execution); otherwise the execution moved it on meanwhile and nothing changes. The node
    stays fenced, and so its blast-radius slots keep counting: nothing lets either go but a
    person (``close [--unfence]``), or repeated failures would fence more nodes than the budget.
    """
    if watched_execution(inc) != execution:
        return Outcome("ignored", incident=as_incident(inc))
    inc, node_doc = as_incident(inc), copy.deepcopy(node_doc)
    lifecycle.move(inc, State.FAILED, "the watchdog")
    inc["failure"] = {"stage": "watchdog", "error": why, "at": now}
    inc["updated_at"] = now
    node = subject_name(inc)
    page = (
        f"incident {inc['id']}: remediation of {node} ({inc['action']}, step {inc['step']}) {why}. "
        f"The node stays fenced. Investigate, then: pitstop incidents --close {inc['id']} --unfence --by NAME"
    )
    return Outcome("failed", incident=inc, node=node_doc, page=page)


def join_block(
    inc: Incident,
    node_doc: NodeDoc,
    budgets: Budgets,
    block: str,
    policy: Policy,
    now: float,
    place: Place | None = None,
) -> Outcome:
    """The node's reservation block, read from Compute when a step is claimed, before the fence:
    from then on the incident counts against that block's budget too (not only once acted on).

    A block already at its budget holds an incident whose node this incident has not fenced yet,
    with a page, as its decision would have had the block been known then (the step it scheduled
    is forgotten, so no cooldown holds it again once the sweep releases it). A node already fenced
    is out of service whatever: it joins past the cap. ``ignored``: nothing new. ``place``: where the
    node sits, cached in its document (core/topology.py reads it for the gang's choice).
    """
    doc_id = block_scope(block)
    known = place is None or node_doc.get("topology") == place
    if inc["state"] in UNCLAIMABLE_STATES or (
        node_doc.get("block") == block and doc_id in inc.get("budget_scopes", []) and known
    ):
        return Outcome("ignored", incident=as_incident(inc))
    inc, node_doc = as_incident(inc), copy.deepcopy(node_doc)
    node_doc["block"] = block
    if place is not None:
        node_doc["topology"] = place
    out = Outcome("joined", incident=inc, node=node_doc)
    fenced = inc["state"] != State.OPEN or bool(inc["timeline"].get("fenced"))
    d = Decision.on(inc, node_doc, budgets, policy, now, out, force=fenced)
    claims, failed, page = _claim_in([("block", doc_id)], inc, d)
    out.budgets.update(claims)
    if failed is not None:
        held: Held = {"reason": f"blast-radius budget {failed} exhausted", "scope": failed, "since": now}
        _hold(inc, d, held, page)
        forget_remediation(node_doc, inc["id"])
    else:
        inc["budget_scopes"] = sorted({*inc.get("budget_scopes", []), *claims})
    inc["updated_at"] = now
    return out
