"""Notification channels, one folder each: ``<name>/__init__.py`` defines ``build(env, http)``,
which returns the channel when the environment configures it (deploy sets that environment, its
secrets from Secret Manager) or None; ``body.py`` builds what it posts without I/O; ``local.py`` is
its sink in the local stack; ``plugin.yaml`` its order, environment and deploy fragment. notify
delivers to every configured channel exactly once per notification, keyed by the folder's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pitstop.adapters.http import post_bytes, post_json
from pitstop.core.answers import Delivery
from pitstop.core.domain import JsonObject

Post = Callable[[str, Mapping[str, object]], int]  # a JSON body posted as it is; the HTTP status
# bytes posted as they are, with these headers (a body a signature covers); the HTTP status
PostBytes = Callable[[str, bytes, Mapping[str, str]], int]


class Channel(Protocol):
    name: str

    def deliver(self, n: JsonObject) -> Delivery:
        """Deliver the notification (as published: notify's edge); what was done (recorded once),
        or raise to be retried."""
        ...


@dataclass(frozen=True)
class Http:
    """How a channel posts (tests pass recorders)."""

    json: Post = post_json
    raw: PostBytes = post_bytes


Build = Callable[[Mapping[str, str], Http], Channel | None]
