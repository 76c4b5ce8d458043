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
from typing import Any

from google.api_core import exceptions as gexc

from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.firestore import IncidentStore
from pitstop.adapters.gke import CheckSettings, GkeScheduler, gke_api_client
from pitstop.adapters.scheduler import NoScheduler, ResultsMerger, Scheduler, SlurmScheduler
from pitstop.core.policy import Policy
from pitstop.core.states import State


def schedulers_for(
    policy: Policy,
    publisher: Any,
    project: str,
    results: Any,
    kube_endpoint: str | None = None,
    subscriber: Any = None,
) -> dict[str, Scheduler]:
    """The scheduler adapter of each cluster in the policy: a Slurm cluster's commands go over its
    Pub/Sub topic; a GKE cluster is reached through its control plane (``kube_endpoint``, the
    local stack's fake API server, stands in for every GKE cluster when set)."""
    out: dict[str, Scheduler] = {}
    for c in policy.clusters:
        if c.scheduler == "slurm":
            topic = (c.raw.get("slurm") or {}).get("command_topic") or f"pitstop-slurm-{c.name}"
            subscriber = subscriber or _subscriber()
            sub_path = slurm_results_subscription(subscriber, project, c.name)
            out[c.name] = SlurmScheduler(
                publisher,
                publisher.topic_path(project, topic),
                results,
                merger=ResultsMerger(subscriber, sub_path, results),
            )
        elif c.scheduler == "gke":
            out[c.name] = gke_scheduler(c.name, c.raw.get("gke") or {}, project, kube_endpoint)
    return out


def slurm_results_subscription(subscriber: Any, project: str, cluster: str) -> str:
    """Where actuate reads a Slurm cluster's results (deploy: infra/resources.yaml); the agent
    publishes them to ``pitstop-slurm-<cluster>-results`` and holds no Firestore access."""
    path: str = subscriber.subscription_path(project, f"pitstop-slurm-{cluster}-results-actuate")
    return path


def _subscriber() -> Any:
    """A Pub/Sub subscriber, created only when a Slurm cluster needs one (the CLI passes none)."""
    from google.cloud.pubsub_v1 import SubscriberClient

    return SubscriberClient()


def gke_scheduler(
    name: str, conf: Mapping[str, Any], project: str, kube_endpoint: str | None
) -> GkeScheduler:
    """A GKE cluster's adapter, connected on first use (a cold start never waits on the cluster).

    In production the control plane comes from ``container.clusters.get`` for the policy's
    ``gke: {location, cluster?, project?}``, called as the function's own identity.
    """
    deadline = float(conf.get("evict_deadline_s") or 120.0)
    checks = CheckSettings.from_conf(conf)
    if kube_endpoint:
        return GkeScheduler(local_api_client(kube_endpoint), evict_deadline_s=deadline, checks=checks)
    proj, cluster = str(conf.get("project") or project), str(conf.get("cluster") or name)
    location = conf.get("location")

    def connect() -> Any:
        if not isinstance(location, str):
            raise ActuatorError(409, f"cluster {name} has no gke.location in the policy", False)
        import google.auth

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        return gke_api_client(proj, location, cluster, credentials)

    return GkeScheduler(connect=connect, evict_deadline_s=deadline, checks=checks)


def local_api_client(endpoint: str) -> Any:
    """A Kubernetes client for an unauthenticated loopback API server (the local stack's fake)."""
    from kubernetes import client as k8s

    cfg: Any = k8s.Configuration()
    cfg.host = endpoint.rstrip("/")
    return k8s.ApiClient(cfg)


@dataclass
class Closing:
    """What ``--close`` did, for the operator: success, and lines to print."""

    ok: bool
    lines: list[str] = field(default_factory=list)


def _refusal(inc: Mapping[str, Any] | None, iid: str) -> Closing:
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
    out = store.close(iid, by, now, unfence)
    inc = out.incident
    if out.result != "closed" or inc is None:
        return _refusal(store.get(iid), iid)
    done = Closing(True, [f"{iid}: closed by {by} (was {inc['closure']['from_state']})"])
    if unfence:
        answer = request_unfence(inc, schedulers.get(inc.get("cluster") or "", NoScheduler()))
        store.mutate(iid, lambda d: d["closure"].update(unfence=answer))
        done.lines.append(f"{iid}: unfence {answer['outcome']}: {answer['detail']}")
    elif inc["closure"]["from_state"] == State.FAILED:
        done.lines.append(f"{iid}: {inc['node']['instance']} stays fenced (use --unfence to return it)")
    return done


def request_unfence(inc: Mapping[str, Any], scheduler: Scheduler) -> dict[str, Any]:
    """Ask the scheduler to lift Pitstop's drain for this incident; what happened, for the record."""
    node = inc["node"]["instance"]
    manual = f"resume {node} in its scheduler yourself (Slurm: scontrol update nodename=<node> state=resume)"
    if isinstance(scheduler, NoScheduler):
        return {"outcome": "not needed", "detail": f"{node} is in no scheduler Pitstop fences"}
    try:
        answer = scheduler.unfence(node, f"{inc['id']}-closed", inc["id"]) or {}
    except ActuatorError as exc:
        if exc.retryable:
            return {"outcome": "sent", "detail": f"the agent has not answered yet ({exc.message})"}
        return {"outcome": "refused", "detail": f"{exc.message}; {manual}"}
    except (gexc.GoogleAPICallError, gexc.RetryError, TimeoutError) as exc:
        return {"outcome": "not sent", "detail": f"{str(exc)[:200]}; {manual}"}
    if answer.get("left_drained"):
        why = str(answer["left_drained"])[:200]
        return {
            "outcome": "left drained",
            "detail": f"drained by someone else ({why}), not by Pitstop",
        }
    return {"outcome": "done", "detail": f"{node} resumed"}
