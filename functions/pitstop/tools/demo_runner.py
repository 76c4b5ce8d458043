"""The demo's scenarios as data (schemas/demo-scenarios.yaml), run one by one on a stack.

A scenario names its faulty node, the job or JobSet on it, the fault and what must be observed
after. The runner makes the moves (tools/demo_stage.py over the stand-ins), waits for the incident
to end, observes what happened (the incident, the fake Compute's calls, Slurm or the fake API
server, the webhook) and checks each expectation; the result's line is the scenario's template
filled from the same observations. A scenario the runner cannot express names a step
(tools/demo_steps.py) that makes its moves and observes; its expectations are data all the same.
"""

from __future__ import annotations

import string
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict, cast

from pitstop.core import resources
from pitstop.core.timefmt import to_epoch
from pitstop.core.timeline import durations
from pitstop.local import inject
from pitstop.local.gke_drive import POD_GRACE_S, evictions, fenced_by
from pitstop.local.gke_stack import NAMESPACE, Watch
from pitstop.local.stack import ZONE, WebhookRecord, webhook_records
from pitstop.plugins.channels.pagerduty.local import PATH as PAGERDUTY_PATH
from pitstop.tools.demo_stage import LogEntry, Observations, Result, Stage

if TYPE_CHECKING:
    from pitstop.core.domain import Incident, JsonObject

SCENARIOS = "demo-scenarios.yaml"
SCHEMA = "demo-scenarios.schema.json"
REGION = ZONE.rsplit("-", 1)[0]
XID_LINES = {
    79: "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    48: "NVRM: Xid (PCI:0000:1b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit "
    "error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
    94: "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, "
    "D-RST: No",
    13: "NVRM: Xid (PCI:0000:b5:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
    "(GPC 1, TPC 3, SM 0): Out Of Range Address",
}
# The GKE stack's every-gang partner and spare (tools/demo.py GKE_NODES says what each node is for).
GKE_PARTNER, GKE_SPARE = 11, 12
WATCHES = {"nodes": "/api/v1/nodes", "pods": f"/api/v1/namespaces/{NAMESPACE}/pods"}


# -- a scenario as schemas/demo-scenarios.schema.json describes it (load checks it) ------------


class ExpectRange(TypedDict, total=False):
    min: float
    max: float
    has: str  # a substring of the observed text, or an item of the observed list


Expectation = str | float | bool | list[object] | ExpectRange | None


class JobSpec(TypedDict, total=False):
    """The scenario's Slurm job: pinned to nodes, or ``size`` nodes ``among`` a range of them."""

    among: list[int | None]  # nodes[start:end]
    size: int
    partition: str  # Slurm: the partition of another machine type's nodes (local/stack.ClusterSpec)
    checkpoint: bool
    pinned: list[int]


class FaultSpec(TypedDict, total=False):
    xid: int  # a key of XID_LINES
    count: int
    kernel: bool
    carrier: Literal["ops_agent", "node_journal", "serial_console"]
    location: Literal["zone", "region"]
    device_plugin: bool
    event: Literal["preempt", "maintenance"]


class VertexFault(TypedDict, total=False):
    code: int  # the google.rpc code the job fails with
    message: str
    times: int  # how many runs in a row fail (Vertex retries internal errors itself)


class VertexSpec(TypedDict, total=False):
    """A Vertex AI scenario's job (tools/demo_vertex.py): its scheduling, whether its training loop
    beats, its fault, and whether its resubmission fails the same way (``again``)."""

    scheduling: JsonObject  # jobSpec.scheduling as the REST API spells it
    heartbeat: bool
    fault: VertexFault | Literal["worker_restart"]
    again: bool


class GangSpec(TypedDict):
    """GKE: the JobSet's nodes and the spares it may move to, by index (default: the faulty node and
    the partner, the spare)."""

    members: list[int]
    spares: list[int]


class Scenario(TypedDict):
    key: str
    name: str
    stack: Literal["slurm", "gke", "vertex"]
    expect: dict[str, Expectation]  # observation name -> what it must be
    detail: str  # the result's line: observations by name in {braces}
    why: NotRequired[str]
    settle: NotRequired[bool]
    step: NotRequired[str]
    node: NotRequired[int]
    gang: NotRequired[bool | GangSpec]
    watch: NotRequired[Literal["nodes", "pods"]]
    job: NotRequired[JobSpec]
    lemon: NotRequired[bool]
    gpu_state: NotRequired[JsonObject]  # what the GPU stand-ins report (the fake Compute's gpu_state): theirs
    fault: NotRequired[FaultSpec]
    linger_s: NotRequired[float]
    timeout_s: NotRequired[float]
    timed: NotRequired[bool]
    vertex: NotRequired[VertexSpec]


Spec = Scenario


@dataclass
class Seen:
    """What a scenario observed: the incident its result reports (timeline, id) and the observations
    its expectations and its line are made of."""

    inc: Incident | None
    obs: Observations = field(default_factory=dict)
    resume_s: float | None = None  # a step's own measure, in place of the incident's


def load(steps: Collection[str], path: Path | None = None) -> list[Scenario]:
    """The scenarios, schema-checked; a repeated key or a step not among ``steps`` is an error."""
    where = path or resources.schema_dir() / SCENARIOS
    scenarios = cast(list[Scenario], resources.load_yaml(where, SCHEMA)["scenarios"])  # checked
    keys = [s["key"] for s in scenarios]
    if len(set(keys)) != len(keys):
        raise resources.DataFileError(
            f"{where}: a key is repeated: {sorted(k for k in keys if keys.count(k) > 1)}"
        )
    unknown = [s["step"] for s in scenarios if "step" in s and s["step"] not in steps]
    if unknown:
        raise resources.DataFileError(f"{where}: no such step in tools/demo_steps.py: {unknown}")
    return scenarios


def unmet(expect: Mapping[str, Expectation], obs: Mapping[str, object]) -> list[str]:
    """The expectations the observations do not meet, by name."""
    return [k for k, want in expect.items() if not _meets(obs.get(k), want)]


def _meets(got: Any, want: Any) -> bool:
    if not isinstance(want, dict):
        return bool(got == want)
    if got is None:
        return False
    if "min" in want and not got >= want["min"]:
        return False
    if "max" in want and not got <= want["max"]:
        return False
    return "has" not in want or want["has"] in got


class _Observed(string.Formatter):
    """Fills a scenario's line; a name nothing observed reads ``None`` (the line of a failed run)."""

    def get_value(self, key: int | str, args: Sequence[object], kwargs: Mapping[str, object]) -> object:
        return kwargs.get(str(key)) if isinstance(key, str) else super().get_value(key, args, kwargs)


def judged(stage: Stage, spec: Spec, seen: Seen) -> Result:
    """The scenario's result: timed if it says so, passed when every expectation is met."""
    inc, obs = seen.inc, seen.obs
    r = Result(spec["name"], False, "", durations(inc) if inc else {}, inc["id"] if inc else None, facts=obs)
    if spec.get("timed") and inc is not None:
        stage.timed(r, inc)
        resume, repair = r.resume_s, r.repair_s
        obs.update(resume_s=resume, repair_s=repair)
        obs["resume_before_repair"] = resume is not None and repair is not None and resume < repair
    if seen.resume_s is not None:
        r.resume_s = obs["resume_s"] = seen.resume_s
    failed = unmet(spec["expect"], obs)
    r.passed = not failed
    r.detail = _Observed().format(spec["detail"], **obs) + (f"; failed: {failed}" if failed else "")
    return r


class Runner:
    """Runs the scenarios of one stack, in order, each a Result (a scenario that breaks is a failed
    scenario, reported with its reason)."""

    def __init__(
        self,
        stage: Stage,
        steps: Mapping[str, Callable[[Stage], Seen]],
        stacks: Mapping[str, Callable[[Stage, Spec], Seen]] | None = None,
    ) -> None:
        self.stage, self.steps = stage, steps
        self.stacks = dict(stacks or {})  # a stack kind of its own (vertex: tools/demo_vertex.py)

    def run(self, spec: Spec) -> Result:
        if "step" in spec:
            seen = self.steps[spec["step"]](self.stage)
        elif spec["stack"] in self.stacks:
            seen = self.stacks[spec["stack"]](self.stage, spec)
        elif spec["stack"] == "gke":
            seen = self.on_gang(spec)
        else:
            seen = self.on_slurm(spec)
        return judged(self.stage, spec, seen)

    def run_all(self, scenarios: list[Scenario], report: Callable[[Result], None]) -> list[Result]:
        results = []
        for spec in scenarios:
            try:
                if spec.get("settle", True):
                    self.stage.settle()
                results.append(self.stage.with_times(self.run(spec)))
            except Exception as exc:  # a scenario that breaks is a failed scenario, reported with its reason
                results.append(Result(spec["key"], False, f"{type(exc).__name__}: {exc}"))
            report(results[-1])
        return results

    # -- the moves ----------------------------------------------------------------------------

    def fault(self, fault: FaultSpec, node: str) -> float | None:
        """Inject the scenario's fault on ``node``; a maintenance notice's window start (epoch s)."""
        st = self.stage
        if fault.get("event") == "preempt":
            st.router.publish(inject.preempt(st.state, node))
            return None
        if fault.get("event") == "maintenance":
            entry = inject.maintenance(st.state, node)
            st.router.publish(entry)
            return to_epoch(entry["protoPayload"]["metadata"]["windowStartTime"]) or 0.0
        line, carrier = XID_LINES[fault["xid"]], fault.get("carrier", "ops_agent")
        if fault.get("device_plugin"):
            assert st.gangs is not None
            st.gangs.device_plugin_xid(node, fault["xid"])
        if fault.get("kernel", carrier == "ops_agent"):
            inject.kernel_prints(st.state, node, line)
        where = REGION if fault.get("location") == "region" else ZONE
        make: dict[str, Callable[[], LogEntry]] = {
            "ops_agent": lambda: st.entry(node, line),
            "node_journal": lambda: st.k8s_entry(node, line, location=where),
            "serial_console": lambda: st.serial_entry(node, line),
        }
        for e in [make[carrier]() for _ in range(fault.get("count", 1))]:
            st.router.publish(e)
        return None

    def job(self, job: JobSpec | None) -> tuple[str | None, list[str], Path | None]:
        """The scenario's Slurm job once it runs: its id, its nodes, its checkpoint marker."""
        if job is None:
            return None, [], None
        st = self.stage
        marker = (
            Path(st.slurm.workdir) / f"checkpoint-{uuid.uuid4().hex[:6]}" if job.get("checkpoint") else None
        )
        script = f"trap 'touch {marker}; exit 0' USR1; sleep 3600 & wait" if marker else "sleep 3600"
        if "pinned" in job:
            held = [st.nodes[i] for i in job["pinned"]]
            jid = st.slurm.submit_on(held, script)
            st.wait(
                lambda: any(j["id"] == jid and j["state"] == "RUNNING" for j in st.slurm.jobs()),
                30,
                f"job {jid} to run",
            )
            return jid, held, marker
        lo, hi = job["among"]
        candidates = st.nodes[lo:hi]
        jid = st.slurm.submit(
            job["size"],
            command=script,
            exclude=[n for n in st.nodes if n not in candidates],
            partition=job.get("partition"),
        )
        return jid, st.wait(lambda: st.slurm.job_nodes(jid), 30, f"job {jid} to run"), marker

    def notes(self, spec: Spec, iid: str) -> list[WebhookRecord]:
        """The incident's notifications, waited for when the scenario expects any."""
        if not {"notes", "notes_text"} & set(spec["expect"]):
            return self.stage.notes_for(iid)
        return self.stage.wait(lambda: self.stage.notes_for(iid), 30, "the notification")

    def pages(self, spec: Spec, node: str) -> list[str]:
        """The PagerDuty alerts triggered about the node (every page goes there too), waited for
        when the scenario expects any."""
        st = self.stage

        def alerts() -> list[str]:
            bodies = [w["body"] for w in webhook_records(st.state, PAGERDUTY_PATH)]
            said = [
                str((b.get("payload") or {}).get("summary"))
                for b in bodies
                if b.get("event_action") == "trigger"
            ]
            return [text for text in said if node in text]

        want = spec["expect"].get("pages")
        return st.wait(alerts, 30, "the page") if want not in (None, 0) else alerts()

    # -- Slurm ----------------------------------------------------------------------------------

    def on_slurm(self, spec: Spec) -> Seen:
        st = self.stage
        job, held, marker = self.job(spec.get("job"))
        bad = st.nodes[spec["node"]] if "node" in spec else held[0]
        if spec.get("lemon"):
            inject.lemon_history(st.db, bad)
        if "gpu_state" in spec:
            st.stack.set_gpu_state(bad, spec["gpu_state"])
        before = inject.instance(st.state, bad)["id"]
        window = self.fault(spec["fault"], bad) if "fault" in spec else None
        inc = st.finished(bad, timeout=spec.get("timeout_s", 90.0))
        now_on = st.slurm.job_nodes(job) if job else []
        time.sleep(spec.get("linger_s", 0))  # let stragglers of a storm arrive
        obs = {**incident_obs(inc), **self.node_obs(bad, before), "bad": bad, "job": job}
        obs.update(
            held=",".join(held),
            now_on=",".join(now_on),
            now_on_count=len(now_on),
            moved_off=bad not in now_on,
        )
        places = {n: "/".join(p) for n, p in st.stack.spec.places.items()}
        obs.update(held_at=_places(held, places), now_at=_places(now_on, places))
        obs["checkpointed"] = marker is not None and marker.exists()
        obs["before_window"] = window is not None and (inc["timeline"].get("fenced") or 1e18) < window
        obs["restarts"] = st.slurm.restarts(job) if job else None
        obs["drained"] = "drain" in st.slurm.node_states().get(bad, "")
        obs["back"] = not obs["drained"]
        notes = self.notes(spec, inc["id"])
        obs.update(notes=len(notes), notes_text=" ".join(str(n["body"].get("text")) for n in notes))
        pages = self.pages(spec, bad)
        obs.update(pages=len(pages), page_text=" ".join(pages))
        if job and "among" in spec["job"]:
            st.slurm.cancel(job)
        return Seen(inc, obs)

    def node_obs(self, node: str, vm_before: str) -> Observations:
        """The node's incidents and what the fake Compute did to its VM."""
        st = self.stage
        reports = st.calls("report_host_as_faulty", node)
        why = reports[0]["body"]["faultReasons"][0] if reports else {}
        vm, incs = inject.instance(st.state, node), st.incidents(node)
        return {
            "incidents": len(incs),
            "xid_incidents": sum(1 for i in incs if i["kind"] == "gpu_xid"),
            "resets": len(st.calls("reset", node)),
            "reports": len(reports),
            "report_behavior": why.get("behavior"),
            "report_description": why.get("description"),
            "perform_maintenance": len(st.calls("perform_maintenance", node)),
            "new_vm": vm["id"] != vm_before,
            "vm_status": vm["status"],
        }

    # -- GKE ------------------------------------------------------------------------------------

    def on_gang(self, spec: Spec) -> Seen:
        """A JobSet on the faulty node and the partner, free to move to the spare (or on the nodes and
        spares the scenario's ``gang`` names); the fault; the JobSet removed afterwards."""
        st, gangs = self.stage, self.stage.gangs
        assert gangs is not None
        bad = st.nodes[spec["node"]]
        given = spec.get("gang")
        members, spares = [bad, st.nodes[GKE_PARTNER]], [st.nodes[GKE_SPARE]]
        if isinstance(given, dict):
            members, spares = [st.nodes[i] for i in given["members"]], [st.nodes[i] for i in given["spares"]]
        g = gangs.gang(spec["key"].removeprefix("gke_"), members, spares)
        watch = Watch(gangs.kube.url, WATCHES[spec["watch"]]) if "watch" in spec else None
        try:
            before = inject.instance(st.state, bad)["id"]
            window = self.fault(spec["fault"], bad)
            inc = st.finished(bad, timeout=spec.get("timeout_s", 90.0))
            where = gangs.moved(g, [bad])
            obs: Observations = {"back": gangs.node_back(bad), "restarts": gangs.restarts(g.name)}
            obs["pinned"] = gangs.pinned(g.name)
            obs["notes"] = len(self.notes(spec, inc["id"]))
        finally:
            events = watch.stop() if watch else []
            gangs.done_with(g)
        evicted = evictions(events, bad)
        obs.update(incident_obs(inc), bad=bad, moved_to=",".join(where))
        places = {n: "/".join(p) for n, p in st.stack.spec.places.items()}
        obs.update(held_at=_places(members, places), now_at=_places(where, places))
        obs.update(self.node_obs(bad, before))
        obs.update(fenced_by=fenced_by(events, bad, inc["id"]), evicted=len(evicted), grace_s=POD_GRACE_S)
        obs["graceful"] = bool(evicted) and all(
            e["grace"] == POD_GRACE_S and e["at"] < (window or 0) for e in evicted
        )
        obs["location"] = REGION if spec["fault"].get("location") == "region" else ZONE
        obs["zone_of_the_vm"] = obs["zone"] == ZONE
        return Seen(inc, obs)


def _places(nodes: list[str], places: Mapping[str, str]) -> str:
    """Where the nodes sit (block/sub-block, each once); a node the stack does not place: block-1/sub-1."""
    return ",".join(sorted({places.get(n, "block-1/sub-1") for n in nodes}))


def choice_obs(inc: Incident) -> Observations:
    """The gang's priced choice (core/tradeoff): what was taken, the sentence, where, each option's
    expected GPU-hours (``choice_wait``, ``choice_move``, ...) and whether a person was paged."""
    choice = inc.get("choice") or {}
    obs: Observations = {
        "choice_decision": choice.get("decision"),
        "choice_why": choice.get("why"),
        "choice_tier": choice.get("tier"),
        "choice_spares": ",".join(choice.get("spares") or []),
        "choice_penalty": choice.get("penalty"),
        "choice_page": choice.get("page"),
    }
    obs.update({f"choice_{o['option']}": o["gpu_h"] for o in choice.get("options") or []})
    return obs


def incident_obs(inc: Incident) -> Observations:
    """What an ended incident says: its outcome, diagnosis, validation, resume and escalations."""
    tl = inc.get("timeline") or {}
    diagnosis, val = inc.get("diagnosis") or {}, inc.get("validation") or {}
    resume, peers = inc.get("resume") or {}, inc.get("corroboration") or {}
    failed = [m for m in inc.get("measured", []) if m.get("kind") == "validate" and not m.get("passed")]
    first, waiting = (failed or [{}])[0], resume.get("waiting") or []
    nccl = first.get("nccl_peers") or []  # the failed validation's peers, each under the fabric's NCCL setup
    return {
        **choice_obs(inc),
        "incident": inc["id"],
        **{k: inc.get(k) for k in ("state", "action", "kind", "trust")},
        "events": (inc.get("counts") or {}).get("events"),
        "zone": node["zone"] if (node := inc.get("node")) else None,
        "fenced": bool(tl.get("fenced")),
        "diagnosis": diagnosis,
        "diagnosis_confirmed": diagnosis.get("confirmed"),
        "diagnosis_why": diagnosis.get("why"),
        "validation": val,
        "validation_passed": bool(val.get("passed")),
        "validation_busbw": val.get("busbw_gbps"),
        "validation_peer": val.get("peer"),
        "resume": resume,
        "resume_mode": resume.get("mode"),
        "waiting_why": waiting[0]["why"] if waiting else None,
        "peers": peers,
        "peers_verdict": peers.get("verdict"),
        "peers_why": peers.get("why"),
        "escalations": [f"{e['from']}->{e['to']}" for e in inc.get("escalations", [])],
        "first_failed_busbw": first.get("busbw_gbps"),
        "first_failed_threshold": first.get("threshold_gbps"),
        "first_failed_peers": ", ".join(str(p.get("peer")) for p in nccl),
        "first_failed_peer_count": len({p.get("peer") for p in nccl}),
        "first_failed_all_degraded": all(p.get("verdict") == "degraded" for p in nccl),
        "requeued_after_repair": tl.get("job_requeued", 0) >= (tl.get("healthy") or 1e18),
        "running_after_validation": tl.get("job_running", 0) >= (tl.get("validated") or 1e18),
    }
