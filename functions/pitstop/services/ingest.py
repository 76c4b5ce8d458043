"""The ingest service: delivery → FaultEvent → incident store → workflow start / page.

At-least-once in, exactly-once effect out. Unrelated and invalid entries are logged and
acknowledged. A delivery whose envelope cannot be decoded at all is a poison message: it
raises, so Pub/Sub retries it and then moves it to the dead-letter topic, where the
original bytes stay for inspection. Transient infrastructure errors before the decision
commits propagate (Pub/Sub retries). What follows a committed decision (a workflow start, a
page) is recorded with it — a pending step, an outbox entry — so trouble there is logged and
left to the sweep (services/sweep.py) instead of turning a done delivery into a retry.

The periodic upkeep (what happens with no entry arriving) is services/sweep.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc

from pitstop.adapters import log
from pitstop.adapters.gke.node import NodeReader, corroborate
from pitstop.adapters.gke.zone import ZoneResolver, fill_zone
from pitstop.core import alerts, corroboration, engine, vertex_log
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.core.envelope import unwrap
from pitstop.core.policy import Policy
from pitstop.core.store import IncidentStore
from pitstop.core.timefmt import to_epoch
from pitstop.services.coalesce import ACK_DEADLINE_S, Coalescer
from pitstop.services.control import RuntimeControl
from pitstop.services.launch import Launcher, Publisher, Starter

# Trouble in a backing service after a decision committed: the sweep finishes what was left.
FOLLOW_UP_ERRORS = (gexc.GoogleAPICallError, gexc.RetryError, ValueError, TimeoutError, ConnectionError)


class PoisonMessageError(ValueError):
    """The delivery cannot be decoded; retrying is pointless, dead-lettering keeps it."""


class Ingest:
    def __init__(
        self,
        policy: Policy,
        store: IncidentStore,
        starter: Starter | None,
        notifier: Publisher | None,
        classifier: Classifier | None = None,
        clock: Callable[[], float] = time.time,
        zones: ZoneResolver | None = None,
        nodes: NodeReader | None = None,
        alerts_topic: str = alerts.DEFAULT_TOPIC,
        ack_deadline_s: float = ACK_DEADLINE_S,
        control: RuntimeControl | None = None,
    ) -> None:
        self.policy, self.store, self.zones, self.nodes = policy, store, zones, nodes
        self.deployed, self.control = policy, control  # the policy as deployed; the runtime control
        self.launcher = Launcher(store, starter, notifier)
        self.classifier = classifier or Classifier(
            policy.xids, Classifier.default().system_events, alerts_topic
        )
        self.clock = clock
        self.coalescer = Coalescer(store, policy, clock, ack_deadline_s=ack_deadline_s)
        self.coalescer.on_outcome = lambda out: self.follow_up(out, self.clock())

    def handle_payload(self, payload: Any, source: str | None = None) -> engine.Outcome:
        """One delivery; ``source`` is the CloudEvent's (the topic it came through), which tells a
        Monitoring notification from the alerts topic (core/alerts.py) from anything else."""
        delivery = unwrap(payload)
        if delivery.entry is None:
            log.emit("ERROR", "poison delivery", reason=delivery.error, message_id=delivery.message_id)
            raise PoisonMessageError(delivery.error or "undecodable delivery")
        return self.handle_event(self.classifier.from_delivery(delivery, source))

    def handle_event(self, ev: FaultEvent) -> engine.Outcome:
        now = self.clock()
        ev = vertex_log.place(ev, self.policy)  # a Vertex AI job's entry: the job of its policy cluster
        if ev["kind"] in ("unrelated", "invalid"):
            sev = "WARNING" if ev["kind"] == "invalid" else "DEBUG"
            ref = ev.get("node")
            node = ref.get("instance") if ref else None  # an undecodable line is recorded against its node
            log.emit(
                sev, f"{ev['kind']} entry acknowledged", reason=ev["reason"], source=ev["source"], node=node
            )
            return engine.Outcome("ignored")
        self.in_force()
        if ev["node"] is not None and ev["node"].get("zone") is None:  # a regional GKE cluster's entry
            why = fill_zone(ev, self.zones) if self.zones is not None else "no zone resolver configured"
            if why is not None:  # ZoneLookupError (Compute or Kubernetes unreachable) is redelivered
                log.emit(
                    "WARNING", "regional event without a zone acknowledged", reason=why, source=ev["source"]
                )
                return engine.Outcome("ignored")
        if self.nodes is not None:  # a GKE node's text line, confirmed by its device plugin's condition
            ev = self._corroborated(ev, self.nodes, self.policy.xids.device_plugin_xids)
        observed = to_epoch(ev.get("observed_at"))
        ev["_observed_ts"] = min(observed, now) if observed else now
        # a system event acts only while fresh: an old one (anyone may publish any timestamp) is a record
        fresh = corroboration.fresh_only(ev, now, self.policy.corroboration["event_max_age_s"])
        if fresh is not ev:
            log.emit("WARNING", "stale system event recorded, not acted on", reason=fresh["reason"],
                     source=ev["source"], node=engine.subject_name(ev))  # fmt: skip
            ev = fresh
        out = self.coalescer.handle(ev, now)
        if out.coalesced:
            return out  # counted in memory: it decided nothing, so nothing follows (no read, no write)
        if out.result == "late":
            log.emit(
                "WARNING",
                "delivery past its ack deadline left to the redelivery",
                node=engine.subject_name(ev),
            )
            return out
        log.emit(
            "INFO",
            f"event {out.result}",
            kind=ev["kind"],
            action=ev["action"],
            xid=ev["xid"],
            node=engine.subject_name(ev),
            incident=out.incident["id"] if out.incident else None,
            mode=self.policy.mode,
        )
        self.follow_up(out, now)
        return out

    def in_force(self) -> Policy:
        """The policy decisions get now: the deployed one with the runtime control as this instance
        has it (services/control.py: read once per ``store.control_cache_s``, never per line)."""
        if self.control is not None:
            pol = self.control.policy(self.deployed)
            if pol is not self.policy:
                self.policy = self.coalescer.policy = pol
        return self.policy

    @staticmethod
    def _corroborated(ev: FaultEvent, nodes: NodeReader, watched: frozenset[int]) -> FaultEvent:
        out = corroborate(ev, nodes, watched)
        if out["source"]["trust"] != ev["source"]["trust"]:
            log.emit(
                "INFO",
                "unverified line corroborated",
                xid=ev["xid"],
                node=engine.subject_name(ev),
                reason=out["source"]["trust_reason"],
            )
        return out

    @property
    def starter(self) -> Starter | None:
        return self.launcher.starter

    def follow_up(self, out: engine.Outcome, now: float) -> None:
        """Page, start or recover what the committed decision asks for (the one start path).

        The decision is committed; a start that fails here stays pending (a lease at most) and
        the sweep starts it, a page stays in the outbox and the sweep publishes it.
        """
        try:
            self.launcher.follow_up(out, self.policy, now)
        except FOLLOW_UP_ERRORS as exc:
            log.emit(
                "WARNING",
                "follow-up left to the sweep",
                result=out.result,
                incident=(out.incident["id"] if out.incident else None) or out.duplicate_of,
                error=repr(exc)[:300],
            )

    def start_workflow(self, iid: str, step: int, now: float) -> str | None:
        """Start (at most once) the execution for one incident step."""
        return self.launcher.start(iid, step, self.policy, now)
