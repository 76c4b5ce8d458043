"""The local stand-in of Vertex AI's JobService (local/fake_vertex.py), and the environment that
points the vertex scheduler at it."""

from __future__ import annotations

from pitstop.local.fake_vertex import FakeVertex, serve

__all__ = ["FakeVertex", "env", "serve"]


def env(endpoint: str) -> dict[str, str]:
    return {"PITSTOP_VERTEX_ENDPOINT": endpoint}
