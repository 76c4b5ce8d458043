"""Managed Service for Prometheus: the DCGM readings of a degraded GKE node's peers, in PromQL.

GKE's managed DCGM metrics are dcgm-exporter's series in Managed Service for Prometheus, which
Cloud Monitoring's timeSeries.list does not speak; its Prometheus-compatible HTTP API does:
``GET https://monitoring.googleapis.com/v1/projects/{project}/location/global/prometheus/api/v1/
query_range?query=...&start=...&end=...&step=...`` ("location has to be global";
https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.location.prometheus.api.v1/query_range),
an empty body, OAuth scope ``monitoring.read`` (or ``monitoring`` / ``cloud-platform``), and the
open-source Prometheus answer (core/promql.py). The caller needs ``monitoring.timeSeries.list``:
roles/monitoring.viewer on the project (infra/iam.yaml, actuate).

Credentials are google-auth's application default (the function's service account); a local
``endpoint`` (the stack's stand-in, local/fake_prometheus.py) is spoken to over plain HTTP
without credentials. An error answer raises google.api_core's exception for its HTTP status, so
the comparison goes on the alert alone (services/actuate/planned.py), as with timeSeries.list.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from google.api_core import exceptions as gexc

from pitstop.adapters import retry
from pitstop.core import promql
from pitstop.core.degraded import PromRule

API = "https://monitoring.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/monitoring.read"
READ_TIMEOUT_S, ATTEMPTS = 5.0, 3  # actuate answers within 120 s; a comparison takes at most ~16 s
ONE_QUERY_MAX = 100  # node names per selector: a job's nodes are read in chunks of this many
_TRANSIENT = (429, 500, 502, 503, 504)


def _transient(exc: Exception) -> bool:
    """Worth another attempt: unreachable (requests' connection errors and timeouts are OSErrors),
    or an answer saying so (429, 5xx)."""
    return isinstance(exc, OSError) or (isinstance(exc, gexc.GoogleAPICallError) and exc.code in _TRANSIENT)


def _unreachable(exc: Exception) -> Exception:
    """The error once the attempts are spent: an HTTP answer as it was, no answer as a 503."""
    if isinstance(exc, OSError):
        return gexc.ServiceUnavailable(f"Prometheus query API unreachable: {exc}")  # type: ignore[no-untyped-call]
    return exc


RETRY = retry.Policy(_transient, ATTEMPTS, retry.Backoff(0.5), _unreachable)


class PromQLReader:
    """query_range on Managed Service for Prometheus, reduced to one value per node (core/promql)."""

    def __init__(self, endpoint: str | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.base = (endpoint or API).rstrip("/")
        self.sleep = sleep
        self._session: Any = None

    @property
    def session(self) -> Any:
        """An authorised requests session (made on first use: only a GKE comparison needs one)."""
        if self._session is None:
            if self.base == API:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession

                creds, _ = google.auth.default(scopes=[SCOPE])
                self._session = AuthorizedSession(creds)  # type: ignore[no-untyped-call]
            else:
                import requests

                self._session = requests.Session()
        return self._session

    def query_range(self, project: str, query: str, span: dict[str, str]) -> list[promql.Series]:
        """One range query's series; an HTTP error raises google.api_core's exception for it.

        Unreachable, 429 and 5xx are tried again (RETRY: three attempts, 0.5 s then 1 s apart).
        """
        url = f"{self.base}/v1/projects/{project}/location/global/prometheus/api/v1/query_range"
        params = {"query": query, **span}

        def attempt() -> list[promql.Series]:
            return _answer(self.session.get(url, params=params, timeout=READ_TIMEOUT_S))

        return retry.call(attempt, RETRY, sleep=self.sleep)

    def node_values(
        self, project: str, rule: PromRule, nodes: Sequence[str], now: float
    ) -> dict[str, float | None]:
        out: dict[str, float | None] = dict.fromkeys(nodes)
        span = promql.window(rule, now)
        for i in range(0, len(nodes), ONE_QUERY_MAX):
            chunk = nodes[i : i + ONE_QUERY_MAX]
            series = self.query_range(project, promql.selector(rule, chunk), span)
            out.update(promql.node_values(rule, series, chunk))
        return out


def _answer(resp: Any) -> list[promql.Series]:
    """The series of a 200 answer; any other status as google.api_core's exception with the API's words."""
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if resp.status_code != 200:
        words = doc if isinstance(doc, dict) else {}
        why = f"{words.get('errorType') or resp.reason}: {str(words.get('error') or resp.text)[:300]}"
        raise gexc.from_http_status(resp.status_code, f"Prometheus query API: {why}")  # type: ignore[no-untyped-call]
    return promql.parse(doc)
