"""The XID, SXid and system-event policies loaded from schemas/, and the pure decision on one event."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, cast

from pitstop.core import resources
from pitstop.core.actions import Action
from pitstop.core.domain import XidDetail
from pitstop.core.nvlink import Nvlink5Table, Verdict, Xid74Table
from pitstop.core.policy_types import DecodeDoc, RefineIf, SxidDoc, SystemEventsDoc, XidPolicyDoc

ANY = "any"  # in a refine clause: the detail key is present


@dataclass(frozen=True)
class Refinement:
    when: RefineIf
    action: str | None
    reason: str | None

    def matches(self, detail: XidDetail) -> bool:
        for key, want in self.when.items():
            have = detail.get(key)  # the schema allows only XidDetail's keys
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
    decode: str | None = None  # a table of ``decode:`` that decides before ``refine``
    tie: str | None = None  # how the engine relates it to other lines of its GPU (TIES)


TIE_PRIMARY = "primary"  # a secondary line naming its primary Xid (45)
TIE_RECOVERY = "recovery"  # the driver's recovery verdict for the GPU (154)


class Decision(NamedTuple):
    """An action and why (one per classified line: a tuple, cheaper to make than a frozen dataclass)."""

    action: str
    reason: str
    anomaly: str | None = None  # what a decode table did not know (the rule decided instead)
    decoded: bool | None = None  # a decode table decided (True) or fell back (False); None: no table


@dataclass(frozen=True)
class Repeat:
    within_h: float
    action: str
    reason: str


@dataclass(frozen=True)
class SxidPolicy:
    """NVSwitch SXid: the action by severity; a repeat of a fatal one on a node escalates."""

    fatal: Decision
    non_fatal: Decision
    unknown: Decision
    repeat: Repeat | None
    lemon: bool  # a non-fatal episode counts toward the node's lemon tally

    @classmethod
    def from_doc(cls, doc: SxidDoc) -> SxidPolicy:
        f, nf, u = doc["fatal"], doc["non_fatal"], doc["unknown"]
        rep = f.get("repeat")
        return cls(
            Decision(f["action"], f["reason"]),
            Decision(nf["action"], nf["reason"]),
            Decision(u["action"], u["reason"]),
            Repeat(float(rep["within_h"]), rep["action"], rep["reason"]) if rep else None,
            bool(nf.get("counts_toward_lemon", False)),
        )

    def decide(self, severity: str | None) -> Decision:
        return {"fatal": self.fatal, "non_fatal": self.non_fatal}.get(severity or "", self.unknown)


def _rules(doc: XidPolicyDoc, bucket_action: Callable[[str, str], str]) -> dict[int, XidRule]:
    rules: dict[int, XidRule] = {}
    for i, r in enumerate(doc["rules"]):
        action = r.get("action") or bucket_action(r["bucket"], f"rules/{i}")
        bucket_action(r["bucket"], f"rules/{i}")
        refine = tuple(Refinement(c["if"], c.get("action"), c.get("reason")) for c in r.get("refine", ()))
        for code in r["codes"]:
            if code in rules:
                raise resources.DataFileError(f"xid policy: rules/{i}: Xid {code} is listed twice")
            rules[code] = XidRule(
                code, r["name"], r["bucket"], action, r["reason"], r.get("app_fault", False), refine,
                r.get("decode"), r.get("tie"),
            )  # fmt: skip
    return rules


def _decoders(doc: DecodeDoc) -> dict[str, Callable[[XidDetail], Verdict | None]]:
    try:
        return {
            "xid74": Xid74Table.from_doc(doc["xid74"]).decode,
            "nvlink5": Nvlink5Table.from_doc(doc["nvlink5"]).decode,
        }
    except ValueError as exc:
        raise resources.DataFileError(f"xid policy: decode: {exc}") from exc


@dataclass(frozen=True)
class XidPolicy:
    rules: Mapping[int, XidRule]
    unknown: XidRule
    recovery: Mapping[int, Decision]
    recovery_unknown: Decision
    overrides: Mapping[int, str] = field(default_factory=dict)
    gpu_unknown: Mapping[str, str] = field(default_factory=dict)
    device_plugin_xids: frozenset[int] = frozenset()
    decoders: Mapping[str, Callable[[XidDetail], Verdict | None]] = field(default_factory=dict)
    sxid: SxidPolicy | None = None

    @classmethod
    def from_doc(cls, doc: XidPolicyDoc) -> XidPolicy:
        buckets: Mapping[str, str] = doc["buckets"]

        def bucket_action(bucket: str, where: str) -> str:
            if bucket not in buckets:
                raise resources.DataFileError(f"xid policy: {where}: bucket {bucket!r} is not in buckets")
            return buckets[bucket]

        u = doc["unknown"]
        unknown = XidRule(0, u["name"], u["bucket"], bucket_action(u["bucket"], "unknown"), u["reason"])
        recovery = {int(k): Decision(v["action"], v["reason"]) for k, v in doc["recovery_actions"].items()}
        ru = doc["recovery_unknown"]
        return cls(
            _rules(doc, bucket_action),
            unknown,
            recovery,
            Decision(ru["action"], ru["reason"]),
            gpu_unknown=dict(doc["gpu_unknown"]),
            device_plugin_xids=frozenset(doc["gke_device_plugin_xids"]),
            decoders=_decoders(doc["decode"]),
            sxid=SxidPolicy.from_doc(doc["sxid"]),
        )

    def with_overrides(self, overrides: Mapping[int, str]) -> XidPolicy:
        """Operator overrides from policy.yaml: the named code always yields that action."""
        return dataclasses.replace(self, overrides=dict(overrides))

    def rule(self, xid: int) -> XidRule:
        return self.rules.get(xid) or self.unknown

    def codes_tied(self, tie: str) -> frozenset[int]:
        """The codes whose rule names this ``tie`` (the engine's per-GPU relations)."""
        return frozenset(c for c, r in self.rules.items() if r.tie == tie)

    def repeat_for(self, kind: str) -> Repeat | None:
        """The escalation a repeat of this kind of fault on one node gets, if its policy names one."""
        return self.sxid.repeat if kind == SXID_KIND and self.sxid is not None else None

    def decide(self, xid: int, detail: XidDetail) -> Decision:
        rule = self.rule(xid)
        head = f"Xid {xid} {rule.name}" if rule is not self.unknown else f"Xid {xid}"
        if xid in self.overrides:
            return Decision(self.overrides[xid], f"{head}: action set by policy override")
        if rule.tie == TIE_RECOVERY and "recovery_to" in detail:
            rec = self.recovery.get(detail["recovery_to"], self.recovery_unknown)
            return Decision(rec.action, f"{head}: code 0x{detail['recovery_to']:x}: {rec.reason}")
        anomaly, decoded = None, None
        if rule.decode is not None:
            verdict = self.decoders[rule.decode](detail)
            if verdict is not None and verdict.action is not None:
                return Decision(verdict.action, f"{head}: {verdict.why}", decoded=True)
            if verdict is not None:
                anomaly, decoded = verdict.why, False
        for ref in rule.refine:
            if ref.matches(detail):
                return Decision(
                    ref.action or rule.action, f"{head}: {ref.reason or rule.reason}", anomaly, decoded
                )
        return Decision(rule.action, f"{head}: {rule.reason}", anomaly, decoded)


SXID_KIND = "nvswitch_sxid"


@dataclass(frozen=True)
class SystemEventRule:
    kind: str
    action: str
    reason: str
    completed: Decision | None


def load_system_events(path: Path | None = None) -> dict[str, SystemEventRule]:
    loaded = resources.load_yaml(
        path or resources.schema_dir() / "system-events.yaml", "system-events.schema.json"
    )
    doc = cast(SystemEventsDoc, loaded)  # the schema checked it
    out: dict[str, SystemEventRule] = {}
    for method, r in doc["methods"].items():
        c = r.get("completed")
        out[method] = SystemEventRule(
            r["kind"], r["action"], r["reason"], Decision(c["action"], c["reason"]) if c else None
        )
    return out


def load_xid_policy(path: Path | None = None) -> XidPolicy:
    doc = resources.load_yaml(path or resources.schema_dir() / "xid-policy.yaml", "xid-policy.schema.json")
    return XidPolicy.from_doc(cast(XidPolicyDoc, doc))  # the schema checked it


@functools.cache
def default_xid_policy() -> XidPolicy:
    return load_xid_policy()


@functools.cache
def default_system_events() -> dict[str, SystemEventRule]:
    return load_system_events()


__all__ = [
    "SXID_KIND",
    "Action",
    "Decision",
    "Repeat",
    "SxidPolicy",
    "SystemEventRule",
    "XidPolicy",
    "XidRule",
    "load_system_events",
    "load_xid_policy",
]
