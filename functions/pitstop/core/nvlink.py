"""NVLink error decodes: Xid 74's registers and NVLink5's (Xid 144-150) unit and status.

Pure lookups in the tables of schemas/xid-policy.yaml (``decode:``), which transcribe NVIDIA's
Xid catalog (WORKFLOW_NVLINK_ERR and the "Xid 144-150 Decode" sheet). A decode answers with
an action and why, or says which part of the line the table does not know (``action`` None):
the caller then falls back to the code's own rule and flags the event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pitstop.core.actions import RANK
from pitstop.core.domain import XidDetail
from pitstop.core.policy_types import Layouts, Nvlink5Doc, Nvlink5UnitDoc, PromoteDoc, Xid74Doc


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str | None  # None: the table does not know this combination
    why: str


def set_bits(value: int) -> list[int]:
    """The positions of the bits set in ``value``, lowest first."""
    return [b for b in range(value.bit_length()) if value >> b & 1]


def _strongest(found: list[tuple[str, str]]) -> tuple[str, str]:
    """The (action, why) pair with the most disruptive action (the first of equals)."""
    return max(found, key=lambda f: RANK[f[0]])


@dataclass(frozen=True)
class Xid74Table:
    """NV-CAT WORKFLOW_NVLINK_ERR: each register bit belongs to a class with an action."""

    classes: Mapping[str, tuple[str, str]]  # class -> (action, reason)
    bits: Mapping[int, Mapping[int, str]]  # register index -> bit -> class

    @classmethod
    def from_doc(cls, doc: Xid74Doc) -> Xid74Table:
        classes = {k: (v["action"], v["reason"]) for k, v in doc["classes"].items()}
        bits: dict[int, dict[int, str]] = {}
        for reg, by_class in doc["registers"].items():
            for klass, positions in by_class.items():
                if klass not in classes:
                    raise ValueError(f"xid74 register {reg}: class {klass!r} is not in classes")
                bits.setdefault(int(reg[1:]), {}).update(dict.fromkeys(positions, klass))
        return cls(classes, bits)

    def decode(self, detail: XidDetail) -> Verdict | None:
        """None when the line printed no registers (older drivers): nothing to decode."""
        regs = detail.get("registers")
        if not regs:
            return None
        found: list[tuple[str, str]] = []
        for i, text in enumerate(regs):
            known = self.bits.get(i, {})
            for bit in set_bits(int(text, 16)):
                klass = known.get(bit)
                if klass is None:
                    return Verdict(None, f"Xid 74 R{i} bit {bit} is not in NVIDIA's NVLink error decode")
                action, reason = self.classes[klass]
                found.append((action, f"{reason} (R{i} bit {bit})"))
        if not found:
            return Verdict(None, "Xid 74 registers carry no error bit to decode")
        return Verdict(*_strongest(found))


@dataclass(frozen=True)
class Nvlink5Unit:
    status: Mapping[int, str]
    exact: bool = False
    any: str | None = None
    reason: Mapping[int, str] | None = None
    subcode: Layouts | None = None
    promote: PromoteDoc | None = None

    @classmethod
    def from_doc(cls, u: Nvlink5UnitDoc) -> Nvlink5Unit:
        def flat(by_bucket: Mapping[str, list[int]] | None) -> dict[int, str]:
            return {v: bucket for bucket, values in (by_bucket or {}).items() for v in values}

        reason = flat(u["reason"]) if "reason" in u else None
        return cls(
            flat(u.get("status")),
            u.get("exact", False),
            u.get("any"),
            reason,
            u.get("subcode"),
            u.get("promote"),
        )

    def layout(self, intr: int) -> Literal["v1", "v2"] | None:
        """v1 (before R575: subcode in intrInfo[9:5]) or v2 (R575 on: intrInfo[6:0]), if either fits."""
        if self.subcode is None:
            return None
        if intr & 0x7F == self.subcode["v2"]:
            return "v2"
        if intr >> 5 & 0x1F == self.subcode["v1"]:
            return "v1"
        return None


@dataclass(frozen=True)
class Nvlink5Table:
    """NV-CAT "Xid 144-150 Decode": (unit, error status or link-down reason) -> bucket -> action."""

    actions: Mapping[str, str]
    units: Mapping[str, Nvlink5Unit]

    @classmethod
    def from_doc(cls, doc: Nvlink5Doc) -> Nvlink5Table:
        units: dict[str, Nvlink5Unit] = {}
        for u in doc["units"]:
            row = Nvlink5Unit.from_doc(u)
            buckets = {
                *row.status.values(),
                *(row.reason or {}).values(),
                row.any,
                row.promote["to"] if row.promote else None,
            }
            if missing := sorted(b for b in buckets if b is not None and b not in doc["actions"]):
                raise ValueError(f"nvlink5 unit {u['names']}: buckets {missing} are not in actions")
            units.update(dict.fromkeys(u["names"], row))
        return cls(dict(doc["actions"]), units)

    def _bucket(self, unit: str, row: Nvlink5Unit, detail: XidDetail) -> tuple[str | None, str]:
        if row.any is not None:
            return row.any, unit
        intr = detail.get("intr_info")
        if row.reason is not None:
            if intr is None:
                return None, f"{unit}: no intrInfo printed to read the link-down reason from"
            code = intr >> 20 & 0x3F
            return row.reason.get(code), f"{unit} link-down reason 0x{code:x}"
        status = detail.get("error_status")
        if status is None:
            return None, f"{unit}: no error status printed"
        where = f"{unit} error status 0x{status:x}"
        if row.promote is not None and intr is not None and status in row.promote["status"]:
            layout = row.layout(intr)
            if layout is not None and intr >> row.promote["bit"][layout] & 1:
                return row.promote["to"], f"{where} with intrInfo's action-2 bit"
        bucket = row.status.get(status)
        if bucket is not None or row.exact or status == 0:
            return bucket, where
        parts = [row.status.get(1 << b) for b in set_bits(status)]
        if any(p is None for p in parts):
            return None, where
        return max(parts, key=lambda b: RANK[self.actions[str(b)]]), where

    def decode(self, detail: XidDetail) -> Verdict | None:
        """None when the line's NVLink5 fields were not parsed at all (nothing to decode)."""
        unit = detail.get("unit")
        if not isinstance(unit, str):
            return None
        row = self.units.get(unit)
        if row is None:
            return Verdict(None, f"NVLink5 unit {unit} is not in NVIDIA's Xid 144-150 decode table")
        bucket, where = self._bucket(unit, row, detail)
        if bucket is None:
            return Verdict(None, f"{where} is not in NVIDIA's Xid 144-150 decode table")
        return Verdict(self.actions[bucket], f"{where}: NVIDIA's decode says {bucket}")
