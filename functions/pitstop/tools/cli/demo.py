"""``pitstop demo``: the local stack plus the fault scenarios."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def cmd_demo(args: argparse.Namespace) -> int:
    import sys

    from pitstop.local.stack import default_workdir
    from pitstop.tools import demo

    unknown = sorted(set(args.only or ()) - set(_keys()))
    if unknown:
        print(f"pitstop demo: no scenario {', '.join(unknown)}; one of: {' '.join(_keys())}", file=sys.stderr)
        return 2

    return demo.run(
        Path(args.workdir) if args.workdir else default_workdir() / "demo", args.only or None, keep=args.keep
    )


def _keys() -> list[str]:
    """The scenarios' keys as the data file lists them (read, not validated: `pitstop demo` validates)."""
    import yaml

    from pitstop.core.resources import schema_dir

    try:
        doc = yaml.safe_load((schema_dir() / "demo-scenarios.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return ["(the scenarios' keys: schemas/demo-scenarios.yaml)"]
    return [str(s.get("key")) for s in doc.get("scenarios", [])]


def add(sub: Subparsers) -> None:
    """demo: the local stack plus the fault scenarios."""
    d = sub.add_parser("demo", help="start the local stack, run the fault scenarios, stop it")
    d.add_argument("--only", nargs="*", help=" ".join(_keys()) + " (schemas/demo-scenarios.yaml)")
    d.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    d.add_argument("--workdir", default=None, help="state and logs (default .local/demo in the repository)")
    d.set_defaults(func=cmd_demo)
