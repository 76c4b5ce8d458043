"""Parsing of NVIDIA driver (NVRM) kernel lines: every Xid line generation seen in the field.

Pure functions over one text line. Formats: reference/xid-catalog.md §3 and
reference/gcp-events.md §2. The catch-all regex tolerates any prefix (syslog, dmesg
timestamps, thread tags, ``kernel:``), ``PCI:`` present or not, MIG ``GPU-I``/``GPU-CI``,
a non-zero PCI domain, an optional function digit, and all three pid/name generations.
"""

from __future__ import annotations

import re
from typing import Any

MAX_MESSAGE = 512  # the driver text we keep as evidence; never used as a command or label

_HEX4 = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>" + _HEX4 + r")(?:\.[0-7])?"
    r"(?: GPU-I:(?P<gi>\d{1,3}))?(?: GPU-CI:(?P<ci>\d{1,3}))?\):\s*(?P<xid>\d{1,4})\b,?\s*(?P<rest>.*)",
    re.S,
)
_PID = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|\d+)\s*(?:,\s*|$)")
_NAME = re.compile(r"name=(?P<name>[^,]*)(?:,\s*|$)")
_OFF_BUS_PCI = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<pci>" + _HEX4 + r")")

_GPC_TPC = re.compile(r"GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?")
_PRIMARY = re.compile(r"caused by previous Xid (?P<xid>\d{1,4})")
_RST = re.compile(r"\bRST: (?P<v>Yes|No)\b", re.I)
_DRST = re.compile(r"\bD-RST: (?P<v>Yes|No)\b", re.I)
_CONTAINED_UNIT = re.compile(r"(?:Contained|Uncontained): (?P<unit>[^(.]+?) \(")
_NVLINK_74 = re.compile(r"fatal error detected on link (?P<link>\d+)(?:\s*\((?P<regs>[^)]*)\))?")
_NVLINK5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]*) (?P<sev>Fatal|Nonfatal) (?P<xc>XC\d) i(?P<inst>\d+) Link (?P<link>-?\d+)"
    r"(?: \((?P<regs>[^)]*)\))?"
)
_RECOVERY = re.compile(
    r"recovery action changed from 0x(?P<old>[0-9a-fA-F]+)(?: \((?P<oldl>[^)]*)\))?"
    r" to 0x(?P<new>[0-9a-fA-F]+)(?: \((?P<newl>[^)]*)\))?",
    re.I,
)
# Spare rows/pages exhausted: the memory can no longer heal itself (xid-catalog.md §3.2, 64).
_REMAP_FAILURE = re.compile(
    r"table is full|reserved rows for bank are remapped|no spare|HW limit reached|full inforom"
    r"|unable to retire page",
    re.I,
)
_DRAM = re.compile(r"framebuffer|DRAM", re.I)
_SRAM = re.compile(r"SRAM|GSP-RISCV", re.I)
_HEXREG = re.compile(r"0x[0-9a-fA-F]+")


def normalise_pci(pci: str) -> str:
    """``DDDD:BB:DD`` lower-case without the function digit: one key per GPU."""
    return pci[:12].lower()


def _yes(m: re.Match[str] | None) -> bool | None:
    return None if m is None else m.group("v").lower() == "yes"


def _detail_for(xid: int, msg: str) -> dict[str, Any]:
    """Code-specific facts that change the action (xid-catalog.md §3.2, §4)."""
    d: dict[str, Any] = {}
    if xid == 13:
        m = _GPC_TPC.search(msg)
        if m:
            d["gpc"] = int(m["gpc"])
            d["tpc"] = int(m["tpc"])
            if m["sm"] is not None:
                d["sm"] = int(m["sm"])
    elif xid == 45:
        m = _PRIMARY.search(msg)
        if m:
            d["primary_xid"] = int(m["xid"])
    elif xid == 48:
        if _SRAM.search(msg):
            d["memory"] = "sram"
        elif _DRAM.search(msg):
            d["memory"] = "dram"
    elif xid == 63:
        d["pending_remap"] = True
    elif xid == 64:
        d["remap_failure"] = _REMAP_FAILURE.search(msg) is not None
    elif xid == 74:
        m = _NVLINK_74.search(msg)
        if m:
            d["link"] = int(m["link"])
            if m["regs"]:
                d["registers"] = _HEXREG.findall(m["regs"])
    elif xid in (94, 95):
        rst, drst = _yes(_RST.search(msg)), _yes(_DRST.search(msg))
        if rst is not None:
            d["rst"] = rst
        if drst is not None:
            d["d_rst"] = drst
        m = _CONTAINED_UNIT.search(msg)
        if m:
            d["unit"] = m["unit"].strip()
    elif 144 <= xid <= 150:
        m = _NVLINK5.search(msg)
        if m:
            d["unit"] = m["unit"]
            d["fatal"] = m["sev"] == "Fatal"
            d["link"] = int(m["link"])
            if m["regs"]:
                d["registers"] = _HEXREG.findall(m["regs"])
    elif xid == 154:
        m = _RECOVERY.search(msg)
        if m:
            d["recovery_from"] = int(m["old"], 16)
            d["recovery_to"] = int(m["new"], 16)
            if m["newl"]:
                d["recovery_label"] = m["newl"].strip()[:64]
    return d


def parse_nvrm(text: str) -> dict[str, Any] | None:
    """Parse one driver line.

    Returns None when the text is not an Xid or fallen-off-the-bus report, and a dict
    with ``error`` when it claims to be an Xid line but matches no known format.
    """
    if "NVRM" not in text:
        return None
    m = _XID.search(text)
    if m is None:
        if "fallen off the bus" in text:
            pm = _OFF_BUS_PCI.search(text)
            return {
                "xid": 79,
                "pci": normalise_pci(pm["pci"]) if pm else None,
                "mig": None,
                "detail": {"inferred_from": "fallen_off_bus_line"},
            }
        if "NVRM: Xid" in text:
            return {"error": "line names an NVRM Xid but matches no known Xid format"}
        return None
    xid = int(m["xid"])
    rest = m["rest"].strip()
    detail: dict[str, Any] = {}
    pm = _PID.match(rest)
    if pm:
        pid = pm["pid"]
        if pid.isdigit():
            detail["pid"] = int(pid)
        rest = rest[pm.end() :]
    nm = _NAME.match(rest)
    if nm:
        name = nm["name"].strip()
        if name and name != "<unknown>":
            detail["process"] = name[:64]
        rest = rest[nm.end() :]
    msg = rest[:MAX_MESSAGE]
    detail["message"] = msg
    detail.update(_detail_for(xid, msg))
    mig = None
    if m["gi"] is not None:
        mig = {"gi": int(m["gi"]), "ci": int(m["ci"]) if m["ci"] is not None else None}
    return {"xid": xid, "pci": normalise_pci(m["pci"]), "mig": mig, "detail": detail}
