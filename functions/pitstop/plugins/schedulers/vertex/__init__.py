"""Vertex AI custom training: a cluster of CustomJobs in one project's regions (``vertex:`` block,
``policy.schema.json``). The platform owns the VMs, so nothing is fenced or reset; an ended job is
read back, classed (schemas/vertex-errors.yaml, core/vertex.py) and, when the platform failed it,
resubmitted once from its checkpoint (``adapter.py``). Its local stand-in is local/fake_vertex.py
(``local.py`` says how the local stack reaches it)."""

from __future__ import annotations

import os
from typing import cast

from pitstop.core.policy import Cluster
from pitstop.core.scheduling import Scheduler
from pitstop.plugins.schedulers import Wiring


def build(c: Cluster, w: Wiring) -> Scheduler:
    from pitstop.plugins.schedulers.vertex.adapter import VertexJobs, VertexScheduler, job_service_client

    conf = c.block("vertex")
    endpoint = w.endpoint("vertex") or os.environ.get("PITSTOP_VERTEX_ENDPOINT")
    regions = tuple(cast(list[str], conf.get("regions") or []))
    accounts = frozenset(cast(list[str], conf.get("job_service_accounts") or []))
    project = str(conf.get("project") or w.project)
    jobs = VertexJobs(lambda loc: job_service_client(loc, endpoint))
    return VertexScheduler(jobs, regions, accounts, project=project)
