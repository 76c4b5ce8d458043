"""Read who can publish to Pitstop's topics and write the logs its sinks select, through gcloud
(``projects get-iam-policy``, ``pubsub topics get-iam-policy``), and judge it with core/exposure.py
against the table in infra/exposure.yaml. For ``pitstop doctor --project`` and the end of a deploy."""

from __future__ import annotations

import json
from collections.abc import Callable

import yaml

from pitstop.core.exposure import ExposureFinding, ExposureTable, IamPolicy, exposure_findings, finding_line
from pitstop.tools import deploy

EXPOSURE = deploy.INFRA / "exposure.yaml"


class ExposureError(Exception):
    """An IAM policy could not be read (no permission, no project): what gcloud said."""


def pitstop_topics(conf: deploy.Conf) -> list[str]:
    """The topics deploy creates (infra/resources.yaml), one set per Slurm cluster for theirs."""
    clusters = deploy.slurm_clusters(conf)
    return [*deploy.TOPICS, *(t.format(cluster=c) for c in clusters for t in deploy.CLUSTER_TOPICS)]


def _policy(run: deploy.Runner, argv: list[str]) -> IamPolicy | None:
    """The policy gcloud printed; None when the resource is not there (a topic not deployed)."""
    res = run([*argv, "--format=json"])
    if res.returncode != 0:
        if "NOT_FOUND" in res.stderr or "not found" in res.stderr.lower():
            return None
        raise ExposureError(f"gcloud {' '.join(argv)}: {res.stderr.strip()[:300]}")
    doc: object = json.loads(res.stdout or "{}")  # IAM's Policy: core/exposure reads it field by field
    return doc if isinstance(doc, dict) else {}


def read_findings(project: str, conf: deploy.Conf, run: deploy.Runner) -> list[ExposureFinding]:
    """Each principal beyond Pitstop's own identities that can feed it logs or messages."""
    table = ExposureTable(yaml.safe_load(EXPOSURE.read_text()), project)
    project_policy = _policy(run, ["projects", "get-iam-policy", project])
    if project_policy is None:
        raise ExposureError(f"project {project} not found")
    topics: dict[str, IamPolicy] = {}
    for topic in pitstop_topics(conf):
        got = _policy(run, ["pubsub", "topics", "get-iam-policy", topic, "--project", project])
        if got is not None:
            topics[topic] = got
    return exposure_findings(project, project_policy, topics, table)


def report(
    project: str,
    conf: deploy.Conf,
    run: deploy.Runner = deploy.run_gcloud,
    log: Callable[[str], None] = print,
) -> int:
    """Print a finding per principal (``finding`` lines); the number of findings, -1 if unreadable."""
    try:
        findings = read_findings(project, conf, run)
    except ExposureError as exc:
        log(f"warning  who can write what Pitstop reads: could not check: {exc}")
        return -1
    for f in findings:
        log(f"finding  {finding_line(f)}")
    if not findings:
        log(f"ok       only Pitstop's own identities can publish to its topics or write logs in {project}")
    return len(findings)
