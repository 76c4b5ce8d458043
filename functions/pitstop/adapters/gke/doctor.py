"""``pitstop doctor``: JobSets whose template cannot restart their gang after a disruption."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from pitstop.adapters.gke.client import DEFAULT_TIMEOUT, KubeApiError, status_body
from pitstop.adapters.gke.objects import JOBSET_GROUP, JOBSET_VERSION, JOBSETS, meta_of, restart_blockers


def doctor_findings(api_client: Any) -> list[str]:
    """One line per JobSet whose template cannot restart its gang after a disruption.

    Pitstop's gang restart relies on the JobSet's own failure policy; without one (or with a
    Job that ignores DisruptionTarget) evicting a member fails the JobSet or replaces one pod.
    """
    custom = k8s.CustomObjectsApi(api_client)
    try:
        resp: Any = custom.list_cluster_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, JOBSETS, _preload_content=False, _request_timeout=DEFAULT_TIMEOUT
        )
    except ApiException as exc:
        if exc.status == 404:
            return []  # JobSet is not installed: nothing to check
        raise KubeApiError(exc.status or 503, "list jobsets", status_body(exc.body)) from exc
    items = json.loads(resp.data or b"{}").get("items") or []
    out: list[str] = []
    for js in items:
        if not isinstance(js, dict):
            continue
        where = f"jobset/{meta_of(js).get('namespace')}/{meta_of(js).get('name')}"
        out += [f"{where}: {why}" for why in restart_blockers(js)]
    return out
