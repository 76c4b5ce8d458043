"""The sweep service: what Cloud Scheduler's once-a-minute call does.

Ingest only acts when an entry arrives, so whatever must happen with no entry arriving
lives here:

- flush this instance's coalesced storm counts (ingest instances also flush on their own
  timer and at shutdown; see services/coalesce.py),
- end bursts of record-only and observe-mode incidents,
- release incidents held for a budget that has freed up,
- restart workflow starts whose starter died mid-lease,
- the watchdog: every incident a started execution owns (OPEN, FENCED, ACTING, VERIFYING)
  is checked against Workflows. An execution that ended without resolving or failing its
  incident, or that has run past its deadline (policy ``watchdog.deadline_s``, per action),
  fails the incident (``failure.stage: watchdog``; an overrunning execution is cancelled),
  keeps the node fenced, and pages a human,
- let FAILED incidents' blast-radius slots go, so they expire with the window like any other,
- publish notifications still in the outbox (services/outbox.py) after a failed publish.

So every incident ends: resolved, failed with a page, or closed by a person.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, cast, runtime_checkable

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.workflows import ExecutionStatus
from pitstop.core import engine, watchdog
from pitstop.core.aggregate import EndBurst, FailStuck, RefuseStart, ReleaseHeld
from pitstop.core.domain import Incident, WorkflowRun
from pitstop.core.engine import Outcome
from pitstop.core.ops import Op, step_key
from pitstop.core.policy import Policy
from pitstop.core.states import State
from pitstop.core.store import IncidentStore, InStates, StartDue
from pitstop.services.ingest import FOLLOW_UP_ERRORS, Ingest


def close_bursts(store: IncidentStore, now: float) -> int:
    """Resolve record-only and observe-mode incidents whose burst has ended; how many. Each is
    listed with its count shards summed: the burst goes on while any shard says so."""
    closed = 0
    for inc in store.query(InStates(frozenset({State.OPEN}))):
        out = store.decide(inc["id"], EndBurst(float(inc["burst_until"])), None, now)
        closed += out.result == "resolved"
    return closed


def release_held(
    store: IncidentStore, policy: Policy, now: float, follow_up: Callable[[Outcome], None] | None = None
) -> int:
    """Retry incidents held for a budget, and those the runtime control held once it no longer
    does (a resume, a silence's end), oldest first; those held for a human (policy, cooldown)
    stay. Shared with ``pitstop replay``, which runs the sweep's rules on its own store."""
    released = 0
    for inc in store.query(InStates(frozenset({State.HELD}))):
        held = inc.get("held") or {}
        if held.get("control"):
            if policy.control.hold(inc, now, enforce=True) is not None:
                continue  # still paused or silenced: tried again (and paged) only once it is not
        elif held.get("scope") is None:
            continue
        out = store.decide(inc["id"], ReleaseHeld("sweep", force=False), policy, now)
        released += out.result == "released"
        if follow_up is not None:
            follow_up(out)
    return released


@runtime_checkable
class Executions(Protocol):
    """What the watchdog asks Workflows (adapters/workflows.py WorkflowStarter)."""

    def get(self, name: str) -> ExecutionStatus: ...
    def cancel(self, name: str) -> bool: ...


class Sweep:
    """One sweep run over the ingest side's store, launcher and in-memory coalescer.

    ``executions`` is what the watchdog asks; by default ingest's own starter when it can
    answer (the WorkflowStarter does), else the watchdog is off.
    """

    def __init__(self, ingest: Ingest, executions: Executions | None = None) -> None:
        self.ingest = ingest
        starter = ingest.starter
        self.executions = executions or (starter if isinstance(starter, Executions) else None)

    def run(self) -> dict[str, int]:
        """Counts of what the run did: bursts `closed`, incidents `released`, starts `restarted`,
        incidents `failed` by the watchdog (their slots keep counting until a person closes
        them), and notifications `republished` from the outbox after a failed publish."""
        ing = self.ingest
        now = ing.clock()
        ing.in_force()  # a resume or a silence's end, as this instance has the control now
        outbox = ing.launcher.outbox
        phases: dict[str, Callable[[float], int]] = {
            "flushed": lambda t: ing.coalescer.flush_all(t) or 0,
            "closed": lambda t: close_bursts(ing.store, t),
            "released": self._release_held,
            "restarted": self._restart_lost,
            "failed": self.watchdog,
        }
        counts = {name: self._phase(name, fn, now) for name, fn in phases.items()}
        del counts["flushed"]
        ing.coalescer.forget()  # re-read what the sweep may have changed (buffered counts stay)
        counts["republished"] = (
            self._phase("republished", lambda _: outbox.publish_pending(time.time()), now) if outbox else 0
        )
        return counts

    @staticmethod
    def _phase(name: str, fn: Callable[[float], int], now: float) -> int:
        """One phase of the run; its failure is logged and the next phase still runs (the watchdog
        and the outbox must not wait on a broken release or start)."""
        try:
            return int(fn(now))
        except Exception as exc:
            log.emit("ERROR", "sweep phase failed", phase=name, error=repr(exc)[:500])
            return 0

    def _release_held(self, now: float) -> int:
        return release_held(
            self.ingest.store, self.ingest.policy, now, lambda out: self.ingest.follow_up(out, now)
        )

    def _restart_lost(self, now: float) -> int:
        """Start decided steps whose starter died before recording the start (its lease ran out)."""
        restarted = 0
        for inc in self.ingest.store.query(StartDue(now)):
            step = int(cast(WorkflowRun, inc["workflow"])["step"])  # a pending start has its workflow
            try:
                restarted += self.ingest.start_workflow(inc["id"], step, now) is not None
            except Exception as exc:
                self._start_refused(inc["id"], step, exc, now)
        return restarted

    def _start_refused(self, iid: str, step: int, exc: Exception, now: float) -> None:
        """Workflows refused the start (quota, permission, a wrong name): count it; a refusal that
        will not pass (a 4xx other than 429), or the third one, fails the incident with a page."""
        what = repr(exc)[:300]
        permanent = isinstance(exc, gexc.ClientError) and not isinstance(exc, gexc.TooManyRequests)

        out = self.ingest.store.decide(iid, RefuseStart(step, what, permanent), None, now)
        log.emit("ERROR", "workflow start refused", incident=iid, step=step, error=what,
                 failed=out.result == "failed")  # fmt: skip
        self.ingest.follow_up(out, now)  # the page it recorded, if it failed the incident

    # -- the watchdog --------------------------------------------------------------------

    def watchdog(self, now: float) -> int:
        """Fail (and page for) every incident whose execution died or overran; how many."""
        if self.executions is None:
            return 0
        failed = 0
        for inc in self.ingest.store.query(InStates(engine.WATCHED_STATES)):
            name = engine.watched_execution(inc)
            verdict = self._verdict(inc, name, now) if name else None
            if name is None or verdict is None:
                continue
            why, overran = verdict
            out = self.ingest.store.decide(inc["id"], FailStuck(name, why), None, now)
            if out.result != "failed":
                continue  # the execution moved the incident on meanwhile
            failed += 1
            log.emit("ERROR", "watchdog failed an incident", incident=inc["id"], execution=name, why=why)
            if overran:
                self._cancel(name)
            self.ingest.follow_up(out, now)  # the page, recorded in the outbox with the decision
        return failed

    def _verdict(self, inc: Incident, name: str, now: float) -> tuple[str, bool] | None:
        """Why the execution no longer looks after the incident, and whether it overran; None if it does."""
        assert self.executions is not None
        try:
            status = self.executions.get(name)
        except FOLLOW_UP_ERRORS as exc:  # Workflows unreachable: ask again next minute
            log.emit("WARNING", "watchdog could not read an execution", execution=name, error=repr(exc)[:300])
            return None
        short = name.rsplit("/", 1)[-1]
        if status.ended:
            detail = f": {status.error[:200]}" if status.error else ""
            return f"execution {short} ended {status.state} without closing the incident{detail}", False
        started = (inc.get("workflow") or {}).get("started_at") or status.started_at
        deadline = self.ingest.policy.watchdog_deadline_s(str(inc["action"]))
        if started is not None:  # a platform window the step waits out, as Compute gave it to act
            got = self.ingest.store.steps(inc["id"]).read(step_key(int(inc.get("step") or 1), Op.ACT))
            acted = got.record if got is not None else None
            deadline = watchdog.with_platform_wait(deadline, float(started), watchdog.platform_until(acted))
        if started is not None and now - float(started) > deadline:
            ran = int(now - float(started))
            return f"execution {short} still {status.state} after {ran} s (deadline {int(deadline)} s)", True
        return None

    def _cancel(self, name: str) -> None:
        """Stop an overrunning execution, so it cannot act on the node after its incident failed."""
        assert self.executions is not None
        try:
            self.executions.cancel(name)
        except FOLLOW_UP_ERRORS as exc:
            log.emit(
                "WARNING", "watchdog could not cancel an execution", execution=name, error=repr(exc)[:300]
            )
