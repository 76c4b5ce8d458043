"""The local stack's chat webhook: it accepts every post (the sink records it)."""

from __future__ import annotations

from collections.abc import Mapping

PATH = "/hook"


def env(base: str) -> dict[str, str]:
    """The notify function's environment that points this channel at the sink at ``base``."""
    return {"PITSTOP_WEBHOOK_URL": base + PATH, "PITSTOP_WEBHOOK_FORMAT": "chat"}


def answer(body: bytes, headers: Mapping[str, str]) -> tuple[int, object]:
    """What a chat webhook answers: 200, no body."""
    return 200, None
