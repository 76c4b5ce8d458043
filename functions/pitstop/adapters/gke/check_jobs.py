"""The bodies of a check's batch/v1 Jobs: the pod on the fenced node (the launcher, its tools in
order) and a validation's NCCL peer.

A part of the GKE checks by responsibility (check_runs.GkeChecks holds one): what each pod runs,
built from the cluster's CheckSettings alone; no API call is made here. checks.py's module
docstring says how a check pod is placed and read.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from pitstop.adapters.gke.checks import (
    CHECK_LABEL,
    CHECK_NODE_ANNOTATION,
    CHECK_NOTE_ANNOTATION,
    CHECK_PEER_ANNOTATION,
    CHECK_ROLE_LABEL,
    CHECK_SECURITY,
    HOSTNAME_LABEL,
    CheckSettings,
    check_script,
    fill_in,
    peer_name,
    sweep_start,
)
from pitstop.adapters.gke.objects import FENCE_KEY, GPU_RESOURCE
from pitstop.adapters.gke.shapes import Container, JobBody, PodSpec


class CheckJobs:
    """The Job bodies of one cluster's checks (``settings``: its namespace, service, images, tools)."""

    def __init__(self, settings: CheckSettings) -> None:
        self.settings = settings

    def launcher(self, kind: str, name: str, node: str, gpus: int, peer: str | None,
                  check: Mapping[str, object], note: str) -> JobBody:  # fmt: skip
        """The Job of the pod on the fenced node: the tools of ``kind``, pinned by ``spec.nodeName``."""
        cs, tools = self.settings, self.settings.tools
        level = str(check.get("dcgm_level"))
        dcgm = ("dcgm", (*tools["dcgmi"], "diag", "-r", level, "-j"))
        # a validation counts the node's GPUs first: GPUs missing are a finding the NCCL test cannot make
        first = [("nvidia_smi_q", (*tools["nvidia-smi"], "-q"))] if kind == "validate" else []
        if kind == "sweep":  # the node check a hang's localisation asks of every node, bounded in time
            limit = ("timeout", str(check.get("timeout_s", 60)))
            smi = [("nvidia_smi_q", (*limit, *tools["nvidia-smi"], "-q"))]
            spec: PodSpec = {"containers": [self.container("sweep", cs.image, check_script("", smi), gpus)]}
        elif kind == "diagnose":
            steps = [
                ("nvidia_smi_q", (*tools["nvidia-smi"], "-q")),
                ("nvlink", (*tools["nvidia-smi"], "nvlink", "--status")),
                dcgm,
            ]
            spec = {
                "containers": [self.container("diagnose", cs.image, check_script(cs.dcgm_setup, steps), gpus)]
            }
        elif peer is None:
            script = check_script(cs.dcgm_setup, [*first, dcgm])
            spec = {"containers": [self.container("dcgm", cs.image, script, gpus)]}
        else:
            size = check.get("message_bytes")
            size = size if isinstance(size, int) else 0  # check_args checked it
            me, other = self.fqdn(name), self.fqdn(peer_name(name))
            values = {"{ranks}": str(2 * gpus), "{hosts}": f"{me}:{gpus},{other}:{gpus}", "{gpus}": str(gpus)}
            mpirun = [fill_in(w, values) for w in cs.mpirun]
            sweep = ("-b", str(sweep_start(size)), "-e", str(size), "-f", "2", "-g", "1")
            nccl = ("nccl", (*mpirun, *tools["all_gather_perf"], *sweep))
            setup = "\n".join(
                s for s in (cs.nccl_setup, fill_in(cs.peer_wait, {"{peer}": shlex.quote(other)})) if s.strip()
            )
            spec = {
                "initContainers": [
                    self.container("dcgm", cs.image, check_script(cs.dcgm_setup, [*first, dcgm]), gpus)
                ],
                "containers": [self.container("nccl", cs.nccl_image, check_script(setup, [nccl]), gpus)],
            }
            if kind in ("link", "revalidate"):  # NCCL only: DCGM ran already (sweep, validate)
                del spec["initContainers"]
            # the pair's other node, for the record (the local all_gather_perf stand-in reads it)
            spec["containers"][0]["env"].append({"name": "PITSTOP_PEER_NODE", "value": peer})
        spec["nodeName"] = node
        ann = {CHECK_PEER_ANNOTATION: peer or "", CHECK_NOTE_ANNOTATION: note[:1000]}
        return self.job(name, name, "node", node, spec, ann)

    def peer_job(self, job_name: str, check_name: str, peer: str, gpus: int) -> JobBody:
        """The NCCL peer: the nccl image's setup (its sshd), then idle until deleted or its deadline."""
        cs = self.settings
        script = "\n".join(s for s in (cs.nccl_setup, f"exec sleep {cs.deadline_s}") if s.strip())
        spec: PodSpec = {
            "nodeSelector": {HOSTNAME_LABEL: peer},
            "containers": [self.container("nccl", cs.nccl_image, script, gpus)],
        }
        return self.job(job_name, check_name, "peer", peer, spec)

    def job(self, name: str, check_name: str, role: str, node: str, pod_spec: PodSpec,
             annotations: Mapping[str, str] | None = None) -> JobBody:  # fmt: skip
        labels = {"app.kubernetes.io/managed-by": "pitstop", CHECK_LABEL: check_name, CHECK_ROLE_LABEL: role}
        pod_spec = {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": self.settings.service,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 10,
            "tolerations": [
                {"key": FENCE_KEY, "operator": "Exists", "effect": "NoSchedule"},
                {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            ],
            **pod_spec,
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": self.settings.namespace,
                "labels": labels,
                "annotations": {CHECK_NODE_ANNOTATION: node, **(annotations or {})},
            },
            "spec": {
                "backoffLimit": 0,
                "parallelism": 1,
                "completions": 1,
                "activeDeadlineSeconds": self.settings.deadline_s,
                "ttlSecondsAfterFinished": self.settings.ttl_s,
                "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
            },
        }

    def container(self, name: str, image: str, script: str, gpus: int) -> Container:
        c: Container = {
            "name": name,
            "image": image,
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64"}],
            "securityContext": CHECK_SECURITY.copy(),
        }
        if gpus > 0:
            c["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
        return c

    def fqdn(self, pod_hostname: str) -> str:
        return f"{pod_hostname}.{self.settings.service}.{self.settings.namespace}.svc.cluster.local"
