"""Where a moved JobSet runs again: in the topology domain its gang's choice named.

JobSet lets a pod template's ``nodeSelector`` change only while the JobSet is suspended or in the
update that suspends it ("Allow pod template to be mutated for suspended JobSets, or JobSets getting
suspended", kubernetes-sigs/jobset pkg/webhooks/jobset_webhook.go ValidateUpdate, there for Kueue),
and merges the template's nodeSelector into each child Job when it resumes it (pkg/controllers/
jobset_controller.go resumeJob, collections.MergeMaps). So a move Pitstop places is:

1. one update, guarded by the read's resourceVersion: ``spec.suspend`` set, the domain's labels
   (``cloud.google.com/gce-topology-block``, and ``-subblock`` when every named node shares one: on
   an NVL72 machine type that is its NVLink domain) added to every replicated Job's pod template, and
   the marks ``pitstop.dev/moved-for=<step key>`` and ``pitstop.dev/pinned=<selector>``;
2. once its pods have left their nodes (restart.WorkloadCycle.wait_gone, 503 while they have not),
   ``spec.suspend`` cleared (and ``pitstop.dev/moved-resumed=<step key>``: a suspend after it is not
   the move's, and closing the incident leaves it). Suspend and resume restart the gang once without touching
   ``status.restarts``; the mark with the JobSet running is what a retry finds: done. It is also
   what makes the resumed gang a new run (kinds.JobSetKind.info: its start names the move), so the
   gang is seen running again, and another member's incident finds it already moved.

The selector stays on the JobSet: a running JobSet's template cannot change, and a key removed while
it is suspended stays on its child Jobs (the merge). Its later restarts run in that domain, and
capacity.py counts only nodes its selector matches, so a later move stays in it too, as Kueue's
``podset-required-topology`` would. Not pinned (the caller restarts it as before): a JobSet Kueue
queues (Kueue owns its suspend and its templates; with TAS it replaces the node in its domain
itself), one its owner annotated ``pitstop.dev/pin: "off"``, one whose pods a PodDisruptionBudget
covers (a suspend deletes pods without the Eviction API), nodes with no one domain, a template
selecting another domain by its owner's choice, or nothing to add.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pitstop.adapters import log, retry
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.client import Kube, KubeApiError
from pitstop.adapters.gke.kinds import Stoppable
from pitstop.adapters.gke.objects import (
    CONFLICT_RETRIES,
    KUEUE_QUEUE_LABEL,
    MOVED_FOR,
    PINNED,
    JobRef,
    annotations_of,
    labels_of,
    live,
    meta_of,
    name_of,
    restarts_of,
    selector_matches,
    spec_of,
    sub,
    subs,
    text,
)
from pitstop.adapters.gke.restart import WorkloadCycle, pods_where
from pitstop.adapters.gke.shapes import KubeObject, RequeueAnswer, SuspendPatch
from pitstop.core import topology

RESUMED = "pitstop.dev/moved-resumed"  # JobSet annotation: the move whose resume was sent (done)
OPT_OUT = "pitstop.dev/pin"  # its owner's ``off``: never pinned
LEVELS = (topology.BLOCK_LABEL, topology.SUBBLOCK_LABEL)  # widest first


def domain(nodes: Sequence[KubeObject], names: Sequence[str]) -> dict[str, str]:
    """The narrowest topology domain holding every named node, as node labels (empty: none).

    A block alone when they span sub-blocks; no domain when any lacks a block label or is gone."""
    by_name = {str(name_of(n)): labels_of(n) for n in nodes}
    found: dict[str, str] = {}
    for label in LEVELS:
        values = {(by_name.get(n) or {}).get(label) for n in names}
        if len(values) != 1 or None in values or not names:
            break
        found[label] = str(values.pop())
    return found if topology.BLOCK_LABEL in found else {}


def selectors(js: KubeObject) -> list[dict[str, str]]:
    """Each replicated Job's pod template nodeSelector, in order."""
    out = []
    for rj in subs(spec_of(js), "replicatedJobs"):
        pod = spec_of(sub(spec_of(sub(rj, "template")), "template"))
        out.append({str(k): str(v) for k, v in sub(pod, "nodeSelector").items()})
    return out


def refusal(js: KubeObject, want: Mapping[str, str]) -> str | None:
    """Why this JobSet is not pinned to ``want`` (None: it may be). A topology key its template
    selects by its owner's choice is theirs; one Pitstop set before is rewritten only with every
    key it has (a key left out would stay on the child Jobs: the merge)."""
    mine = dict(p.partition("=")[::2] for p in (text(annotations_of(js), PINNED) or "").split(",") if p)
    for ns in selectors(js):
        for key in LEVELS:
            if key in ns and ns[key] != want.get(key) and mine.get(key) != ns[key]:
                return f"its template selects {key}={ns[key]} (its owner's)"
            if key in ns and key not in want:
                return f"its template already selects {key}={ns[key]}, narrower than the move"
    if all(all(ns.get(k) == v for k, v in want.items()) for ns in selectors(js)):
        return "its template already selects that domain"
    return None


def pinned_body(js: KubeObject, want: Mapping[str, str], key: str) -> SuspendPatch:
    """The one update: suspended, the selector added to every pod template, marked; guarded."""
    rjobs: list[KubeObject] = []
    for rj in subs(spec_of(js), "replicatedJobs"):
        new: dict[str, Any] = copy.deepcopy(dict(rj))
        pod = new.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod.setdefault("spec", {}).setdefault("nodeSelector", {}).update(want)
        rjobs.append(new)
    said = ",".join(f"{k}={v}" for k, v in want.items())
    return {
        "metadata": {
            "resourceVersion": text(meta_of(js), "resourceVersion"),
            "annotations": {MOVED_FOR: key, PINNED: said},
        },
        "spec": {"suspend": True, "replicatedJobs": rjobs},
    }


class GangPin:
    """Moves a plain JobSet's gang into a topology domain (module doc), once per step."""

    def __init__(self, kube: Kube, jobsets: Callable[[JobRef], Stoppable], cycle: WorkloadCycle) -> None:
        self.kube, self.jobsets, self.cycle = kube, jobsets, cycle

    def move(self, jr: JobRef, key: str, seen: int | None, names: Sequence[str]) -> RequeueAnswer | None:
        """Restart the gang once in the domain of ``names``; None: not pinned (module doc)."""
        target = self.jobsets(jr)
        js = target.read()
        if js is None:
            return None
        if annotations_of(js).get(MOVED_FOR) == key:
            return self._finish(jr, target, key)  # a retry: this step suspended it (or resumed it)
        why = self._skip(jr, target, js, seen)
        want = domain(self.kube.items("list nodes", self.kube.core.list_node), names) if why is None else {}
        why = why or (None if want else "the nodes share no block") or refusal(js, want)
        if why is not None:
            log.emit("INFO", "gke move not pinned", job=jr.id, why=why, ctx=key)
            return None
        self._suspend(jr, target, want, key)
        return self._finish(jr, target, key)

    def release(self, jr: JobRef, incident: str) -> str | None:
        """At the incident's close: resume a JobSet a failed step of it left suspended mid-move."""
        target = self.jobsets(jr)
        js = target.read()
        mark = (text(annotations_of(js), MOVED_FOR) or "") if js is not None else ""
        done = text(annotations_of(js), RESUMED) == mark if js is not None else True
        if js is None or not mark.startswith(f"{incident}-") or done or not spec_of(js).get("suspend"):
            return None  # resumed after the move: a suspend since is someone else's
        target.patch({"spec": {"suspend": False}})
        return f"{jr.id}: resumed (suspended for {mark}'s move)"

    def _skip(self, jr: JobRef, target: Stoppable, js: KubeObject, seen: int | None) -> str | None:
        if text(annotations_of(js), OPT_OUT) == "off":
            return f"its owner annotated {OPT_OUT}: off"
        if labels_of(js).get(KUEUE_QUEUE_LABEL) or self.kube.workload(jr.namespace, meta_of(js).get("uid")):
            return "Kueue places it"
        if spec_of(js).get("suspend"):
            return "it is suspended"
        if seen is not None and restarts_of(js) != seen:
            return "it restarted since the fault"
        return self._budget(jr, target)

    def _budget(self, jr: JobRef, target: Stoppable) -> str | None:
        """A suspend deletes pods without the Eviction API: a JobSet whose pods a PodDisruptionBudget
        covers is restarted through evictions instead, which honour it."""
        pods = self.kube.items(f"list pods of {target.what}", self.kube.core.list_namespaced_pod,
                               jr.namespace, label_selector=target.pods)  # fmt: skip
        pdbs = self.kube.items(
            f"list pdbs in {jr.namespace}",
            self.kube.policy.list_namespaced_pod_disruption_budget,
            jr.namespace,
        )
        for b in pdbs:
            if any(selector_matches(sub(spec_of(b), "selector"), labels_of(p)) for p in pods if live(p)):
                return f"PodDisruptionBudget {name_of(b)} covers its pods"
        return None

    def _suspend(self, jr: JobRef, target: Stoppable, want: Mapping[str, str], key: str) -> None:
        def attempt() -> None:
            js = target.read()
            if js is None:
                raise ActuatorError(404, f"{jr.id} no longer exists", False)
            if annotations_of(js).get(MOVED_FOR) == key:
                return
            try:
                target.patch(pinned_body(js, want, key))
            except KubeApiError as exc:
                if exc.status == 409:
                    raise retry.StaleReadError(exc.message) from exc  # changed since read: read again
                raise

        why = f"{jr.id} kept changing while Pitstop moved it"
        retry.call(attempt, retry.conflicts(CONFLICT_RETRIES, lambda _: ActuatorError(503, why, True)))

    def _finish(self, jr: JobRef, target: Stoppable, key: str) -> RequeueAnswer:
        """Resume what this step suspended once its pods are gone; a resumed one is done."""
        js = target.read()
        if js is None:
            return {"job": jr.id, "outcome": "jobset no longer exists"}
        said = text(annotations_of(js), PINNED) or ""
        out: RequeueAnswer = {"job": jr.id, "restarted": True, "pinned": said, "restarts": restarts_of(js)}
        if not spec_of(js).get("suspend"):
            return {**out, "outcome": f"restarted once on {said} (resumed already)"}

        def left() -> list[KubeObject]:
            pods = self.kube.items(f"list pods of {target.what}", self.kube.core.list_pod_for_all_namespaces,
                                   label_selector=target.pods)  # fmt: skip
            return [p for p in pods if live(p)]

        forced = self.cycle.wait_gone(left, f"waiting for the pods of {jr.id} to leave", _held(jr, key))
        target.patch({"metadata": {"annotations": {RESUMED: key}}, "spec": {"suspend": False}})
        log.emit("INFO", "gke gang moved and pinned", job=jr.id, pinned=said, ctx=key)
        out = {**out, "outcome": f"restarted once on {said}: suspended with that nodeSelector, resumed"}
        return {**out, "forced": forced} if forced else out


def _held(jr: JobRef, key: str) -> Callable[[list[KubeObject]], str]:
    def message(pods: list[KubeObject]) -> str:
        where = pods_where(pods)
        return (
            f"{jr.id}: pod {where} stuck Terminating on a Ready node (its kubelet cannot end it), so"
            f" it is not force-deleted; {jr.id} stays suspended for {key}; closing the incident resumes it"
        )

    return message
