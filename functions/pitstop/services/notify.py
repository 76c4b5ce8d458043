"""The notify service: notifications topic → webhook (Google Chat or Slack), Cloud Monitoring, logs.

Decoupled from remediation by Pub/Sub: a webhook outage makes this function raise, so the
message is redelivered with backoff while remediation carries on. Each notification is
handled once per sink (metrics, webhook), tracked in Firestore by its own deterministic id
(the outbox gives every page and incident notification one, so a re-published copy is the
same notification) or else by message id, so a redelivery after a partial failure neither
double-posts nor double-counts. Two deliveries of one notification at once (a redelivery while
the first still runs, or the outbox publishing it again) cannot both post: each sink is claimed
in the ledger under a precondition (create, or an update conditioned on the document's update
time) before its effect, and a delivery that finds a live claim raises, so Pub/Sub redelivers it
once the claim's holder has recorded the sink done (or its claim has lapsed, if it died).
Metrics are written first and neither sink blocks the other:
a dead webhook does not hide a failed remediation from Cloud Monitoring, and a Monitoring
outage does not silence the webhook (the function raises after posting, so the metrics are
retried on redelivery).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import firestore

from pitstop.adapters import log
from pitstop.adapters.monitoring import MetricsWriter

SEVERITY_ICON = {"critical": "🔴", "warning": "🟠", "info": "🔵"}
NOTIFICATION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")  # usable as a Firestore document id
# How long a delivery holds a sink before another may take it over (it died): longer than a
# webhook post (10 s timeout) or a metrics write.
SINK_CLAIM_S = 60.0


class SinkBusyError(RuntimeError):
    """Another delivery of this notification holds the sink: redeliver later."""


def ledger_key(n: Mapping[str, Any], message_id: str) -> str:
    """The notification's own id when it carries a valid one, else the Pub/Sub message id."""
    nid = n.get("id")
    return nid if isinstance(nid, str) and NOTIFICATION_ID.fullmatch(nid) else message_id


def _escape_slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render(n: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """The webhook body. Text comes from validated names and policy reasons, never raw log lines."""
    inc = n.get("incident") or {}
    sev = str(n.get("severity", "info"))
    node = (inc.get("node") or {}).get("instance", "?")
    lines = [f"{SEVERITY_ICON.get(sev, '')} [{sev.upper()}] {n.get('summary', '')}"]
    facts = [
        ("incident", inc.get("id")),
        ("node", node),
        ("cluster", inc.get("cluster")),
        ("action", inc.get("action")),
        ("state", inc.get("state")),
    ]
    lines.append(" · ".join(f"{k}: {v}" for k, v in facts if v))
    d = n.get("durations_s") or {}
    if d.get("resolved") is not None:
        lines.append(
            f"time to remediate: {d['resolved']:.0f} s (isolated after {d.get('fenced') or 0:.0f} s)"
        )
    if n.get("jobs"):
        lines.append(f"jobs on the node: {', '.join(map(str, n['jobs']))}")
    if n.get("todo"):
        lines.append(f"what to do: {n['todo']}")
    text = "\n".join(lines)
    if fmt == "slack":
        safe = _escape_slack(text)
        return {"text": safe, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": safe}}]}
    return {"text": text}


class Notify:
    def __init__(
        self,
        webhook_url: str | None,
        fmt: str,
        metrics: MetricsWriter | None,
        ledger: Any | None,
        post: Callable[[str, bytes], int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url, self.fmt, self.metrics, self.ledger = webhook_url, fmt, metrics, ledger
        self.post, self.clock = post or self._post, clock

    @staticmethod
    def _post(url: str, data: bytes) -> int:
        if not url.startswith(("https://", "http://127.0.0.1", "http://localhost")):
            raise ValueError("webhook URL must be https (or a local http endpoint)")
        req = urllib.request.Request(  # noqa: S310 - scheme checked above
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json; charset=UTF-8"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return int(resp.status)

    def handle(self, n: Mapping[str, Any], message_id: str) -> dict[str, Any]:
        key = ledger_key(n, message_id)
        ref = self.ledger.document(key) if self.ledger is not None and key else None
        log.emit(
            {"critical": "CRITICAL", "warning": "WARNING"}.get(str(n.get("severity")), "INFO"),
            str(n.get("summary", "")),
            notification=n.get("kind"),
            incident=(n.get("incident") or {}).get("id"),
        )
        done: dict[str, Any] = {}
        metrics_error: Exception | None = None
        if self.metrics is not None and self._claim(ref, "metrics", done):
            metrics_error = self._write_metrics(n, ref, key, done)
        if self.url and self._claim(ref, "webhook", done):
            try:
                status = self.post(self.url, json.dumps(render(n, self.fmt)).encode())
                if status >= 300:
                    raise RuntimeError(f"webhook answered {status}")
            except Exception:
                self._unclaim(ref, "webhook")
                raise
            self._record(ref, done, "webhook", {})
        if metrics_error is not None:  # posted; the redelivery retries only the metrics
            raise RuntimeError("metrics not written; retried on redelivery") from metrics_error
        return done

    def _claim(self, ref: Any, sink: str, done: dict[str, Any]) -> bool:
        """True when this delivery now holds ``sink``; False when it is already done (nothing to do).

        Raises SinkBusyError while another delivery holds it, or when another wins the race to it.
        """
        if ref is None:
            return not done.get(sink)
        snap = ref.get()
        doc = snap.to_dict() or {} if snap.exists else {}
        done.update({k: v for k, v in doc.items() if not k.endswith("_claim")})
        if doc.get(sink):
            return False
        now = self.clock()
        held = doc.get(f"{sink}_claim") or {}
        if float(held.get("until") or 0) > now:
            raise SinkBusyError(f"{sink} of this notification is being delivered; redeliver later")
        claim = {f"{sink}_claim": {"token": uuid.uuid4().hex, "until": now + SINK_CLAIM_S}}
        try:
            if snap.exists:
                ref.update(claim, option=firestore.Client.write_option(last_update_time=snap.update_time))
            else:
                ref.create(claim)
        except (gexc.Conflict, gexc.FailedPrecondition):
            raise SinkBusyError(f"another delivery took {sink} of this notification") from None
        return True

    def _record(self, ref: Any, done: dict[str, Any], sink: str, extra: Mapping[str, Any]) -> None:
        done.update(extra)
        done[sink] = self.clock()
        if ref is not None:
            ref.set({**extra, sink: done[sink], f"{sink}_claim": firestore.DELETE_FIELD}, merge=True)

    @staticmethod
    def _unclaim(ref: Any, sink: str) -> None:
        """Give a sink up at once after a failed attempt, so the redelivery need not wait out the claim."""
        if ref is not None:
            ref.set({f"{sink}_claim": firestore.DELETE_FIELD}, merge=True)

    def _write_metrics(
        self, n: Mapping[str, Any], ref: Any, key: str, done: dict[str, Any]
    ) -> Exception | None:
        """Write the notification's metric points once; a failure is logged and returned, not raised."""
        assert self.metrics is not None
        try:
            series = self.metrics.write(n, self.clock())
        except Exception as e:  # any Monitoring error: the webhook must still be tried
            log.emit("ERROR", "metrics not written", notification=key, error=repr(e)[:500])
            self._unclaim(ref, "metrics")
            return e
        self._record(ref, done, "metrics", {"metrics_series": series})
        return None
