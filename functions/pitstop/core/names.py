"""Validation of identifiers that later reach API paths, Slurm reasons, node lists and labels.

Anything from a log entry is untrusted: only strings that are valid Compute Engine names
get through, so a hostile log line can never smuggle text into a URL or a command. An
instance name is also a Slurm node name, and Slurm reads some strings as more than one
node: ``ALL``/``all`` (every node), ``DEFAULT`` (slurm.conf's defaults record) and hostlist
expressions (``a3-node-[000-003]``, ``a3-node-001,a3-node-002``). Those are refused here,
at parse time, so a name is always exactly one node.
"""

from __future__ import annotations

import re

# RFC 1035 label, as Compute Engine requires for instance names.
_INSTANCE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
# e.g. us-central1-a, europe-west4-b, me-central2-c
_ZONE = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]", re.ASCII)
# e.g. us-central1: a regional GKE cluster's location, which is not a zone
_REGION = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+", re.ASCII)
# Project IDs (6-30 chars), optionally domain-scoped ("example.com:proj"), or a project number.
_PROJECT = re.compile(
    r"(?:[a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]{1,20}", re.ASCII
)
_INSTANCE_ID = re.compile(r"[0-9]{1,20}", re.ASCII)
_CLUSTER = re.compile(r"[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?", re.ASCII)
# A scheduler's own job id: Slurm's (``1234``, an array task ``1234_7``, a het component ``1234+1``),
# the GKE adapter's ``kind/namespace/name`` (adapters/gke/objects.py parse_job_id), or a Vertex AI
# CustomJob's numeric id (the last part of its resource name: core/vertex.py).
_JOB_ID = re.compile(
    r"[0-9]{1,10}(?:[_+][0-9]{1,10})?"
    r"|[0-9]{11,20}"
    r"|(?:jobset|job|pod)/[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?",
    re.ASCII,
)

# Words Slurm reads as keywords where it expects node names (compared case-insensitively).
SLURM_KEYWORDS = frozenset({"all", "default"})
# Characters that make Slurm read a string as a hostlist expression rather than one name.
_HOSTLIST_CHARS = "[],"
MAX_NAME = 63


def instance_problem(s: object) -> str | None:
    """Why ``s`` is not one plain Compute Engine instance (and Slurm node) name; None if it is.

    The reason never quotes the input (it may be hostile), only fixed words.
    """
    if not isinstance(s, str):
        return "instance name is not a string"
    if _INSTANCE.fullmatch(s) is not None and s not in SLURM_KEYWORDS:
        return None  # the common case: a plain lower-case RFC 1035 name that is no keyword
    if not s:
        return "instance name is empty"
    if len(s) > MAX_NAME:
        return f"instance name is longer than {MAX_NAME} characters"
    keyword = s.lower()
    if keyword in SLURM_KEYWORDS:  # a fixed word, so safe to name in the reason
        return f"instance name is the Slurm keyword {keyword.upper()}, not a node name"
    if any(c in s for c in _HOSTLIST_CHARS):
        return "instance name contains '[', ']' or ',': Slurm would read it as a hostlist of several nodes"
    if _INSTANCE.fullmatch(s) is None:
        return "instance name is not a valid Compute Engine name (RFC 1035: a-z, 0-9 and '-')"
    return None


def valid_instance(s: object) -> bool:
    return instance_problem(s) is None


def valid_zone(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 63 and _ZONE.fullmatch(s) is not None


def valid_region(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 61 and _REGION.fullmatch(s) is not None


def zone_in_region(zone: object, region: object) -> bool:
    """Whether ``zone`` is a valid zone of ``region`` (``us-central1-a`` of ``us-central1``)."""
    return valid_zone(zone) and valid_region(region) and str(zone).rsplit("-", 1)[0] == region


def valid_project(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 100 and _PROJECT.fullmatch(s) is not None


def valid_instance_id(s: object) -> bool:
    return isinstance(s, str) and _INSTANCE_ID.fullmatch(s) is not None


def valid_cluster(s: object) -> bool:
    return isinstance(s, str) and len(s) <= 40 and _CLUSTER.fullmatch(s) is not None


def valid_job_id(s: object) -> bool:
    """One job of a scheduler Pitstop drives (it reaches scontrol and Kubernetes URLs), nothing more."""
    return isinstance(s, str) and len(s) <= 330 and _JOB_ID.fullmatch(s) is not None
