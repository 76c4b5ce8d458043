"""The `pitstop` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any

import orjson

from .classify import Classifier


def _lines(path: str) -> Iterator[bytes]:
    stream: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for raw in stream:
            if raw.strip():
                yield raw
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


_TABLE_COLS = (("kind", 10), ("action", 14), ("xid", 4), ("node", 28), ("gpu", 12), ("reason", 0))


def _table_row(ev: dict[str, Any]) -> str:
    node = ev["node"]["instance"] if ev.get("node") else "-"
    gpu = (ev.get("gpu") or {}).get("pci") or "-"
    vals = {
        "kind": ev["kind"],
        "action": ev["action"],
        "xid": "" if ev["xid"] is None else str(ev["xid"]),
        "node": node,
        "gpu": gpu,
        "reason": ev["reason"],
    }
    return "  ".join(vals[c].ljust(w) if w else vals[c] for c, w in _TABLE_COLS)


def cmd_classify(args: argparse.Namespace) -> int:
    clf = Classifier.default()
    out = sys.stdout.buffer
    if args.format == "table":
        out.write(("  ".join(c.upper().ljust(w) if w else c.upper() for c, w in _TABLE_COLS) + "\n").encode())
    for raw in _lines(args.path):
        ev = clf.classify_bytes(raw)
        if args.format == "table":
            out.write((_table_row(ev) + "\n").encode())
        else:
            out.write(orjson.dumps(ev) + b"\n")
    out.flush()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.target == "classify":
        result = bench.bench_classify(args.lines)
    else:  # pragma: no cover - argparse restricts choices
        raise SystemExit(f"unknown benchmark {args.target}")
    sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pitstop", description="GPU-cluster fault remediation on Google Cloud.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser(
        "classify", help="classify log entries (JSON Lines in, one FaultEvent JSON line out each)"
    )
    c.add_argument("path", nargs="?", default="-", help="JSON Lines file, or - for standard input")
    c.add_argument("--format", choices=("json", "table"), default="json")
    c.set_defaults(func=cmd_classify)

    b = sub.add_parser("bench", help="measure speed")
    b.add_argument("target", choices=("classify",))
    b.add_argument("--lines", type=int, default=100_000)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        return 0
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(f"pitstop: {exc}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
