"""Publishing notifications (pages, incident summaries) to the notifications topic."""

from __future__ import annotations

import json
from collections.abc import Mapping

from google.cloud.pubsub_v1 import PublisherClient

from pitstop.core.notifications import sealed


class Notifier:
    """``key``: the per-deploy notification key (secret pitstop-notify-key): each notification is
    sealed with it as it is published (core/notifications.sealed), the same each time it is."""

    def __init__(
        self, project: str, topic: str, publisher: PublisherClient | None = None, key: bytes | None = None
    ) -> None:
        self.publisher = publisher or PublisherClient()
        self.topic = self.publisher.topic_path(project, topic)
        self.key = key

    def publish(self, notification: Mapping[str, object]) -> str:
        """Publish a notification (a Notice or a page) as JSON; its kind and severity as attributes."""
        if self.key:
            notification = sealed(notification, self.key)
        data = json.dumps(notification, default=str).encode()
        attrs = {"kind": str(notification.get("kind", "")), "severity": str(notification.get("severity", ""))}
        message_id: str = self.publisher.publish(self.topic, data, **attrs).result(timeout=30)
        return message_id
