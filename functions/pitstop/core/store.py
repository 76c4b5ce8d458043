"""The incident store, as a port: what the services ask of it, and the one rule for committing a decision.

Two implementations keep the same semantics: adapters/firestore.py (each decision all or
nothing: a batch conditioned on what it read, or a transaction; for the functions) and
adapters/memory_store.py (a lock standing for the transaction, for unit tests, ``pitstop replay``
and the simulator). tests/adapters/test_store_port.py runs one suite
against both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pitstop.core import aggregate, engine, remediation
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
    StepRecord,
)
from pitstop.core.engine import Budgets, Outcome, subject_key
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.core.steps import StepStore

T = TypeVar("T")


@dataclass(frozen=True)
class Commit:
    """The documents one decision writes, all in one transaction or none: the incidents (a burst's
    end may close one incident while the event opens the next), the subject's node document, the
    budgets it claimed or released, and the notifications it causes (outbox entries)."""

    incidents: list[Incident] = field(default_factory=list)
    node: NodeDoc | None = None
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    outbox: list[OutboxEntry] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.incidents) + (self.node is not None) + len(self.budgets) + len(self.outbox)


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
    return Commit(incidents, node, dict(out.budgets), [outbox_entry(n, now) for n in notices(out)])


def notices(out: Outcome) -> list[Notification]:
    """The notifications a decision causes: its page first, then its incident notices."""
    page = [remediation.page_notification(out.page, out.incident)] if out.page else []
    return [*page, *out.notices]


def outbox_entry(notification: Notification, now: float) -> OutboxEntry:
    """A notification as the outbox keeps it until the topic has it (published as stored)."""
    plain: JsonObject = json.loads(json.dumps(notification, default=str))  # enums as their strings
    return {"id": str(notification["id"]), "notification": plain, "created_at": now, "sent": False}


def node_key_of(commit: Commit) -> str | None:
    return subject_key(commit.node) if commit.node is not None else None


class UnitOfWork(Protocol):
    """What one decision reads and writes, as a store's transaction offers it (Firestore's, or the
    memory store's lock): the incident, the subject's node document, the budgets (read lazily), and
    the write of its outcome. :func:`run` is the one way any store decides a command."""

    def incident(self, iid: str) -> Incident | None: ...
    def node(self, key: str) -> NodeDoc | None: ...
    @property
    def budgets(self) -> Budgets: ...
    def write(self, commit: Commit) -> None: ...


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


Countable = aggregate.Countable


class Decisions(Protocol):
    """Decisions, each read-decide-write in one transaction (core/aggregate.decide decides them)."""

    def apply(
        self, ev: FaultEvent, policy: Policy, now: float, countable: Countable | None = None
    ) -> Outcome:
        """Decide one event, exactly once per delivery identity; or, if ``countable`` says so of
        the incident as read, nothing (``coalesced``: the incident as read, nothing written)."""
        ...

    def decide(self, iid: str, cmd: aggregate.Command, policy: Policy | None, now: float) -> Outcome:
        """Decide any other command on an incident (:func:`run`) and write its outcome atomically."""
        ...


class Counts(Protocol):
    """Storm counts in shards (see :func:`with_shards`) and what tells a cache they may be stale."""

    def put_count_shards(self, pages: Mapping[str, Mapping[str, CountShard]]) -> None:
        """Write shards' totals (``page -> shard -> totals``, each naming its incident), each
        replacing that shard's earlier totals whole, blindly: one write per page, no read; the
        page's other shards stay as they were."""
        ...

    def incident_as_decided(self, iid: str) -> Incident | None:
        """The incident document without its shards (one read): what a cache keeps."""
        ...

    def resolved_since(self, since: float) -> list[Resolution]:
        """Resolutions recorded at ``since`` or later (one query: at least one read)."""
        ...


class Starts(Protocol):
    def pending_starts(self, now: float) -> list[Incident]: ...


class Records(Protocol):
    """Incidents, nodes and budgets as documents, and what remediation records beside them."""

    def get(self, iid: str) -> Incident | None: ...  # with its count shards summed
    def list(self, states: Iterable[State] | None = None) -> list[Incident]: ...  # likewise
    def latest_incident(self, nkey: str) -> Incident | None: ...  # as decided, no shards
    def get_node(self, key: str) -> NodeDoc | None: ...
    def put_node(self, key: str, doc: NodeDoc) -> None: ...
    def set_node_fields(self, key: str, fields: NodeFields) -> None: ...
    def budget(self, doc_id: str) -> Budget | None: ...
    def mark_job_requeue(self, key: str, incident: str, now: float) -> bool: ...
    def claim_job_restart(
        self, job_key: str, run_key: str, now: float, cap: int, window_s: float
    ) -> bool: ...
    def step_record(self, iid: str, key: str) -> StepRecord | None: ...
    def steps(self, iid: str) -> StepStore[Any]: ...


class Outbox(Protocol):
    """Notifications recorded before they are published (services/outbox.py)."""

    def outbox_add(self, nid: str, entry: OutboxEntry) -> OutboxEntry: ...
    def outbox_mark_sent(self, nid: str, message_id: str, now: float, keep_s: float) -> None: ...
    def outbox_note_failure(self, nid: str, now: float) -> None: ...
    def outbox_unsent(self, created_before: float) -> Iterator[OutboxEntry]: ...


class IncidentStore(Decisions, Counts, Starts, Records, Outbox, Protocol):
    """Everything services ask of the store."""

    writes: int  # documents written by this process (``pitstop bench ingest``)
    retries: int  # decisions that lost to a contender and ran again (``pitstop bench ingest``)
