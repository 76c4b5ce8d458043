"""``pitstop doctor``: JobSets whose template cannot restart their gang after a disruption."""

from __future__ import annotations

from pitstop.adapters.gke.client import ApiClient, Kube, KubeApiError
from pitstop.adapters.gke.objects import JOBSET_GROUP, JOBSET_VERSION, JOBSETS, meta_of, restart_blockers


def doctor_findings(api_client: ApiClient) -> list[str]:
    """One line per JobSet whose template cannot restart its gang after a disruption.

    Pitstop's gang restart relies on the JobSet's own failure policy; without one (or with a
    Job that ignores DisruptionTarget) evicting a member fails the JobSet or replaces one pod.
    """
    kube = Kube(api_client)
    try:
        items = kube.items(
            "list jobsets", kube.custom.list_cluster_custom_object, JOBSET_GROUP, JOBSET_VERSION, JOBSETS
        )
    except KubeApiError as exc:
        if exc.status == 404:
            return []  # JobSet is not installed: nothing to check
        raise
    out: list[str] = []
    for js in items:
        where = f"jobset/{meta_of(js).get('namespace')}/{meta_of(js).get('name')}"
        out += [f"{where}: {why}" for why in restart_blockers(js)]
    return out
