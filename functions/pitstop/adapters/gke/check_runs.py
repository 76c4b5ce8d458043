"""Checks on a fenced GKE node (diagnose, validate, revalidate, and a gang's sweep and link):
start once per name, and read the result from the pods' logs.

How the checks are divided, by responsibility, each part held (composed) and handed what it needs:
checks.py (the settings, the arguments, the script every pod runs and how its log is cut),
check_jobs.CheckJobs (the Job bodies, no API), check_peers.CheckPeers (a validation's peer:
chosen, created, deleted) and :class:`GkeChecks` here (whether a check may start on the node now,
its Job created once, its outcome read back). checks.py's module docstring says how a check runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import urllib3
from kubernetes.client.exceptions import ApiException

from pitstop.adapters import log
from pitstop.adapters.errors import ActuatorError
from pitstop.adapters.gke.check_jobs import CheckJobs
from pitstop.adapters.gke.check_peers import CheckPeers
from pitstop.adapters.gke.checks import (
    CHECK_LABEL,
    CHECK_NODE_ANNOTATION,
    CHECK_NOTE_ANNOTATION,
    CHECK_PEER_ANNOTATION,
    CHECK_ROLE_LABEL,
    JOB_NAME_LABEL,
    LOG_LIMIT_BYTES,
    CheckSettings,
    _names,
    _needs_peer,
    check_args,
    check_job,
    pod_failure,
    split_outputs,
)
from pitstop.adapters.gke.client import Kube, KubeApiError, status_body
from pitstop.adapters.gke.objects import (
    EMPTY,
    allocatable_gpus,
    annotations_of,
    condition_true,
    labels_of,
    live,
    meta_of,
    name_of,
    pod_gpus,
    spec_of,
    status_of,
    sub,
    subs,
    text,
    valid_object_name,
)
from pitstop.adapters.gke.shapes import CheckReport, CheckStarted, KubeObject


class GkeChecks:
    """The check Jobs of one cluster."""

    def __init__(self, kube: Kube, settings: CheckSettings) -> None:
        self.kube, self.settings = kube, settings
        self.jobs = CheckJobs(settings)
        self.peers = CheckPeers(kube, settings, self.jobs)

    def start(self, node: str, check: Mapping[str, object], key: str) -> CheckStarted:
        """Start a diagnose or validate run on the fenced node, once per ``check["name"]``.

        A retry finds the Job it (or an earlier attempt) created (409 AlreadyExists) and answers as
        the first call did. A 503 (retryable) while pods that hold GPUs are still on the node: the
        kubelet would refuse the check's pod, and a diagnostic must see every GPU.
        """
        kind, name, gpus = check_args(check)
        if not valid_object_name(node):
            raise ActuatorError(400, f"not a valid node name: {str(node)[:100]!r}", False)
        ns = self.settings.namespace
        existing = check_job(self.kube, self.settings.namespace, name)
        if existing is not None:
            return self._started_answer(existing, node, name)
        cur = self.kube.node_or_none(node)
        if cur is None:
            raise ActuatorError(503, f"node {node} does not exist (yet): cannot run {kind} on it", True)
        holders = [
            f"{meta_of(p).get('namespace')}/{meta_of(p).get('name')}"
            for p in self.kube.pods_on(node)
            if live(p) and pod_gpus(spec_of(p)) > 0 and labels_of(p).get(CHECK_LABEL) != name
            and not str(labels_of(p).get(CHECK_LABEL)).startswith(f"{check.get('group') or name}-")
        ]  # fmt: skip
        if holders:
            raise ActuatorError(
                503, f"{kind} on {node} waits for pods still holding GPUs: {holders[:5]}", True
            )
        have = allocatable_gpus(cur)
        use = min(gpus, have) if gpus > 0 else have
        notes = [] if use >= gpus else [f"{node} offers {have} of {gpus} GPUs: the check gets {use}"]
        peer: str | None = None
        if _needs_peer(kind, check):
            pinned = check.get("peer_node") if kind == "link" else None  # a ring pair's other end
            skip = frozenset(_names(check.get("exclude_peers")))  # peers measured already
            peer, why = self.peers.ensure(node, cur, name, gpus, str(pinned) if pinned else None, skip)
            if why:
                notes.append(why)
        note = "; ".join(notes)
        body = self.jobs.launcher(kind, name, node, use, peer, check, note)
        try:
            self.kube.call(f"create job {ns}/{name}", self.kube.batch.create_namespaced_job, ns, body)
        except KubeApiError as exc:
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            found = check_job(self.kube, self.settings.namespace, name)
            if found is None:
                raise ActuatorError(503, f"check job {ns}/{name} exists and is gone again", True) from exc
            return self._started_answer(found, node, name)
        log.emit("INFO", "gke check started", check=name, node=node, kind=kind, peer=peer, note=note, ctx=key)
        return {"started": name, "peer": peer, "note": note}

    def result(self, node: str, check: Mapping[str, object]) -> CheckReport:
        """The run's state; once its pod has ended, each tool's output read from the pod's log.

        ``outputs`` holds stdout per tool, ``stderr`` and ``exit_codes`` what the script recorded
        beside it; ``error`` says why the pod did not succeed (e.g. the kubelet refused it). The
        peer's Job is deleted once the run is done (best effort); the check's own Job is left to
        Kubernetes' TTL (``ttl_s``), so a retry reads the same logs again.
        """
        _, name, _ = check_args(check)
        ns = self.settings.namespace
        job = check_job(self.kube, self.settings.namespace, name)
        if job is None:
            raise ActuatorError(409, f"no check {ns}/{name}: never started, or removed after its ttl", False)
        if annotations_of(job).get(CHECK_NODE_ANNOTATION) != node:
            raise ActuatorError(
                409,
                f"check {name} runs on {annotations_of(job).get(CHECK_NODE_ANNOTATION)}, not {node}",
                False,
            )
        peer = text(annotations_of(job), CHECK_PEER_ANNOTATION) or None
        pods = self.kube.items(
            f"list pods of check {name}",
            self.kube.core.list_namespaced_pod,
            ns,
            label_selector=f"{JOB_NAME_LABEL}={name}",
        )
        pods.sort(key=lambda p: str(meta_of(p).get("creationTimestamp") or ""))
        pod = next((p for p in reversed(pods) if not live(p)), None)
        job_done = condition_true(job, "Complete") or condition_true(job, "Failed")
        base: CheckReport = {"done": False, "outputs": {}, "peer": peer, "error": None}
        if pod is None and not job_done:
            phase = text(status_of(pods[-1]), "phase") if pods else "no pod yet"
            return {**base, "state": phase}
        outputs: dict[str, str] = {}
        stderr: dict[str, str] = {}
        codes: dict[str, int] = {}
        errors: list[str] = []
        if pod is not None:
            for container in self._started_containers(pod):
                out, err, rc = split_outputs(self._pod_log(str(name_of(pod)), container, errors))
                outputs.update(out)
                stderr.update(err)
                codes.update(rc)
            if status_of(pod).get("phase") != "Succeeded":
                errors.insert(0, pod_failure(pod))
        else:
            conds = subs(status_of(job), "conditions")
            failed = next((c for c in conds if c.get("type") == "Failed"), EMPTY)
            errors.insert(
                0, f"check job {name} failed without a pod: {failed.get('reason')} {failed.get('message')}"
            )
        if peer is not None:
            self.peers.delete(name)
        return {
            **base,
            "done": True,
            "outputs": outputs,
            "stderr": stderr,
            "exit_codes": codes,
            "error": "; ".join(errors) or None,
            "state": text(status_of(pod), "phase") if pod is not None else "Failed",
        }

    def _started_answer(self, job: KubeObject, node: str, name: str) -> CheckStarted:
        """What start_check answered the first time, read back from the Job it created."""
        ann = annotations_of(job)
        if ann.get(CHECK_NODE_ANNOTATION) != node or labels_of(job).get(CHECK_ROLE_LABEL) != "node":
            raise ActuatorError(
                409, f"check {name} already exists for node {ann.get(CHECK_NODE_ANNOTATION)}", False
            )
        return {
            "started": name,
            "peer": text(ann, CHECK_PEER_ANNOTATION) or None,
            "note": text(ann, CHECK_NOTE_ANNOTATION) or "",
        }

    def _started_containers(self, pod: KubeObject) -> list[str]:
        """The containers of an ended pod that ran (init containers first), in spec order."""
        st = status_of(pod)
        ran = {
            str(c.get("name"))
            for key in ("initContainerStatuses", "containerStatuses")
            for c in subs(st, key)
            if "terminated" in sub(c, "state")
        }
        spec = spec_of(pod)
        names = [str(c.get("name")) for key in ("initContainers", "containers") for c in subs(spec, key)]
        return [n for n in names if n in ran]

    def _pod_log(self, pod: str, container: str, errors: list[str]) -> str:
        """A container's log as text. Raw bytes (``_preload_content=False``): the client would parse
        a log that is JSON and hand back a Python repr (kubernetes-client/python#811, #1354)."""
        ns = self.settings.namespace
        try:
            resp = self.kube.core.read_namespaced_pod_log(
                pod,
                ns,
                container=container,
                limit_bytes=LOG_LIMIT_BYTES,
                _preload_content=False,
                _request_timeout=self.kube.timeout,
            )
        except ApiException as exc:
            errors.append(
                f"log of {pod}/{container}: {exc.status} {status_body(exc.body).get('message', '')}"[:300]
            )
            return ""
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ActuatorError(
                503, f"log of {ns}/{pod}: Kubernetes API unreachable ({str(exc)[:200]})", True
            ) from exc
        data = resp.data or b""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
