"""The XID and system-event policies loaded from schemas/, and the pure decision on one event."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.core import resources
from pitstop.core.actions import Action

ANY = "any"  # in a refine clause: the detail key is present


@dataclass(frozen=True)
class Refinement:
    when: Mapping[str, Any]
    action: str | None
    reason: str | None

    def matches(self, detail: Mapping[str, Any]) -> bool:
        for key, want in self.when.items():
            have = detail.get(key)
            if want == ANY:
                if have is None:
                    return False
            elif isinstance(want, list):
                if have not in want:
                    return False
            elif have != want or have is None:
                return False
        return True


@dataclass(frozen=True)
class XidRule:
    code: int
    name: str
    bucket: str
    action: str
    reason: str
    app_fault: bool = False
    refine: tuple[Refinement, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: str
    reason: str


@dataclass(frozen=True)
class XidPolicy:
    rules: Mapping[int, XidRule]
    unknown: XidRule
    recovery: Mapping[int, Decision]
    recovery_unknown: Decision
    overrides: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> XidPolicy:
        buckets: Mapping[str, str] = doc["buckets"]

        def bucket_action(bucket: str, where: str) -> str:
            if bucket not in buckets:
                raise resources.DataFileError(f"xid policy: {where}: bucket {bucket!r} is not in buckets")
            return buckets[bucket]

        rules: dict[int, XidRule] = {}
        for i, r in enumerate(doc["rules"]):
            action = r.get("action") or bucket_action(r["bucket"], f"rules/{i}")
            bucket_action(r["bucket"], f"rules/{i}")
            refine = tuple(Refinement(c["if"], c.get("action"), c.get("reason")) for c in r.get("refine", ()))
            for code in r["codes"]:
                if code in rules:
                    raise resources.DataFileError(f"xid policy: rules/{i}: Xid {code} is listed twice")
                rules[code] = XidRule(
                    code, r["name"], r["bucket"], action, r["reason"], r.get("app_fault", False), refine
                )
        u = doc["unknown"]
        unknown = XidRule(0, u["name"], u["bucket"], bucket_action(u["bucket"], "unknown"), u["reason"])
        recovery = {int(k): Decision(v["action"], v["reason"]) for k, v in doc["recovery_actions"].items()}
        ru = doc["recovery_unknown"]
        return cls(rules, unknown, recovery, Decision(ru["action"], ru["reason"]))

    def with_overrides(self, overrides: Mapping[int, str]) -> XidPolicy:
        """Operator overrides from policy.yaml: the named code always yields that action."""
        return XidPolicy(self.rules, self.unknown, self.recovery, self.recovery_unknown, dict(overrides))

    def rule(self, xid: int) -> XidRule:
        return self.rules.get(xid) or self.unknown

    def decide(self, xid: int, detail: Mapping[str, Any]) -> Decision:
        rule = self.rule(xid)
        head = f"Xid {xid} {rule.name}" if rule is not self.unknown else f"Xid {xid}"
        if xid in self.overrides:
            return Decision(self.overrides[xid], f"{head}: action set by policy override")
        if xid == 154 and "recovery_to" in detail:
            rec = self.recovery.get(detail["recovery_to"], self.recovery_unknown)
            return Decision(rec.action, f"{head}: code 0x{detail['recovery_to']:x}: {rec.reason}")
        for ref in rule.refine:
            if ref.matches(detail):
                return Decision(ref.action or rule.action, f"{head}: {ref.reason or rule.reason}")
        return Decision(rule.action, f"{head}: {rule.reason}")


@dataclass(frozen=True)
class SystemEventRule:
    kind: str
    action: str
    reason: str
    completed: Decision | None


def load_system_events(path: Path | None = None) -> dict[str, SystemEventRule]:
    doc = resources.load_yaml(
        path or resources.schema_dir() / "system-events.yaml", "system-events.schema.json"
    )
    out: dict[str, SystemEventRule] = {}
    for method, r in doc["methods"].items():
        c = r.get("completed")
        out[method] = SystemEventRule(
            r["kind"], r["action"], r["reason"], Decision(c["action"], c["reason"]) if c else None
        )
    return out


def load_xid_policy(path: Path | None = None) -> XidPolicy:
    doc = resources.load_yaml(path or resources.schema_dir() / "xid-policy.yaml", "xid-policy.schema.json")
    return XidPolicy.from_doc(doc)


@functools.cache
def default_xid_policy() -> XidPolicy:
    return load_xid_policy()


@functools.cache
def default_system_events() -> dict[str, SystemEventRule]:
    return load_system_events()


__all__ = [
    "Action",
    "Decision",
    "SystemEventRule",
    "XidPolicy",
    "XidRule",
    "load_system_events",
    "load_xid_policy",
]
