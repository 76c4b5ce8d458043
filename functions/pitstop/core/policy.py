"""The deployment's policy: shipped defaults merged with policy.yaml, validated, with lookups."""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import yaml

from pitstop.core import plugins, resources, watchdog
from pitstop.core.catalog import XidPolicy, default_xid_policy
from pitstop.core.control import Control
from pitstop.core.domain import JsonObject, LocaliseConfig, NodeRef
from pitstop.core.policy_types import (
    CheckpointAdviceConfig,
    ClusterDoc,
    ClusterMatch,
    CorroborationConfig,
    DiagnoseConfig,
    MovesConfig,
    PolicyDoc,
    ValidationConfig,
    WindowName,
)

_MIG_MEMBER = re.compile(r"-[a-z0-9]{4}$")


def deep_merge(base: Mapping[str, object], over: Mapping[str, object]) -> JsonObject:
    """Maps merge key by key; lists and scalars from ``over`` replace. Free-form: it runs on
    YAML before a schema checked it."""
    out = dict(base)
    for k, v in over.items():
        mine = out.get(k)
        if isinstance(v, Mapping) and isinstance(mine, Mapping):
            out[k] = deep_merge(mine, v)
        else:
            out[k] = v
    return out


@dataclass(frozen=True)
class Cluster:
    name: str
    scheduler: str
    size: int | None
    match: ClusterMatch
    raw: ClusterDoc

    def block(self, name: str) -> Mapping[str, object]:
        """The cluster's block for a scheduler folder (``vertex: {...}``), as its fragment of the
        policy schema checked it; empty when the entry has none."""
        found = cast(Mapping[str, object], self.raw).get(name)
        return cast(Mapping[str, object], found) if isinstance(found, Mapping) else {}

    def matches(self, node: NodeRef, labels: Mapping[str, str] | None = None) -> bool:
        m = self.match
        if not m:  # a platform's cluster (Vertex AI): its VMs are not Pitstop's to claim
            return False
        inst = node["instance"]
        if "name_pattern" in m and not fnmatch.fnmatchcase(inst, m["name_pattern"]):
            return False
        if "mig" in m and not (inst.startswith(m["mig"] + "-") and _MIG_MEMBER.search(inst)):
            return False
        if "gke_cluster" in m and node.get("cluster") != m["gke_cluster"]:
            return False
        if "zones" in m and node.get("zone") not in m["zones"]:
            return False
        if "labels" in m:
            if labels is None:
                return False
            if any(labels.get(k) != v for k, v in m["labels"].items()):
                return False
        return True


@dataclass(frozen=True)
class Policy:
    """The policy in force: the deployed one, with the runtime control (core/control.py) people
    change without a redeploy; decisions read both from here."""

    doc: PolicyDoc
    xids: XidPolicy
    clusters: tuple[Cluster, ...]
    control: Control = field(default_factory=Control)

    def with_control(self, control: Control) -> Policy:
        return replace(self, control=control)

    @property
    def enforce(self) -> bool:
        """The deployed mode is enforce (a cluster's own mode may differ: :meth:`enforces`)."""
        return bool(self.doc["mode"] == "enforce")

    @property
    def mode(self) -> str:
        return str(self.doc["mode"])

    def mode_for(self, cluster: str | None) -> str:
        """The cluster's mode: its own in the runtime control, else the policy's."""
        return self.control.mode(cluster, self.mode)

    def enforces(self, cluster: str | None) -> bool:
        return self.mode_for(cluster) == "enforce"

    def enabled(self, action: str) -> bool:
        return action == "NONE" or action in self.doc["enabled_actions"]

    def window(self, name: WindowName) -> float:
        return float(self.doc["windows"][name])

    def cooldown_s(self, action: str) -> float:
        return float(self.doc["cooldowns"].get(action, 0))

    def cluster_for(self, node: NodeRef | None, labels: Mapping[str, str] | None = None) -> Cluster | None:
        """The cluster whose ``match`` claims the node (None: no node, a job's episode, or no cluster)."""
        if node is None:
            return None
        for c in self.clusters:
            if c.matches(node, labels):
                return c
        return None

    def cluster_named(self, name: str) -> Cluster | None:
        """The configured cluster of that name (a job-level signal names its cluster)."""
        return next((c for c in self.clusters if c.name == name), None)

    def budget_cap(self, scope: str, size: int | None) -> int:
        """How many nodes of a scope may start remediation in one window."""
        budgets = self.doc["budgets"]
        b = {"cluster": budgets["cluster"], "zone": budgets["zone"], "block": budgets["block"]}[scope]
        cap = int(b["max_nodes"])
        if size:
            cap = min(cap, max(1, math.ceil(size * float(b["max_percent"]) / 100)))
        return cap

    def job_restarts(self) -> tuple[int, float]:
        """The job-disruption budget: (gang restarts per job, within this many seconds)."""
        jr = self.doc["budgets"]["job_restarts"]
        return int(jr["max"]), float(jr["window_s"])

    @property
    def budget_window_s(self) -> float:
        return float(self.doc["budgets"]["window_s"])

    def watchdog_deadline_s(self, action: str) -> float:
        """How long an execution for this action may run before the watchdog fails its incident."""
        deadlines = self.doc["watchdog"]["deadline_s"]
        return watchdog.deadline_s(action, float(deadlines.get(action, deadlines["default"])))

    @property
    def trust_text_syslog(self) -> str:
        """What unverified evidence may start: ``record`` (nothing) or ``act`` (see core/trust.py)."""
        trust = self.doc.get("trust")
        return str(trust.get("text_syslog", "record")) if isinstance(trust, Mapping) else "record"

    def reschedule(self, cluster: Cluster | None) -> str:
        """``early`` or ``after_repair``: the cluster's own choice, else the policy's."""
        own = cluster.raw.get("reschedule") if cluster else None
        return str(own or self.doc["resume"]["reschedule"])

    @property
    def corroborate(self) -> bool:
        """Whether log evidence is confirmed on the node before anything is disrupted."""
        return bool(self.doc["corroboration"]["enabled"])

    @property
    def corroboration(self) -> CorroborationConfig:
        """How the node and Compute are asked (its bounds in time: core/corroboration.py)."""
        return self.doc["corroboration"].copy()

    @property
    def diagnose(self) -> DiagnoseConfig:
        return self.doc["diagnose"].copy()

    @property
    def validation(self) -> ValidationConfig:
        return self.doc["validation"].copy()

    @property
    def moves(self) -> MovesConfig:
        """How a gang's choice at a fault is priced (core/tradeoff.py)."""
        return self.doc["moves"].copy()  # the defaults always carry it

    @property
    def checkpoint_advice(self) -> CheckpointAdviceConfig:
        """How `pitstop report` advises each job's checkpoint interval (core/checkpointing.py)."""
        return self.doc["checkpoint_advice"].copy()  # the defaults always carry it

    @property
    def localise(self) -> LocaliseConfig:
        """How a hung job is localised (core/localise.py)."""
        return self.doc["localise"].copy()  # the defaults always carry it


def from_doc(user: Mapping[str, object] | None, where: str = "policy") -> Policy:
    """The policy from ``user`` (policy.yaml as parsed: free-form until the schema checked it)."""
    defaults = resources.load_yaml(resources.schema_dir() / "policy.defaults.yaml", "policy.schema.json")
    # the policy schema with each scheduler folder's block (core/plugins.py)
    if user is not None and not isinstance(user, Mapping):
        raise resources.DataFileError(f"{where}: (top level): must be a mapping")
    merged = deep_merge(defaults, user or {})
    resources.validate(merged, plugins.policy_validator(), where)
    doc = cast(PolicyDoc, merged)  # its schema checked it just above
    seen: set[str] = set()
    clusters = []
    for i, c in enumerate(doc["clusters"]):
        if c["name"] in seen:
            raise resources.DataFileError(f"{where}: clusters/{i}/name: duplicate cluster {c['name']!r}")
        seen.add(c["name"])
        clusters.append(Cluster(c["name"], c["scheduler"], c.get("size"), c.get("match") or {}, c))
    xids = default_xid_policy()
    if doc["xid_overrides"]:
        xids = xids.with_overrides({int(k): v for k, v in doc["xid_overrides"].items()})
    return Policy(doc, xids, tuple(clusters))


def load(path: str | Path | None = None) -> Policy:
    """policy.yaml from ``path``, $PITSTOP_POLICY, or the shipped defaults alone."""
    path = path or os.environ.get("PITSTOP_POLICY")
    if not path:
        return from_doc(None)
    try:
        with open(path, encoding="utf-8") as f:
            user = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise resources.DataFileError(f"{path}: not valid YAML: {exc}") from exc
    return from_doc(user, str(path))
