"""Who can write each input Pitstop reads, through gcloud: the IAM policies of the project, of its
folders and organization (``projects get-ancestors``, inherited roles included) and of each of
Pitstop's topics, custom roles read with ``iam roles describe``; judged by core/writers.py
against the threat model (schemas/inputs.yaml) and the predefined roles (schemas/iam-roles.yaml).
For ``pitstop doctor --project`` and the end of a deploy."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import yaml

from pitstop.core import inputs, resources
from pitstop.core.writers import (
    InputWriters,
    Policy,
    Roles,
    custom_roles,
    input_writers,
    own_members,
    writer_line,
)
from pitstop.tools import deploy

ROLES_FILE = "iam-roles.yaml"


class ExposureError(Exception):
    """An IAM policy could not be read (no permission, no project): what gcloud said."""


def pitstop_topics(conf: deploy.Conf) -> list[str]:
    """The topics deploy creates (infra/resources.yaml), one set per Slurm cluster for theirs."""
    clusters = deploy.slurm_clusters(conf)
    return [*deploy.TOPICS, *(t.format(cluster=c) for c in clusters for t in deploy.CLUSTER_TOPICS)]


@dataclass(frozen=True)
class RoleDoc:
    predefined: dict[str, frozenset[str]]  # permission -> roles
    own: list[str]
    public: frozenset[str]


def role_doc() -> RoleDoc:
    doc = yaml.safe_load((resources.schema_dir() / ROLES_FILE).read_text())
    perms = {str(p): frozenset(str(r) for r in roles) for p, roles in doc["permissions"].items()}
    return RoleDoc(perms, [str(p) for p in doc["own_members"]], frozenset(map(str, doc["public_members"])))


def _json(run: deploy.Runner, argv: list[str]) -> object | None:
    """What gcloud printed as JSON; None when the resource is not there (a topic not deployed)."""
    res = run([*argv, "--format=json"])
    if res.returncode != 0:
        if "NOT_FOUND" in res.stderr or "not found" in res.stderr.lower():
            return None
        raise ExposureError(f"gcloud {' '.join(argv)}: {res.stderr.strip()[:300]}")
    doc: object = json.loads(res.stdout or "null")
    return doc


def _policy(run: deploy.Runner, argv: list[str]) -> Mapping[str, object] | None:
    doc = _json(run, argv)
    return doc if isinstance(doc, dict) else (None if doc is None else {})


ANCESTOR_POLICY = {  # an ancestor's type -> how gcloud reads its IAM policy
    "folder": ["resource-manager", "folders", "get-iam-policy"],
    "organization": ["organizations", "get-iam-policy"],
}


def project_policies(project: str, run: deploy.Runner) -> list[Policy]:
    """The project's policy, then each ancestor's (its folders, its organization): all count."""
    own = _policy(run, ["projects", "get-iam-policy", project])
    if own is None:
        raise ExposureError(f"project {project} not found")
    out = [Policy(f"project {project}", own)]
    ancestors = _json(run, ["projects", "get-ancestors", project])
    for a in ancestors if isinstance(ancestors, list) else []:
        kind, ident = (str(a.get("type")), str(a.get("id"))) if isinstance(a, dict) else ("", "")
        if kind in ANCESTOR_POLICY:
            got = _policy(run, [*ANCESTOR_POLICY[kind], ident])
            out.append(Policy(f"{kind} {ident} (inherited)", got or {}))
    return out


def custom_role_permissions(names: set[str], run: deploy.Runner) -> dict[str, frozenset[str] | None]:
    """Each custom role's permissions (``iam roles describe``); None when it cannot be read."""
    out: dict[str, frozenset[str] | None] = {}
    for name in sorted(names):
        parent, _, role = name.partition("/roles/")
        kind, ident = parent.split("/", 1)
        flag = "--project" if kind == "projects" else "--organization"
        try:
            doc = _json(run, ["iam", "roles", "describe", role, flag, ident])
        except ExposureError:
            doc = None
        perms = doc.get("includedPermissions") if isinstance(doc, dict) else None
        out[name] = frozenset(map(str, perms)) if isinstance(perms, list) else None
    return out


def read_writers(project: str, conf: deploy.Conf, run: deploy.Runner) -> list[InputWriters]:
    """For each input of the threat model (planned ones aside), who can write it in ``project``."""
    roles = role_doc()
    policies = project_policies(project, run)
    topics: dict[str, Policy] = {}
    for topic in pitstop_topics(conf):
        got = _policy(run, ["pubsub", "topics", "get-iam-policy", topic, "--project", project])
        if got is not None:
            topics[topic] = Policy(f"topic {topic}", got)
    custom = custom_role_permissions(custom_roles([*policies, *topics.values()]), run)
    table, own = Roles(roles.predefined, custom), own_members(roles.own, project)
    clusters = deploy.slurm_clusters(conf)
    model = inputs.model()
    return [
        input_writers(i, policies, topics, table, own, clusters)
        for i in model["inputs"]
        if i.get("status") != "planned"
    ]


def report(
    project: str,
    conf: deploy.Conf,
    run: deploy.Runner = deploy.run_gcloud,
    log: Callable[[str], None] = print,
    every: bool = False,
) -> int:
    """Print who can write Pitstop's inputs; the number of principals beyond Pitstop's own that can,
    -1 if the policies could not be read. ``every`` (the doctor): each input with all its writers;
    else (the end of a deploy) a ``finding`` line per principal beyond Pitstop's own."""
    try:
        found = read_writers(project, conf, run)
    except ExposureError as exc:
        log(f"warning  who can write what Pitstop reads: could not check: {exc}")
        return -1
    public = role_doc().public
    others: dict[str, set[str]] = {}
    for iw in found:
        for w in iw.others:
            others.setdefault(w.member, set()).add(iw.input["id"])
        if every:
            _section(iw, public, log)
    if not every:
        for member, ids in sorted(others.items()):
            who = f"anyone ({member})" if member in public else member
            log(f"finding  {who} can write {', '.join(sorted(ids))} (pitstop doctor --project {project})")
    if not others:
        log(f"ok       only Pitstop's own identities can write its inputs in {project}")
    return len(others)


def _section(iw: InputWriters, public: frozenset[str], log: Callable[[str], None]) -> None:
    inp = iw.input
    log(f"input    {inp['id']}: {inp['what']} (alone: {inp['alone']})")
    for w in iw.writers:
        log(f"  writer {writer_line(w, public)}")
    for role in iw.unread_roles:
        log(f"  check  custom role {role} could not be read: it may carry a writer's permission")
    for b in iw.beyond_iam:
        log(f"  also   {b}: not in IAM (see the threat model, docs/security.md)")
