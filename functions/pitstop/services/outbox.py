"""The outbox: every page and incident notification is recorded before it is published.

Publishing after a commit can fail, and the redelivery that follows is a duplicate with
nothing left to announce. So a notification is first an entry ``<prefix>_outbox/<id>``:

- A notification born in a decision (a page for an incident held for a budget or a cooldown,
  a step's resolved or failed summary) is recorded by the store in that decision's transaction
  (core/store.commit_of), so the entry commits with the incident or not at all. Right after the
  commit the launcher publishes it (:meth:`send`) and marks it sent.
- A notification born outside a decision (a step's note that a job was not restarted) is
  recorded first, then published, then marked sent (:meth:`deliver`).
- Whatever is still unsent the sweep publishes (:meth:`publish_pending`): at once if a publish
  of it already failed, else once it is older than a few seconds (its publisher died, or is
  still on its way: the grace keeps the sweep from racing it).

Each entry's id is deterministic and travels in the notification as ``id``; notify keys its
ledger by it, so a notification published twice (a lost mark-sent, a sweep that raced a slow
publisher) is posted and counted once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Protocol, cast

from pitstop.adapters import log
from pitstop.core.answers import Notification
from pitstop.core.domain import OutboxEntry
from pitstop.core.notifications import notification_id as notification_id
from pitstop.core.store import IncidentStore, outbox_entry

PUBLISH_GRACE_S = 10.0  # an entry this old, never tried, has lost its publisher
KEEP_SENT_S = 7 * 86400.0  # a sent entry keeps this long: its expire_at, for a Firestore TTL policy
MAX_PER_SWEEP = 200
MAX_FAILURES_IN_A_ROW = 3  # then the topic is down: stop, do not wait out every publish timeout


class Publisher(Protocol):
    def publish(self, notification: Notification) -> str: ...


def _recorded(entry: OutboxEntry) -> Notification:
    """The notification an entry keeps: one of ours, made plain JSON (enums as their strings)."""
    return cast(Notification, entry["notification"])


class Outbox:
    """Notifications kept in Firestore until the topic has them (the store records a decision's
    notifications with it: core/store.commit_of)."""

    def __init__(
        self,
        store: IncidentStore,
        publisher: Publisher | None,
        clock: Callable[[], float] = time.time,
        grace_s: float = PUBLISH_GRACE_S,
    ) -> None:
        self.store, self.publisher, self.clock, self.grace_s = store, publisher, clock, grace_s

    def send(self, notification: Notification) -> bool:
        """Publish a recorded notification and mark it sent; on failure it stays for the sweep."""
        nid = str(notification["id"])
        if self.publisher is None:
            return False
        try:
            message_id = self.publisher.publish(notification)
        except Exception as exc:  # any publish failure: the entry is safe, the sweep retries it
            log.emit(
                "ERROR",
                "notification not published; the sweep retries it",
                notification=nid,
                error=repr(exc)[:300],
            )
            self._note_failure(nid)
            return False
        try:
            self.store.outbox_mark_sent(nid, message_id, self.clock(), KEEP_SENT_S)
        except Exception as exc:  # published: a copy the sweep sends again is one to notify's ledger
            log.emit(
                "WARNING",
                "notification published but not marked sent",
                notification=nid,
                error=repr(exc)[:300],
            )
        return True

    def _note_failure(self, nid: str) -> None:
        """Remember that a publish failed, so the sweep retries it without waiting for the grace."""
        try:
            self.store.outbox_note_failure(nid, self.clock())
        except Exception as exc:  # the grace period covers it
            log.emit(
                "WARNING",
                "outbox entry not updated after a failed publish",
                notification=nid,
                error=repr(exc)[:300],
            )

    def deliver(self, notification: Notification) -> bool:
        """Record (once per id), publish, mark sent: for a notification no transaction produced."""
        stored = self.store.outbox_add(str(notification["id"]), outbox_entry(notification, self.clock()))
        if stored.get("sent"):
            return True  # a retried caller: this notification already went out
        plain = stored.get("notification") or outbox_entry(notification, self.clock())["notification"]
        return self.send(cast(Notification, plain))  # one of ours, as JSON carries it

    def publish_pending(self, now: float) -> int:
        """Publish what is still unsent (failed, or older than the grace); how many went out."""
        sent = failed = 0
        for entry in itertools.islice(self.store.outbox_unsent(now - self.grace_s), MAX_PER_SWEEP):
            if self.send(_recorded(entry)):
                sent, failed = sent + 1, 0
                continue
            failed += 1
            if failed == MAX_FAILURES_IN_A_ROW:
                break  # the topic is unreachable: the next sweep tries again
        if sent:
            log.emit("INFO", "outbox: unsent notifications published", count=sent)
        return sent
