"""A fake of the one Container (GKE) API call ingest makes: ``clusters.get``, for a node's zones.

``GET /v1/projects/P/locations/L/clusters/C`` answers the cluster with its ``locations`` (the
zones its nodes may be in) and ``nodePools[].locations``, as Container API v1 does
(cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters); an
unknown cluster is 404 with Google's error body. ``fail(n, code)`` makes the next ``n`` requests
fail with ``code`` (503: the API unavailable). ``requests`` records every path asked.
"""

from __future__ import annotations

import re
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from pitstop.core.domain import JsonObject
from pitstop.local.json_http import ErrorBody, serve_json

_CLUSTER = re.compile(r"/v1/projects/([^/]+)/locations/([^/]+)/clusters/([^/?]+)")


class FakeContainer:
    def __init__(self) -> None:
        self.clusters: dict[tuple[str, str, str], JsonObject] = {}  # as added: a Cluster resource
        self.requests: list[str] = []
        self._fail: list[int] = []  # one status per request still to fail
        self.lock = threading.Lock()

    def add_cluster(
        self,
        project: str,
        location: str,
        name: str,
        zones: list[str],
        pools: dict[str, list[str]] | None = None,
    ) -> None:
        """A cluster whose nodes may be in ``zones``; ``pools`` names node pools with zones of their own."""
        with self.lock:
            self.clusters[(project, location, name)] = {
                "name": name,
                "location": location,
                "locations": list(zones),
                "nodePools": [{"name": p, "locations": list(z)} for p, z in (pools or {}).items()],
                "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/{location}/clusters/{name}",
            }

    def fail(self, count: int, code: int = 503) -> None:
        with self.lock:
            self._fail = [code] * count

    def dispatch(self, method: str, path: str, _body: bytes) -> tuple[int, Any]:
        with self.lock:
            self.requests.append(path)
            if self._fail:
                code = self._fail.pop()
                return code, _error(code, "UNAVAILABLE" if code >= 500 else "PERMISSION_DENIED", "injected")
            m = _CLUSTER.fullmatch(path.partition("?")[0])
            if method != "GET" or m is None:
                return 404, _error(404, "NOT_FOUND", f"no route {method} {path}")
            cluster = self.clusters.get((m.group(1), m.group(2), m.group(3)))
            if cluster is None:
                return 404, _error(
                    404,
                    "NOT_FOUND",
                    f"Not found: projects/{m.group(1)}/locations/{m.group(2)}/clusters/{m.group(3)}.",
                )
            return 200, dict(cluster)


def _error(code: int, status: str, message: str) -> ErrorBody:
    return {"error": {"code": code, "message": message, "status": status}}


def serve(fake: FakeContainer, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``fake`` on localhost; returns the server and the API root (``.../v1``)."""
    server = serve_json(fake.dispatch, "fake-container", port=port)
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
