"""Cloud Functions entry points (deployed from this folder; see infra/).

Each handler builds its service once per instance from the environment:
GOOGLE_CLOUD_PROJECT, PITSTOP_POLICY (path to policy.yaml), PITSTOP_NOTIFICATIONS_TOPIC,
PITSTOP_WORKFLOWS_ENDPOINT (local runner only), and the emulator variables in tests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from typing import Any

import functions_framework
from cloudevents.http import CloudEvent
from google.cloud import firestore

from pitstop import policy as policy_mod
from pitstop.ingest import Ingest
from pitstop.notifier import Notifier
from pitstop.store import IncidentStore
from pitstop.workflows_client import WorkflowStarter


def _project() -> str:
    return os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ["GCP_PROJECT"]


@functools.cache
def _ingest() -> Ingest:
    project = _project()
    pol = policy_mod.load()
    store = IncidentStore(firestore.Client(project=project), pol.doc["store"]["collection_prefix"])
    wf = pol.doc["workflow"]
    starter = WorkflowStarter(
        project, wf["location"], wf["name"], os.environ.get("PITSTOP_WORKFLOWS_ENDPOINT")
    )
    notifier = Notifier(project, os.environ.get("PITSTOP_NOTIFICATIONS_TOPIC", "pitstop-notifications"))
    service = Ingest(pol, store, starter, notifier)

    def _flush_on_term(signum: int, frame: Any) -> None:  # Cloud Run sends SIGTERM before scale-in
        service.coalescer.flush_all(time.time())
        raise SystemExit(0)

    with contextlib.suppress(ValueError):  # not the main thread (some test servers)
        signal.signal(signal.SIGTERM, _flush_on_term)
    return service


@functions_framework.cloud_event
def ingest(cloud_event: CloudEvent) -> None:
    """Pub/Sub messagePublished: one LogEntry from the Cloud Logging sink."""
    _ingest().handle_payload({"message": (cloud_event.data or {}).get("message")})


@functions_framework.http
def sweep(request: Any) -> tuple[dict[str, int], int]:
    """Cloud Scheduler, every minute: flush counts, end bursts, retry held incidents and lost starts."""
    return _ingest().sweep(), 200
