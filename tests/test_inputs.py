"""The threat model (schemas/inputs.yaml) lists every input the code reads (issue 35).

Each test walks what the repository reads from outside (the sink filters' branches, the topics
deploy creates, the alert policies, the metric types in code, data and policies, the Node
conditions, the functions' entry points, the Slurm commands the agent runs and every adapter
module) and fails when one is not in the model, or when the model names one that is gone. Every
input says who can write it and what it may cause alone (never more than a fence), and every
disruptive action it may lead to names the evidence that gates it.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import yaml

from pitstop.core import inputs, plugins, resources
from pitstop.core.sinks import SINK_FILTERS

ROOT = Path(__file__).resolve().parents[1]
PITSTOP = ROOT / "functions" / "pitstop"
INFRA = ROOT / "infra"
MODEL = inputs.model()


def _all(key: str) -> list[Any]:
    return [v for i in MODEL["inputs"] for v in i.get(key, [])]  # type: ignore[attr-defined]


def test_the_model_matches_its_schema_and_its_own_names() -> None:
    resources.validate(
        yaml.safe_load((ROOT / "schemas" / "inputs.yaml").read_text()), "inputs.schema.json", "inputs"
    )
    ids = [i["id"] for i in MODEL["inputs"]]
    assert len(ids) == len(set(ids))
    for inp in MODEL["inputs"]:
        for gated in inp["leads_to"]:
            assert set(gated["actions"]) <= set(MODEL["actions"]), inp["id"]
            assert set(gated["gates"]) <= set(MODEL["gates"]), inp["id"]
        if inp["kind"] == "evidence":
            assert inp["leads_to"] == [] and inp["alone"] == "record", inp["id"]  # it confirms, never acts
        for w in inp["writes"]:
            if w["scope"] in ("project", "topic", "cluster"):
                assert w["permission"] in MODEL["permissions"], (inp["id"], w["permission"])
    assert {i for used in MODEL["adapters"].values() for i in used} <= set(ids)


def test_nothing_a_writer_sends_does_more_than_fence_alone() -> None:
    """Only Pitstop's own channels (kind control, granted to its accounts alone) may act: a writer
    there is Pitstop, and says so (the doctor names any other)."""
    assert {i["alone"] for i in MODEL["inputs"] if i["kind"] != inputs.CONTROL} <= set(inputs.ALONE)
    control = [i for i in MODEL["inputs"] if i["kind"] == inputs.CONTROL]
    assert all("deploy grants" in i.get("writer_note", "") and not i["leads_to"] for i in control)
    hints = [i for i in MODEL["inputs"] if i["kind"] == "hint" and i.get("status") != "planned"]
    assert all(i["writes"] for i in hints)
    leading = [i["id"] for i in hints if i["leads_to"]]
    assert {"log-kernel-journal", "topic-events", "alert-heartbeat", "metric-managed-prometheus"} <= set(
        leading
    )


def _branches(text: str) -> Iterator[tuple[str, str]]:
    """(resource.type, log id) of each branch of a sink filter (one pair per parenthesised group).
    A branch selects its log by ``log_id("ID")``, or by a prefix of its name (``logName:"/logs/P"``,
    a log per job: Vertex AI's ``ml.googleapis.com%2F<job id>``), listed as ``P*`` unescaped."""
    for group in re.split(r"\)\s+OR\s+\(", text) if ") OR (" in " ".join(text.split()) else [text]:
        rtype = re.search(r'resource\.type="([^"]+)"', group)
        log_id = re.search(r'log_id\("([^"]+)"\)', group)
        prefix = re.search(r'logName:"/logs/([^"]+)"', group)
        name = log_id.group(1) if log_id else f"{unquote(prefix.group(1))}*" if prefix else None
        assert rtype and name, group
        yield rtype.group(1), name


def _sink_filter_files() -> set[str]:
    """Every filter file a sink uses: deploy's own and those a plugin folder's sinks add."""
    added = {
        str(s["filter_file"])
        for p in plugins.all_plugins()
        for s in (p.deploy.get("resources") or {}).get("sinks") or []
        if s.get("kind") == "log-sink"
    }
    return set(SINK_FILTERS.values()) | added


def test_every_sink_filter_branch_is_a_listed_log_route() -> None:
    listed = {(r["filter"], r["resource_type"], r["log_id"]) for r in _all("routes")}
    found = {
        (f.name, rtype, log_id)
        for f in (INFRA / "filters").glob("*.filter")
        for rtype, log_id in _branches(f.read_text())
    }
    assert _sink_filter_files() == {f for f, _, _ in found}  # every filter a sink uses, walked
    assert "vertex-jobs.filter" in _sink_filter_files()
    assert found == listed, (found - listed, listed - found)


def test_every_topic_deploy_creates_is_listed() -> None:
    doc = yaml.safe_load((INFRA / "resources.yaml").read_text())
    topics = {e["name"] for e in _walk(doc) if isinstance(e, dict) and e.get("kind") == "topic"}
    read = {
        e["topic"]
        for e in _walk(doc)
        if isinstance(e, dict) and e.get("kind") in ("subscription", "eventarc-trigger")
    }
    read |= {
        f.split("=", 1)[1]
        for e in _walk(doc)
        if isinstance(e, dict)
        for f in e.get("flags") or []
        if str(f).startswith("--trigger-topic=")
    }
    assert read <= topics
    assert topics == set(_all("topics")), topics ^ set(_all("topics"))


def _walk(doc: Any) -> Iterator[Any]:
    yield doc
    for v in doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []:
        yield from _walk(v)


def test_every_alert_policy_is_listed() -> None:
    policies = {
        str(f.relative_to(INFRA))
        for f in (INFRA / "monitoring").rglob("*.json")
        if "conditions" in json.loads(f.read_text())
    }
    assert policies == set(_all("policy_files")), policies ^ set(_all("policy_files"))


def _metric_types() -> dict[str, str]:
    """Every metric type the repository names, and where: alert policies, the degraded rules of
    schemas/xid-policy.yaml, and the code (a writer's prefix, a reader's type)."""
    found: dict[str, str] = {}
    typed = re.compile(
        r"\b((?:custom|workload)\.googleapis\.com/[A-Za-z0-9_./]+|logging\.googleapis\.com/user/[A-Za-z0-9_]+)"
    )
    for f in [
        *(INFRA / "monitoring").rglob("*.json"),
        ROOT / "schemas" / "xid-policy.yaml",
        *PITSTOP.rglob("*.py"),
    ]:
        text = f.read_text()
        for m in typed.findall(text):
            found.setdefault(m.rstrip("/."), str(f.relative_to(ROOT)))
        for m in re.findall(r"\b(DCGM_FI_[A-Z0-9_]+)", text):
            found.setdefault(m, str(f.relative_to(ROOT)))
    return found


def test_every_metric_type_the_repository_reads_or_writes_is_listed() -> None:
    patterns = _all("metric_types")
    unlisted = {
        t: where
        for t, where in _metric_types().items()
        if not any(fnmatch.fnmatchcase(t, p) or fnmatch.fnmatchcase(f"{t}/x", p) for p in patterns)
    }
    assert unlisted == {}
    assert {"custom.googleapis.com/pitstop/job/heartbeat", "DCGM_FI_DEV_SM_CLOCK"} <= set(_metric_types())


def test_every_node_condition_pitstop_reads_is_listed() -> None:
    found = set()
    for f in [*PITSTOP.joinpath("adapters").rglob("*.py"), *PITSTOP.joinpath("core").glob("*.py")]:
        found |= set(re.findall(r'^[A-Z_]*CONDITION\s*=\s*"([A-Za-z]+)"', f.read_text(), re.M))
    found |= set(re.findall(r'"condition":\s*"([A-Za-z]+)"', (INFRA / "gke" / "npd.yaml").read_text()))
    assert found == set(_all("node_conditions")), found ^ set(_all("node_conditions"))


def test_every_function_entry_point_is_listed() -> None:
    tree = ast.parse((ROOT / "functions" / "main.py").read_text())
    served = {
        fn.name
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef)
        for d in fn.decorator_list
        if isinstance(d, ast.Attribute)
        and isinstance(d.value, ast.Name)
        and d.value.id == "functions_framework"
    }
    deployed = {
        e["entry_point"]
        for e in _walk(yaml.safe_load((INFRA / "resources.yaml").read_text()))
        if isinstance(e, dict) and "entry_point" in e
    }
    listed = {i["entry_point"] for i in MODEL["inputs"] if "entry_point" in i}
    assert served == deployed == listed, (served, deployed, listed)


def test_every_slurm_command_the_agent_runs_is_listed() -> None:
    text = "".join(f.read_text() for f in (PITSTOP / "agent" / "slurm").glob("*.py"))
    run = set(re.findall(r'\[\s*"(s(?:control|queue|info|run|batch|cancel|acct|acctmgr))"', text))
    assert run == set(_all("slurm_commands")), run ^ set(_all("slurm_commands"))


def test_every_adapter_module_is_placed() -> None:
    modules = {str(f.relative_to(PITSTOP)) for f in (PITSTOP / "adapters").rglob("*.py")}
    assert modules == set(MODEL["adapters"]), modules ^ set(MODEL["adapters"])


def test_every_reader_the_model_names_exists() -> None:
    for inp in MODEL["inputs"]:
        for where in inp["read_by"]:
            path = where.split(" ")[0]
            assert (
                (PITSTOP / path).is_file()
                or (ROOT / "functions" / path).is_file()
                or (INFRA / path).is_file()
            ), (
                inp["id"],
                where,
            )


def test_the_security_table_is_the_models_and_the_readme_points_to_it() -> None:
    """docs/security.md's table is generated from the model (python -m pitstop.tools.security_table);
    the README keeps one line and the link, and no claim the model contradicts."""
    from pitstop.tools import security_table

    doc = security_table.DOC.read_text()
    assert security_table.rendered(doc, MODEL) == doc, "stale: python -m pitstop.tools.security_table"
    assert all(f"`{i['id']}`" in doc for i in MODEL["inputs"])
    readme = (ROOT / "README.md").read_text()
    assert "(docs/security.md)" in readme
    assert "no other identity may" not in readme  # a project-level publisher may: topic-alerts
