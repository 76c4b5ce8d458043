"""The one path from a decided incident step to a running workflow execution.

Whoever asks for a step — ingest for a new or raised incident, the sweep for a released
one, actuate for a step-up at close — the same three things happen: the engine decides
(policy, cooldown, budgets, mode), the store commits that decision with the step marked
``pending`` in the same transaction, and :meth:`Launcher.follow_up` pages a human if the
engine asked for one and starts the step at most once (lease, find-or-create by labels,
record). A starter that dies half-way leaves the step pending; the sweep picks it up once
the lease has run out.
"""

from __future__ import annotations

from typing import Protocol, cast

from pitstop.adapters import log
from pitstop.core.aggregate import LeaseStart, RecordStarted
from pitstop.core.answers import WorkflowArgument
from pitstop.core.domain import Incident, WorkflowRun
from pitstop.core.engine import Outcome
from pitstop.core.policy import Policy
from pitstop.core.states import UNCLAIMABLE_STATES, RunState
from pitstop.core.store import IncidentStore, notices
from pitstop.services.outbox import Outbox, Publisher

__all__ = ["Launcher", "Publisher", "Starter", "start_lost", "workflow_argument"]


class Starter(Protocol):
    def find(self, incident_id: str, step: int) -> str | None: ...
    def start(self, incident_id: str, step: int, argument: WorkflowArgument) -> str: ...


def workflow_argument(inc: Incident, step: int) -> WorkflowArgument:
    """What one execution of remediate.yaml is given about its incident."""
    return {
        "incident_id": inc["id"],
        "step": step,
        "action": inc["action"],
        "kind": inc["kind"],
        "xid": inc["xid"],
        "node": inc["node"],  # None for a job's episode (kind hang): ``job`` names it
        "job": inc.get("job"),
        "cluster": inc["cluster"],
        "scheduler": inc["scheduler"],
        "reason": inc["reason"],
        "maintenance": inc.get("maintenance"),
        "alerts": inc.get("alerts"),
    }


def start_lost(inc: Incident, now: float) -> bool:
    """A step was decided but its starter's lease ran out before it recorded a start.

    Not for an incident that ended or waits meanwhile (closed by a person before it started).
    """
    wf = inc.get("workflow") or {}
    if inc.get("state") in UNCLAIMABLE_STATES:
        return False
    return bool(wf.get("state") == RunState.PENDING and wf.get("lease_until", 0) <= now)


class Launcher:
    def __init__(self, store: IncidentStore, starter: Starter | None, notifier: Publisher | None) -> None:
        self.store, self.starter, self.notifier = store, starter, notifier
        # Pages are recorded with the decision that causes them (the outbox attaches to the store).
        self.outbox = Outbox(store, notifier) if notifier is not None else None

    def follow_up(self, out: Outcome, policy: Policy, now: float) -> None:
        """Act on a committed decision: page a human, start its step, or recover a lost start."""
        inc = out.incident
        if self.outbox is not None:
            for notice in notices(out):  # recorded in the outbox with the decision: now published
                self.outbox.send(notice)
        if out.start_step is not None and inc is not None:
            self.start(inc["id"], out.start_step, policy, now)
        elif inc is not None:
            if start_lost(inc, now):
                self.recover(inc["id"], policy, now)  # its starter died: whoever sees it next starts it
        elif out.result == "duplicate" and out.duplicate_of:
            self.recover(out.duplicate_of, policy, now)

    def start(self, iid: str, step: int, policy: Policy, now: float) -> str | None:
        """Start (at most once) the execution for one incident step."""
        if self.starter is None:  # a step is pending only where its cluster enforces (core/engine)
            return None
        leased = self.store.decide(iid, LeaseStart(step), policy, now)
        inc = leased.incident
        if leased.result != "leased" or inc is None:
            return None  # another starter holds the lease, or it is already started
        name = self.starter.find(iid, step) or self.starter.start(iid, step, workflow_argument(inc, step))
        self.store.decide(iid, RecordStarted(step, name), policy, now)
        log.emit("INFO", "remediation started", incident=iid, step=step, execution=name)
        return name

    def recover(self, iid: str, policy: Policy, now: float) -> None:
        """Start a decided step whose starter died, if it is still pending (read fresh)."""
        inc = self.store.get(iid)
        if inc is not None and start_lost(inc, now):
            wf = cast(WorkflowRun, inc["workflow"])  # start_lost: a pending start has its workflow
            self.start(iid, int(wf["step"]), policy, now)
