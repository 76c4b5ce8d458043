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
# One message is cut to this many bytes of UTF-8 before any pattern sees it (core/parse.py);
# parse_nvrm itself never reads more than this many characters of whatever it is given.
MAX_LINE = 64 * 1024

# Every number a line carries, with the range a real driver line can hold. A value outside
# it makes the whole line invalid (with a reason), so nothing absurd reaches a decision.
LIMITS: dict[str, tuple[int, int]] = {
    "xid": (1, 9999),
    "pid": (0, 4_194_304),  # Linux PID_MAX_LIMIT
    "pci_device": (0, 0x1F),  # domain (16 bits) and bus (8 bits) are bounded by their 4 and 2 hex digits
    "gi": (0, 255),
    "ci": (0, 255),
    "gpc": (0, 1023),
    "tpc": (0, 1023),
    "sm": (0, 1023),
    "primary_xid": (1, 9999),
    "link": (-1, 1023),
    "recovery_from": (0, 0xFFFF_FFFF),
    "recovery_to": (0, 0xFFFF_FFFF),
}
_MAX_DIGITS = 10  # no limit above needs more decimal (or hex) digits; longer is out of range

_A = re.ASCII
_HEX4 = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>" + _HEX4 + r")(?:\.[0-7])?"
    r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\):\s*(?P<xid>\d+)\b,?\s*(?P<rest>.*)",
    re.S | _A,
)
_PID = re.compile(r"pid=(?P<pid>'<unknown>'|<unknown>|\d+)\s*(?:,\s*|$)", _A)
_NAME = re.compile(r"name=(?P<name>[^,]*)(?:,\s*|$)", _A)
_OFF_BUS_PCI = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<pci>" + _HEX4 + r")", _A)

_GPC_TPC = re.compile(r"GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?", _A)
_PRIMARY = re.compile(r"caused by previous Xid (?P<xid>\d+)", _A)
_RST = re.compile(r"\bRST: (?P<v>Yes|No)\b", re.I | _A)
_DRST = re.compile(r"\bD-RST: (?P<v>Yes|No)\b", re.I | _A)
_CONTAINED_UNIT = re.compile(r"(?:Contained|Uncontained): (?P<unit>[^(.]+?) \(", _A)
_NVLINK_74 = re.compile(r"fatal error detected on link (?P<link>\d+)(?:\s*\((?P<regs>[^)]*)\))?", _A)
_NVLINK5 = re.compile(
    r"(?P<unit>[A-Z][A-Z0-9_]*) (?P<sev>Fatal|Nonfatal) (?P<xc>XC\d) i(?P<inst>\d+) Link (?P<link>-?\d+)"
    r"(?: \((?P<regs>[^)]*)\))?",
    _A,
)
_RECOVERY = re.compile(
    r"recovery action changed from 0x(?P<old>[0-9a-fA-F]+)(?: \((?P<oldl>[^)]*)\))?"
    r" to 0x(?P<new>[0-9a-fA-F]+)(?: \((?P<newl>[^)]*)\))?",
    re.I | _A,
)
# Spare rows/pages exhausted: the memory can no longer heal itself (xid-catalog.md §3.2, 64).
_REMAP_FAILURE = re.compile(
    r"table is full|reserved rows for bank are remapped|no spare|HW limit reached|full inforom"
    r"|unable to retire page",
    re.I | _A,
)
_DRAM = re.compile(r"framebuffer|DRAM", re.I | _A)
_SRAM = re.compile(r"SRAM|GSP-RISCV", re.I | _A)
_HEXREG = re.compile(r"0x[0-9a-fA-F]+", _A)


class _OutOfRangeError(Exception):
    """A number outside its LIMITS; caught in :func:`parse_nvrm`, which makes the line invalid."""


_DIGITS = {
    10: re.compile(rf"[0-9]{{1,{_MAX_DIGITS}}}"),
    16: re.compile(rf"[0-9a-fA-F]{{1,{_MAX_DIGITS}}}"),
}


def bounded_int(digits: str, what: str, base: int = 10) -> int:
    """``digits`` as an int within LIMITS[what]; raises _OutOfRangeError (never ValueError) otherwise.

    The length is checked before ``int()``, so a number of any size costs nothing and cannot
    reach Python's limit on decimal digits.
    """
    lo, hi = LIMITS[what]
    body = digits[1:] if digits[:1] == "-" else digits
    if _DIGITS[base].fullmatch(body):
        value = int(digits, base)
        if lo <= value <= hi:
            return value
    raise _OutOfRangeError(f"{what.replace('_', ' ')} is out of range ({lo} to {hi})")


def normalise_pci(pci: str) -> str:
    """``DDDD:BB:DD`` lower-case without the function digit: one key per GPU."""
    pci = pci[:10].lower()
    bounded_int(pci[8:10], "pci_device", 16)
    return pci


def _yes(m: re.Match[str] | None) -> bool | None:
    return None if m is None else m.group("v").lower() == "yes"


def _registers(regs: str | None) -> list[str] | None:
    return _HEXREG.findall(regs) if regs else None


def _detail_13_45_48(xid: int, msg: str, d: dict[str, Any]) -> None:
    if xid == 13:
        m = _GPC_TPC.search(msg)
        if m:
            d["gpc"] = bounded_int(m["gpc"], "gpc")
            d["tpc"] = bounded_int(m["tpc"], "tpc")
            if m["sm"] is not None:
                d["sm"] = bounded_int(m["sm"], "sm")
    elif xid == 45:
        m = _PRIMARY.search(msg)
        if m:
            d["primary_xid"] = bounded_int(m["xid"], "primary_xid")
    elif xid == 48:
        if _SRAM.search(msg):
            d["memory"] = "sram"
        elif _DRAM.search(msg):
            d["memory"] = "dram"


def _detail_links(xid: int, msg: str, d: dict[str, Any]) -> None:
    if xid == 74:
        m = _NVLINK_74.search(msg)
        if m:
            d["link"] = bounded_int(m["link"], "link")
            if regs := _registers(m["regs"]):
                d["registers"] = regs
    elif 144 <= xid <= 150:
        m = _NVLINK5.search(msg)
        if m:
            d["unit"] = m["unit"][:64]
            d["fatal"] = m["sev"] == "Fatal"
            d["link"] = bounded_int(m["link"], "link")
            if regs := _registers(m["regs"]):
                d["registers"] = regs


def _detail_for(xid: int, msg: str) -> dict[str, Any]:
    """Code-specific facts that change the action (xid-catalog.md §3.2, §4)."""
    d: dict[str, Any] = {}
    if xid in (13, 45, 48):
        _detail_13_45_48(xid, msg, d)
    elif xid == 63:
        d["pending_remap"] = True
    elif xid == 64:
        d["remap_failure"] = _REMAP_FAILURE.search(msg) is not None
    elif xid == 74 or 144 <= xid <= 150:
        _detail_links(xid, msg, d)
    elif xid in (94, 95):
        rst, drst = _yes(_RST.search(msg)), _yes(_DRST.search(msg))
        if rst is not None:
            d["rst"] = rst
        if drst is not None:
            d["d_rst"] = drst
        m = _CONTAINED_UNIT.search(msg)
        if m:
            d["unit"] = m["unit"].strip()[:64]
    elif xid == 154:
        m = _RECOVERY.search(msg)
        if m:
            d["recovery_from"] = bounded_int(m["old"], "recovery_from", 16)
            d["recovery_to"] = bounded_int(m["new"], "recovery_to", 16)
            if m["newl"]:
                d["recovery_label"] = m["newl"].strip()[:64]
    return d


def _off_bus(text: str) -> dict[str, Any]:
    """The multi-line "fallen off the bus" report without an Xid line: an inferred Xid 79."""
    pm = _OFF_BUS_PCI.search(text)
    return {
        "xid": 79,
        "pci": normalise_pci(pm["pci"]) if pm else None,
        "mig": None,
        "detail": {"inferred_from": "fallen_off_bus_line"},
    }


def _pid_and_name(rest: str, detail: dict[str, Any]) -> str:
    """Take the optional ``pid=…, name=…,`` prefix off ``rest`` into ``detail``; the message is left."""
    pm = _PID.match(rest)
    if pm:
        pid = pm["pid"]
        if pid[0].isdigit():
            detail["pid"] = bounded_int(pid, "pid")
        rest = rest[pm.end() :]
    nm = _NAME.match(rest)
    if nm:
        name = nm["name"].strip()
        if name and name != "<unknown>":
            detail["process"] = name[:64]
        rest = rest[nm.end() :]
    return rest


def _xid_line(m: re.Match[str]) -> dict[str, Any]:
    xid = bounded_int(m["xid"], "xid")
    pci = normalise_pci(m["pci"])
    mig = None
    if m["gi"] is not None:
        mig = {
            "gi": bounded_int(m["gi"], "gi"),
            "ci": bounded_int(m["ci"], "ci") if m["ci"] is not None else None,
        }
    detail: dict[str, Any] = {}
    msg = _pid_and_name(m["rest"].strip(), detail)[:MAX_MESSAGE]
    detail["message"] = msg
    detail.update(_detail_for(xid, msg))
    return {"xid": xid, "pci": pci, "mig": mig, "detail": detail}


def parse_nvrm(text: str) -> dict[str, Any] | None:
    """Parse one driver line; never raises.

    Returns None when the text is not an Xid or fallen-off-the-bus report, and a dict
    with ``error`` when it claims to be one but matches no known format or carries a
    number out of its range (LIMITS).
    """
    text = text[:MAX_LINE]
    if "NVRM" not in text:
        return None
    try:
        m = _XID.search(text)
        if m is not None:
            return _xid_line(m)
        if "fallen off the bus" in text:
            return _off_bus(text)
    except _OutOfRangeError as exc:
        return {"error": f"Xid line rejected: {exc}"}
    if "NVRM: Xid" in text:
        return {"error": "line names an NVRM Xid but matches no known Xid format"}
    return None
