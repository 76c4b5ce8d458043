"""Where a bench run's CPU went: the Firestore emulator, the function instances, the bench itself.

On one machine the emulator stands in for Firestore, which in the cloud runs on Google's machines:
a run whose emulator used most of the cores measured the stand-in, not the functions. So each run
reports the CPU seconds of each part over its push window (``/proc/<pid>/stat`` utime + stime).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from pitstop.tools.bench_types import RunCpu

TICK = os.sysconf("SC_CLK_TCK")
LISTEN = "0A"  # /proc/net/tcp's state of a listening socket


def cpu_s(pids: Iterable[int]) -> float:
    """User and system CPU seconds these processes used so far (every thread; gone ones count 0)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat: utime, stime
    return ticks / TICK


def listener_pid(port: int) -> int | None:
    """The process listening on this loopback port (the emulator the bench was pointed at)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == LISTEN:
                inodes.add(f"socket:[{cols[9]}]")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or not inodes:
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (d / "fd").iterdir()):
                return int(d.name)
        except OSError:
            continue
    return None


class CpuWatch:
    """CPU seconds of the emulator, the instances and this process between its start and ``done``."""

    def __init__(self, emulator: list[int], instances: list[int]) -> None:
        self._pids = (emulator, instances)
        self._t0, self._own0 = time.perf_counter(), time.process_time()
        self._at0 = (cpu_s(emulator), cpu_s(instances))

    def done(self) -> RunCpu:
        """Each part's CPU seconds, and ``cores_busy``: their sum over the wall time (of ``cpus``)."""
        emulator = cpu_s(self._pids[0]) - self._at0[0]
        instances = cpu_s(self._pids[1]) - self._at0[1]
        own = time.process_time() - self._own0
        wall = max(time.perf_counter() - self._t0, 1e-9)
        return {
            "emulator": round(emulator, 1),
            "instances": round(instances, 1),
            "bench": round(own, 1),
            "cores_busy": round((emulator + instances + own) / wall, 2),
        }
