"""`pitstop deploy` / `pitstop teardown`: the whole pipeline into one project with gcloud.

What gets deployed is data: infra/resources.yaml lists the resources in order, and the IAM
bindings come from infra/iam.yaml. This module is the interpreter: each resource ``kind`` has a
builder that turns an entry into gcloud commands (create, describe, update, delete). ``--dry-run``
prints the plan, one command per line, with values known only at run time as ``<placeholders>``.
A real run is idempotent: each step that creates something first asks gcloud whether it exists
and then updates or skips it. Planning reads files and writes none.

A few steps are not plain gcloud: Pitstop's pieces in a GKE cluster are the kustomize base
infra/gke, applied with ``kubectl apply -k`` through a small overlay written at run time (after gcloud
fetched the cluster's credentials into a private directory), and read-only checks warn about
settings Pitstop depends on but must not change (serial-port logging on GKE nodes).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypedDict, cast

import yaml

from pitstop.core import plugins, resources, sinks
from pitstop.core.policy import deep_merge, from_doc
from pitstop.tools import deploy_monitoring
from pitstop.tools.deploy_types import AccountSpec, Grant, IamCondition, IamDoc, ResourceEntry, ScaleKey

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "infra"
RESOURCES = INFRA / "resources.yaml"
EXISTING = "<existing>"  # in update/delete commands: the name the step's check printed
PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"  # an Eventarc Pub/Sub trigger's event type

WORKDIR = "<gke-credentials>"  # a private directory apply/teardown make for kubeconfig files
PRIVATE = "<private-files>"  # a private directory apply makes for a generated secret's first value
GENERATED_BYTES = 32  # a generated secret's value: this many random bytes, hex
DIGEST_LABEL = "pitstop_config"
Entry = ResourceEntry
# deploy.yaml over infra/deploy.defaults.yaml: a person's file, each key read after its check here
Conf = Mapping[str, object]


@dataclass
class Gate:
    """Run a step only when every command prints exactly `prints` (`negate`: only when one does not)."""

    commands: list[list[str]]
    prints: str
    negate: bool = False

    def comment(self) -> str:
        """The condition as a shell comment after the step's command (a dry run's line stays one command)."""
        each = "; ".join(shlex.join(["gcloud", *c]) for c in self.commands)
        return f"  # {'unless' if self.negate else 'when'} each prints {self.prints}: {each}"


@dataclass
class Step:
    what: str
    argv: list[str]
    check: list[str] | None = None  # exits 0 when the resource already exists
    update: list[str] | None = None  # run instead of argv when it exists (None: skip)
    captures: dict[str, list[str]] = field(default_factory=dict)  # placeholder -> gcloud printing it
    delete: list[str] | None = None  # for teardown; "<existing>" is each name the check printed
    expect: str | None = None  # the check prints exactly this when what is deployed is current
    when: str | None = None  # run only when the check prints exactly this (warn: warn when argv does)
    warn: str | None = None  # a read-only check: argv's output (or `when`) is reported, never fatal
    program: str = "gcloud"  # kubectl for GKE's kustomize base
    env: dict[str, str] = field(default_factory=dict)  # e.g. KUBECONFIG under <gke-credentials>
    overlay: Overlay | None = None  # a kustomize overlay written where argv's -k names, just before it runs
    credentials: list[str] | None = None  # a gcloud command run first (with env), before argv or delete
    purge: list[str] | None = None  # what `teardown --purge` runs: delete the data kept by default
    gate: Gate | None = None  # run only when gcloud reports this (a function's secrets readable)

    def line(self) -> str:
        """The step as a shell line: what a person would type to do it by hand (a REST call for
        what deploy runs in-process, deploy_monitoring)."""
        if deploy_monitoring.is_api(self.argv):
            return deploy_monitoring.line(self.argv)
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())  # an assignment, not a word
        cmd = env + shlex.join([self.program, *self.argv])
        if self.credentials is not None:
            cmd = f"{env}{shlex.join(['gcloud', *self.credentials])} && {cmd}"
        if self.overlay is not None:
            cmd += "  # " + self.overlay.comment()
        return cmd + (self.gate.comment() if self.gate is not None else "")


@dataclass
class Overlay:
    """A kustomize overlay of a base under infra/: the base, the component that fills the accounts'
    emails in (``accounts/`` beside it) and the local-config ConfigMap holding them (infra/gke)."""

    base: str  # a directory with a kustomization.yaml
    accounts: dict[str, str]  # pitstop-accounts' data: actuator, ingest -> service-account email

    def comment(self) -> str:
        """What the directory holds, for a dry run's line (the directory is made at run time)."""
        named = ", ".join(f"{k}={v}" for k, v in self.accounts.items())
        return f"-k: an overlay of {self.base} with {ACCOUNTS_CONFIGMAP} {named}"

    def write(self, directory: Path) -> None:
        """The overlay's two files. kustomize takes a base or component only by a relative path."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        base = os.path.relpath(self.base, directory)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [base, "accounts.yaml"],
            "components": [f"{base}/accounts"],
        }
        accounts = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": ACCOUNTS_CONFIGMAP,
                "annotations": {"config.kubernetes.io/local-config": "true"},  # read, never applied
            },
            "data": self.accounts,
        }
        (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        (directory / "accounts.yaml").write_text(yaml.safe_dump(accounts, sort_keys=False))


ACCOUNTS_CONFIGMAP = "pitstop-accounts"  # infra/gke/accounts/kustomization.yaml's source


@functools.cache
def _resources() -> list[Entry]:
    """resources.yaml with the plugin folders' fragments in, checked once (read-only: every reader
    renders a copy)."""
    doc = resources.load_yaml(RESOURCES, "deploy-resources.schema.json")
    spliced = {"resources": _spliced(cast(list[Entry], doc["resources"]))}
    resources.validate(spliced, "deploy-resources.schema.json", f"{RESOURCES} with the plugin folders")
    return spliced["resources"]


def _spliced(entries: list[Entry]) -> list[Entry]:
    """Each ``plugins: <slot>`` entry replaced by the folders' entries for it, in their order; each
    function given the env and secrets its folders add (plugin.yaml ``deploy``)."""
    out: list[Entry] = []
    for e in entries:
        if "plugins" in e:
            out += [
                cast(Entry, x) for p in plugins.all_plugins() for x in _fragment(p, "resources", e["plugins"])
            ]
        elif "resources" in e:
            out.append({**e, "resources": _spliced(e["resources"])})
        elif e.get("kind") == "function":
            out.append(_with_function_fragments(e))
        else:
            out.append(e)
    return out


def _fragment(p: plugins.Plugin, *path: str) -> list[object]:
    """A list at ``path`` in a plugin's deploy fragment (empty when absent)."""
    node: object = p.deploy
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return list(node) if isinstance(node, list) else []


def _with_function_fragments(e: Entry) -> Entry:
    fn: Entry = {**e}
    for p in plugins.all_plugins():
        functions = p.deploy.get("functions")
        more = functions.get(e["name"]) if isinstance(functions, dict) else None
        if not isinstance(more, dict):
            continue
        fn["env"] = {**fn.get("env", {}), **more.get("env", {})}
        fn["secrets"] = {**fn.get("secrets", {}), **more.get("secrets", {})}
        fn["secrets_if"] = {**fn.get("secrets_if", {}), **more.get("secrets_if", {})}
    return fn


@functools.cache
def _iam() -> IamDoc:
    """iam.yaml with each plugin folder's grants appended to its accounts' and its conditions, checked."""
    doc = resources.load_yaml(INFRA / "iam.yaml", "deploy-iam.schema.json")
    accounts = cast(dict[str, dict[str, list[object]]], doc["service_accounts"])
    conditions = cast(dict[str, object], doc["conditions"])
    for p in plugins.all_plugins():
        iam = p.deploy.get("iam")
        if not isinstance(iam, dict):
            continue
        for account, grants in (iam.get("service_accounts") or {}).items():
            for key, listed in grants.items():
                accounts.setdefault(account, {}).setdefault(key, []).extend(listed)
        conditions.update(iam.get("conditions") or {})
    resources.validate(doc, "deploy-iam.schema.json", f"{INFRA / 'iam.yaml'} with the plugin folders")
    return cast(IamDoc, doc)  # checked just above


class GkeCluster(TypedDict):
    """A `gke_clusters` entry of deploy.yaml, checked (its project filled in)."""

    name: str
    location: str
    project: str
    # its node pools' MIGs as (zone, name); None until read (learn_node_groups) or listed
    node_groups: list[tuple[str, str]] | None


APIS: list[str] = next(e["names"] for e in _resources() if e.get("kind") == "apis")
ALERTS_CHANNEL: str = next(e["name"] for e in _resources() if e.get("kind") == "notification-channel")
TOPICS: list[str] = [e["name"] for e in _resources() if e.get("kind") == "topic" and "for_each" not in e]
CLUSTER_TOPICS: list[str] = [  # one of each per Slurm cluster ("{cluster}" in the name)
    e["name"] for e in _resources() if e.get("kind") == "topic" and e.get("for_each") == "cluster"
]


class ConfigError(ValueError):
    """deploy.yaml is wrong; the message names the key (and, for an unknown key, the nearest known one)."""


CONFIG_SCHEMA = "deploy.schema.json"


def load_config(path: str | None) -> dict[str, object]:
    """infra/deploy.defaults.yaml over the plugin folders' defaults, with ``path`` merged over it key
    by key, checked: every key known (schemas/deploy.schema.json, ``additionalProperties: false``,
    with the keys each plugin folder adds) and each value as deploy uses it."""
    conf: dict[str, object] = deep_merge(
        plugins.deploy_defaults(), yaml.safe_load((INFRA / "deploy.defaults.yaml").read_text())
    )
    if path:
        conf = deep_merge(conf, _user_config(path))
    try:
        resources.validate(conf, config_validator(), path or "infra/deploy.defaults.yaml")
        expand_accounts({}, slurm_clusters(conf))  # names fit the account-id rules
        notification_channels(conf)
        telemetry_files(conf)
        gke_clusters(conf, "my-project")
        compute_scope(conf, "my-project", groups_known=False)
        db = conf.get("firestore_database")
        if not isinstance(db, str) or not DATABASE.fullmatch(db):
            raise ValueError(f"firestore_database: {db!r} is not a database id (and not (default))")
        ndb = conf.get("notify_database")
        if not isinstance(ndb, str) or not DATABASE.fullmatch(ndb) or ndb == db:
            raise ValueError(
                f"notify_database: {ndb!r} is not a database id of its own (not {db} or (default))"
            )
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}" if path and not str(exc).startswith(path) else str(exc)) from None
    return conf


def _user_config(path: str) -> dict[str, object]:
    """A person's deploy.yaml: a mapping whose every key deploy knows (a typo names the key it meant)."""
    import difflib

    try:
        user = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(user, dict):
        raise ConfigError(f"{path}: a mapping of settings (key: value), not {type(user).__name__}")
    known = config_schema()["properties"]
    assert isinstance(known, dict)
    for key in user:
        if key not in known:
            near = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(sorted(known))}"
            raise ConfigError(f"{path}: {key}: not a deploy.yaml setting ({hint})")
    return user


def config_schema() -> dict[str, Any]:
    """deploy.yaml's schema: schemas/deploy.schema.json and the keys each plugin folder adds
    (its deploy.schema.json: core/plugins.deploy_schema)."""
    base = copy.deepcopy(resources.schema(CONFIG_SCHEMA))
    base["properties"] = {**base["properties"], **plugins.deploy_schema()["properties"]}
    return base


@functools.cache
def config_validator() -> Any:
    return resources.validator_of(config_schema())


PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,19}"  # a project id or number
PROJECT_NAME = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")  # an id: resource names in conditions use it
DATABASE = re.compile(r"[a-z][a-z0-9-]{2,61}[a-z0-9]")  # a Firestore database id, never (default)
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}-[a-z]")
REGION = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}")
GKE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")
NAME_PREFIX = re.compile(r"[a-z][-a-z0-9]{0,61}")
CHANNEL = re.compile(rf"projects/(?:{PROJECT_ID})/notificationChannels/[0-9]{{1,19}}")


def _listed(conf: Conf, key: str) -> list[object]:
    """A deploy.yaml key that holds a list (unset or null: none)."""
    value = conf.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{key}: {value!r} is not a list")
    return value


def setting(conf: Conf, key: str) -> str:
    """A deploy.yaml setting that is one word (``region``, ``runtime``)."""
    value = conf.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: {value!r} is not a string")
    return value


def policy_path(conf: Conf) -> str | None:
    """`policy`: the path of the site's policy.yaml (None: the shipped defaults)."""
    path = conf.get("policy")
    if path is not None and not isinstance(path, str):
        raise ValueError(f"policy: {path!r} is not a path")
    return path


ACCOUNT_EMAIL = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9.-]+\.gserviceaccount\.com")


def slurm_controller_accounts(conf: Conf, clusters: list[str]) -> dict[str, str]:
    """`slurm_controller_accounts`: cluster -> the account its controller VM runs as, which may mint
    tokens as the cluster's agent account (the agent's --impersonate-service-account)."""
    given = conf.get("slurm_controller_accounts") or {}
    if not isinstance(given, Mapping):
        raise ValueError(f"slurm_controller_accounts: {given!r} is not {{cluster: account email}}")
    for cluster, account in given.items():
        if cluster not in clusters:
            raise ValueError(
                f"slurm_controller_accounts: {cluster!r} is not one of slurm_clusters {clusters}"
            )
        if not isinstance(account, str) or not ACCOUNT_EMAIL.fullmatch(account):
            raise ValueError(
                f"slurm_controller_accounts: {str(account)[:80]!r} is not a service account's email"
            )
    return {str(c): str(a) for c, a in given.items()}


def slurm_clusters(conf: Conf) -> list[str]:
    """`slurm_clusters`: the names (expand_accounts checks each fits an account id)."""
    names = _listed(conf, "slurm_clusters")
    if not all(isinstance(c, str) for c in names):
        raise ValueError(f"slurm_clusters: {names!r} is not a list of names")
    return [str(c) for c in names]


def notification_channels(conf: Conf) -> list[str]:
    """`notification_channels`: full resource names (projects/P/notificationChannels/ID), checked."""
    channels = conf.get("notification_channels") or []
    if not isinstance(channels, list):
        raise ValueError("notification_channels: a list of projects/P/notificationChannels/ID names")
    for c in channels:
        if not isinstance(c, str) or not CHANNEL.fullmatch(c):
            raise ValueError(f"notification_channels: {c!r} is not projects/P/notificationChannels/ID")
    return [str(c) for c in channels]


TELEMETRY = INFRA / "monitoring" / "telemetry"
SIGNALS = ("hang", "degraded")  # core/alerts.SIGNALS: what a telemetry policy may raise


def telemetry_files(conf: Conf) -> list[Path]:
    """The telemetry policies (shipped, then deploy.yaml's `telemetry_policies`), each checked: a
    policy JSON whose user labels name the Pitstop signal it raises (core/alerts.py reads them)."""
    extra = conf.get("telemetry_policies") or []
    if not isinstance(extra, list) or not all(isinstance(p, str) for p in extra):
        raise ValueError("telemetry_policies: a list of paths to alert policy JSON files")
    files = sorted(TELEMETRY.glob("*.json")) + [Path(str(p)).resolve() for p in extra]
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"telemetry_policies: {f}: {exc}") from None
        labels = doc.get("userLabels") if isinstance(doc, dict) else None
        if not isinstance(labels, dict) or labels.get("pitstop_signal") not in SIGNALS:
            raise ValueError(f"telemetry_policies: {f}: userLabels.pitstop_signal must be one of {SIGNALS}")
        if not isinstance(doc.get("displayName"), str):
            raise ValueError(f"telemetry_policies: {f}: no displayName (deploy finds a policy again by it)")
    return files


def gke_clusters(conf: Conf, project: str) -> list[GkeCluster]:
    """`gke_clusters`: {name, location, project?, node_groups?} each, checked (they end up in
    commands and conditions)."""
    out: list[GkeCluster] = []
    for c in _listed(conf, "gke_clusters"):
        if not isinstance(c, Mapping) or set(c) - {"name", "location", "project", "node_groups"}:
            raise ValueError(f"gke_clusters: {c!r} is not {{name, location, project?, node_groups?}}")
        name, loc, proj = c.get("name"), c.get("location"), c.get("project", project)
        if not isinstance(name, str) or not GKE_NAME.fullmatch(name):
            raise ValueError(f"gke_clusters: {name!r} is not a GKE cluster name")
        if not isinstance(loc, str) or not (ZONE.fullmatch(loc) or REGION.fullmatch(loc)):
            raise ValueError(f"gke_clusters: location {loc!r} of {name} is not a zone or region")
        if not isinstance(proj, str) or not PROJECT_NAME.fullmatch(proj):
            raise ValueError(f"gke_clusters: project {proj!r} of {name} is not a project id")
        groups = c.get("node_groups")
        out.append(
            {
                "name": name,
                "location": loc,
                "project": proj,
                "node_groups": None if groups is None else _node_groups(name, loc, groups),
            }
        )
    return out


# GKE's node-pool MIG: gke-<cluster>-<pool>-<hash>-grp, one per zone of the pool, listed in the
# pool's instanceGroupUrls (reference/gke.md "Without Kubernetes access"; Container API v1
# NodePool.instanceGroupUrls: cloud.google.com/kubernetes-engine/docs/reference/rest/v1/
# projects.locations.clusters.nodePools). Its VMs are named after the MIG's base instance name
# (the MIG's name without -grp) plus "-" and four random characters (Compute API
# InstanceGroupManager.baseInstanceName: "the MIG appends a hyphen and a random four-character
# string"). The cluster and pool parts are truncated by GKE, so the names are read, not built.
GKE_NODE_GROUP = re.compile(r"(gke-[a-z0-9-]{1,53})-grp")


def _node_groups(cluster: str, location: str, groups: object) -> list[tuple[str, str]]:
    """`node_groups: ["ZONE/MIG", ...]` of one cluster, each a GKE node-pool MIG in its location."""
    if not isinstance(groups, list):
        raise ValueError(f"gke_clusters: node_groups of {cluster} is not a list of ZONE/MIG")
    out: list[tuple[str, str]] = []
    for g in groups:
        zone, _, mig = str(g).partition("/") if isinstance(g, str) else ("", "", "")
        if not ZONE.fullmatch(zone) or not GKE_NODE_GROUP.fullmatch(mig):
            raise ValueError(f"gke_clusters: {g!r} of {cluster} is not ZONE/gke-...-grp (a node pool's MIG)")
        if zone != location and not zone.startswith(f"{location}-"):
            raise ValueError(f"gke_clusters: node group {g} of {cluster} is outside its location {location}")
        out.append((zone, mig))
    return out


def node_group_urls(urls: object) -> list[str]:
    """``ZONE/MIG`` of each node pool's ``instanceGroupUrls`` (what gcloud printed as JSON)."""
    pools = urls if isinstance(urls, list) else []
    found = [
        m.group(1) + "/" + m.group(2)
        for pool in pools
        if isinstance(pool, Mapping)
        for u in (pool.get("instanceGroupUrls") or [])
        if (m := re.search(r"/zones/([a-z0-9-]+)/instanceGroup(?:Manager)?s/([a-z0-9-]+)$", str(u)))
    ]
    return sorted(set(found))


def learn_node_groups(conf: Conf, project: str, run: Runner) -> Conf:
    """deploy.yaml with each GKE cluster's node groups read from its node pools (gcloud container
    node-pools list), where the file does not list them. ``ValueError`` when a cluster's pools
    cannot be read: actuate's Compute grant names its MIGs and VMs exactly, so they must be known."""
    clusters: list[object] = []
    for c, raw in zip(gke_clusters(conf, project), _listed(conf, "gke_clusters"), strict=True):
        if c["node_groups"] is not None:
            clusters.append(raw)
            continue
        where = [f"--cluster={c['name']}", f"--location={c['location']}", "--project", c["project"]]
        res = run(["container", "node-pools", "list", *where, "--format=json(name,instanceGroupUrls)"])
        if res.returncode != 0:
            raise ValueError(
                f"gke_clusters: could not read the node pools of {c['name']} ({res.stderr.strip()[:300]});"
                " list them as node_groups: [ZONE/MIG, ...]"
            )
        groups = node_group_urls(json.loads(res.stdout or "[]"))
        clusters.append({**dict(cast(Mapping[str, object], raw)), "node_groups": groups})
    return {**conf, "gke_clusters": clusters}


MIG_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")


def compute_scope(conf: Conf, project: str, groups_known: bool = True) -> dict[str, list[tuple[str, str]]]:
    """Where actuate may act on VMs: project -> [(zone or region, instance name prefix)].

    From `compute_zones` (a zone or region, or {zone, project?, name_prefix?, migs?}) and each GKE
    cluster's node groups: the MIG by its exact name (``(zone, "mig:<name>")``) and the VMs named
    after it (``(zone, "<base instance name>-")``), never the cluster's whole zone or region (a
    region-wide clause admitted every VM and MIG of the region: issue 35, 9). A named prefix
    admits only the MIGs listed by exact name in ``migs``. ``groups_known``: a GKE cluster whose
    node groups are not read yet is an error (deploy reads them first: learn_node_groups).
    """
    entries: list[object] = [{"zone": z} if isinstance(z, str) else z for z in _listed(conf, "compute_zones")]
    for c in gke_clusters(conf, project):
        if c["node_groups"] is None and groups_known:
            raise ValueError(
                f"gke_clusters: the node groups of {c['name']} are not known (learn_node_groups)"
            )
        for where, mig in c["node_groups"] or []:
            base = mig.removesuffix("-grp")
            entries.append({"zone": where, "project": c["project"], "name_prefix": f"{base}-", "migs": [mig]})
    out: dict[str, list[tuple[str, str]]] = {}
    for e in entries:
        if not isinstance(e, Mapping) or set(e) - {"zone", "project", "name_prefix", "migs"}:
            raise ValueError(f"compute_zones: {e!r} is not a zone or {{zone, project?, name_prefix?, migs?}}")
        migs = e.get("migs") or []
        if not isinstance(migs, list) or not all(isinstance(m, str) and MIG_NAME.fullmatch(m) for m in migs):
            raise ValueError(f"compute_zones: migs {migs!r} must be a list of instance group names")
        if migs and not e.get("name_prefix"):
            raise ValueError("compute_zones: migs narrow a name_prefix entry (a whole zone admits its MIGs)")
        zone, proj, prefix = e.get("zone"), e.get("project", project), e.get("name_prefix", "")
        if not isinstance(zone, str) or not (ZONE.fullmatch(zone) or REGION.fullmatch(zone)):
            raise ValueError(f"compute_zones: {zone!r} is not a zone or region")
        if not isinstance(proj, str) or not PROJECT_NAME.fullmatch(proj):
            raise ValueError(f"compute_zones: project {proj!r} is not a project id")
        if prefix and (not isinstance(prefix, str) or not NAME_PREFIX.fullmatch(prefix)):
            raise ValueError(f"compute_zones: name_prefix {prefix!r} is not the start of an instance name")
        if prefix and not ZONE.fullmatch(zone):
            raise ValueError(f"compute_zones: a name_prefix needs a zone, not the region {zone}")
        for item in [(zone, prefix), *((zone, f"mig:{m}") for m in migs)]:
            if item not in out.setdefault(proj, []):
                out[proj].append(item)
    return out


CLAUSES_PER_CONDITION = 12  # IAM allows 12 logical operators per condition: 12 clauses is 11 ORs


def compute_conditions(project: str, scope: list[tuple[str, str]]) -> list[IamCondition]:
    """The IAM conditions that limit the actuator role in one project to its zones and names.

    A zone admits every resource under projects/P/zones/Z/ (its VMs and MIGs); a region every
    zone whose name starts with it; a name prefix only VMs so named; a
    ``mig:<name>`` entry that one MIG by its exact name (instanceGroupManagers.update can resize,
    abandon or re-template a group: never a whole zone's). Past 12 clauses the scope is split
    over several bindings of the same role.
    """
    clauses: list[str] = []
    for zone, prefix in scope:
        where = f"projects/{project}/zones/{zone}" + ("/" if ZONE.fullmatch(zone) else "-")
        if not prefix:
            clauses.append(f'resource.name.startsWith("{where}")')
        elif prefix.startswith("mig:"):
            clauses.append(f'resource.name == "{where}instanceGroupManagers/{prefix[4:]}"')
        else:
            clauses.append(f'resource.name.startsWith("{where}instances/{prefix}")')
    chunks = [clauses[i : i + CLAUSES_PER_CONDITION] for i in range(0, len(clauses), CLAUSES_PER_CONDITION)]
    return [
        {"title": "pitstop-actuator-zones" + (f"-{n}" if n > 1 else ""), "expression": " || ".join(chunk)}
        for n, chunk in enumerate(chunks, 1)
    ]


GKE_NODE_PREFIX = "gke-"  # GKE names node VMs gke-<cluster>-<pool>-...: adapters/gke/zone.py asks no other


def node_lookup_conditions(project: str, locations: list[str]) -> list[IamCondition]:
    """The IAM conditions on ingest's pitstopNodeLookup (compute.instances.get) in one project:
    Compute instances only, in the zones of its GKE clusters' locations (a region: each of its
    zones; a zonal cluster: that zone), named ``gke-*``. ``resource.name`` of an instance is
    ``projects/P/zones/Z/instances/NAME`` and ``extract("/instances/{name}")`` gives NAME
    (infra/roles/pitstop-node-lookup.yaml cites Google's pages). Two ANDs and the locations' ORs
    must stay within 12 logical operators: past 11 locations the scope is split over bindings.
    """
    where = [
        f'resource.name.startsWith("projects/{project}/zones/{loc}'
        + ("/" if ZONE.fullmatch(loc) else "-")
        + '")'
        for loc in dict.fromkeys(locations)
    ]
    per = CLAUSES_PER_CONDITION - 1
    chunks = [where[i : i + per] for i in range(0, len(where), per)]
    return [
        {
            "title": "pitstop-gke-node-lookup" + (f"-{n}" if n > 1 else ""),
            "expression": 'resource.type == "compute.googleapis.com/Instance" && '
            + (f"({' || '.join(chunk)})" if len(chunk) > 1 else chunk[0])
            + f' && resource.name.extract("/instances/{{name}}").startsWith("{GKE_NODE_PREFIX}")',
        }
        for n, chunk in enumerate(chunks, 1)
    ]


CLUSTER_NAME = re.compile(r"[a-z](?:[a-z0-9-]{0,14}[a-z0-9])?")  # fits pitstop-slurm-<name> (30 max)


def expand_accounts(specs: Mapping[str, AccountSpec], clusters: list[str]) -> dict[str, AccountSpec]:
    """iam.yaml's accounts, a `{cluster}` one once per Slurm cluster (its `cluster` key set)."""
    for c in clusters:
        if not CLUSTER_NAME.fullmatch(c):
            raise ValueError(f"slurm_clusters: {c!r} must be 1-16 lowercase letters, digits or '-'")
    out: dict[str, AccountSpec] = {}
    for comp, spec in specs.items():
        if "{cluster}" not in comp:
            out[comp] = spec
            continue
        for c in clusters:
            one: AccountSpec = {**spec, "display": spec["display"].format(cluster=c), "cluster": c}
            out[comp.format(cluster=c)] = one
    return out


def _targets(pattern: str, spec: AccountSpec, clusters: list[str]) -> list[str]:
    """A resource name for each cluster it covers: the account's own cluster, or all of them."""
    if "{cluster}" not in pattern:
        return [pattern]
    return [pattern.format(cluster=c) for c in ([spec["cluster"]] if "cluster" in spec else clusters)]


def sa_email(component: str, project: str) -> str:
    return f"pitstop-{component}@{project}.iam.gserviceaccount.com"


@dataclass(frozen=True)
class Target:
    """Where a plan deploys, and what its entries may refer to."""

    project: str
    region: str
    conf: Conf
    source_dir: str
    iam: IamDoc
    accounts: dict[str, AccountSpec]
    clusters: list[str]
    sink_scope: list[str]  # --folder=/--organization= of an aggregated sink, else empty
    variables: dict[str, str]  # what {name} in resources.yaml stands for
    source: str  # source_digest of the function source
    gke: list[GkeCluster]  # gke_clusters, each with its project
    compute: dict[str, list[tuple[str, str]]]  # compute_scope: project -> [(zone, name prefix)]
    prefix: str  # the policy's store.collection_prefix

    @property
    def p(self) -> list[str]:
        return ["--project", self.project]

    def at(self, e: Entry) -> list[str]:
        """--project of an entry that names its own (a GKE cluster's project), else the plan's."""
        return ["--project", str(e.get("project") or self.project)]

    def member(self, component: str) -> str:
        return f"serviceAccount:{sa_email(component, self.project)}"


def _target(project: str, region: str, conf: Conf, source_dir: str) -> Target:
    iam = _iam()
    clusters = slurm_clusters(conf)
    agg = conf.get("aggregated_sink") or {}
    if not isinstance(agg, Mapping):
        raise ValueError(f"aggregated_sink: {agg!r} is not {{folder: ID}} or {{organization: ID}}")
    scope = [f"--{k}={agg[k]}" for k in ("folder", "organization") if k in agg][:1]
    variables = {k: v for k, v in conf.items() if isinstance(v, str)} | {"project": project, "region": region}
    for name, agent in iam["service_agents"].items():
        variables[f"{name}_agent"] = agent["member"].format(project_number="<project-number>")
    policy_file = policy_path(conf)
    policy_doc = yaml.safe_load(Path(policy_file).read_text()) if policy_file else None
    return Target(
        project,
        region,
        conf,
        source_dir,
        iam,
        expand_accounts(iam["service_accounts"], clusters),
        clusters,
        scope,
        variables,
        source_digest(policy_file),
        gke_clusters(conf, project),
        compute_scope(conf, project),
        str(from_doc(policy_doc, str(policy_file)).doc["store"]["collection_prefix"]),
    )


def plan(project: str, region: str, conf: Conf, source_dir: str = "<staged-source>") -> list[Step]:
    """The ordered steps that deploy infra/resources.yaml into the project (nothing is run)."""
    t = _target(project, region, conf, source_dir)
    steps = [step for entry in _entries(_resources(), t, {}) for step in _build(entry, t)]
    learn = runtime_values(project, region, t.sink_scope or t.p)
    for step in steps:
        step.captures = _captures([*step.argv, *(step.update or [])], learn)
    return steps


def dry_run_lines(project: str, region: str, conf: Conf) -> list[str]:
    return [s.line() for s in plan(project, region, conf)]


# -- reading resources.yaml: repetition, generated entries, {variables} ------------------------


def _entries(entries: Iterable[Entry], t: Target, scope: Mapping[str, str]) -> Iterator[Entry]:
    """Each resource entry once per `for_each` value, groups and `expand` generators flattened."""
    for entry in entries:
        if not _configured(entry, t):
            continue
        for values in _for_each(entry, t) if "for_each" in entry else [{}]:
            inner = {**scope, **values}
            if "resources" in entry:
                yield from _entries(entry["resources"], t, inner)
            elif "expand" in entry:
                for generated, own in EXPAND[entry["expand"]](entry, t):
                    yield _render_entry(generated, {**t.variables, **inner, **own})
            else:
                yield _render_entry(entry, {**t.variables, **inner})


def _configured(entry: Entry | Grant, t: Target) -> bool:
    """An entry (or a grant) with ``if_config: KEY`` exists only when deploy.yaml sets KEY."""
    key = entry.get("if_config")
    return key is None or bool(t.conf.get(key))


def _render_text(text: str, variables: Mapping[str, str]) -> str:
    """{name} replaced; unknown names stay (they are not templates)."""
    return re.sub(r"\{([a-z_]+)\}", lambda m: variables.get(m[1], m[0]), text)


def _render_entry(entry: Entry, variables: Mapping[str, str]) -> Entry:
    return cast(Entry, _render(entry, variables))  # the same keys, each string in it rendered


def _render(value: object, variables: Mapping[str, str]) -> object:
    """{name} replaced in every string; unknown names stay (they are not templates)."""
    if isinstance(value, str):
        return _render_text(value, variables)
    if isinstance(value, list):
        return [_render(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, variables) for k, v in value.items()}
    return value


FOR_EACH: dict[str, Callable[[Entry, Target], list[dict[str, str]]]] = {
    "cluster": lambda _, t: [{"cluster": c} for c in t.clusters],
    "controller": lambda _, t: [
        {"cluster": c, "controller": a} for c, a in slurm_controller_accounts(t.conf, t.clusters).items()
    ],
    "compute_project": lambda _, t: [{"compute_project": p} for p in t.compute],
    "gke_project": lambda _, t: [{"gke_project": p} for p in dict.fromkeys(c["project"] for c in t.gke)],
    "gke_cluster": lambda _, t: [
        {"gke_cluster": c["name"], "gke_location": c["location"], "gke_project": c["project"]} for c in t.gke
    ],
    "ttl": lambda e, t: [
        {"ttl_collection": f"{t.prefix}_{name}", "ttl_field": fld} for name, fld in e["ttls"].items()
    ],
    "sink": lambda _, t: [{"sink": s} for s in sinks.SINK_FILTERS],
    "file": lambda e, _: [
        {"file": str(f.relative_to(INFRA)), "stem": f.stem} for f in sorted(INFRA.glob(e["files"]))
    ],
    "telemetry_file": lambda _, t: [
        {"file": str(f.relative_to(INFRA)) if f.is_relative_to(INFRA) else str(f), "stem": f.stem}
        for f in telemetry_files(t.conf)
    ],
}
Generated = Iterator[tuple[Entry, dict[str, str]]]  # an entry and the variables it is rendered with


def _for_each(entry: Entry, t: Target) -> list[dict[str, str]]:
    """FOR_EACH's values, or ``config:<key>``: each entry of that deploy.yaml list as ``{item}``."""
    key = entry["for_each"]
    if key.startswith("config:"):
        return [{"item": str(v)} for v in _listed(t.conf, key.removeprefix("config:"))]
    return FOR_EACH[key](entry, t)


def _condition(name: str | None, t: Target) -> IamCondition | None:
    """An iam.yaml `conditions` entry, rendered for this plan (None: unconditional)."""
    if name is None:
        return None
    cond = t.iam["conditions"][name]
    each = (
        [{}]
        if "join" not in cond
        else [{cond["join"].removesuffix("s"): str(v)} for v in _listed(t.conf, cond["join"])]
    )
    clauses = [" ".join(_render_text(cond["expression"], {**t.variables, **v}).split()) for v in each]
    return {"title": cond["title"], "expression": " || ".join(clauses)}


def _expand_accounts(entry: Entry, t: Target) -> Generated:
    """iam.yaml's service accounts, each followed by its project-level roles."""
    for comp, spec in t.accounts.items():
        account: Entry = {"kind": "service-account", "name": comp, "display": spec["display"]}
        yield {**account, "what": entry["what"]}, {"account": comp}
        for b in (b for b in spec.get("project_roles", []) if _configured(b, t)):
            role = _render_text(b["role"], t.variables)
            binding: Entry = {"kind": "project-binding", "member": t.member(comp), "role": role}
            binding["condition"] = _condition(b.get("condition"), t)
            yield {**binding, "what": entry["role_what"]}, {"account": comp, "role": role}


def _expand_scoped_roles(entry: Entry, t: Target) -> Generated:
    """iam.yaml's compute_roles (each compute project, zone-conditioned) and gke_roles (each GKE
    project; the node lookup conditioned to its clusters' GKE node VMs)."""
    gke_projects = list(dict.fromkeys(c["project"] for c in t.gke))
    for comp, spec in t.accounts.items():
        scoped: tuple[tuple[Literal["compute_roles", "gke_roles"], list[str], str], ...] = (
            ("compute_roles", list(t.compute), "compute_project"),
            ("gke_roles", gke_projects, "gke_project"),
        )
        for key, projects, var in scoped:
            for b, proj in ((b, proj) for b in spec.get(key, []) for proj in projects):
                role = _render_text(b["role"], {**t.variables, var: proj})
                conds: list[IamCondition | None] = [None]
                if b.get("condition") == "compute-zones":
                    conds = list(compute_conditions(proj, t.compute[proj]))
                elif b.get("condition") == "gke-node-vms":
                    locations = [c["location"] for c in t.gke if c["project"] == proj]
                    conds = list(node_lookup_conditions(proj, locations))
                for cond in conds:
                    binding: Entry = {"kind": "project-binding", "member": t.member(comp), "role": role}
                    binding |= {"project": proj, "condition": cond}
                    own = {"account": comp, "role": role, "on_project": proj}
                    yield {**binding, "what": entry["what"]}, own


def _expand_account_roles(entry: Entry, t: Target) -> Generated:
    """iam.yaml's resource-level roles (`topic_roles` ...) as `topic-binding` ... entries."""
    for comp, spec in t.accounts.items():
        for key in entry["roles"]:
            on = key.removesuffix("_roles")
            for b in spec.get(key, []):
                if not _configured(b, t):
                    continue
                for name in _targets(_granted_on(b, on), spec, t.clusters):
                    member, role = t.member(comp), b["role"]
                    yield (
                        {
                            "kind": f"{on}-binding",
                            "name": name,
                            "member": member,
                            "role": role,
                            "what": entry["what"],
                        },
                        {"account": comp, "name": name, "member": member, "role": role},
                    )


def _granted_on(b: Grant, on: str) -> str:
    """The resource a resource-level grant names under its kind's key (a topic role's ``topic``)."""
    name = b.get(on)
    if not isinstance(name, str):
        raise ValueError(f"iam.yaml: a {on} role names no {on}: {b}")
    return name


def _expand_agent_roles(entry: Entry, t: Target) -> Generated:
    """A Google service agent's roles on Pitstop's own accounts (iam.yaml service_agents)."""
    member = t.variables[f"{entry['agent']}_agent"]
    for b in t.iam["service_agents"][entry["agent"]].get("account_roles", []):
        name = sa_email(b["account"], t.project)
        binding: Entry = {
            "kind": "service-account-binding",
            "name": name,
            "member": member,
            "role": b["role"],
        }
        yield {**binding, "what": entry["what"]}, {"account": b["account"], "role": b["role"]}


EXPAND: dict[str, Callable[[Entry, Target], Generated]] = {
    "accounts": _expand_accounts,
    "scoped-roles": _expand_scoped_roles,
    "account-roles": _expand_account_roles,
    "agent-roles": _expand_agent_roles,
}


# -- the kinds: one builder per resource kind -------------------------------------------------


def _build(entry: Entry, t: Target) -> list[Step]:
    if entry.get("kind") not in KINDS:
        raise ValueError(f"{RESOURCES.name}: unknown kind {entry.get('kind')!r} in {entry}")
    return KINDS[entry["kind"]](entry, t)


def _crud(
    what: str,
    group: list[str],
    name: str,
    where: list[str],
    pre: Iterable[str] = (),
    post: Iterable[str] = (),
) -> Step:
    """A resource gcloud names on its command line: `group create|describe|delete name`."""
    return Step(
        what,
        [*group, "create", name, *pre, *where, *post],
        check=[*group, "describe", name, *where],
        delete=[*group, "delete", name, *where, "--quiet"],
    )


def _updatable(step: Step) -> Step:
    """The same step with `update` in place of `create`: rerunning converges instead of skipping."""
    verb = step.argv.index("create")
    step.update = [*step.argv[:verb], "update", *step.argv[verb + 1 :]]
    return step


def _apis(e: Entry, t: Target) -> list[Step]:
    return [Step(e.get("what", "enable APIs"), ["services", "enable", *e["names"], *t.at(e)])]


def _custom_role(e: Entry, t: Target) -> list[Step]:
    """The role, and first its restore: IAM keeps a deleted role's id for 37 days, so create fails."""
    role, p = e["name"], t.at(e)
    restore = Step(
        "restore the custom role if a teardown deleted it (IAM keeps its id for 37 days)",
        ["iam", "roles", "undelete", role, *p],
        check=["iam", "roles", "describe", role, *p, "--format=value(deleted)"],
        when="True",
    )
    create = _crud(e["what"], ["iam", "roles"], role, p, post=[f"--file={INFRA / e['file']}"])
    return [restore, _updatable(create)]


def _service_account(e: Entry, t: Target) -> list[Step]:
    """Created by its account id, then known by its email."""
    group, email = ["iam", "service-accounts"], sa_email(e["name"], t.project)
    create = [*group, "create", f"pitstop-{e['name']}", *t.p, f"--display-name={e['display']}"]
    where = [email, *t.p]
    return [
        Step(
            e["what"],
            create,
            check=[*group, "describe", *where],
            delete=[*group, "delete", *where, "--quiet"],
        )
    ]


def _topic(e: Entry, t: Target) -> list[Step]:
    return [_crud(e.get("what", f"topic {e['name']}"), ["pubsub", "topics"], e["name"], t.p)]


def _subscription(e: Entry, t: Target) -> list[Step]:
    pre = [f"--topic={e['topic']}", *e.get("flags", [])]
    return [_crud(e["what"], ["pubsub", "subscriptions"], e["name"], t.p, pre=pre)]


def _subscription_update(e: Entry, t: Target) -> list[Step]:
    return [Step(e["what"], ["pubsub", "subscriptions", "update", e["name"], *e["flags"], *t.p])]


def _secret(e: Entry, t: Target) -> list[Step]:
    """A secret; one that deploy ``generate``s is created with a random first value (written just
    before, into a private directory of this run: _write_generated), never shown or kept."""
    pre = ["--replication-policy=automatic"]
    if e.get("generate"):
        pre.append(f"--data-file={PRIVATE}/{e['name']}")
    return [_crud(e["what"], ["secrets"], e["name"], t.p, pre=pre)]


def _firestore_database(e: Entry, t: Target) -> list[Step]:
    """Pitstop's own database: never deleted by teardown (it holds the incidents) unless --purge.

    The purge deletes every collection Pitstop writes, the outbox included, and leaves the
    database (its id cannot be reused for a while after a delete).
    """
    db = f"--database={e['name']}"
    create = ["firestore", "databases", "create", db, f"--location={t.region}", "--type=firestore-native"]
    ids = [f"{t.prefix}_{c}" for c in e["collections"]] + list(e.get("subcollections", []))
    purge = ["firestore", "bulk-delete", db, f"--collection-ids={','.join(ids)}", *t.p, "--quiet"]
    check = ["firestore", "databases", "describe", db, *t.p]
    return [Step(e["what"], [*create, *t.p], check=check, purge=purge)]


def _firestore_ttl(e: Entry, t: Target) -> list[Step]:
    ttl = ["firestore", "fields", "ttls", "update", e["field"], f"--collection-group={e['collection_group']}"]
    db = f"--database={t.conf['firestore_database']}"
    return [Step(e["what"], [*ttl, db, "--enable-ttl", "--async", *t.p])]


def _binding(group: list[str]) -> Callable[[Entry, Target], list[Step]]:
    """`group add-iam-policy-binding`: on a topic, subscription, secret or service account."""

    def build(e: Entry, t: Target) -> list[Step]:
        grant = [f"--member={e['member']}", f"--role={e['role']}"]
        return [Step(e["what"], [*group, "add-iam-policy-binding", e["name"], *t.p, *grant])]

    return build


def _project_binding(e: Entry, t: Target) -> list[Step]:
    """Project-level: the only bindings teardown removes (the others go with their resource).

    With a condition, teardown removes exactly that conditional binding (gcloud matches it whole).
    """
    cond = e.get("condition")
    flag = "--condition=None"
    if cond:
        flag = f"--condition=expression={cond['expression']},title={cond['title']}"
    grant = [f"--member={e['member']}", f"--role={e['role']}", flag, "--quiet"]
    project = str(e.get("project") or t.project)
    return [
        Step(
            e["what"],
            ["projects", "add-iam-policy-binding", project, *grant],
            delete=["projects", "remove-iam-policy-binding", project, *grant],
        )
    ]


def _org_policy_check(e: Entry, t: Target) -> list[Step]:
    """Warn (never fail) when an organization policy Pitstop depends on is set against it."""
    argv = ["resource-manager", "org-policies", "describe", e["constraint"], *t.at(e), "--effective"]
    argv.append("--format=value(booleanPolicy.enforced)")
    return [Step(e["what"], argv, warn=e["warn"], when=e["when"])]


def _gke_node_pool_check(e: Entry, t: Target) -> list[Step]:
    """Warn about a GKE cluster's node pools that match `filter` (printed by name)."""
    where = [f"--cluster={e['cluster']}", f"--location={e['location']}", *t.at(e)]
    argv = ["container", "node-pools", "list", *where, f"--filter={e['filter']}", "--format=value(name)"]
    return [Step(e["what"], argv, warn=e["warn"])]


def _gke_kustomize(e: Entry, t: Target) -> list[Step]:
    """The kustomize base ``e["base"]`` (infra/gke: actuate's and ingest's RBAC, the admission policy,
    node-problem-detector) applied with ``kubectl apply -k`` in the cluster itself.

    gcloud writes the cluster's credentials (the caller's identity, not Pitstop's) into a private
    directory of this run; beside it an overlay names actuate's and ingest's accounts (Overlay).
    Teardown deletes the same objects with ``kubectl delete -k``.
    """
    name, loc, proj = e["cluster"], e["location"], str(e.get("project") or t.project)
    cluster = f"{WORKDIR}/{proj}.{loc}.{name}"
    accounts = {"actuator": sa_email("actuate", t.project), "ingest": sa_email("ingest", t.project)}
    return [
        Step(
            e["what"],
            ["apply", "-k", f"{cluster}.kustomize"],
            program="kubectl",
            env={"KUBECONFIG": f"{cluster}.kubeconfig"},
            overlay=Overlay(str(INFRA / e["base"]), accounts),
            credentials=["container", "clusters", "get-credentials", name, f"--location={loc}", *t.at(e)],
            delete=["delete", "-k", f"{cluster}.kustomize", "--ignore-not-found"],
        )
    ]


def _function_binding(e: Entry, t: Target) -> list[Step]:
    where = [e["name"], f"--region={t.region}", f"--member={e['member']}", *t.p]
    return [Step(e["what"], ["functions", "add-invoker-policy-binding", *where])]


def _env(env: Mapping[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in env.items())


def _secrets(e: Entry, t: Target) -> dict[str, str]:
    """The function's secrets (env -> secret), with those whose deploy.yaml key is set."""
    secrets = dict(e.get("secrets") or {})
    for key, more in (e.get("secrets_if") or {}).items():
        secrets.update(more if t.conf.get(key) else {})
    return secrets


SCALE_FLAGS: tuple[ScaleKey, ...] = ("concurrency", "cpu", "memory", "max_instances", "min_instances")


def scale_flags(e: Entry) -> list[str]:
    """A function's size as measured (resources.yaml ``scale``): each flag set, none left to a default.

    Left out, a gen2 function takes one request per instance on up to 100 instances: a storm
    spread over that many coalescers (README "Storms as deployed").
    """
    scale = e.get("scale") or {}
    missing = [k for k in SCALE_FLAGS if k not in scale]
    if missing:
        raise ValueError(f"function {e['name']}: scale sets no {', '.join(missing)} (infra/resources.yaml)")
    if int(scale["concurrency"]) > 1 and float(scale["cpu"]) < 1:
        raise ValueError(f"function {e['name']}: concurrency above 1 needs cpu 1 or more")
    return [f"--{k.replace('_', '-')}={scale[k]}" for k in SCALE_FLAGS]


def _function(e: Entry, t: Target) -> list[Step]:
    """A gen2 function from the staged source, labelled with a digest of its flags and source.

    A function that reads secrets is deployed with them only once each secret's latest version is
    enabled: Cloud Run resolves a secret environment variable before an instance starts and fails
    the revision, and the deploy, when it cannot (cloud.google.com/run/docs/configuring/services/
    secrets). deploy creates the operator's secrets empty, so until a version is added the function
    is deployed without them (notify then logs its pages, delivering none); the run after `gcloud
    secrets versions add` redeploys it with them (its flags, and digest, differ). A secret deploy
    ``generate``s has its version from its create on (an earlier step): bound, never waited for.
    """
    secrets = _secrets(e, t)
    generated = _generated_secrets(t)
    own = {k: v for k, v in secrets.items() if v in generated}
    waited = {k: v for k, v in secrets.items() if v not in generated}
    bound = _function_step(e, t, _secret_flags(secrets) if secrets else [])
    if not waited:
        return [bound]
    names = list(dict.fromkeys(waited.values()))
    latest = [
        ["secrets", "versions", "describe", "latest", f"--secret={n}", *t.p, "--format=value(state)"]
        for n in names
    ]
    bound.gate = Gate(latest, "ENABLED")
    waiting = _function_step(e, t, _secret_flags(own))
    waiting.what += f" without {', '.join(waited)}: add a version to {', '.join(names)}, deploy again"
    waiting.gate, waiting.delete = Gate(latest, "ENABLED", negate=True), None  # the bound step deletes it
    return [bound, waiting]  # one of the two runs


def _secret_flags(secrets: Mapping[str, str]) -> list[str]:
    """gcloud's flag for exactly these secrets (env -> secret, latest); none: any binding cleared
    (gcloud otherwise keeps one the function had; --set-secrets replaces them all)."""
    if not secrets:
        return ["--clear-secrets"]
    return [f"--set-secrets={','.join(f'{k}={v}:latest' for k, v in secrets.items())}"]


def _generated_secrets(t: Target) -> frozenset[str]:
    """The secrets this plan creates with a value of its own (``generate``: the notify key)."""
    return frozenset(
        e["name"] for e in _entries(_resources(), t, {}) if e.get("kind") == "secret" and e.get("generate")
    )


def _function_step(e: Entry, t: Target, secret_flags: list[str]) -> Step:
    fn, where = e["name"], [e["name"], "--gen2", f"--region={t.region}", *t.p]
    argv = [
        "functions",
        "deploy",
        fn,
        f"--entry-point={e['entry_point']}",
        *e.get("flags", []),
        *scale_flags(e),
    ]
    argv += secret_flags
    # functions-framework serves a Python function with THREADS threads: as many as the
    # concurrency Cloud Run sends it (cloud.google.com/functions/docs/configuring/concurrency).
    env = {**e["env"], "THREADS": e["scale"]["concurrency"]}
    argv += [f"--set-env-vars={_env(env)}", f"--service-account={sa_email(e['account'], t.project)}"]
    argv += ["--gen2", f"--runtime={t.conf['runtime']}", f"--region={t.region}", f"--source={t.source_dir}"]
    argv += ["--no-allow-unauthenticated", *t.p]
    digest = config_digest([a for a in argv if not a.startswith("--source=")], t.source)
    return Step(
        e.get("what", f"function {fn}"),
        [*argv, f"--update-labels={DIGEST_LABEL}={digest}"],
        check=["functions", "describe", *where, f"--format=value(labels.{DIGEST_LABEL})"],
        expect=digest,
        delete=["functions", "delete", *where, "--quiet"],
    )


def _workflow(e: Entry, t: Target) -> list[Step]:
    """The workflow as is from workflows/, labelled like a function."""
    name, source, env = e["name"], ROOT / e["source"], _env(e["env"])
    email, where = sa_email(e["account"], t.project), [e["name"], f"--location={t.region}"]
    digest = config_digest([t.project, t.region, env, email], _digest_files([source]))
    argv = ["workflows", "deploy", name, f"--source={source}", f"--location={t.region}"]
    argv += [f"--service-account={email}", f"--set-env-vars={env}", *e.get("flags", [])]
    return [
        Step(
            e.get("what", f"workflow {name}"),
            [*argv, f"--labels={DIGEST_LABEL}={digest}", *t.p],
            check=["workflows", "describe", *where, *t.p, f"--format=value(labels.{DIGEST_LABEL})"],
            expect=digest,
            delete=["workflows", "delete", *where, *t.p, "--quiet"],
        )
    ]


def _log_sink(e: Entry, t: Target) -> list[Step]:
    """A sink with its filter file; an aggregated one lives in its folder or organization."""
    sink, where = e["name"], t.sink_scope or t.p
    dest = f"pubsub.googleapis.com/projects/{t.project}/topics/{e['topic']}"
    pre = [dest, f"--log-filter={sinks.read_filter(e.get('filter_file') or sinks.SINK_FILTERS[sink])}"]
    step = _updatable(_crud(e.get("what", f"log sink {sink}"), ["logging", "sinks"], sink, where, pre))
    step.argv += ["--include-children"] if t.sink_scope else []
    return [step]


def _log_metric(e: Entry, t: Target) -> list[Step]:
    pre = [f"--config-from-file={_config_path(e)}"]
    return [_updatable(_crud(e["what"], ["logging", "metrics"], e["name"], t.p, pre))]


def _scheduler_job(e: Entry, t: Target) -> list[Step]:
    name, where = e["name"], [e["name"], f"--location={t.region}"]
    job = [*where, f"--schedule={e['schedule']}", f"--uri={e['uri']}", "--http-method=POST"]
    job += [f"--oidc-service-account-email={sa_email(e['account'], t.project)}", *t.p]
    return [
        Step(
            e.get("what", f"scheduler job {name}"),
            ["scheduler", "jobs", "create", "http", *job],
            check=["scheduler", "jobs", "describe", *where, *t.p],
            update=["scheduler", "jobs", "update", "http", *job],
            delete=["scheduler", "jobs", "delete", *where, *t.p, "--quiet"],
        )
    ]


def _by_title(group: list[str], flag: str) -> Callable[[Entry, Target], list[Step]]:
    """Monitoring objects get server-chosen ids: found (and updated, deleted) by display name."""

    def build(e: Entry, t: Target) -> list[Step]:
        path = INFRA / e["file"]
        title = json.loads(path.read_text())["displayName"]
        listed = [*t.p, f"--filter=displayName={json.dumps(title)}", "--format=value(name)"]
        return [
            Step(
                e["what"],
                [*group, "create", f"--{flag}={path}", *t.p],
                check=[*group, "list", *listed],
                update=[*group, "update", EXISTING, f"--{flag}={path}", *t.p],
                delete=[*group, "delete", EXISTING, *t.p, "--quiet"],
            )
        ]

    return build


def _monitoring_by_name(collection: str, display_name: str) -> list[str]:
    """Monitoring's own ids: a policy or channel is found again (each one) by its display name."""
    return [deploy_monitoring.API, "GET", collection, f"displayName={display_name}"]


def _alert_policy(e: Entry, t: Target) -> list[Step]:
    """An alert policy from its file, sent to `notification_channels` (with none, the file as is),
    or, for a telemetry policy, to its own `channel` (Pitstop's, learned at run time). In-process:
    gcloud has policies only in alpha (deploy_monitoring); an update replaces the whole policy
    (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/patch)."""
    path, api, collection = INFRA / e["file"], deploy_monitoring.API, f"projects/{t.project}/alertPolicies"
    channels = e.get("channel") or ",".join(notification_channels(t.conf))
    fields = [f"from={path}", *([f"notificationChannels={channels}"] if channels else [])]
    return [
        Step(
            e["what"],
            [api, "POST", collection, *fields],
            check=_monitoring_by_name(collection, json.loads(path.read_text())["displayName"]),
            update=[api, "PATCH", EXISTING, *fields],
            delete=[api, "DELETE", EXISTING],
        )
    ]


def _notification_channel(e: Entry, t: Target) -> list[Step]:
    """A Pub/Sub notification channel to a Pitstop topic, found again (and deleted) by its display
    name. In-process: gcloud has channels only in beta (deploy_monitoring)."""
    api, collection = deploy_monitoring.API, f"projects/{t.project}/notificationChannels"
    topic = f"projects/{t.project}/topics/{e['topic']}"
    return [
        Step(
            e["what"],
            [api, "POST", collection, f"displayName={e['name']}", "type=pubsub", f"labels.topic={topic}"],
            check=_monitoring_by_name(collection, e["name"]),
            delete=[api, "DELETE", EXISTING],
        )
    ]


def _eventarc_trigger(e: Entry, t: Target) -> list[Step]:
    """A further Pub/Sub trigger of a gen2 function (its Cloud Run service has the function's name)."""
    where = [e["name"], f"--location={t.region}", *t.p]
    argv = ["eventarc", "triggers", "create", *where, f"--destination-run-service={e['function']}"]
    argv += [f"--destination-run-region={t.region}", f"--event-filters=type={PUBSUB_PUBLISHED}"]
    argv += [f"--transport-topic=projects/{t.project}/topics/{e['topic']}"]
    argv += [f"--service-account={sa_email(e['account'], t.project)}"]
    return [
        Step(
            e["what"],
            argv,
            check=["eventarc", "triggers", "describe", *where],
            delete=["eventarc", "triggers", "delete", *where, "--quiet"],
        )
    ]


KINDS: dict[str, Callable[[Entry, Target], list[Step]]] = {
    "apis": _apis,
    "custom-role": _custom_role,
    "service-account": _service_account,
    "project-binding": _project_binding,
    "topic": _topic,
    "topic-binding": _binding(["pubsub", "topics"]),
    "subscription": _subscription,
    "subscription-update": _subscription_update,
    "subscription-binding": _binding(["pubsub", "subscriptions"]),
    "firestore-database": _firestore_database,
    "firestore-ttl": _firestore_ttl,
    "secret": _secret,
    "secret-binding": _binding(["secrets"]),
    "service-account-binding": _binding(["iam", "service-accounts"]),
    "function": _function,
    "function-binding": _function_binding,
    "workflow": _workflow,
    "log-sink": _log_sink,
    "log-metric": _log_metric,
    "scheduler-job": _scheduler_job,
    "dashboard": _by_title(["monitoring", "dashboards"], "config-from-file"),
    "alert-policy": _alert_policy,
    "notification-channel": _notification_channel,
    "eventarc-trigger": _eventarc_trigger,
    "org-policy-check": _org_policy_check,
    "gke-node-pool-check": _gke_node_pool_check,
    "gke-kustomize": _gke_kustomize,
}


# -- files gcloud reads that are derived, not kept in infra/ ------------------------------------


def _config_path(entry: Entry) -> Path:
    return Path(tempfile.gettempdir()) / str(entry["config_file"])


def _configs() -> dict[str, str]:
    """Each `config_file` of resources.yaml by its path, as JSON (a `filter_file` folded in)."""
    out = {}
    for e in _resources():
        if "config_file" in e:
            conf = {
                ("filter" if k == "filter_file" else k): sinks.read_filter(v) if k == "filter_file" else v
                for k, v in e["config"].items()
            }
            out[str(_config_path(e))] = json.dumps(conf, indent=2)
    return out


def write_config_files(argv: list[str]) -> None:
    """Write the derived files a command names, just before it runs (planning writes nothing).

    Replaced atomically, never written through: the path is in the shared temp directory.
    """
    for path, text in _configs().items():
        if any(a.endswith(f"={path}") for a in argv):
            fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".pitstop-")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)


# -- the function source --------------------------------------------------------------------

SHIPPED = (
    "main.py",
    "requirements.txt",
    "pitstop/__init__.py",
    "pitstop/core",
    "pitstop/services",
    "pitstop/adapters",
    "pitstop/plugins",
)
BUNDLED = {"pitstop/schemas": ROOT / "schemas", "pitstop/filters": INFRA / "filters"}  # data read at run time


def config_digest(argv: list[str], content: str) -> str:
    """A label value that changes when a deployment's flags or sources do (a rerun skips it otherwise)."""
    h = hashlib.sha256("\0".join(argv).encode())
    h.update(content.encode())
    return h.hexdigest()[:20]


def _digest_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _shipped(policy_path: str | None) -> dict[str, bytes]:
    """The function source, file by file (path in the upload -> content).

    An allow-list: only what the functions import or read at run time, so the CLI, the Slurm agent
    and the local stand-ins never ship, and nothing new ships by accident.
    """
    roots = {name: ROOT / "functions" / name for name in SHIPPED} | BUNDLED
    out: dict[str, bytes] = {}
    for name, src in roots.items():
        files = [src] if src.is_file() else sorted(f for f in src.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(src).parts
            if any(p == "__pycache__" or p.startswith(".") for p in rel) or f.suffix in (".pyc", ".pyo"):
                continue
            if name == "pitstop/plugins" and f.name == "local.py":  # a folder's local sink or stand-in
                continue
            out[str(PurePosixPath(name, *rel))] = f.read_bytes()
    out["policy.yaml"] = Path(policy_path).read_bytes() if policy_path else b"{}\n"  # {}: observe mode
    return out


def source_digest(policy_path: str | None) -> str:
    """sha256 over each staged file's path, NUL, content, NUL in path order: what stage_source writes.

    Computed without staging, so a dry run prints the same labels as a real run.
    """
    h = hashlib.sha256()
    for name, data in sorted(_shipped(policy_path).items()):
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def stage_source(policy_path: str | None, into: Path | None = None) -> Path:
    """The function source as gcloud uploads it: the shipped code, its data and the policy."""
    out = into or Path(tempfile.mkdtemp(prefix="pitstop-src-"))
    for name, data in _shipped(policy_path).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _gcloud(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gcloud", *argv], capture_output=True, text=True, check=False)


run_gcloud: Runner = _gcloud  # what a tool beside deploy runs gcloud with
_run: Runner = deploy_monitoring.runner(_gcloud, os.environ)  # deploy's: gcloud, and its REST calls


def runtime_values(project: str, region: str, sink_scope: list[str]) -> dict[str, list[str]]:
    """How to learn each value known only at run time: the gcloud command that prints it."""
    p = ["--project", project]

    def function(fn: str, field_path: str) -> list[str]:
        return [
            "functions",
            "describe",
            fn,
            "--gen2",
            f"--region={region}",
            *p,
            f"--format=value({field_path})",
        ]

    out = {"<project-number>": ["projects", "describe", project, "--format=value(projectNumber)"]}
    for fn in ("pitstop-actuate", "pitstop-sweep"):
        out[f"<{fn}-url>"] = function(fn, "serviceConfig.uri")
    for fn in ("pitstop-ingest", "pitstop-notify"):
        out[f"<{fn}-trigger>"] = function(fn, "eventTrigger.trigger")
        out[f"<{fn}-trigger-subscription>"] = [
            "eventarc",
            "triggers",
            "describe",
            f"<{fn}-trigger>",
            f"--location={region}",
            *p,
            "--format=value(transport.pubsub.subscription)",
        ]
    out["<pitstop-ingest-alerts-trigger-subscription>"] = [
        "eventarc",
        "triggers",
        "describe",
        "pitstop-ingest-alerts",
        f"--location={region}",
        *p,
        "--format=value(transport.pubsub.subscription)",
    ]
    out["<pitstop-alerts-channel>"] = _monitoring_by_name(
        f"projects/{project}/notificationChannels", ALERTS_CHANNEL
    )
    plugin_sinks = [e["name"] for e in _resources() if e.get("kind") == "log-sink" and "filter_file" in e]
    for sink in [
        *sinks.SINK_FILTERS,
        *plugin_sinks,
    ]:  # an aggregated sink lives in its folder or organization
        out[f"<{sink}-writer-identity>"] = ["logging", "sinks", "describe", sink, *sink_scope]
        out[f"<{sink}-writer-identity>"].append("--format=value(writerIdentity)")
    return out


def _captures(argv: list[str], learn: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The commands a step needs run first, including those its own commands depend on."""
    out: dict[str, list[str]] = {}
    todo = _placeholders(argv)
    while todo:
        ph = todo.pop()
        if ph in learn and ph not in out:
            out[ph] = learn[ph]
            todo += _placeholders(learn[ph])
    return out


def _learn(ph: str, step: Step, values: dict[str, str], run: Runner) -> str:
    if not values.get(ph) and ph in step.captures:
        argv = [
            _fill(a, {d: _learn(d, step, values, run) for d in _placeholders([a])}) for a in step.captures[ph]
        ]
        values[ph] = run(argv).stdout.strip()
    return values.get(ph, "")


Tool = Callable[[str, list[str], Mapping[str, str]], subprocess.CompletedProcess[str]]


def _tool(program: str, argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """A command other than plain gcloud: kubectl, or gcloud with its own KUBECONFIG."""
    return subprocess.run(
        [program, *argv], env={**os.environ, **env}, capture_output=True, text=True, check=False
    )


def _plain(step: Step) -> bool:
    return step.program == "gcloud" and not step.env and step.overlay is None and step.credentials is None


def _execute(
    step: Step, argv: list[str], values: Mapping[str, str], run: Runner, tool: Tool
) -> subprocess.CompletedProcess[str]:
    """One of the step's commands: plain gcloud through `run`, the rest (credentials first) through `tool`."""
    if _plain(step):
        return run(argv)
    env = {k: _fill(v, values) for k, v in step.env.items()}
    if step.credentials is not None:
        got = tool("gcloud", [_fill(a, values) for a in step.credentials], env)
        if got.returncode != 0:
            return got
    argv = [_fill(a, values) for a in argv]
    if step.overlay is not None:
        step.overlay.write(Path(argv[argv.index("-k") + 1]))
    return tool(step.program, argv, env)


@contextmanager
def _workdir(steps: list[Step]) -> Iterator[dict[str, str]]:
    """The run's values, with a private directory for kubeconfig files and generated secrets when
    a step needs one."""
    used = [
        ph for ph in (WORKDIR, PRIVATE) if any(ph in v for s in steps for v in [*s.env.values(), *s.argv])
    ]
    if not used:
        yield {}
        return
    path = tempfile.mkdtemp(prefix="pitstop-deploy-")  # 0700: credentials never land in shared /tmp
    try:
        yield dict.fromkeys(used, path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write_generated(argv: list[str], values: Mapping[str, str]) -> None:
    """A generated secret's first value, in the run's private directory, just before its create."""
    where = values.get(PRIVATE)
    for a in argv:
        if where and a.startswith(f"--data-file={where}/"):
            fd = os.open(a.split("=", 1)[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(GENERATED_BYTES))


def _warned(step: Step, res: subprocess.CompletedProcess[str]) -> str:
    """A check step's log line: ok, or a warning with what it found (or why it could not look)."""
    out = res.stdout.strip()
    if res.returncode != 0:
        return f"warning  {step.what}: could not check: {res.stderr.strip()[:300]}"
    if (out == step.when) if step.when is not None else bool(out):
        return f"warning  {step.what}: {step.warn}" + ("" if step.when else f": {' '.join(out.split())}")
    return f"ok       {step.what}"


def apply(
    steps: list[Step], run: Runner = _run, log: Callable[[str], None] = print, tool: Tool = _tool
) -> int:
    """Run the plan; a step whose check finds the resource is skipped, updated or redeployed."""
    with _workdir(steps) as values:
        for step in steps:
            if step.gate is not None and not _opens(step.gate, run):
                log(f"skipped  {step.what}")
                continue
            needed = [ph for ph in _placeholders([*step.argv, *(step.update or [])]) if ph != EXISTING]
            missing = [ph for ph in needed if not _learn(ph, step, values, run)]
            if missing:
                log(f"FAILED   {step.what}: could not learn {', '.join(missing)} from gcloud")
                return 1
            argv = [_fill(a, values) for a in step.argv]
            if step.warn is not None:
                log(_warned(step, run(argv)))
                continue
            found = _existing(step, run)
            if step.when is not None and found != step.when:
                log(f"skipped  {step.what}")
                continue
            if found is not None and step.when is None:
                if step.expect is not None and found == step.expect:
                    log(f"current  {step.what}")
                    continue
                if step.expect is None and step.update is None:
                    log(f"exists   {step.what}")
                    continue
                if step.update is not None:
                    existing = found.splitlines()[0]
                    argv = [_fill(a, {**values, EXISTING: existing}) for a in step.update]
            write_config_files(argv)
            _write_generated(argv, values)
            res = _execute(step, argv, values, run, tool)
            if res.returncode != 0:
                log(f"FAILED   {step.what}: {res.stderr.strip()[:500]}")
                return 1
            log(f"ok       {step.what}")
    return 0


def _opens(gate: Gate, run: Runner) -> bool:
    passed = all(run(c).stdout.strip() == gate.prints for c in gate.commands)
    return passed != gate.negate


def _existing(step: Step, run: Runner) -> str | None:
    """What the step's check printed, or None when the resource is not there."""
    if step.check is None:
        return None
    res = run(step.check)
    out = res.stdout.strip()
    return out if res.returncode == 0 and out else None


def _placeholders(argv: list[str]) -> list[str]:
    return [m for a in argv for m in re.findall(r"<[a-z0-9-]+>", a)]


def _fill(arg: str, values: Mapping[str, str]) -> str:
    for k, v in values.items():
        arg = arg.replace(k, v)
    return arg


def _shown(argv: list[str]) -> str:
    return (
        deploy_monitoring.line(argv, inline=True)
        if deploy_monitoring.is_api(argv)
        else shlex.join(["gcloud", *argv])
    )


def teardown_lines(steps: list[Step], purge: bool) -> list[str]:
    """What teardown runs, in its order, as shell lines (``teardown --dry-run``). ``<existing>`` stands
    for each name the step's check finds (the comment after it says how), a resource named only when
    it was created; with ``purge``, the data's bulk deletes come last."""
    out = []
    for step in reversed(steps):
        if step.delete is None:
            continue
        line = dataclasses.replace(step, argv=step.delete).line()
        if any(EXISTING in a for a in step.delete) and step.check is not None:
            line += f"  # {EXISTING}: each name `{_shown(step.check)}` prints"
        out.append(line)
    if purge:
        out += [shlex.join(["gcloud", *s.purge]) for s in steps if s.purge is not None]
    return out


def teardown(
    steps: list[Step],
    purge: bool,
    run: Runner = _run,
    log: Callable[[str], None] = print,
    tool: Tool = _tool,
) -> int:
    """Undo the plan in reverse; resources named only at creation are found through the step's check.

    Pitstop's Firestore data stays unless ``purge``: then every collection it writes is deleted
    (listed first), after everything that could write one is gone.
    """
    with _workdir(steps) as values:
        for step in reversed(steps):
            if step.delete is None:
                continue
            targets = [step.delete]
            if any(EXISTING in a for a in step.delete):
                found = _existing(step, run)
                names = found.splitlines() if found else []
                targets = [[_fill(a, {EXISTING: n}) for a in step.delete] for n in names]
            if not targets:
                log(f"absent   {step.what}")
            for argv in targets:
                res = _execute(step, argv, values, run, tool)
                log(("deleted  " if res.returncode == 0 else "absent   ") + step.what)
    for step in [s for s in steps if s.purge is not None] if purge else []:
        assert step.purge is not None
        ids = next(a for a in step.purge if a.startswith("--collection-ids=")).split("=", 1)[1]
        log(f"purging  {step.what}: collections {ids.replace(',', ', ')}")
        res = run(step.purge)
        if res.returncode != 0:
            log(f"FAILED   purge {step.what}: {res.stderr.strip()[:500]}")
            return 1
        log(f"purged   {step.what}")
    return 0
