"""A person ends an incident: ``pitstop incidents --close ID [--unfence] --by NAME``.

Closing is one engine decision (core/engine.py ``close_by_person``) committed by the store:
the incident becomes RESOLVED with ``closure: {by, at, from_state, unfence}`` and timeline
``closed``, and its blast-radius slots are let go. OPEN, HELD and FAILED incidents can be
closed; one an execution works on (an OPEN one with a started execution, FENCED, ACTING,
VERIFYING) ends by itself, or the watchdog fails it.

``--unfence`` returns the node to service by the same path actuate's unfence takes: the
cluster's scheduler adapter, which for Slurm publishes a ``resume`` for this incident to the
cluster's agent. The agent lifts only Pitstop's own drain for this incident; a drain someone
else set stays (``left_drained``). What the agent answered is recorded on the incident
(``closure.unfence``); when it cannot be asked (no permission, no answer yet), the answer says
so and what to run by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from google.api_core import exceptions as gexc

from pitstop.adapters.errors import ActuatorError
from pitstop.core.aggregate import CloseByPerson, RecordUnfenceAnswer
from pitstop.core.domain import Incident, UnfenceAnswer
from pitstop.core.engine import subject_name
from pitstop.core.scheduling import JobReleaser, Scheduler, StepRef
from pitstop.core.states import State
from pitstop.core.store import IncidentStore
from pitstop.services.schedulers import NoScheduler


@dataclass
class Closing:
    """What ``--close`` did, for the operator: success, and lines to print."""

    ok: bool
    lines: list[str] = field(default_factory=list)


def _refusal(inc: Incident | None, iid: str) -> Closing:
    if inc is None:
        return Closing(False, [f"{iid}: no such incident"])
    state = inc["state"]
    if state == State.RESOLVED:
        return Closing(False, [f"{iid}: already RESOLVED"])
    execution = (inc.get("workflow") or {}).get("execution")
    return Closing(
        False,
        [
            f"{iid}: {state} with execution {execution} working on it; it ends by itself, or the "
            "sweep's watchdog fails it past its deadline (then close it)"
        ],
    )


def close_incident(
    store: IncidentStore,
    schedulers: Mapping[str, Scheduler],
    iid: str,
    by: str,
    now: float,
    unfence: bool,
) -> Closing:
    """Close an incident for a person and, if asked, ask its node's scheduler to take the node back."""
    out = store.decide(iid, CloseByPerson(by, unfence), None, now)
    inc = out.incident
    if out.result != "closed" or inc is None:
        return _refusal(store.get(iid), iid)
    done = Closing(True, [f"{iid}: closed by {by} (was {inc['closure']['from_state']})"])
    scheduler = schedulers.get(inc.get("cluster") or "", NoScheduler())
    done.lines += [f"{iid}: {line}" for line in release_jobs(inc, scheduler)]
    if unfence:
        answer = request_unfence(inc, scheduler)
        store.decide(iid, RecordUnfenceAnswer(answer), None, now)
        done.lines.append(f"{iid}: unfence {answer['outcome']}: {answer['detail']}")
    elif inc["closure"]["from_state"] == State.FAILED:
        done.lines.append(f"{iid}: {subject_name(inc)} stays fenced (use --unfence to return it)")
    return done


def release_jobs(inc: Incident, scheduler: Scheduler) -> list[str]:
    """What a failed step left of Pitstop's own job changes, undone (a Kueue Workload it deactivated
    is reactivated, a gang a hang's checks stopped is resumed, with or without ``--unfence``: the
    job may run elsewhere); else how to by hand."""
    jobs = [str(j["id"]) for j in inc.get("jobs") or [] if isinstance(j, Mapping) and j.get("id")]
    own = inc.get("job")  # a hung job's incident is on the job itself
    if isinstance(own, Mapping) and own.get("job") and str(own["job"]) not in jobs:
        jobs.append(str(own["job"]))
    if not jobs or not isinstance(scheduler, JobReleaser):
        return []
    try:
        return scheduler.release_jobs(jobs, StepRef(inc["id"], label="closed"))
    except ActuatorError as exc:
        return [f"jobs not released ({exc.message}); reactivate their Kueue Workloads by hand"]


def request_unfence(inc: Incident, scheduler: Scheduler) -> UnfenceAnswer:
    """Ask the scheduler to lift Pitstop's drain for this incident; what happened, for the record."""
    ref = inc.get("node")
    if ref is None:  # a job's episode: Pitstop fenced no node of its own for it
        return {"outcome": "not needed", "detail": f"{subject_name(inc)} has no node of its own to return"}
    node = ref["instance"]
    manual = f"resume {node} in its scheduler yourself (Slurm: scontrol update nodename=<node> state=resume)"
    if scheduler.name == NoScheduler.name:
        return {"outcome": "not needed", "detail": f"{node} is in no scheduler Pitstop fences"}
    try:
        answer = scheduler.unfence(node, StepRef(inc["id"], label="closed"))
    except ActuatorError as exc:
        if exc.retryable:
            return {"outcome": "sent", "detail": f"the agent has not answered yet ({exc.message})"}
        return {"outcome": "refused", "detail": f"{exc.message}; {manual}"}
    except (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError) as exc:
        return {"outcome": "not sent", "detail": f"{str(exc)[:200]}; {manual}"}
    if answer.left_fenced:
        why = answer.left_fenced
        return {
            "outcome": "left drained",
            "detail": f"drained by someone else ({why}), not by Pitstop",
        }
    return {"outcome": "done", "detail": f"{node} resumed"}
