"""Where a bench run's CPU went (tools/bench_cpu.py): read from /proc, checked against known work."""

from __future__ import annotations

import os
import socket
import time

from pitstop.tools.bench_cpu import CpuWatch, cpu_s, listener_pid


def _burn(seconds: float) -> None:
    """Use this much CPU (process time, not wall time: a loaded machine only makes it slower)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_listener_of_a_loopback_port_is_found_and_nothing_for_a_closed_one() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listener_pid(port) == os.getpid()
    assert listener_pid(port) is None


def test_cpu_seconds_follow_the_work_done() -> None:
    before = cpu_s([os.getpid()])
    _burn(0.3)
    assert cpu_s([os.getpid()]) - before >= 0.25  # clock ticks: a tick's rounding either way
    assert cpu_s([2**22 + 7]) == 0.0  # a process that is not there counts nothing


def test_a_watch_tells_each_part_apart() -> None:
    watch = CpuWatch(emulator=[], instances=[os.getpid()])
    _burn(0.3)
    got = watch.done()
    assert got["emulator"] == 0.0 and got["instances"] >= 0.2 and got["bench"] >= 0.2
    assert got["cores_busy"] > 0
