"""Publishing notifications (pages, incident summaries) to the notifications topic."""

from __future__ import annotations

import json
from collections.abc import Mapping

from google.cloud.pubsub_v1 import PublisherClient


class Notifier:
    def __init__(self, project: str, topic: str, publisher: PublisherClient | None = None) -> None:
        self.publisher = publisher or PublisherClient()
        self.topic = self.publisher.topic_path(project, topic)

    def publish(self, notification: Mapping[str, object]) -> str:
        """Publish a notification (a Notice or a page) as JSON; its kind and severity as attributes."""
        data = json.dumps(notification, default=str).encode()
        attrs = {"kind": str(notification.get("kind", "")), "severity": str(notification.get("severity", ""))}
        message_id: str = self.publisher.publish(self.topic, data, **attrs).result(timeout=30)
        return message_id
