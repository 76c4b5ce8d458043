"""Parsing of NVIDIA driver (NVRM) kernel lines: every Xid line generation seen in the field.

Pure functions over one text line. Formats: reference/xid-catalog.md §3 and
reference/gcp-events.md §2. The catch-all regex tolerates any prefix (syslog, dmesg
timestamps, thread tags, ``kernel:``), ``PCI:`` present or not, MIG ``GPU-I``/``GPU-CI``,
a non-zero PCI domain, an optional function digit, and all three pid/name generations.

Degrade, never drop: a line whose Xid code is readable is a fault whatever its other fields
say. A pid, PCI address, MIG instance, process name, number or message outside what a driver
can print is left out of the facts (or cut to its bound) and named in ``detail.anomalies``;
an unreadable PCI address leaves the GPU unknown, which the classifier answers with the
node-level action for the code. Only a line whose code cannot be read is an error.
"""

from __future__ import annotations

import itertools
import re
from typing import Literal

from pitstop.core.domain import LineError, MigRef, XidDetail, XidLine

MAX_MESSAGE = 512  # the driver text we keep as evidence; never used as a command or label
# One message is cut to this many bytes of UTF-8 before any pattern sees it (core/parse.py);
# parse_nvrm itself never reads more than this many characters of whatever it is given.
MAX_LINE = 64 * 1024
MAX_PROCESS = 64
MAX_ANOMALIES = 8  # anomalies kept per line (each at most MAX_ANOMALY characters)
MAX_ANOMALY = 160
MAX_EXCERPT = 24  # characters of an implausible field quoted in its anomaly
MAX_REGISTERS = 8
MAX_HEADS = 8  # "NVRM: Xid (...): <code>" heads tried per line for one whose code can be read

# Every number a line carries, with the range a real driver line can hold. The code itself
# outside its range makes the line unreadable (an error); any other number outside its range
# is left out of the facts and named in ``detail.anomalies``.
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
    "register": (0, 0xFFFF_FFFF),  # NVLink error registers are 32 bits wide
}
_MAX_DIGITS = 10  # no limit above needs more decimal (or hex) digits; longer is out of range

_A = re.ASCII
_HEX4 = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
# The head of every Xid line: what sits in the parentheses is read separately, so an odd PCI
# field degrades the GPU, never the line. ``[^)]*`` cannot backtrack: linear on any input.
_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\):\s*(?P<xid>\d+)\b,?\s*(?P<rest>.*)", re.S | _A)
_WHERE = re.compile(r"\s*(?:PCI:)?(?P<pci>" + _HEX4 + r")(?:\.[0-7])?(?=\s|$)", _A)
_GI = re.compile(r"GPU-I:\s*(?P<v>\d+)", _A)
_CI = re.compile(r"GPU-CI:\s*(?P<v>\d+)", _A)
_PID = re.compile(r"pid=(?P<pid>[^,]*)(?:,\s*|$)", _A)
_UNKNOWN_PIDS = frozenset({"'<unknown>'", "<unknown>", "'N/A'", "N/A"})
_NAME = re.compile(r"name=(?P<name>[^,]*)(?:,\s*|$)", _A)
_OFF_BUS_PCI = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at )?(?:PCI:)?(?P<pci>" + _HEX4 + r")", _A)

_GPC_TPC = re.compile(r"GPC (?P<gpc>\d+), TPC (?P<tpc>\d+)(?:, SM (?P<sm>\d+))?", _A)
_PRIMARY = re.compile(r"caused by previous Xid (?P<xid>\d+)", _A)
_RST = re.compile(r"\bRST: (?P<v>Yes|No)\b", re.I | _A)
_DRST = re.compile(r"\bD-RST: (?P<v>Yes|No)\b", re.I | _A)
_CONTAINED_UNIT = re.compile(r"(?:Contained|Uncontained): (?P<unit>[^(.]+?) \(", _A)
_NVLINK_74 = re.compile(r"fatal error detected on link (?P<link>\d+)(?:\s*\((?P<regs>[^)]*)\))?", _A)
# NV-CAT WORKFLOW_NVLINK5_ERR: "<sub component> <fatal vs nonfatal> <Crosscontain> <injected>
# <link> (<intrInfo> <errorStatus> <errorDebugData[0..4]>)".
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
_PRINTABLE = re.compile(r"[\x20-\x7e]*", _A)

_HEX = re.compile(r"[0-9a-fA-F]+", _A)


def printable(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, anything outside printable ASCII as '?'."""
    cut = text[:limit]
    return cut if _PRINTABLE.fullmatch(cut) else "".join(c if " " <= c <= "~" else "?" for c in cut)


def excerpt(text: str, limit: int = MAX_EXCERPT) -> str:
    """A short, printable quote of hostile text for an anomaly (never the whole field)."""
    return printable(text, limit) + (f"...({len(text)} chars)" if len(text) > limit else "")


class Anomalies(list[str]):
    """What a line carried that no driver prints: at most MAX_ANOMALIES short notes."""

    def add(self, note: str) -> None:
        if len(self) < MAX_ANOMALIES:
            self.append(note[:MAX_ANOMALY])


def bounded_int(digits: str, what: str, found: Anomalies | None = None, base: int = 10) -> int | None:
    """``digits`` as an int within LIMITS[what], or None (and an anomaly) when it is not.

    The length is checked before ``int()``, so a number of any size costs nothing and cannot
    reach Python's limit on decimal digits.
    """
    lo, hi = LIMITS[what]
    body = digits[1:] if digits[:1] == "-" else digits
    if (
        0 < len(body) <= _MAX_DIGITS
        and (body.isdigit() if base == 10 else _HEX.fullmatch(body))
        and body.isascii()
    ):
        value = int(digits, base)
        if lo <= value <= hi:
            return value
    if found is not None:
        shown = f"0x{excerpt(digits)}" if base == 16 else excerpt(digits)
        found.add(f"{what.replace('_', ' ')} {shown} is out of range ({lo} to {hi}); left out")
    return None


def normalise_pci(pci: str, found: Anomalies) -> str | None:
    """``DDDD:BB:DD`` lower-case without the function digit: one key per GPU; None if no GPU has it."""
    pci = pci[:10].lower()  # matched as dddd:bb:dd hex: the device is two hex digits
    if int(pci[8:10], 16) > LIMITS["pci_device"][1]:
        found.add(f"PCI device {pci} is out of range (0 to 0x1f): the GPU is unknown")
        return None
    return pci


def _yes(m: re.Match[str] | None) -> bool | None:
    return None if m is None else m.group("v").lower() == "yes"


def _registers(regs: str | None, found: Anomalies) -> list[str] | None:
    """The hex registers a line prints, or None; all of them, or none when one is implausible
    (their positions carry the meaning, so a partial list would be misread)."""
    if not regs:
        return None
    out = _HEXREG.findall(regs)
    if not out:
        return None
    if len(out) > MAX_REGISTERS or any(len(r) > 10 for r in out):
        found.add(f"NVLink registers ({excerpt(regs)}) are not 32-bit words; left out")
        return None
    return out


_GPC_KEYS: tuple[Literal["gpc", "tpc", "sm"], ...] = ("gpc", "tpc", "sm")
_RECOVERY_KEYS: tuple[tuple[Literal["recovery_from", "recovery_to"], str], ...] = (
    ("recovery_from", "old"),
    ("recovery_to", "new"),
)


def _detail_13_45_48(xid: int, msg: str, d: XidDetail, found: Anomalies) -> None:
    if xid == 13:
        m = _GPC_TPC.search(msg)
        if m:
            for key in _GPC_KEYS:
                if m[key] is not None and (v := bounded_int(m[key], key, found)) is not None:
                    d[key] = v
    elif xid == 45:
        m = _PRIMARY.search(msg)
        if m and (v := bounded_int(m["xid"], "primary_xid", found)) is not None:
            d["primary_xid"] = v
    elif xid == 48:
        if _SRAM.search(msg):
            d["memory"] = "sram"
        elif _DRAM.search(msg):
            d["memory"] = "dram"


def _detail_74(msg: str, d: XidDetail, found: Anomalies) -> None:
    m = _NVLINK_74.search(msg)
    if m:
        if (link := bounded_int(m["link"], "link", found)) is not None:
            d["link"] = link
        if regs := _registers(m["regs"], found):
            d["registers"] = regs


def _detail_nvlink5(msg: str, d: XidDetail, found: Anomalies) -> None:
    m = _NVLINK5.search(msg)
    if not m:
        return
    d["unit"] = m["unit"][:64]
    d["fatal"] = m["sev"] == "Fatal"
    if (link := bounded_int(m["link"], "link", found)) is not None:
        d["link"] = link
    if regs := _registers(m["regs"], found):
        d["registers"] = regs
        d["intr_info"] = int(regs[0], 16)
        if len(regs) > 1:
            d["error_status"] = int(regs[1], 16)


def _detail_94_95(msg: str, d: XidDetail) -> None:
    rst, drst = _yes(_RST.search(msg)), _yes(_DRST.search(msg))
    if rst is not None:
        d["rst"] = rst
    if drst is not None:
        d["d_rst"] = drst
    m = _CONTAINED_UNIT.search(msg)
    if m:
        d["unit"] = m["unit"].strip()[:64]


def _detail_154(msg: str, d: XidDetail, found: Anomalies) -> None:
    m = _RECOVERY.search(msg)
    if m:
        for key, group in _RECOVERY_KEYS:
            if (v := bounded_int(m[group], key, found, 16)) is not None:
                d[key] = v
        if m["newl"]:
            d["recovery_label"] = m["newl"].strip()[:64]


def _detail_for(xid: int, msg: str, found: Anomalies) -> XidDetail:
    """Code-specific facts that change the action (xid-catalog.md §3.2, §4)."""
    d: XidDetail = {}
    if xid in (13, 45, 48):
        _detail_13_45_48(xid, msg, d, found)
    elif xid == 63:
        d["pending_remap"] = True
    elif xid == 64:
        d["remap_failure"] = _REMAP_FAILURE.search(msg) is not None
    elif xid == 74:
        _detail_74(msg, d, found)
    elif 144 <= xid <= 150:
        _detail_nvlink5(msg, d, found)
    elif xid in (94, 95):
        _detail_94_95(msg, d)
    elif xid == 154:
        _detail_154(msg, d, found)
    return d


def _off_bus(text: str) -> XidLine:
    """The "fallen off the bus" report without an Xid line: an inferred Xid 79.

    Both forms name the GPU: the one-line ``NVRM: GPU dddd:bb:dd.f: GPU has fallen off the bus.``
    and the probe-time ``NVRM: The NVIDIA GPU dddd:bb:dd.f`` (xid-catalog.md §3.2, 79).
    """
    found = Anomalies()
    pm = _OFF_BUS_PCI.search(text)
    detail: XidDetail = {"inferred_from": "fallen_off_bus_line"}
    pci = normalise_pci(pm["pci"], found) if pm else None
    if found:
        detail["anomalies"] = list(found)
    return {"xid": 79, "pci": pci, "mig": None, "detail": detail}


def _pid_and_name(rest: str, detail: XidDetail, found: Anomalies) -> str:
    """Take the optional ``pid=…, name=…,`` prefix off ``rest`` into ``detail``; the message is left."""
    pm = _PID.match(rest)
    if pm:
        pid = pm["pid"].strip()
        if pid and pid not in _UNKNOWN_PIDS:
            if pid.isdigit():
                if (v := bounded_int(pid, "pid", found)) is not None:
                    detail["pid"] = v
            else:
                found.add(f"pid {excerpt(pid)} is not a process id; left out")
        rest = rest[pm.end() :]
    nm = _NAME.match(rest)
    if nm:
        name = nm["name"].strip()
        if name and name != "<unknown>":
            if len(name) > MAX_PROCESS or not _PRINTABLE.fullmatch(name):
                found.add(f"process name {excerpt(name)} is not a plausible name; cut")
                name = printable(name, MAX_PROCESS)
            detail["process"] = name
        rest = rest[nm.end() :]
    return rest


def _gpu(where: str, found: Anomalies) -> tuple[str | None, MigRef | None]:
    """The GPU the parentheses name: its PCI address and MIG instance, each None when unreadable."""
    wm = _WHERE.match(where)
    if wm is None:
        found.add(f"PCI address {excerpt(where)!r} is not readable: the GPU is unknown")
        return None, None
    pci = normalise_pci(wm["pci"], found)
    gm = _GI.search(where, wm.end()) if "GPU-I" in where else None
    if pci is None or gm is None:
        return pci, None
    gi = bounded_int(gm["v"], "gi", found)
    cm = _CI.search(where, gm.end())
    ci = bounded_int(cm["v"], "ci", found) if cm is not None else None
    if gi is None or (cm is not None and ci is None):
        return pci, None  # the GPU is known, its MIG instance is not
    return pci, {"gi": gi, "ci": ci}


def _xid_line(m: re.Match[str], xid: int) -> XidLine:
    found = Anomalies()
    pci, mig = _gpu(m["where"], found)
    detail: XidDetail = {}
    msg = _pid_and_name(m["rest"].strip(), detail, found)
    detail["message"] = msg[:MAX_MESSAGE]
    detail.update(_detail_for(xid, msg, found))  # read from the whole message, kept cut
    if len(msg) > MAX_MESSAGE:
        found.add(f"message of {len(msg)} characters cut to {MAX_MESSAGE}")
    if found:
        detail["anomalies"] = list(found)
    return {"xid": xid, "pci": pci, "mig": mig, "detail": detail}


def parse_nvrm(text: str) -> XidLine | LineError | None:
    """Parse one driver line; never raises.

    Returns None when the text is not an Xid or fallen-off-the-bus report, and a dict
    with ``error`` when it claims to be one but its Xid code cannot be read.
    """
    text = text[:MAX_LINE]
    if "NVRM" not in text:
        return None
    first = _XID.search(text)
    if first is not None:  # the common case first: one head, a readable code
        xid = bounded_int(first["xid"], "xid")
        if xid is not None:
            return _xid_line(first, xid)
        for m in itertools.islice(_XID.finditer(text, first.end("xid")), MAX_HEADS - 1):
            xid = bounded_int(m["xid"], "xid")
            if xid is not None:
                return _xid_line(m, xid)
        lo, hi = LIMITS["xid"]
        return {"error": f"Xid line rejected: xid {excerpt(first['xid'])} is out of range ({lo} to {hi})"}
    if "fallen off the bus" in text:
        return _off_bus(text)
    if "NVRM: Xid" in text:
        return {"error": "line names an NVRM Xid but matches no known Xid format"}
    return None
