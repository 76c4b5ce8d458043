"""Validation of identifiers that later reach API paths, Slurm reasons and labels.

Anything from a log entry is untrusted: only strings that are valid Compute Engine names
get through, so a hostile log line can never smuggle text into a URL or a command.
"""

from __future__ import annotations

import re

# RFC 1035 label, as Compute Engine requires for instance names.
_INSTANCE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
# e.g. us-central1-a, europe-west4-b, me-central2-c
_ZONE = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]")
# Project IDs (6-30 chars), optionally domain-scoped ("example.com:proj"), or a project number.
_PROJECT = re.compile(r"(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]{1,20}")
_INSTANCE_ID = re.compile(r"[0-9]{1,20}")
_CLUSTER = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?")


def valid_instance(s: object) -> bool:
    return isinstance(s, str) and _INSTANCE.fullmatch(s) is not None


def valid_zone(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 63 and _ZONE.fullmatch(s) is not None


def valid_project(s: object) -> bool:
    return isinstance(s, str) and _PROJECT.fullmatch(s) is not None


def valid_instance_id(s: object) -> bool:
    return isinstance(s, str) and _INSTANCE_ID.fullmatch(s) is not None


def valid_cluster(s: object) -> bool:
    return isinstance(s, str) and _CLUSTER.fullmatch(s) is not None
