"""The notify service: notifications topic → Cloud Monitoring metrics, then each configured channel.

Decoupled from remediation by Pub/Sub: a channel outage makes this function raise, so the
message is redelivered with backoff while remediation carries on. Each notification reaches each
sink (the metrics, every channel folder services/channels.py finds) exactly once: every sink is one record
of the step runner (core/steps.py) keyed ``<notification id>.<sink>``, claimed in progress before
its effect. The key is the notification's own deterministic id (the outbox gives every page and
incident notification one, so a re-published copy is the same notification), else the Pub/Sub
message id. A redelivery after a partial failure replays the sinks that are done; two deliveries
of one notification at once cannot both post, since the second finds the first's live claim and
raises (SinkBusyError), so Pub/Sub redelivers it once the first has recorded its result (or its
claim has lapsed, if it died).

Metrics are written first and no sink blocks another: a dead webhook does not hide a failed
remediation from Cloud Monitoring or from PagerDuty, and a Monitoring outage does not silence the
channels (the function raises after delivering, so only the failed sinks are retried).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from pitstop.adapters import log
from pitstop.adapters.monitoring import MetricsWriter
from pitstop.core import steps
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject
from pitstop.core.steps import StepRunner, StepStore
from pitstop.services.channels import Channel

NOTIFICATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")  # usable as a Firestore document id
# How long a delivery holds a sink before another may take it over (it died): longer than a post
# (10 s timeout) or a metrics write.
SINK_CLAIM_S = 60.0

SinkBusyError = steps.BusyError


def ledger_key(n: JsonObject, message_id: str) -> str:
    """The notification's own id when it carries a valid one, else the Pub/Sub message id."""
    nid = n.get("id")
    return nid if isinstance(nid, str) and NOTIFICATION_ID.fullmatch(nid) else message_id


def _warn(message: str, fields: Mapping[str, str]) -> None:
    log.emit("WARNING", message, **fields)


class Notify:
    def __init__(
        self,
        channels: list[Channel],
        metrics: MetricsWriter | None,
        ledger: StepStore[Any] | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.channels, self.metrics, self.clock = channels, metrics, clock
        self.ledger = ledger if ledger is not None else steps.MemoryStepStore()
        self.runner: StepRunner[Any] = StepRunner(self.ledger, SINK_CLAIM_S, clock, _warn)

    def handle(self, n: JsonObject, message_id: str) -> dict[str, Delivery]:
        """Deliver to every sink not yet done; raise at the end if any failed (Pub/Sub redelivers).

        ``n`` is the message's JSON object as published, unchecked (main.py: Pub/Sub's edge): the
        outbox publishes core/answers.Notification, but any publisher may write to the topic."""
        key = ledger_key(n, message_id)
        log.emit(
            {"critical": "CRITICAL", "warning": "WARNING"}.get(str(n.get("severity")), "INFO"),
            str(n.get("summary", "")),
            notification=n.get("kind"),
            incident=(n.get("incident") or {}).get("id"),
        )
        done: dict[str, Delivery] = {}
        failed: list[tuple[str, Exception]] = []
        for sink, effect in self._sinks(n):
            try:
                out = self.runner.run(f"{key}.{sink}", {"op": sink, "notification": key}, effect)
                done[sink] = cast(Delivery, out)  # the sink's answer, or its record's when replayed
            except steps.BusyError:
                raise  # another delivery holds this sink: redeliver later; it records what it did
            except Exception as exc:  # any sink's error: the others must still be tried
                log.emit(
                    "ERROR",
                    f"{sink} {_NOT_DONE.get(sink, 'not delivered')}",
                    notification=key,
                    error=repr(exc)[:500],
                )
                failed.append((sink, exc))
        if failed:
            first, error = failed[0]
            what = f"{first} {_NOT_DONE.get(first, 'not delivered')}"
            raise RuntimeError(f"{what} ({error}); retried on redelivery") from error
        return done

    def _sinks(self, n: JsonObject) -> list[tuple[str, steps.Handler]]:
        """Metrics first, then each channel: (sink name, its effect)."""
        out: list[tuple[str, steps.Handler]] = []
        if self.metrics is not None:
            metrics = self.metrics
            out.append(("metrics", lambda _claim: {"metrics_series": metrics.write(n, self.clock())}))
        out += [(ch.name, _delivery(ch, n)) for ch in self.channels]
        return out


_NOT_DONE = {"metrics": "not written"}


def _delivery(ch: Channel, n: JsonObject) -> steps.Handler:
    return lambda _claim: dict(ch.deliver(n))  # the runner keeps a plain JSON object
