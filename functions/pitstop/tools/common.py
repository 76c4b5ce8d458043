"""What several verbs share: reading input lines, the operator's incident store, durations."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def lines(path: str) -> Iterator[bytes]:
    stream: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for raw in stream:
            if raw.strip():
                yield raw
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def database() -> str:
    """The database deploy creates (``pitstop``); the emulator's local stack keeps the default one."""
    import os

    named = os.environ.get("PITSTOP_FIRESTORE_DATABASE")
    return named or ("(default)" if os.environ.get("FIRESTORE_EMULATOR_HOST") else "pitstop")


def store_and_policy(project: str | None) -> Any:
    import os

    from google.cloud import firestore

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.core import policy as policy_mod

    pol = policy_mod.load()
    client = firestore.Client(
        project=project or os.environ.get("GOOGLE_CLOUD_PROJECT"),
        database=database(),
    )
    return IncidentStore(client, pol.doc["store"]["collection_prefix"]), pol


def duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].replace(".", "", 1).isdigit():
        raise SystemExit(f"--since takes a duration like 90m, 6h or 2d, not {text!r}")
    return float(text[:-1]) * units[text[-1]]
