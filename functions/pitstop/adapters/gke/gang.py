"""A hung gang's stop-time checks: stop it, wait until its pods are gone, check every node at once,
then start it again once (ByteRobust's stop-time diagnostics: the job is hung anyway).

Why stop first: the hung pods hold every GPU of their nodes, and the kubelet admits a check pod
only against free GPUs, so a check beside a running gang cannot see its GPUs (reference/gke.md §2).

- **stop**: the job's own ``spec.suspend`` (JobSet, batch Job: kinds.Stoppable), or, for a job
  Kueue admits, its Workload deactivated as the restart path does (Kueue then suspends it). The
  job is annotated ``pitstop.dev/stopped-for=<step key>`` with the nodes its pods ran on in the
  same patch (guarded by resourceVersion), so a retry finds them after the pods are gone.
- **wait**: until no pod of the job is left on a node, bounded (restart.WorkloadCycle.wait_gone,
  with its stuck-Terminating handling: forced on a node that is not Ready, refused on a Ready one).
- **check**: one ``sweep`` Job per node (checks.py), pinned by ``spec.nodeName`` and holding all of
  the node's GPUs: ``nvidia-smi -q`` under ``timeout``; the node's Xid conditions are read beside it.
  Nothing found: one ``link`` Job per ring pair, all at once, its NCCL peer on the pair's other node.
  Each node is in two pairs (its launcher and its neighbour's peer), so each pod takes half of the
  node's GPUs: the pairs are compared with each other, all measured alike.
- **resume**: ``suspend`` cleared / the Workload reactivated, once, and the annotation removed. A
  step that fails in between leaves the mark; closing the incident resumes it (:meth:`release`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pitstop.adapters import log, retry
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.check_runs import GkeChecks
from pitstop.adapters.gke.client import Kube, KubeApiError
from pitstop.adapters.gke.kinds import JobKind, Stoppable
from pitstop.adapters.gke.objects import (
    CONFLICT_RETRIES,
    JobRef,
    allocatable_gpus,
    annotations_of,
    live,
    meta_of,
    node_name_of,
    parse_job_id,
    spec_of,
    text,
    valid_object_name,
)
from pitstop.adapters.gke.restart import WorkloadCycle, pods_where
from pitstop.adapters.gke.shapes import CheckReport, GangResumed, GangStarted, KubeObject, SuspendPatch

STOPPED_FOR = "pitstop.dev/stopped-for"  # job annotation: the step key of Pitstop's stop
STOPPED_NODES = "pitstop.dev/stopped-nodes"  # job annotation: where its pods ran when stopped
SWEEP, LINKS = "sweep", "links"
MAX_NODES = 512


def node_check(check: Mapping[str, object], index: int) -> dict[str, object]:
    """The check of one node (or ring pair) of the gang: the gang check's name with its index."""
    kind = SWEEP if check.get("kind") == SWEEP else "link"
    return {**check, "kind": kind, "name": f"{check.get('name')}-{index}", "group": check.get("name")}


def pairs_of(check: Mapping[str, object]) -> list[tuple[str, str]]:
    """The ring pairs a links check names (``a+b``), both ends valid node names."""
    out = []
    given = check.get("pairs")
    for p in given if isinstance(given, list) else []:
        a, _, b = str(p).partition("+")
        if valid_object_name(a) and valid_object_name(b):
            out.append((a, b))
    return out


class GangStop:
    """Stop-time checks of one cluster's hung gangs (the GKE side of core/scheduling.GangChecks)."""

    def __init__(
        self,
        kube: Kube,
        kinds: Mapping[str, JobKind],
        cycle: WorkloadCycle,
        checks: GkeChecks,
        node_status: Callable[[str], str],
    ) -> None:
        self.kube, self.kinds, self.cycle, self.checks = kube, kinds, cycle, checks
        self.node_status = node_status

    def start(self, job: str, check: Mapping[str, object], key: str) -> GangStarted:
        """Stop the gang, wait until its pods are gone, start the check on every node it ran on.

        Answers 503 while pods are still on the nodes (the workflow asks again; the stop is not
        repeated). No nodes in the answer: nothing was stopped or checked, ``note`` says why.
        """
        jr = parse_job_id(job)
        name = str(check.get("name"))
        if check.get("kind") == LINKS:
            return self._links(jr, check, key)
        if check.get("kind") != SWEEP:
            raise ActuatorError(
                400, f"a gang check is a sweep or links, not {str(check.get('kind'))[:40]!r}", False
            )
        target = self.kinds[jr.kind].stoppable(jr)
        if target is None:
            why = f"{jr.id} is a bare pod: nothing would create it again after a stop"
            return {"started": name, "nodes": [], "stopped": False, "note": why}
        nodes, why = self._stop(jr, target, key)
        if not nodes:
            return {"started": name, "nodes": [], "stopped": False, "note": why}
        forced = self.cycle.wait_gone(
            lambda: self._left(target),
            f"waiting for the pods of {jr.id} to leave its nodes",
            lambda held: _held(jr, held, key),
        )
        for i, node in enumerate(nodes):
            self.checks.start(node, node_check(check, i), key)
        log.emit("INFO", "gke gang stopped and checked", job=jr.id, nodes=len(nodes), forced=forced, ctx=key)
        return {"started": name, "nodes": nodes, "stopped": True, "forced": forced}

    def _links(self, jr: JobRef, check: Mapping[str, object], key: str) -> GangStarted:
        """The ring pairs' NCCL test, all at once, on the gang this step stopped (half the GPUs each)."""
        name, pairs = str(check.get("name")), pairs_of(check)
        target = self.kinds[jr.kind].stoppable(jr)
        obj = target.read() if target is not None else None
        if obj is None or annotations_of(obj).get(STOPPED_FOR) != key:
            return {
                "started": name,
                "nodes": [],
                "stopped": False,
                "note": f"{jr.id} is not stopped for {key}",
            }
        nodes = sorted({n for p in pairs for n in p})
        half = min((allocatable_gpus(self.kube.node(n)) for n in nodes), default=0) // 2
        for i, (a, b) in enumerate(pairs):
            self.checks.start(a, {**node_check(check, i), "peer_node": b, "gpus": max(half, 1)}, key)
        log.emit("INFO", "gke ring pairs started", job=jr.id, pairs=len(pairs), gpus=half, ctx=key)
        return {"started": name, "nodes": nodes, "stopped": True}

    def _stop(self, jr: JobRef, target: Stoppable, key: str) -> tuple[list[str], str]:
        """Suspend it (or deactivate its Workload) with the mark and its nodes; (nodes, why none).
        The patch is guarded by the read's resourceVersion: a 409 reads again (retry.conflicts)."""

        def attempt() -> tuple[list[str], str]:
            obj = target.read()
            if obj is None:
                return [], f"{jr.id} no longer exists"
            ann = annotations_of(obj)
            wl = self.kube.workload(jr.namespace, meta_of(obj).get("uid"))
            if ann.get(STOPPED_FOR) == key:  # an earlier attempt stopped it: make sure, then go on
                nodes = [n for n in (text(ann, STOPPED_NODES) or "").split(",") if valid_object_name(n)]
                why = self.cycle.deactivate(jr, wl, key) if wl is not None else None
                return (nodes, "") if why is None else ([], why)
            if wl is None and spec_of(obj).get("suspend"):
                return [], f"{jr.id} is suspended (not by Pitstop): left alone"
            nodes = self._nodes(target)
            if not nodes:
                return [], f"{jr.id} has no pod on a node: nothing to check"
            if len(nodes) > MAX_NODES:
                return [], f"{jr.id} runs on {len(nodes)} nodes (more than {MAX_NODES}): not stopped"
            body: SuspendPatch = {
                "metadata": {
                    "resourceVersion": text(meta_of(obj), "resourceVersion"),
                    "annotations": {STOPPED_FOR: key, STOPPED_NODES: ",".join(nodes)},
                }
            }
            if wl is None:
                body["spec"] = {"suspend": True}
            try:
                target.patch(body)
            except KubeApiError as exc:
                if exc.status == 409:
                    raise retry.StaleReadError(exc.message) from exc  # changed since read: read again
                raise
            why = self.cycle.deactivate(jr, wl, key) if wl is not None else None
            return (nodes, "") if why is None else ([], why)

        why = f"{jr.id} kept changing while Pitstop stopped it"
        return retry.call(attempt, retry.conflicts(CONFLICT_RETRIES, lambda _: ActuatorError(503, why, True)))

    def _nodes(self, target: Stoppable) -> list[str]:
        pods = self.kube.items(f"list pods of {target.what}", self.kube.core.list_pod_for_all_namespaces,
                               label_selector=target.pods)  # fmt: skip
        found = {node_name_of(p) for p in pods if live(p)}
        return sorted(n for n in found if n is not None and valid_object_name(n))

    def _left(self, target: Stoppable) -> list[KubeObject] | None:
        """Its pods still on a node once it is suspended; None before (Kueue suspends it a moment later)."""
        obj = target.read()
        if obj is not None and not spec_of(obj).get("suspend"):
            return None
        pods = self.kube.items(f"list pods of {target.what}", self.kube.core.list_pod_for_all_namespaces,
                               label_selector=target.pods)  # fmt: skip
        return [p for p in pods if live(p)]

    def result(self, job: str, check: Mapping[str, object]) -> CheckReport:
        """Every node's check, its tools' outputs keyed ``tool@node`` (core/localise.py reads them),
        with each node's Xid conditions as ``node_condition@node``; done once every node's is."""
        links = check.get("kind") == LINKS
        units = (
            [(a, f"{a}+{b}") for a, b in pairs_of(check)]
            if links
            else [(n, n) for n in _strings(check.get("nodes")) if valid_object_name(n)]
        )
        outputs: dict[str, str] = {}
        codes: dict[str, int] = {}
        errors: list[str] = []
        done = True
        for i, (node, where) in enumerate(units):
            try:
                res = self.checks.result(node, node_check(check, i))
            except ActuatorError as exc:
                if exc.retryable:
                    raise
                errors.append(f"{node}: {exc.message}"[:300])
                continue
            done = done and bool(res.get("done"))
            outputs.update({f"{k}@{where}": v for k, v in (res.get("outputs") or {}).items()})
            codes.update({f"{k}@{where}": v for k, v in (res.get("exit_codes") or {}).items()})
            if res.get("error"):
                errors.append(f"{where}: {res['error']}"[:300])
            if res.get("done") and not links:
                outputs[f"node_condition@{node}"] = self.node_status(node)
        return {"done": done, "outputs": outputs, "exit_codes": codes, "error": "; ".join(errors[:8]) or None}

    def resume(self, job: str, key: str) -> GangResumed:
        """Start the gang again once: what this step stopped (a retry, or someone's resume, finds it done)."""
        jr = parse_job_id(job)
        target = self.kinds[jr.kind].stoppable(jr)
        obj = target.read() if target is not None else None
        if target is None or obj is None:
            return {"job": jr.id, "outcome": "no longer exists: nothing to resume", "resumed": False}
        if annotations_of(obj).get(STOPPED_FOR) != key:  # a retry after the resume, or someone's resume
            going = not spec_of(obj).get("suspend")
            why = "not stopped for this step: " + (
                "it runs (resumed already)" if going else "suspended by someone"
            )
            return {"job": jr.id, "outcome": why, "resumed": going}
        self._restart(jr, target, obj, key)
        log.emit("INFO", "gke gang resumed after its checks", job=jr.id, ctx=key)
        return {"job": jr.id, "outcome": "resumed: its pods are created again", "resumed": True}

    def release(self, job: str, incident: str) -> str | None:
        """At the incident's close: resume a gang a failed step of this incident left stopped."""
        jr = parse_job_id(job)
        target = self.kinds[jr.kind].stoppable(jr)
        obj = target.read() if target is not None else None
        mark = (text(annotations_of(obj), STOPPED_FOR) or "") if obj is not None else ""
        if target is None or obj is None or not mark.startswith(f"{incident}-"):
            return None
        self._restart(jr, target, obj, mark)
        return f"{jr.id}: resumed (stopped for {mark}'s checks)"

    def _restart(self, jr: JobRef, target: Stoppable, obj: KubeObject, key: str) -> None:
        """The Workload reactivated first, the mark removed last: a retry in between finds the mark."""
        wl = self.kube.workload(jr.namespace, meta_of(obj).get("uid"))
        if wl is not None:
            self.cycle.activate(jr, wl, key)
        body: SuspendPatch = {"metadata": {"annotations": {STOPPED_FOR: None, STOPPED_NODES: None}}}
        if wl is None:
            body["spec"] = {"suspend": False}
        target.patch(body)


def _strings(v: object) -> list[str]:
    return [str(n) for n in v] if isinstance(v, list) else []


def _held(jr: JobRef, pods: list[KubeObject], key: str) -> str:
    where = pods_where(pods)
    return (
        f"{jr.id}: pod {where} stuck Terminating past its grace period on a Ready node (its kubelet"
        f" cannot end it), so it is not force-deleted and its node cannot be checked. {jr.id} stays"
        f" stopped for {key}; closing the incident resumes it"
    )
