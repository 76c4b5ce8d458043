"""Deterministic request ids for effects that an API deduplicates (Compute Engine's ``requestId``).

A retried actuate call, a re-run workflow step or a second execution of the same step must
send the *same* id, so the API recognises the repeat and does the effect once (DESIGN.md,
"At-least-once in, exactly-once effect out"). The id is a UUID (Compute requires a valid,
non-zero UUID), derived by uuid5 from what identifies the effect: the incident, its step,
the operation and, where one step makes several calls, something that tells them apart.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

from pitstop.core.domain import JobRunDoc

# Fixed for ever: changing it would change every id and defeat deduplication of in-flight retries.
PITSTOP_NAMESPACE = uuid.UUID("f09170ed-d601-49f3-afe2-6a2e14305987")


def request_id(incident: str, step: int, op: str, extra: str = "") -> str:
    """The request id of one effect: the same arguments give the same id, anything else another.

    The parts are encoded as a JSON array, so no choice of strings can make two different
    effects collide (``("a-1", 2)`` and ``("a", 12)`` stay apart).
    """
    if not isinstance(incident, str) or not incident:
        raise ValueError("request_id needs an incident id")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError("request_id needs a non-negative integer step")
    if not isinstance(op, str) or not op:
        raise ValueError("request_id needs an operation name")
    if not isinstance(extra, str):
        raise ValueError("request_id's extra must be a string")
    key = json.dumps(["pitstop-request", incident, step, op, extra], separators=(",", ":"))
    return str(uuid.uuid5(PITSTOP_NAMESPACE, key))


def derived_request_id(parent: str, label: str) -> str:
    """A second, distinct and equally deterministic id for a follow-up call of the same effect.

    Used when one effect needs a new attempt that must not be taken for a repeat of the first
    (setLabels after a stale fingerprint: the first request was refused and changed nothing).
    """
    return str(uuid.uuid5(uuid.UUID(parent), label))


def job_key(cluster: str, job: str) -> str:
    """The id of one job of one cluster across its runs (the job-disruption budget's record)."""
    parts = json.dumps([cluster, job], separators=(",", ":"))
    return "job-" + hashlib.sha256(parts.encode()).hexdigest()[:24]


def requeue_key(cluster: str, job: str, run: JobRunDoc) -> str:
    """The id of one run of one job (cluster, job, restart count, start time): a requeue's record.

    A gang moves once per fault: the first incident to claim a run requeues it; a later run of
    the same job (already requeued, by Pitstop or anyone) has another key. A Firestore document
    id: no ``/``, bounded length; the parts are hashed so no choice of strings can collide.
    """
    parts = json.dumps(
        [cluster, job, run.get("restarts"), run.get("start_time")], separators=(",", ":"), default=str
    )
    digest = hashlib.sha256(parts.encode()).hexdigest()[:24]
    safe = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{cluster}-{job}")[:100]
    return f"{safe}-{digest}"


def block_scope(block: str) -> str:
    """The budget document of a reservation block (``cluster/block`` from Compute's host topology)."""
    return "block-" + hashlib.sha256(block.encode()).hexdigest()[:16]
