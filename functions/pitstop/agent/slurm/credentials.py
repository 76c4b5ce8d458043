"""The Google credentials the agent calls Pub/Sub with: the VM's own, or a named service account's.

By default the client libraries use Application Default Credentials (on a controller VM: its
service account, pitstop-slurm-CLUSTER). A fleet whose controllers share one VM account (Cluster
Toolkit's default) names Pitstop's per-cluster account instead (``--impersonate-service-account``,
or PITSTOP_IMPERSONATE_SA in /etc/pitstop/agent.env): the agent then holds short-lived tokens of
that account, minted by IAM Credentials' generateAccessToken with the VM's identity, which needs
roles/iam.serviceAccountTokenCreator on that account and nothing else (google-auth's
impersonated_credentials; cloud.google.com/iam/docs/service-account-impersonation).
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Any

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
LIFETIME_S = 3600  # each token's; google-auth mints the next one before it expires
ACCOUNT = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9.-]+\.iam\.gserviceaccount\.com")


def for_account(account: str | None) -> Any:  # a google.auth Credentials (untyped library), or None
    """None (the libraries' default credentials), or ``account``'s through impersonation."""
    if not account:
        return None
    if ACCOUNT.fullmatch(account) is None:
        raise SystemExit(f"pitstop-slurm-agent: {account!r} is not a service account email")
    import google.auth
    from google.auth import impersonated_credentials

    source, _ = google.auth.default(scopes=SCOPES)
    return impersonated_credentials.Credentials(  # type: ignore[no-untyped-call]
        source_credentials=source, target_principal=account, target_scopes=SCOPES, lifetime=LIFETIME_S
    )


def version() -> str:
    """The installed distribution's version: the agent's own wheel, or the whole package."""
    for name in ("pitstop-slurm-agent", "pitstop"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
