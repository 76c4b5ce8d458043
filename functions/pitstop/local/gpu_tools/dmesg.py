"""Stand-in ``dmesg --raw``: the node's kernel ring buffer since boot, as the fake Compute keeps it.

Each record prints as the real tool prints it raw: ``<prio>[seconds] message`` with
prio = facility * 8 + level (syslog(2)); kernel records have facility 0, lines user space wrote to
/dev/kmsg facility 1 (LOG_USER, forced by the kernel). NVRM prints Xids at KERN_WARNING (level 4).
``seconds`` is the time since the VM booted (printk's clock), as the fake Compute dates the line.
"""

from __future__ import annotations

import sys

from pitstop.local.gpu_tools.state import NodeState, load_or_say

LEVEL_WARNING = 4


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["--raw"], ["-r"]):
        print("dmesg stand-in: only --raw is supported", file=sys.stderr)
        return 2
    st = load_or_say("dmesg")
    if st is None:
        return 1
    for n, (facility, msg) in enumerate(st.kmsg):
        print(f"<{facility * 8 + LEVEL_WARNING}>[{seconds(st, n):12.6f}] {msg}")
    return 0


def seconds(st: NodeState, n: int) -> float:
    """The printk time of line ``n``: its seconds since the VM booted (the stand-in Compute keeps
    both); a line or boot of unknown time gets a place in the first minutes after boot."""
    at = st.kmsg_at[n] if n < len(st.kmsg_at) else None
    if at is None or st.boot is None or at < st.boot:
        return 100.0 + n * 0.5
    return at - st.boot


if __name__ == "__main__":
    sys.exit(main())
