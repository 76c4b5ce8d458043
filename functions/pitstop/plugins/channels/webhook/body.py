"""A Google Chat or Slack incoming webhook's body, built without I/O (imports no google.*, no I/O
layer: lint-imports checks it)."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pitstop.core.notifications import Notification, text_lines

FORMATS = ("chat", "slack")


def _escape_slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SlackText(TypedDict):
    type: str  # mrkdwn
    text: str


class SlackBlock(TypedDict):
    type: str  # section
    text: SlackText


class ChatBody(TypedDict):
    """An incoming webhook's body: Google Chat reads ``text``; Slack shows ``blocks`` when present."""

    text: str
    blocks: NotRequired[list[SlackBlock]]


def render(n: Notification, fmt: str) -> ChatBody:
    """A chat webhook's body: Google Chat (``chat``) or Slack (``slack``, mrkdwn escaped)."""
    text = "\n".join(text_lines(n))
    if fmt == "slack":
        safe = _escape_slack(text)
        return {"text": safe, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": safe}}]}
    return {"text": text}
