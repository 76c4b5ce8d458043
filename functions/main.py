"""Cloud Functions entry points (deployed from this folder; see infra/).

Each handler builds its service once per instance from the environment:
GOOGLE_CLOUD_PROJECT, PITSTOP_POLICY (path to policy.yaml), PITSTOP_NOTIFICATIONS_TOPIC, PITSTOP_ALERTS_TOPIC,
PITSTOP_WEBHOOK_URL and PITSTOP_NOTIFY_KEY (from Secret Manager via --set-secrets) and PITSTOP_WEBHOOK_FORMAT
(chat|slack); local endpoints PITSTOP_WORKFLOWS_ENDPOINT, PITSTOP_COMPUTE_ENDPOINT,
PITSTOP_MONITORING_ENDPOINT and PITSTOP_KUBE_ENDPOINT (the fake Kubernetes API server every GKE
cluster is reached at) only when running on the local stack; emulator variables in tests.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import functions_framework
from cloudevents.http import CloudEvent
from google.cloud import firestore

from pitstop.adapters import log
from pitstop.adapters.firestore import IncidentStore
from pitstop.core import policy as policy_mod

if TYPE_CHECKING:
    from google.cloud.pubsub_v1 import PublisherClient

    from pitstop.adapters.compute import ComputeAdapter
    from pitstop.services.actuate import Actuator
    from pitstop.services.control import RuntimeControl
    from pitstop.services.ingest import Ingest
    from pitstop.services.notify import Notify
    from pitstop.services.sweep import Sweep

# Every function is deployed from this one module, so a client library imported here is loaded
# by every instance. Each builder below imports what its own function needs: google-cloud-compute's
# types alone are ~94 MiB resident, which ingest (whose instances hold a storm's state) never needs
# but for a rare regional-node lookup, and monitoring's ~40 MiB only notify needs.


def _compute_adapter(endpoint: str | None) -> ComputeAdapter:
    """The Compute adapter (the local chaos entry point swaps in one that can crash)."""
    from pitstop.adapters.compute import ComputeAdapter

    return ComputeAdapter(endpoint)


def _publisher() -> PublisherClient:
    """actuate's Pub/Sub publisher (the local chaos entry point swaps in one that can time out)."""
    from google.cloud.pubsub_v1 import PublisherClient

    return PublisherClient()


def _project() -> str:
    return os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ["GCP_PROJECT"]


def _notify_key() -> bytes | None:
    """The per-deploy key notifications are sealed with (secret pitstop-notify-key, set by deploy).
    Without it ids are the incident's digest and no alert key is sent: PagerDuty alerts are then
    never resolved by a notification, only by a person."""
    key = os.environ.get("PITSTOP_NOTIFY_KEY", "").strip()
    if not key:
        log.emit("ERROR", "PITSTOP_NOTIFY_KEY is not set: notifications are not sealed")
    return key.encode() or None


class _LazyInstances:
    """Compute's instances client, made on first use: only a regional GKE entry needs it."""

    def get(self, **kwargs: Any) -> Any:
        return _compute().instances.get(**kwargs)


T = TypeVar("T")


class _Once(Generic[T]):
    """``functools.cache`` for a builder without arguments, except that it builds once when its
    first calls come from several threads at once: ``functools.cache`` builds in each of them, and
    an ingest instance whose first deliveries arrived together kept two coalescers, the second
    one's cache blind to a line the first had committed, and counted a redelivery of that line
    again (`pitstop bench ingest` with a 1 ms ack deadline: 61 lines of 60, on main too)."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build, self._lock, self._made = build, threading.Lock(), list[T]()

    def __call__(self) -> T:
        if not self._made:
            with self._lock:
                if not self._made:
                    self._made.append(self._build())
        return self._made[0]

    def cache_info(self) -> SimpleNamespace:
        return SimpleNamespace(currsize=len(self._made))

    def cache_clear(self) -> None:
        with self._lock:
            self._made.clear()


@_Once
def _compute() -> ComputeAdapter:
    return _compute_adapter(os.environ.get("PITSTOP_COMPUTE_ENDPOINT"))


def _control(db: firestore.Client, pol: policy_mod.Policy) -> RuntimeControl:
    """The runtime control document (pitstop pause, mode, silence), read once per control_cache_s."""
    from pitstop.adapters.firestore_control import FirestoreControl
    from pitstop.services.control import RuntimeControl

    store = pol.doc["store"]
    return RuntimeControl(FirestoreControl(db, store["collection_prefix"]), float(store["control_cache_s"]))


def _db(project: str, env: str = "PITSTOP_FIRESTORE_DATABASE") -> firestore.Client:
    """Pitstop's own Firestore database (deploy creates it; IAM conditions grant only it), or with
    ``env`` PITSTOP_NOTIFY_DATABASE notify's ledger database (unset: the same database)."""
    main = os.environ.get("PITSTOP_FIRESTORE_DATABASE", "(default)")
    return firestore.Client(project=project, database=os.environ.get(env, main))


@_Once
def _ingest() -> Ingest:
    from pitstop.adapters.gke.node import KubeClients, NodeReader
    from pitstop.adapters.gke.zone import ClusterZones, ZoneResolver
    from pitstop.adapters.pubsub import Notifier
    from pitstop.adapters.workflows import WorkflowStarter
    from pitstop.services.coalesce import ACK_DEADLINE_S
    from pitstop.services.ingest import Ingest

    project = _project()
    pol = policy_mod.load()
    db = _db(project)
    store = IncidentStore(db, pol.doc["store"]["collection_prefix"])
    wf = pol.doc["workflow"]
    starter = WorkflowStarter(
        project, wf["location"], wf["name"], os.environ.get("PITSTOP_WORKFLOWS_ENDPOINT")
    )
    notifier = Notifier(
        project, os.environ.get("PITSTOP_NOTIFICATIONS_TOPIC", "pitstop-notifications"), key=_notify_key()
    )
    # GKE: the Node an entry names gives a regional node's zone (spec.providerID; else Compute's
    # instances.get in each of its cluster's zones, from clusters.get) and its device plugin's word
    # on a serial-console Xid line (XidCriticalError).
    kube = KubeClients(pol, project, os.environ.get("PITSTOP_KUBE_ENDPOINT"))
    clusters = ClusterZones(endpoint=os.environ.get("PITSTOP_CONTAINER_ENDPOINT"))
    zones = ZoneResolver(kube_for=kube, instances=_LazyInstances(), clusters=clusters)
    alerts_topic = os.environ.get("PITSTOP_ALERTS_TOPIC", "pitstop-alerts")
    # The trigger subscription's ack deadline (deploy sets both): a delivery past it is redelivered.
    deadline = float(os.environ.get("PITSTOP_ACK_DEADLINE_S", ACK_DEADLINE_S))
    return Ingest(
        pol,
        store,
        starter,
        notifier,
        zones=zones,
        nodes=NodeReader(kube),
        alerts_topic=alerts_topic,
        ack_deadline_s=deadline,
        control=_control(db, pol),
    )


def _sweep() -> Sweep:
    """Not cached on its own: it works on the ingest service's store and coalescer; the
    watchdog asks Workflows through ingest's starter."""
    from pitstop.services.sweep import Sweep

    return Sweep(_ingest())


# -- storm counts reach Firestore when the instance stops ------------------------------------
# Handlers run in worker threads, where no signal handler can be installed; this module is
# imported in the main thread, so the hooks are installed here, once. Counts are also merged
# every store.flush_interval_s by the coalescer's own timer thread while the instance lives.

SHUTDOWN_FLUSH_S = 8.0  # Cloud Run allows 10 s between SIGTERM and SIGKILL
_previous_sigterm: Any = None


def flush_counts() -> None:
    """Merge this instance's buffered storm counts, if ingest was ever built here."""
    if _ingest.cache_info().currsize:
        _ingest().coalescer.flush_all(time.time(), wait_s=SHUTDOWN_FLUSH_S)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Flush (in a thread, so a lock the interrupted code holds cannot block it), then go on
    with what SIGTERM did before (the server's own graceful stop, or the default exit)."""
    worker = threading.Thread(target=flush_counts, name="pitstop-flush-on-term", daemon=True)
    worker.start()
    worker.join(SHUTDOWN_FLUSH_S)
    prev = _previous_sigterm
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        raise SystemExit(0)


def _install_shutdown_hooks() -> None:
    global _previous_sigterm
    atexit.register(flush_counts)
    if threading.current_thread() is not threading.main_thread():
        return  # imported by a worker thread: only atexit and the timer remain
    with contextlib.suppress(ValueError, OSError):
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_sigterm)


_install_shutdown_hooks()


@_Once
def _actuator() -> Actuator:
    from pitstop.adapters.monitoring import TelemetryReader
    from pitstop.adapters.prometheus import PromQLReader
    from pitstop.adapters.pubsub import Notifier
    from pitstop.adapters.workflows import WorkflowStarter
    from pitstop.services.actuate import STEP_CLAIM_S, Actuator
    from pitstop.services.schedulers import Wiring, schedulers_for

    project = _project()
    pol = policy_mod.load()
    prefix = pol.doc["store"]["collection_prefix"]
    db = _db(project)
    publisher = _publisher()
    wiring = Wiring(
        project,
        publisher,
        db.collection(f"{prefix}_slurm_results"),
        kube_endpoint=os.environ.get("PITSTOP_KUBE_ENDPOINT"),
    )
    schedulers = schedulers_for(pol, wiring)
    wf = pol.doc["workflow"]
    starter = WorkflowStarter(
        project, wf["location"], wf["name"], os.environ.get("PITSTOP_WORKFLOWS_ENDPOINT")
    )
    notifier = Notifier(
        project,
        os.environ.get("PITSTOP_NOTIFICATIONS_TOPIC", "pitstop-notifications"),
        publisher,
        key=_notify_key(),
    )
    return Actuator(
        pol,
        IncidentStore(db, prefix),
        _compute_adapter(os.environ.get("PITSTOP_COMPUTE_ENDPOINT")),
        schedulers,
        notifier,
        starter,
        # the local stack runs the workflow's waits scaled down, so it scales the claim with them
        claim_s=float(os.environ.get("PITSTOP_STEP_CLAIM_S", STEP_CLAIM_S)),
        telemetry=TelemetryReader(os.environ.get("PITSTOP_MONITORING_ENDPOINT")),
        prometheus=PromQLReader(os.environ.get("PITSTOP_PROMETHEUS_ENDPOINT")),
        control=_control(db, pol),
    )


@_Once
def _notify() -> Notify:
    from pitstop.adapters.monitoring import MetricsWriter
    from pitstop.adapters.step_records import FirestoreStepStore
    from pitstop.services.channels import configured
    from pitstop.services.notify import Notify

    project = _project()
    pol = policy_mod.load()
    endpoint = os.environ.get("PITSTOP_MONITORING_ENDPOINT")
    metrics = MetricsWriter(project, endpoint) if os.environ.get("PITSTOP_METRICS", "on") != "off" else None
    # notify's own database: its IAM grant reaches no incident or step (infra/iam.yaml notify-database)
    ledger = _db(project, "PITSTOP_NOTIFY_DATABASE").collection(
        f"{pol.doc['store']['collection_prefix']}_notifications"
    )
    return Notify(configured(os.environ), metrics, FirestoreStepStore(ledger))


@functions_framework.cloud_event
def ingest(cloud_event: CloudEvent) -> None:
    """Pub/Sub messagePublished: one LogEntry from the Cloud Logging sink, or one Cloud Monitoring
    notification from the alerts topic (the CloudEvent's source says which topic it came through)."""
    _ingest().handle_payload({"message": (cloud_event.data or {}).get("message")}, cloud_event["source"])


@functions_framework.http
def sweep(request: Any) -> tuple[dict[str, int], int]:
    """Cloud Scheduler, every minute: end bursts, retry held incidents and lost starts, the watchdog."""
    return _sweep().run(), 200


@functions_framework.http
def actuate(request: Any) -> tuple[dict[str, Any], int]:
    """Called by the remediation workflow (OIDC; only the workflow's account may invoke it)."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return {"error": "request body must be a JSON object"}, 400
    return _actuator().handle(body)


@functions_framework.cloud_event
def notify(cloud_event: CloudEvent) -> None:
    """Pub/Sub messagePublished on the notifications topic."""
    message = (cloud_event.data or {}).get("message") or {}
    try:
        notification = json.loads(base64.b64decode(message.get("data") or ""))
    except ValueError:
        log.emit("ERROR", "notification is not base64 JSON; dropped", message_id=message.get("messageId"))
        return
    if not isinstance(notification, dict):
        log.emit("ERROR", "notification is not a JSON object; dropped", message_id=message.get("messageId"))
        return
    _notify().handle(notification, str(message.get("messageId") or cloud_event["id"]))
