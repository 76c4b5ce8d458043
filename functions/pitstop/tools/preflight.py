"""`pitstop deploy`'s pre-flight: deploy.yaml and the policy it names, checked together.

Each file is schema-checked on its own when it loads (deploy.load_config, core.policy.load); what
neither can see alone is checked here, before anything is created:

- **enforce needs a Compute scope.** ``mode: enforce`` with no ``compute_zones`` and no
  ``gke_clusters`` is an error, not a warning: actuate would get no Compute Engine role at all, so
  its first call on every incident (the claim reads the VM) is refused, every incident fails and
  pages, and the deploy still exits 0. A warning in a long deploy log is easy to miss; enforce that
  cannot act is not enforce.
- **The clusters agree.** A policy cluster with ``scheduler: slurm`` needs its command and results
  topics (deploy.yaml ``slurm_clusters``), a ``scheduler: gke`` one its RBAC and IAM (deploy.yaml
  ``gke_clusters``), and a cluster deploy.yaml names but no policy cluster schedules gets topics or
  grants nothing uses while its faults go unrouted. Either way is an error naming the entry to add.
- **The webhook secret holds a version** (a real deploy only, read through gcloud): without one
  notify cannot post a page. A warning: the deploy can go on and the version be added after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pitstop.core import policy as policy_mod
from pitstop.core.policy import Policy
from pitstop.tools import deploy

WEBHOOK_SECRET = "pitstop-webhook"  # noqa: S105 - the secret's name (infra/resources.yaml)


@dataclass(frozen=True)
class Finding:
    level: Literal["error", "warning"]
    text: str

    def line(self) -> str:
        return f"{self.level}: {self.text}"


def check(conf: Mapping[str, object], project: str) -> list[Finding]:
    """The configuration checks (no gcloud): errors stop a deploy, warnings are printed."""
    path = deploy.policy_path(conf)  # deploy ships this file, never $PITSTOP_POLICY
    try:
        pol = policy_mod.load(path) if path else policy_mod.from_doc(None)
    except (OSError, ValueError) as exc:
        return [Finding("error", f"policy: {exc}")]
    return enforce_scope(conf, pol, project) + slurm_agreement(conf, pol) + gke_agreement(conf, pol, project)


def enforce_scope(conf: Mapping[str, object], pol: Policy, project: str) -> list[Finding]:
    """``mode: enforce`` with nowhere actuate may act. A GKE cluster whose node groups are not read
    yet counts (no gcloud here: deploy reads them before it plans, and stops when it cannot)."""
    if pol.doc.get("mode") != "enforce" or deploy.compute_scope(conf, project, groups_known=False):
        return []
    if any(c["node_groups"] is None for c in deploy.gke_clusters(conf, project)):
        return []
    return [
        Finding(
            "error",
            "the policy's mode is enforce, but deploy.yaml names no compute_zones and no gke_clusters: "
            "actuate would get no Compute Engine role and every remediation would fail. Add the zones "
            "(or regions) of your GPU VMs, e.g. `compute_zones: [us-central1-a]`, or deploy in "
            "`mode: observe` first",
        )
    ]


def slurm_agreement(conf: Mapping[str, object], pol: Policy) -> list[Finding]:
    """deploy.yaml's slurm_clusters and the policy's scheduler: slurm clusters, name for name."""
    deployed = set(deploy.slurm_clusters(conf))
    scheduled = {c.name for c in pol.clusters if c.scheduler == "slurm"}
    out = [
        Finding(
            "error",
            f"policy cluster {name!r} has scheduler slurm but deploy.yaml's slurm_clusters does not "
            f"name it: its agent would have no command or results topic. Add {name} to slurm_clusters",
        )
        for name in sorted(scheduled - deployed)
    ]
    out += [
        Finding(
            "error",
            f"slurm_clusters names {name!r}, but no policy cluster of that name has scheduler slurm: "
            f"its nodes' faults would never reach its agent. Add to the policy's clusters: "
            f"{{name: {name}, scheduler: slurm, match: {{name_pattern: '{name}-*'}}}} (your nodes' pattern)",
        )
        for name in sorted(deployed - scheduled)
    ]
    return out


def gke_agreement(conf: Mapping[str, object], pol: Policy, project: str) -> list[Finding]:
    """deploy.yaml's gke_clusters and the policy's scheduler: gke clusters, by (name, location, project)."""
    deployed = {(c["name"], c["location"], c["project"]) for c in deploy.gke_clusters(conf, project)}
    scheduled: dict[tuple[str, str, str], str] = {}
    out: list[Finding] = []
    for c in (c for c in pol.clusters if c.scheduler == "gke"):
        gke = c.raw["gke"]  # the policy schema requires it, with its location, on a gke cluster
        key = (str(gke.get("cluster") or c.name), str(gke["location"]), str(gke.get("project") or project))
        scheduled[key] = c.name
    for key in sorted(set(scheduled) - deployed):
        name, location, proj = key
        out.append(
            Finding(
                "error",
                f"policy cluster {scheduled[key]!r} is GKE cluster {name} in {location} (project {proj}), "
                f"which deploy.yaml's gke_clusters does not name: actuate would have no RBAC or IAM there. "
                f"Add {{name: {name}, location: {location}, project: {proj}}} to gke_clusters",
            )
        )
    for name, location, proj in sorted(deployed - set(scheduled)):
        out.append(
            Finding(
                "error",
                f"gke_clusters names {name} in {location} (project {proj}), but no policy cluster with "
                f"scheduler gke is that cluster. Add to the policy's clusters: {{name: {name}, "
                f"scheduler: gke, match: {{gke_cluster: {name}}}, gke: {{location: {location}}}}}",
            )
        )
    return out


def webhook_secret(project: str, run: deploy.Runner) -> list[Finding]:
    """A warning when the webhook secret has no enabled version, or cannot be read (a real deploy only)."""
    listed = run(
        [
            *("secrets", "versions", "list", WEBHOOK_SECRET, "--project", project),
            "--filter=state:ENABLED",
            "--limit=1",
            "--format=value(name)",
        ]
    )
    add = f"echo -n https://chat.googleapis.com/... | gcloud secrets versions add {WEBHOOK_SECRET} "
    add += "--data-file=-"
    if listed.returncode != 0:
        if "NOT_FOUND" in listed.stderr or "not found" in listed.stderr.lower():
            return [
                Finding(
                    "warning",
                    f"the secret {WEBHOOK_SECRET} does not exist yet: deploy creates it "
                    f"empty and notify cannot page until you add the webhook URL: {add}",
                )
            ]
        return [
            Finding("warning", f"could not read {WEBHOOK_SECRET}'s versions: {listed.stderr.strip()[:200]}")
        ]
    if not listed.stdout.strip():
        return [
            Finding(
                "warning",
                f"the secret {WEBHOOK_SECRET} has no enabled version: notify cannot "
                f"page until you add the webhook URL: {add}",
            )
        ]
    return []
