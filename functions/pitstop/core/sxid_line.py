"""Parsing of NVIDIA NVSwitch driver (SXid) kernel lines.

The NVSwitch driver prints ``nvidia-nvswitch<N>: SXid (PCI:<dddd:bb:dd.f>): <code>, <text>``
(open-gpu-kernel-modules, ``nvswitch_event.h``: ``"SXid (PCI:%s): %u, %s"``, the device
prefix from the kernel's dev_printk). ``<text>`` is ``Fatal, Link <n> <what>`` or
``Non-fatal, Link <n> <what>``, optionally ending in ``(First)`` (the first error since the
interrupt was last cleared); some errors name no link (``Non-fatal, PRI WRITE SYSB error,
instance=3``), and follow-up lines of an SXid carry its code without a severity (``Severity 1
Engine instance 00 ...``, ``Data {...}``). Any prefix (dmesg time, syslog header) is accepted.

Degrade, never drop, as for Xid lines (core/xid_line.py): a readable code is an SXid; an odd
PCI address, link or switch number is left out and named in ``detail.anomalies``.
"""

from __future__ import annotations

import itertools
import re

from pitstop.core.domain import LineError, SxidDetail, SxidLine
from pitstop.core.xid_line import MAX_HEADS, MAX_LINE, MAX_MESSAGE, Anomalies, bounded_int, excerpt

SXID_RANGE = (1, 99_999)  # codes are five decimal digits (Fabric Manager guide, SXid tables)
MAX_SWITCH = 63
_A = re.ASCII
_SXID = re.compile(
    r"(?:nvidia-nvswitch(?P<switch>\d+):\s*)?SXid \((?P<where>[^)]*)\):\s*(?P<code>\d+)\b,?\s*(?P<rest>.*)",
    re.S | _A,
)
_SWITCH_PCI = re.compile(r"\s*(?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$", _A)
_SEVERITY = re.compile(r"(?P<sev>Fatal|Non-fatal|Nonfatal)\b,?\s*", re.I | _A)
_LINK = re.compile(r"Link (?P<link>-?\d+)\b\s*", _A)
_FIRST = re.compile(r"\s*\(First\)\s*$", re.I | _A)
SEVERITIES = {"fatal": "fatal", "non-fatal": "non_fatal", "nonfatal": "non_fatal"}


def _switch_pci(where: str, found: Anomalies) -> str | None:
    """The NVSwitch's PCI address as printed (``dddd:bb:dd.f``, lower case), or None."""
    m = _SWITCH_PCI.match(where)
    if m is None:
        found.add(f"NVSwitch PCI address {excerpt(where)!r} is not readable")
        return None
    pci = m["pci"].lower()
    if int(pci[8:10], 16) > 0x1F:
        found.add(f"NVSwitch PCI device {pci} is out of range (0 to 0x1f)")
        return None
    return pci


def _body(rest: str, d: SxidDetail, found: Anomalies) -> None:
    """Severity, link and the (First) marker off the text; the message is what is left."""
    sm = _SEVERITY.match(rest)
    if sm:
        d["severity"] = SEVERITIES[sm["sev"].lower()]
        rest = rest[sm.end() :]
    lm = _LINK.match(rest)
    if lm:
        if (link := bounded_int(lm["link"], "link", found)) is not None:
            d["link"] = link
        rest = rest[lm.end() :]
    fm = _FIRST.search(rest)
    if fm:
        d["first"] = True
        rest = rest[: fm.start()]
    if len(rest) > MAX_MESSAGE:
        found.add(f"message of {len(rest)} characters cut to {MAX_MESSAGE}")
    d["message"] = rest[:MAX_MESSAGE]


def _code(digits: str) -> int:
    """The code's value, or 0 (out of range) for more digits than any code has."""
    return int(digits) if len(digits) <= 6 else 0


def parse_sxid(text: str) -> SxidLine | LineError | None:
    """Parse one NVSwitch driver line; never raises.

    None when the text is no SXid report; a dict with ``error`` when it names one whose code
    cannot be read; else ``{"sxid": code, "detail": {...}}``.
    """
    text = text[:MAX_LINE]
    if "SXid" not in text:
        return None
    heads = list(itertools.islice(_SXID.finditer(text), MAX_HEADS))
    if not heads:
        return {"error": "line names an NVSwitch SXid but matches no known SXid format"}
    lo, hi = SXID_RANGE
    m = next((h for h in heads if lo <= _code(h["code"]) <= hi), None)
    if m is None:
        return {
            "error": f"SXid line rejected: sxid {excerpt(heads[0]['code'])} is out of range ({lo} to {hi})"
        }
    code = _code(m["code"])
    found = Anomalies()
    d: SxidDetail = {"sxid": code}
    if m["switch"] is not None:
        if len(m["switch"]) <= 3 and int(m["switch"]) <= MAX_SWITCH:
            d["switch"] = int(m["switch"])
        else:
            found.add(f"NVSwitch number {excerpt(m['switch'])} is out of range (0 to {MAX_SWITCH})")
    if (pci := _switch_pci(m["where"], found)) is not None:
        d["switch_pci"] = pci
    _body(m["rest"].strip(), d, found)
    if "severity" not in d:
        found.add("no Fatal/Non-fatal word: a follow-up line of an SXid, or a form this parser does not know")
    if found:
        d["anomalies"] = list(found)
    return {"sxid": code, "detail": d}
