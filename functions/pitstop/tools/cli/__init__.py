"""The ``pitstop`` command line: one module per verb, each with ``add(subparsers)`` and its handler."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pitstop.core.resources import DataFileError
from pitstop.tools import report, simulate
from pitstop.tools.cli import (
    bench,
    classify,
    demo,
    deploy,
    doctor,
    errors,
    incidents,
    local,
    mode,
    pause,
    replay,
    resume,
    silence,
)

# in this order: it is the order `pitstop --help` lists them (simulate and report live in their own
# modules of tools/: the fleet model in tools/sim/, the page in report.py and report_model.py)
VERBS = (
    classify,
    bench,
    incidents,
    pause,
    resume,
    mode,
    silence,
    replay,
    local,
    deploy,
    demo,
    doctor,
    simulate,
    report,
)


def version() -> str:
    """The installed package's version (pyproject.toml's, through the package metadata)."""
    from importlib import metadata

    try:
        return metadata.version("pitstop")
    except metadata.PackageNotFoundError:  # run from a checkout without `make install`
        return "unknown (not installed: run `make install`)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pitstop", description="GPU-cluster fault remediation on Google Cloud.")
    p.add_argument("--version", action="version", version=f"pitstop {version()}", help="print the version")
    sub = p.add_subparsers(dest="command", required=True, metavar="VERB")
    for verb in VERBS:
        verb.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        return 0
    except (FileNotFoundError, IsADirectoryError, PermissionError, DataFileError) as exc:
        print(f"pitstop: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        said = errors.explain(exc)
        if said is None:
            raise  # not a failure a person can fix: a bug, with its traceback
        print(f"pitstop {args.command}: {said}", file=sys.stderr)
        return 2
    return rc
