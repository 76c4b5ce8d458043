"""What `pitstop pause`, `resume`, `mode` and `silence` share: the control store, who a person is,
the flags every change takes, and what a change prints (core/control.py decides the change)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

from pitstop.core.control import Change, Control, ControlDoc, ControlError, ControlStore, Stamp, changes_lines
from pitstop.core.policy import Policy
from pitstop.tools import common

AUDIT_DAYS = 7.0  # how far back `pitstop incidents` lists the control's changes


def store_and_policy(args: argparse.Namespace) -> tuple[ControlStore, Policy]:
    """The control document's store, in the database and under the prefix deploy.yaml names."""
    from pitstop.adapters.firestore_control import FirestoreControl

    store, pol = common.store_and_policy(args.project, args.config)
    return FirestoreControl(store.db, pol.doc["store"]["collection_prefix"]), pol


def who(by: str | None) -> str:
    """``--by``, else the account gcloud is logged in as (what `gcloud config get-value account` says)."""
    if by:
        return by
    gcloud = shutil.which("gcloud")
    if gcloud is not None:
        try:
            got = subprocess.run([gcloud, "config", "get-value", "account"], capture_output=True,
                                 text=True, timeout=30, check=False)  # fmt: skip
            account = got.stdout.strip()
            if got.returncode == 0 and account and account != "(unset)":
                return account
        except (OSError, subprocess.TimeoutExpired):
            pass
    raise ControlError("who is making this change? pass --by NAME (or log in: gcloud auth login)")


def stamp(args: argparse.Namespace, reason: str | None = None) -> Stamp:
    text = (reason if reason is not None else args.reason) or ""
    return {"by": who(args.by), "at": time.time(), "reason": text.strip()[:500]}


def known_cluster(pol: Policy, cluster: str | None) -> None:
    """A change for a cluster the policy does not configure would match nothing: refused."""
    if cluster is not None and pol.clusters and pol.cluster_named(cluster) is None:
        named = ", ".join(c.name for c in pol.clusters)
        raise ControlError(
            f"the policy has no cluster {cluster!r} (it has: {named}); pass --config deploy.yaml"
        )


def apply(
    args: argparse.Namespace,
    change: Callable[[ControlDoc, Stamp], tuple[ControlDoc, Change]],
    check: Any = None,
) -> int:
    """Make one change (audited with who, when and why), then print it and what is in force now."""
    store, pol = store_and_policy(args)
    if check is not None:
        check(pol)
    who_ = stamp(args)
    done = store.change_control(lambda doc: change(doc, who_))
    print("\n".join(changes_lines([done])))
    show(store, time.time())
    return 0


def show(store: ControlStore, now: float) -> None:
    lines = Control.of(store.read_control()).lines(now)
    print("in force:" if lines else "in force: nothing (the policy as deployed)")
    for line in lines:
        print(f"  {line}")


def summary(store: ControlStore, now: float, days: float = AUDIT_DAYS) -> list[str]:
    """What `pitstop incidents` prints first: what is in force, and the changes of the last days."""
    lines = [f"  {x}" for x in Control.of(store.read_control()).lines(now)]
    changes = changes_lines(store.control_changes(now - days * 86400))
    out = ["runtime control in force:", *lines] if lines else []
    if changes:
        out += [f"runtime control changes in the last {days:g} days:", *(f"  {c}" for c in changes)]
    return out


def add_flags(p: argparse.ArgumentParser, reason_required: bool = True) -> None:
    p.add_argument(
        "--reason",
        required=reason_required,
        default=None,
        help="why (kept with the change, shown in `pitstop incidents`, the report and every page it causes)",
    )
    p.add_argument("--by", default=None, help="who makes the change (default: gcloud's logged-in account)")
    common.add_store_flags(p)
