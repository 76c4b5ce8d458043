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


def database(config: str | None = None) -> str:
    """The store's Firestore database: deploy.yaml's ``firestore_database`` when ``config`` names one;
    else $PITSTOP_FIRESTORE_DATABASE, the emulator's default one, or deploy's ``pitstop``."""
    import os

    if config:
        from pitstop.tools import deploy

        return deploy.setting(deploy.load_config(config), "firestore_database")
    named = os.environ.get("PITSTOP_FIRESTORE_DATABASE")
    return named or ("(default)" if os.environ.get("FIRESTORE_EMULATOR_HOST") else "pitstop")


def policy_file(config: str | None, policy: str | None = None) -> str | None:
    """The policy to read: ``--policy``, else deploy.yaml's ``policy`` (``--config``), else
    $PITSTOP_POLICY or the shipped defaults (None)."""
    if policy or not config:
        return policy
    from pitstop.tools import deploy

    return deploy.policy_path(deploy.load_config(config))


def store_and_policy(project: str | None, config: str | None = None) -> Any:
    """The incident store deploy made (its database and the policy's collection prefix), and the policy."""
    import os

    from google.cloud import firestore

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.core import policy as policy_mod

    pol = policy_mod.load(policy_file(config))
    client = firestore.Client(
        project=project or os.environ.get("GOOGLE_CLOUD_PROJECT"),
        database=database(config),
    )
    return IncidentStore(client, pol.doc["store"]["collection_prefix"]), pol


def add_store_flags(p: argparse.ArgumentParser) -> None:
    """--project and --config: where the incident store is (every verb that reads it takes both)."""
    p.add_argument(
        "--project", default=None, help="the incident store's project (default $GOOGLE_CLOUD_PROJECT)"
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="deploy.yaml",
        help="the deploy.yaml Pitstop was deployed with: its firestore_database and its policy's "
        "store.collection_prefix (default: database pitstop, or $PITSTOP_FIRESTORE_DATABASE; "
        "the shipped policy, or $PITSTOP_POLICY)",
    )


def duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].replace(".", "", 1).isdigit():
        raise SystemExit(f"--since takes a duration like 90m, 6h or 2d, not {text!r}")
    return float(text[:-1]) * units[text[-1]]
