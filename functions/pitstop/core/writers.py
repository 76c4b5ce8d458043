"""Who can write each of Pitstop's inputs: the principals whose roles carry a permission the input's
writer needs (schemas/inputs.yaml ``writes``), on the project, inherited from its folders and
organization, or on the input's own topic.

Pure: tools/exposure.py reads the IAM policies (getAncestry, getIamPolicy) and the custom roles;
the predefined roles come from schemas/iam-roles.yaml. Inputs written under Kubernetes RBAC, by
root on a node or by Google alone are named with their scope: IAM cannot say who those are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pitstop.core.inputs import Input, topics_of

IamPolicy = Mapping[str, object]  # as getIamPolicy answers it: bindings of role, members, condition
CUSTOM_ROLE = re.compile(r"(?:projects|organizations)/[^/]+/roles/[A-Za-z0-9_.]+")
IAM_SCOPES = frozenset({"project", "topic"})


@dataclass(frozen=True)
class Policy:
    """One IAM policy and where it was read (``project P``, ``folder 123 (inherited)``, ``topic T``)."""

    where: str
    doc: IamPolicy


@dataclass(frozen=True)
class Roles:
    """Role -> the permissions it carries, for the permissions the inputs need: predefined roles
    from schemas/iam-roles.yaml, custom roles as IAM's roles.get answered (None: not readable)."""

    predefined: Mapping[str, frozenset[str]]  # permission -> the predefined roles that carry it
    custom: Mapping[str, frozenset[str] | None] = field(default_factory=dict)

    def carries(self, role: str, permission: str) -> bool | None:
        """True/False; None for a custom role whose permissions could not be read."""
        if CUSTOM_ROLE.fullmatch(role):
            got = self.custom.get(role)
            return None if got is None else permission in got
        return role in self.predefined.get(permission, frozenset())


@dataclass(frozen=True)
class Writer:
    member: str
    role: str
    permission: str
    where: str
    conditional: bool
    own: bool  # Pitstop's own account or a Google agent acting for it


@dataclass(frozen=True)
class InputWriters:
    """One input, and who can write it."""

    input: Input
    writers: tuple[Writer, ...]
    unread_roles: tuple[str, ...] = ()  # custom roles of a binding that could not be read
    beyond_iam: tuple[str, ...] = ()  # "<permission> (<scope>)" writers IAM does not name

    @property
    def others(self) -> tuple[Writer, ...]:
        return tuple(w for w in self.writers if not w.own)


def custom_roles(policies: Iterable[Policy]) -> set[str]:
    """The custom roles the policies bind: the ones to read through IAM."""
    return {b[1] for p in policies for b in _bindings(p.doc) if CUSTOM_ROLE.fullmatch(b[1])}


def _bindings(policy: IamPolicy) -> Iterable[tuple[str, str, bool]]:
    """(member, role, conditional) of each binding."""
    got = policy.get("bindings")
    for b in got if isinstance(got, list) else []:
        if isinstance(b, Mapping) and isinstance(b.get("role"), str):
            for m in b.get("members") or []:
                yield str(m), str(b["role"]), bool(b.get("condition"))


def input_writers(
    inp: Input,
    project: list[Policy],
    topics: Mapping[str, Policy],
    roles: Roles,
    own: re.Pattern[str],
    clusters: list[str],
) -> InputWriters:
    """Who can write ``inp``: ``project`` is the project's policy and its ancestors'; ``topics`` each
    topic's own policy (absent: not deployed); ``own`` matches Pitstop's own members."""
    found: dict[tuple[str, str, str, str], Writer] = {}
    unread: set[str] = set()
    beyond = [f"{w['permission']} ({w['scope']})" for w in inp["writes"] if w["scope"] not in IAM_SCOPES]
    for w in (w for w in inp["writes"] if w["scope"] in IAM_SCOPES):
        where = list(project)
        if w["scope"] == "topic":
            where += [topics[t] for t in topics_of(inp, clusters) if t in topics]
        for pol in where:
            for member, role, cond in _bindings(pol.doc):
                carries = roles.carries(role, w["permission"])
                if carries is None:
                    unread.add(role)
                elif carries:
                    key = (member, role, w["permission"], pol.where)
                    found[key] = Writer(
                        member, role, w["permission"], pol.where, cond, bool(own.fullmatch(member))
                    )
    writers = tuple(sorted(found.values(), key=lambda x: (x.own, x.member, x.where)))
    return InputWriters(inp, writers, tuple(sorted(unread)), tuple(beyond))


def own_members(patterns: Iterable[str], project: str) -> re.Pattern[str]:
    """One pattern for Pitstop's own members in ``project`` (schemas/iam-roles.yaml own_members)."""
    return re.compile("|".join(f"(?:{p.replace('{project}', re.escape(project))})" for p in patterns))


def writer_line(w: Writer, public: frozenset[str]) -> str:
    """One principal that can write an input, as the doctor prints it."""
    who = f"anyone ({w.member})" if w.member in public else w.member
    tags = [
        t for t, on in (("Pitstop's own", w.own), ("conditional: check what it allows", w.conditional)) if on
    ]
    return f"{who}: {w.permission} by {w.role} on {w.where}" + (f" [{'; '.join(tags)}]" if tags else "")
