"""Stand-in ``nvidia-smi``: ``-q`` (GPU count, lost GPUs, remapped rows) and ``nvlink --status``."""

from __future__ import annotations

import sys
import time
import zlib

from pitstop.local.gpu_tools.state import NodeState, StateError, load


def _remap_rows(s: NodeState, index: int) -> list[str]:
    hit = index == s.remap_gpu and s.remap != "none"
    rows = [
        ("Correctable Error", "0"),
        ("Uncorrectable Error", "1" if hit else "0"),
        ("Pending", "Yes" if hit and s.remap == "pending" else "No"),
        ("Remapping Failure Occurred", "Yes" if hit and s.remap == "failure" else "No"),
    ]
    out = ["    Remapped Rows"] + [f"        {k:<34}: {v}" for k, v in rows]
    out.append("        Bank Remap Availability Histogram")
    hist = (("Max", 639 if hit else 640), ("High", 1 if hit else 0), ("Partial", 0), ("Low", 0), ("None", 0))
    return out + [f"            {k:<30}: {n} bank(s)" for k, n in hist]


def _clock_events(s: NodeState, index: int) -> list[str]:
    """``Clocks Event Reasons`` (drivers from R535 on; "Clocks Throttle Reasons" before): a
    throttled GPU shows its slowdown active."""
    hot = index == s.throttle_gpu and s.throttle > 0
    thermal, power = hot and s.throttle_reason == "thermal", hot and s.throttle_reason == "power"
    rows = [
        ("Idle", False, 8),
        ("Applications Clocks Setting", False, 8),
        ("SW Power Cap", power, 8),
        ("HW Slowdown", thermal, 8),
        ("HW Thermal Slowdown", thermal, 12),
        ("HW Power Brake Slowdown", False, 12),
        ("Sync Boost", False, 8),
        ("SW Thermal Slowdown", thermal, 8),
        ("Display Clock Setting", False, 8),
    ]
    out = ["    Clocks Event Reasons"]
    return out + [f"{' ' * pad}{k:<{42 - pad}}: {'Active' if on else 'Not Active'}" for k, on, pad in rows]


def _ecc(s: NodeState, index: int) -> list[str]:
    """``ECC Errors``: a GPU whose correctable count rises shows it (an hour's worth so far)."""
    dram = s.sbe_rate if index == s.ecc_gpu else 0
    out = ["    ECC Errors"]
    for scope in ("Volatile", "Aggregate"):
        out.append(f"        {scope}")
        rows = [("SRAM Correctable", 0), ("SRAM Uncorrectable Parity", 0), ("SRAM Uncorrectable SEC-DED", 0)]
        rows += [("DRAM Correctable", dram), ("DRAM Uncorrectable", 0)]
        out += [f"            {k:<30}: {n}" for k, n in rows]
    return out


def query(s: NodeState) -> str:
    """The parts of ``nvidia-smi -q`` Pitstop reads, laid out as the real tool lays them out."""
    lines = [
        f"{'Timestamp':<42}: {time.strftime('%a %b %d %H:%M:%S %Y', time.gmtime())}",
        f"{'Driver Version':<42}: 550.90.07",
        f"{'CUDA Version':<42}: 12.4",
        "",
        f"{'Attached GPUs':<42}: {s.total_gpus}",
    ]
    for i in range(s.total_gpus):
        if s.hung and i == s.dcgm_gpu:  # NVML cannot open a GPU stuck mid-kernel
            lines.append(
                f"Unable to determine the device handle for GPU {s.pci(i)[4:-2].lower()}: Unknown Error"
            )
            continue
        if i >= s.gpus:
            pci = s.pci(i)[4:-2].lower()
            lines.append(
                f"Unable to determine the device handle for GPU {pci}: GPU is lost.  "
                "Reboot the system to recover this GPU"
            )
            continue
        lines += [f"GPU {s.pci(i)}", f"    {'Product Name':<38}: {s.product}"]
        lines += [f"    {'Minor Number':<38}: {i}", "    Retired Pages"]
        lines += [
            f"        {k:<34}: N/A" for k in ("Single Bit ECC", "Double Bit ECC", "Pending Page Blacklist")
        ]
        lines += _clock_events(s, i) + _ecc(s, i)
        lines += _remap_rows(s, i)
    return "\n".join(lines) + "\n"


def nvlink_status(s: NodeState) -> str:
    lines = []
    for i in range(s.gpus):
        lines.append(
            f"GPU {i}: {s.product} (UUID: GPU-{i:08x}-0000-0000-0000-{zlib.crc32(s.node.encode()):012d})"
        )
        for link in range(18):
            down = i in s.nvlink_down and link >= 12
            lines.append(f"\t Link {link}: {'<inactive>' if down else '26.562 GB/s'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        s = load()
    except StateError as exc:
        print(f"nvidia-smi stand-in: {exc}", file=sys.stderr)
        return 2
    if s.gpus <= 0:
        print("No devices were found")
        return 6
    if argv[:1] == ["nvlink"] and any(a in ("-s", "--status") for a in argv[1:]):
        sys.stdout.write(nvlink_status(s))
    elif "-q" in argv or "--query" in argv:
        sys.stdout.write(query(s))
    else:
        print("usage: nvidia_smi -q | nvlink --status", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
