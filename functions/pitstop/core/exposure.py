"""Who besides Pitstop can publish to its topics or write the logs its sinks select: a finding per
principal, with the risk in words (``pitstop doctor --project``; the table is infra/exposure.yaml).

Log content and topic messages are unauthenticated input (issue 21): Pitstop checks and corroborates
what they say, but the people who can write them are what a platform engineer should know and can
narrow. Pure: the IAM policies are read by tools/exposure.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypedDict

# An IAM policy as getIamPolicy answers it (``bindings``: role, members, condition); read field by
# field, anything else in it ignored.
IamPolicy = Mapping[str, object]


class TopicRisk(TypedDict):
    match: str  # a regular expression on the topic's name
    risk: str


class LogRisk(TypedDict):
    risk: str


class ExposureDoc(TypedDict):
    """infra/exposure.yaml."""

    publish_roles: list[str]
    log_write_roles: list[str]
    own_members: list[str]  # regular expressions; ``{project}`` is the project
    topics: list[TopicRisk]  # the first match names a topic's risk
    logs: LogRisk
    public_members: list[str]


class ExposureFinding(TypedDict):
    """One principal that can write what Pitstop reads: its grants, and what each lets it do."""

    member: str
    grants: list[str]  # "<role> on project P" / "<role> on topic T"
    risks: list[str]


class ExposureTable:
    """infra/exposure.yaml, compiled for one project."""

    def __init__(self, doc: ExposureDoc, project: str) -> None:
        self.publish_roles = frozenset(str(r) for r in doc["publish_roles"])
        self.log_roles = frozenset(str(r) for r in doc["log_write_roles"])
        self.own = [re.compile(str(p).replace("{project}", re.escape(project))) for p in doc["own_members"]]
        self.topics = [(re.compile(str(t["match"])), str(t["risk"])) for t in doc["topics"]]
        self.log_risk = str(doc["logs"]["risk"])
        self.public = frozenset(str(m) for m in doc["public_members"])

    def is_own(self, member: str) -> bool:
        return any(p.fullmatch(member) for p in self.own)

    def topic_risk(self, topic: str) -> str:
        return next(risk for pat, risk in self.topics if pat.fullmatch(topic))


def _grants(policy: IamPolicy, roles: frozenset[str]) -> Iterable[tuple[str, str, bool]]:
    """(member, role, conditional) for each binding of one of ``roles``."""
    bindings = policy.get("bindings")
    for b in bindings if isinstance(bindings, list) else []:
        if isinstance(b, Mapping) and b.get("role") in roles:
            for m in b.get("members") or []:
                yield str(m), str(b["role"]), bool(b.get("condition"))


def _risk(base: str, member: str, conditional: bool, table: ExposureTable) -> str:
    if member in table.public:
        base = f"anyone ({member}) {base}"
    return base + (" (under an IAM condition: check what it allows)" if conditional else "")


def exposure_findings(
    project: str,
    project_policy: IamPolicy,
    topic_policies: Mapping[str, IamPolicy],
    table: ExposureTable,
) -> list[ExposureFinding]:
    """One finding per principal beyond Pitstop's own identities that can write logs in the project
    or publish to one of Pitstop's topics (on the project, which covers every topic, or on a topic)."""
    found: dict[str, ExposureFinding] = {}

    def add(member: str, grant: str, risk: str) -> None:
        if table.is_own(member):
            return
        f = found.setdefault(member, {"member": member, "grants": [], "risks": []})
        if grant not in f["grants"]:
            f["grants"].append(grant)
        if risk not in f["risks"]:
            f["risks"].append(risk)

    where = f"project {project}"
    for member, role, cond in _grants(project_policy, table.log_roles):
        add(member, f"{role} on {where}", _risk(table.log_risk, member, cond, table))
    for member, role, cond in _grants(project_policy, table.publish_roles):
        for topic in sorted(topic_policies):
            add(member, f"{role} on {where}", _risk(table.topic_risk(topic), member, cond, table))
    for topic, policy in sorted(topic_policies.items()):
        for member, role, cond in _grants(policy, table.publish_roles):
            add(member, f"{role} on topic {topic}", _risk(table.topic_risk(topic), member, cond, table))
    return sorted(found.values(), key=lambda f: f["member"])


def finding_line(f: ExposureFinding) -> str:
    """What ``pitstop doctor`` prints for one principal."""
    return f"{f['member']} ({', '.join(f['grants'])}): " + "; ".join(f["risks"])
