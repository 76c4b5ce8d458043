"""The incident store, as a port: what the services ask of it, and the one way a decision is committed.

The port (:class:`IncidentStore`) is a unit of work: ``apply`` and ``decide`` read, decide
(core/aggregate.decide) and write one decision atomically; ``get``, ``query`` and ``steps`` read;
three sub-ports hold what is not an incident (``counts``: storm counts and what a cache reads,
``outbox``: notifications until published, ``records``: node, budget and job documents).

How a decision is read, decided and written is written once, here (:func:`fold` for an event,
:func:`run` for any other command), over a small :class:`UnitOfWork` each store offers: its
transaction, as adapters/firestore.py (a batch conditioned on what it read; for the functions) and
adapters/memory_store.py (a lock standing for the transaction, for unit tests, ``pitstop replay``
and the simulator) provide it. tests/adapters/test_store_port.py runs one suite against both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from pitstop.core import aggregate, engine, remediation
from pitstop.core.aggregate import Countable
from pitstop.core.answers import Notification
from pitstop.core.domain import (
    Budget,
    CountShard,
    FaultEvent,
    Incident,
    JsonObject,
    NodeDoc,
    NodeFields,
    OutboxEntry,
    Resolution,
)
from pitstop.core.engine import Budgets, Outcome
from pitstop.core.policy import Policy
from pitstop.core.states import RunState, State
from pitstop.core.steps import StepStore


@dataclass(frozen=True)
class Delivery:
    """The record that an event's delivery was decided (its key: core/engine.event_key), written
    with its decision so that a redelivery is not decided again; ``incident``: the one it went to.
    Kept until ``expire_at`` (the policy's ``dedup_ttl_h``; Firestore's TTL policy deletes it)."""

    key: str
    incident: str | None
    node: str
    expire_at: float


@dataclass(frozen=True)
class Commit:
    """The documents one decision writes, all in one transaction or none: the incidents (a burst's
    end may close one incident while the event opens the next), the subject's node document, the
    budgets it claimed or released, the notifications it causes (outbox entries) and, for an
    event, its delivery's record. ``result``: what was decided (the bench tallies commits by it)."""

    incidents: list[Incident] = field(default_factory=list)
    node: NodeDoc | None = None
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    outbox: list[OutboxEntry] = field(default_factory=list)
    delivery: Delivery | None = None
    result: str = ""

    @property
    def count(self) -> int:
        docs = len(self.incidents) + (self.node is not None) + len(self.budgets) + len(self.outbox)
        return docs + (self.delivery is not None)


NOT_WRITTEN = frozenset({"ignored", "duplicate", "refused"})


def commit_of(out: Outcome, now: float) -> Commit:
    """What a decision writes: the incident a burst's end closed, the incident it decided, the node
    document (unless the event was only absorbed, or the command was about the incident alone),
    every budget document it claimed or released, and an outbox entry for each notification (a
    page it asks for among them). Nothing for an ignored, duplicate or refused one."""
    if out.result in NOT_WRITTEN:
        return Commit()
    incidents = [inc for inc in (out.closed, out.incident) if inc is not None]
    node = out.node if out.result != "absorbed" else None
    entries = [outbox_entry(n, now) for n in notices(out)]
    return Commit(incidents, node, dict(out.budgets), entries, result=out.result)


def notices(out: Outcome) -> list[Notification]:
    """The notifications a decision causes: its page first, then its incident notices."""
    page = [remediation.page_notification(out.page, out.incident)] if out.page else []
    return [*page, *out.notices]


def outbox_entry(notification: Notification, now: float) -> OutboxEntry:
    """A notification as the outbox keeps it until the topic has it (published as stored)."""
    plain: JsonObject = json.loads(json.dumps(notification, default=str))  # enums as their strings
    return {"id": str(notification["id"]), "notification": plain, "created_at": now, "sent": False}


class UnitOfWork(Protocol):
    """What one decision reads and writes, as a store's transaction offers it (Firestore's, or the
    memory store's lock): the incident, the subject's node document, the budgets (read lazily), an
    event delivery's record, and the write of its outcome. :func:`fold` and :func:`run` are the
    one way any store decides."""

    def incident(self, iid: str) -> Incident | None: ...
    def node(self, key: str) -> NodeDoc | None: ...
    @property
    def budgets(self) -> Budgets: ...
    def delivered(self, key: str) -> Delivery | None:
        """The delivery's record if it was decided before (None: it was not, or the store does not
        read it here because the write of a new one is conditioned on its absence)."""
        ...

    def write(self, commit: Commit) -> None: ...


def fold(
    uow: UnitOfWork, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
) -> Outcome:
    """Decide one event on its subject's node and latest incident as the unit of work reads them,
    and write what it decides with its delivery's record: a delivery decided before is not
    decided again (``duplicate``); one the caller counts in memory is not written (``coalesced``)."""
    key, nkey = engine.event_key(ev), engine.subject_key(ev)
    node = uow.node(nkey)
    named = node.get("latest_incident") if node else None
    latest = uow.incident(named) if named else None
    given = aggregate.Given(now, policy, node, uow.budgets)
    out = aggregate.decide(latest, aggregate.FoldEvent(ev, key, countable), given)
    if out.coalesced:
        return out
    if (seen := uow.delivered(key)) is not None:
        return Outcome("duplicate", duplicate_of=seen.incident)
    commit = commit_of(out, now)
    if commit.count:
        iid = out.incident["id"] if out.incident else None
        keep_s = policy.window("dedup_ttl_h") * 3600
        uow.write(replace(commit, delivery=Delivery(key, iid, nkey, now + keep_s)))
    return out


def run(uow: UnitOfWork, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> Outcome:
    """Decide one command on the incident as the unit of work reads it, and write what it decides."""
    inc = uow.incident(iid)
    node = uow.node(inc["node_key"]) if inc is not None and aggregate.reads_node(cmd) else None
    out = aggregate.decide(inc, cmd, aggregate.Given(now, policy, node, uow.budgets))
    commit = commit_of(out, now)
    if commit.count:
        uow.write(commit)
    return out


# -- storm counts in shards ---------------------------------------------------------------------
#
# Google's distributed counter: "each counter is a document with a subcollection of shards, and
# the value of the counter is the sum of the value of the shards", because a single document
# cannot be updated at an unlimited rate (https://cloud.google.com/firestore/docs/solutions/counters).
# Here each shard has one writer (one node state of one ingest instance), which holds the shard's
# totals in memory and writes them whole: a blind write (no read, no transaction, no contender),
# idempotent if retried, bounded as the incident's own counts are (the same counting rule). An
# instance keeps its shards in pages (one document per PAGE_SHARDS shards, services/coalesce.py),
# so one write carries every node's counts of an interval.
RESOLVED_KEEP_S = 86_400.0  # a resolution's record in the resolved feed, for instances' caches
# A count page (an instance's shards) is deleted this long after its last write, by the Firestore
# TTL policy deploy creates on its ``expire_at`` (infra/resources.yaml firestore-ttl). A page is
# written only by the instance that owns it, so one untouched this long belongs to an instance
# gone for months, and its incidents' storm counts are no longer summed (their decided counts,
# the first lines and every decision, stay on the incident).
COUNT_PAGE_KEEP_S = 90 * 86_400.0


def with_shards(inc: Incident, shards: Iterable[CountShard]) -> Incident:
    """The incident as reports, notifications and people see it: its decided counts plus every
    shard's (a view: what is stored stays as decided; the incident's bounds apply to the sum:
    engine.add_deltas)."""
    view = engine.as_incident(inc)
    for shard in shards:
        engine.add_deltas(view, shard)
        view["burst_until"] = max(float(view.get("burst_until") or 0), float(shard.get("burst_until") or 0))
    return view


def resolution(inc: Incident, now: float) -> Resolution | None:
    """The resolved feed's record of an incident written RESOLVED (None if it is not): instances
    that count its node's lines in memory learn from it that it stopped absorbing."""
    if inc.get("state") != State.RESOLVED:
        return None
    at = max(now, float(inc.get("updated_at") or 0))  # a test's fake clock may run ahead of now
    return {"incident": inc["id"], "node": inc.get("node_key"), "at": at, "expire_at": at + RESOLVED_KEEP_S}


@dataclass(frozen=True)
class InStates:
    """Incidents in these states (empty: every incident), with their count shards summed, oldest first."""

    states: frozenset[State] = frozenset()

    def matches(self, inc: Incident) -> bool:
        return not self.states or inc["state"] in self.states


@dataclass(frozen=True)
class StartDue:
    """Incidents whose decided workflow step was not started and whose start lease has run out
    at ``now`` (the starter's crash recovery), as decided (no shards: the starter reads the run)."""

    now: float

    def matches(self, inc: Incident) -> bool:
        wf = inc.get("workflow")
        return wf is not None and wf.get("state") == RunState.PENDING and wf.get("lease_until", 0) <= self.now


Query = InStates | StartDue
EVERY = InStates()  # every incident


def oldest_first(incidents: Iterable[Incident]) -> list[Incident]:
    return sorted(incidents, key=lambda d: d.get("created_at", 0))


def due(entries: Iterable[OutboxEntry], created_before: float) -> list[OutboxEntry]:
    """Unsent outbox entries to publish now, oldest first: those whose publish failed (at once)
    and those recorded before ``created_before`` (older than the grace a decision's own
    publish gets)."""
    unsent = [e for e in entries if e.get("sent") is False]
    ready = [e for e in unsent if e.get("failed_at") is not None or e.get("created_at", 0) <= created_before]
    return sorted(ready, key=lambda e: float(e.get("created_at", 0)))


class Counts(Protocol):
    """Storm counts in shards (see :func:`with_shards`), and what a coalescer's cache reads: an
    incident as decided, a node's latest incident, and the resolved feed that says it may be stale."""

    def put_shards(self, pages: Mapping[str, Mapping[str, CountShard]]) -> None:
        """Write shards' totals (``page -> shard -> totals``, each naming its incident), each
        replacing that shard's earlier totals whole, blindly: one write per page, no read; the
        page's other shards stay as they were."""
        ...

    def as_decided(self, iid: str) -> Incident | None:
        """The incident document without its shards (one read): what a cache keeps."""
        ...

    def latest(self, nkey: str) -> Incident | None:
        """The node's latest incident as decided (no shards), resolved or not."""
        ...

    def resolved_since(self, since: float) -> list[Resolution]:
        """Resolutions recorded at ``since`` or later (one query: at least one read)."""
        ...


class Outbox(Protocol):
    """Notifications recorded before they are published (services/outbox.py); a decision's own are
    written with it (:class:`Commit`)."""

    def add(self, nid: str, entry: OutboxEntry) -> OutboxEntry:
        """Record an entry unless one with this id exists; the stored entry either way."""
        ...

    def mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None:
        """The topic has it; it expires ``keep_s`` later."""
        ...

    def note_failure(self, nid: str, now: float) -> None:
        """A publish of it failed (the sweep retries it without waiting)."""
        ...

    def unsent(self, created_before: float) -> Iterator[OutboxEntry]:
        """Unsent entries whose publish failed or that were recorded before ``created_before``,
        oldest first."""
        ...


class Records(Protocol):
    """The documents beside incidents that remediation reads and writes: nodes, budgets, jobs."""

    def node(self, key: str) -> NodeDoc | None: ...
    def put_node(self, key: str, doc: NodeDoc) -> None: ...
    def set_node_fields(self, key: str, fields: NodeFields) -> None:
        """Merge facts learned while acting into the node's document (created if absent)."""
        ...

    def budget(self, doc_id: str) -> Budget | None: ...
    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool:
        """Claim the requeue of one run of a job for this incident (its own retries find it theirs)."""
        ...

    def claim_job_restart(self, job_key: str, run_key: str, now: float, cap: int, window_s: float) -> bool:
        """Admit one more restart of the job within its disruption budget (remediation.admit_restart)."""
        ...


class IncidentStore(Protocol):
    """Everything services ask of the store: two decisions, three reads and three sub-ports."""

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> Outcome:
        """Decide one event (:func:`fold`), exactly once per delivery identity; or, if
        ``countable`` says so of the incident as read, nothing (``coalesced``: the incident as
        read, nothing written)."""
        ...

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> Outcome:
        """Decide any other command on an incident (:func:`run`) and write its outcome atomically."""
        ...

    def get(self, iid: str) -> Incident | None:
        """The incident with its count shards summed."""
        ...

    def query(self, where: Query = EVERY) -> list[Incident]: ...

    def steps(self, iid: str) -> StepStore[Any]:
        """The incident's step records, for the step runner (``steps(iid).read(key)``: one)."""
        ...

    @property
    def counts(self) -> Counts: ...
    @property
    def outbox(self) -> Outbox: ...
    @property
    def records(self) -> Records: ...
