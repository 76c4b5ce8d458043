"""``pitstop classify``: JSON Lines of LogEntries in, one FaultEvent line (or table row) out each."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import orjson

from pitstop.core.classify import Classifier

if TYPE_CHECKING:
    from pitstop.core.domain import FaultEvent

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
from pitstop.tools.common import lines

_TABLE_COLS = (("kind", 13), ("action", 14), ("xid", 6), ("node", 28), ("gpu", 12), ("reason", 0))


def _table_row(ev: FaultEvent) -> str:
    """One row; an NVSwitch SXid shows as S<code> on its switch's PCI address."""
    ref, card = ev.get("node"), ev.get("gpu")
    node = ref["instance"] if ref else "-"
    sxid = ev["detail"].get("sxid")
    gpu = (card.get("pci") if card else None) or ev["detail"].get("switch_pci") or "-"
    vals = {
        "kind": ev["kind"],
        "action": ev["action"],
        "xid": str(ev["xid"]) if ev["xid"] is not None else (f"S{sxid}" if sxid else ""),
        "node": node,
        "gpu": gpu,
        "reason": ev["reason"],
    }
    return "  ".join(vals[c].ljust(w) if w else vals[c] for c, w in _TABLE_COLS)


STDIN_NOTE = (
    "pitstop classify: reading JSON Lines from standard input (end with Ctrl-D); "
    "pass a file, or - to read standard input without this note"
)


def cmd_classify(args: argparse.Namespace) -> int:
    if args.path is None:  # no path given: standard input, which a person at a terminal may not expect
        if sys.stdin.isatty():
            print(STDIN_NOTE, file=sys.stderr)
        args.path = "-"
    clf = Classifier.default()
    out = sys.stdout.buffer
    if args.format == "table":
        out.write(("  ".join(c.upper().ljust(w) if w else c.upper() for c, w in _TABLE_COLS) + "\n").encode())
    for raw in lines(args.path):
        ev = clf.classify_bytes(raw)
        if args.format == "table":
            out.write((_table_row(ev) + "\n").encode())
        else:
            out.write(orjson.dumps(ev) + b"\n")
    out.flush()
    return 0


def add(sub: Subparsers) -> None:
    """classify: JSON Lines of LogEntries in, one FaultEvent line (or table row) out each."""
    c = sub.add_parser(
        "classify", help="classify log entries (JSON Lines in, one FaultEvent JSON line out each)"
    )
    c.add_argument(
        "path", nargs="?", default=None, help="JSON Lines file, or - for standard input (the default)"
    )
    c.add_argument(
        "--format",
        choices=("json", "table"),
        default="json",
        help="json: one FaultEvent per line (default); table: one aligned row per entry",
    )
    c.set_defaults(func=cmd_classify)
