"""Stand-in for the corroboration's clock read (``date +%s.%N; cat /proc/uptime``): the node's wall
clock, then its seconds since boot (proc(5): uptime and idle time), from the boot time the fake
Compute keeps for the VM (its last start). A node the state file does not date booted a day ago.
"""

from __future__ import annotations

import sys
import time

from pitstop.local.gpu_tools.state import load_or_say

UNKNOWN_UPTIME_S = 86_400.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("clock stand-in: takes no arguments", file=sys.stderr)
        return 2
    st = load_or_say("clock")
    if st is None:
        return 1
    now = time.time()
    up = now - st.boot if st.boot is not None and st.boot <= now else UNKNOWN_UPTIME_S
    print(f"{now:.9f}")
    print(f"{up:.2f} {up * 7.5:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
