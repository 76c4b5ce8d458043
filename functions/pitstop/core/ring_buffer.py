"""The kernel ring buffer as a check reads it: its NVRM lines, and when each was printed.

``dmesg --raw`` prints ``<prio>[seconds] message``: prio = facility * 8 + level (syslog(2),
dmesg(1)); ``seconds`` is the kernel's printk clock since boot, not wall time. To date a line,
the same check reads the node's clock: ``date +%s.%N`` (wall seconds) and ``/proc/uptime``
(seconds since boot, proc(5)), printed together; the boot's wall time is their difference, and a
line's wall time is that plus its ``seconds``.

How far to trust the mapping: ``/proc/uptime`` is CLOCK_BOOTTIME (NTP-disciplined), printk's
clock is the scheduler clock (not disciplined), so they drift apart by the NTP frequency
correction (tens of ppm) times the time since boot; a suspended VM's printk clock also stops
while uptime runs on. Both errors make a line look *older* than it is, except the drift, which
may go either way. So a line is dated with an allowance of ``slack_s`` plus ``drift_ppm`` of
its own seconds since boot, applied where it fails closed: a line counts as printed after the
episode began when it is within the allowance of it, but as printed after the node's last
remediation only when it is past it by more than the allowance (an old line replayed after a
reset never counts; a new one printed within the allowance after it is missed, and a person is
paged instead).

Every output here is hostile input (a node's tools, whatever runs there): bounded lines, bounded
numbers, and anything unreadable is no date at all, which confirms nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KERNEL_FACILITY = 0
MAX_LINES = 20_000  # a ring buffer is a few MiB at most; beyond this the output is not dmesg's
_RAW = re.compile(r"^<(?P<prio>\d{1,4})>\[\s*(?P<ts>\d{1,10}\.\d{1,9})\]\s?(?P<msg>.*)$", re.ASCII)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]{0,40}\):"
    r"\s*(?P<xid>\d{1,4})\b",
    re.ASCII,
)
# The NVSwitch driver's "nvidia-nvswitch<N>: SXid (PCI:<dddd:bb:dd.f>): <code>, ..." (core/sxid_line.py).
_SXID = re.compile(
    r"SXid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\):\s*(?P<sxid>\d{1,6})\b",
    re.ASCII,
)
_WALL = re.compile(r"^\s*(?P<s>\d{9,11}(?:\.\d{1,9})?)\s*$", re.ASCII)
_UPTIME = re.compile(r"^\s*(?P<up>\d{1,10}(?:\.\d{1,9})?)(?:\s+\d{1,12}(?:\.\d{1,9})?)?\s*$", re.ASCII)
EPOCH_RANGE = (946_684_800.0, 253_370_764_800.0)  # 2000 to 9998: anything else is no clock reading
MAX_UPTIME_S = 20 * 365 * 86400.0


@dataclass(frozen=True)
class KernelXid:
    xid: int  # the Xid, or an NVSwitch's SXid code when ``nvswitch``
    pci: str
    facility: int
    nvswitch: bool = False
    ts: float = 0.0  # printk's seconds since boot

    @property
    def name(self) -> str:
        return f"SXid {self.xid}" if self.nvswitch else f"Xid {self.xid}"


def parse_dmesg_raw(text: str) -> tuple[list[KernelXid], int]:
    """The NVRM Xid records of a ``dmesg --raw`` output, and how many of its lines were records."""
    found: list[KernelXid] = []
    records = 0
    for line in text.splitlines()[:MAX_LINES]:
        m = _RAW.match(line[:4096])
        if m is None:
            continue
        records += 1
        facility, ts = int(m["prio"]) >> 3, float(m["ts"])
        x = _XID.search(m["msg"])
        if x is not None:
            found.append(KernelXid(int(x["xid"]), x["pci"].lower(), facility, ts=ts))
        elif (sx := _SXID.search(m["msg"])) is not None:
            found.append(KernelXid(int(sx["sxid"]), sx["pci"].lower(), facility, nvswitch=True, ts=ts))
    return found, records


def xid_in(message: str) -> tuple[int, str] | None:
    """(Xid, PCI) of an NVRM Xid line's text (a Node condition's message), or None."""
    m = _XID.search(message[:2048])
    return (int(m["xid"]), m["pci"].lower()) if m else None


def parse_boot_clock(text: object) -> float | None:
    """The boot's wall time from the check's clock read: ``date +%s.%N`` then ``/proc/uptime``.

    None for anything else (missing, more lines, numbers out of range): the lines are undated.
    """
    if not isinstance(text, str) or len(text) > 256:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) != 2:
        return None
    wall, up = _WALL.match(lines[0]), _UPTIME.match(lines[1])
    if wall is None or up is None:
        return None
    now, uptime = float(wall["s"]), float(up["up"])
    if not (EPOCH_RANGE[0] <= now < EPOCH_RANGE[1]) or not (0.0 <= uptime <= MAX_UPTIME_S):
        return None
    boot = now - uptime
    return boot if math.isfinite(boot) and boot >= EPOCH_RANGE[0] else None


@dataclass(frozen=True)
class Dating:
    """How a line's printk seconds map to wall time, and the allowance its mapping gets."""

    boot: float  # the boot's wall time (parse_boot_clock)
    slack_s: float
    drift_ppm: float

    def printed_at(self, line: KernelXid) -> float:
        return self.boot + line.ts

    def allowance(self, line: KernelXid) -> float:
        return self.slack_s + self.drift_ppm * 1e-6 * line.ts

    def since(self, line: KernelXid, began: float) -> bool:
        """Printed after the episode began (within the allowance: a miss here only pages)."""
        return self.printed_at(line) >= began - self.allowance(line)

    def past(self, line: KernelXid, remediated: float) -> bool:
        """Printed after the node's last remediation by more than the allowance (a replayed old
        line must never pass; a new line inside the allowance is missed and a person paged)."""
        return self.printed_at(line) > remediated + self.allowance(line)
