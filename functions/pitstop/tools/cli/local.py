"""``pitstop local up|down|status|inject|chaos``: the whole pipeline on this machine; each sub-verb
has a parser of its own, so its help lists only its own flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import orjson
import yaml

if TYPE_CHECKING:
    from pitstop.core.domain import Failure, Held, Incident, JsonObject
    from pitstop.local.gke_stack import JobSetSummary, NodeSummary
    from pitstop.local.stack import ClusterSpec, StackState

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
from pitstop.core import engine
from pitstop.tools.common import lines


class IncidentStatus(TypedDict):
    """One incident as `pitstop local status` shows it, with the effects it caused on the stand-ins."""

    id: str
    node: str
    state: str
    action: str
    events: int
    held: Held | None
    failure: Failure | None
    durations_s: dict[str, float | None]
    effects: dict[str, dict[str, int]]  # compute | slurm | kube -> method or op -> calls


class Operation(TypedDict):
    method: str
    path: str


class StackStatus(TypedDict, total=False):
    """What `pitstop local status --json` prints: the Slurm view or the Kubernetes one. The stand-ins'
    own records (VMs, the chaos controller's status) are free-form: they are
    shown as the stand-ins (pitstop.local) answer, and read only by a person."""

    incidents: list[IncidentStatus]
    slurm_nodes: list[dict[str, str]]
    slurm_jobs: list[dict[str, str]]
    k8s_nodes: list[NodeSummary]
    jobsets: list[JobSetSummary]
    instances: list[JsonObject]
    operations: list[Operation]
    notifications: list[str]
    chaos: JsonObject | None


def cmd_local(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pitstop.local import stack as st

    workdir = Path(args.workdir) if args.workdir else st.default_workdir()
    if args.action == "up":
        return _local_up(args, workdir)
    if args.action == "down":
        stopped = st.down(workdir)
        print(f"stopped {len(stopped)} processes" if stopped else "no local stack running")
        return 0
    if not (workdir / "stack.json").is_file():
        said = f"no local stack in {workdir}: start one with `pitstop local up`"
        print(f"pitstop local {args.action}: {said}", file=sys.stderr)
        return 2
    state = st.StackState.load(workdir)
    if args.action == "inject":
        return _local_inject(state, args.path, args.at_rate)
    if args.action == "chaos":
        return _local_chaos(state, args)
    return local_status(state, args.json)


def cluster_spec(args: argparse.Namespace) -> ClusterSpec:
    """The simulated cluster: defaults, then --config's YAML, then --nodes/--spot (the last word wins).

    --config may also set job_nodes, which is written back to ``args``. On GKE the job is a JobSet
    the stack creates as it starts (``jobset_nodes``), not a Slurm job the daemon submits.
    """
    from pathlib import Path

    from pitstop.local import stack as st

    spec = st.ClusterSpec.gke() if args.scheduler == "gke" else st.ClusterSpec()
    if args.config:
        conf = yaml.safe_load(Path(args.config).read_text()) or {}
        for k in ("nodes", "prefix", "spot", "machine_type", "mig", "name"):
            if k in conf:
                setattr(spec, k, conf[k])
        args.job_nodes = conf.get("job_nodes", args.job_nodes)
    if args.nodes:
        spec.nodes = args.nodes
    if args.spot:
        spec.spot = args.spot.split(",")
    if spec.scheduler == "gke":
        spec.jobset_nodes, args.job_nodes = args.job_nodes or 0, 0
    return spec


def _local_up(args: argparse.Namespace, workdir: Path) -> int:
    """Start the stack in a background process that owns it until `local down`; print where it answers.

    That process keeps the stack's supervisor and chaos endpoint alive after this command returns.
    If any part fails to start it stops what did start, and the reason is printed here.
    """
    import contextlib
    import json
    import os
    import signal
    import subprocess
    from dataclasses import asdict

    from pitstop.local import daemon
    from pitstop.local import stack as st

    with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
        if st.daemon_alive(st.StackState.load(workdir).daemon_pid):
            print(
                f"pitstop: a local stack is already running in {workdir} (pitstop local down)",
                file=sys.stderr,
            )
            return 1
    spec = cluster_spec(args)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in (daemon.READY, daemon.FAILED):
        (workdir / name).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pitstop.local.daemon", "--workdir", str(workdir)]
    argv += ["--spec", json.dumps(asdict(spec)), "--sweep-interval", str(args.sweep_interval)]
    argv += ["--job-nodes", str(args.job_nodes or 0)]
    with open(workdir / "stack.log", "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        ready = _await_stack(workdir, proc)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        raise
    if ready is None:
        failed = workdir / daemon.FAILED
        why = failed.read_text() if failed.exists() else f"see {workdir / 'stack.log'}"
        print(f"pitstop: the local stack did not start:\n{why}", file=sys.stderr)
        return 1
    state = st.StackState.load(workdir)
    if ready.get("job"):
        print(f"submitted job {ready['job']} on {args.job_nodes} nodes")
    if spec.jobset_nodes:
        print(f"created JobSet train on {spec.jobset_nodes} nodes (kubectl get jobsets)")
    print(f"local stack up in {workdir} (stop it with: pitstop local down)")
    for k, v in state.endpoints.items():
        print(f"  {k:<11} {v}")
    if state.kubeconfig:
        print(f"  kubernetes  KUBECONFIG={state.kubeconfig}")
    else:
        print(f"  slurm       SLURM_CONF={state.slurm_conf}")
    return 0


def _await_stack(workdir: Path, proc: Any, timeout: float = 600.0) -> Mapping[str, object] | None:
    """The background process's ready.json once it is up; None if it exited first or took too long."""
    import json
    import time

    from pitstop.local import daemon

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = workdir / daemon.READY
        if ready.exists():
            doc: object = json.loads(
                ready.read_text()
            )  # the daemon's: its endpoints, and the job it submitted
            return doc if isinstance(doc, dict) else {}
        if proc.poll() is not None:
            return None
        time.sleep(0.5)
    proc.terminate()
    return None


def _local_inject(state: StackState, path: str, at_rate: float) -> int:
    """Publish entries the way the log sink would: only those its filters select; bad JSON as is."""
    import time

    from pitstop.local import stack as st

    router = st.Router(state)
    sent = dropped = 0
    gap = 1.0 / at_rate if at_rate else 0.0
    for raw in lines(path):
        try:
            entry = orjson.loads(raw)
        except orjson.JSONDecodeError:
            router.publish_raw(raw)  # what a broken producer would send; ingest dead-letters it
            sent += 1
            continue
        if isinstance(entry, dict) and router.publish(entry):
            sent += 1
        else:
            dropped += 1
        if gap:
            time.sleep(gap)
    print(f"published {sent} entries; {dropped} did not match the sink filters")
    return 0


def _local_chaos(state: StackState, args: argparse.Namespace) -> int:
    """Hand one chaos request to the stack's controller (pitstop.local.chaos lists the kinds)."""
    import json
    import urllib.error
    import urllib.request

    if "control" not in state.endpoints:
        print("pitstop: this stack has no controller (started before chaos existed)", file=sys.stderr)
        return 1
    body = {"kind": args.path, "arg": args.arg, "times": args.times, "node": args.node, "method": args.method}
    req = urllib.request.Request(  # noqa: S310 - the loopback URL from stack.json
        state.endpoints["control"] + "/chaos",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310
            result = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        print(f"pitstop: {json.loads(exc.read() or b'{}').get('error', exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"pitstop: the stack's controller does not answer ({exc}); is the stack up? "
            "(a stack left by `pitstop demo --keep` has none)",
            file=sys.stderr,
        )
        return 1
    print(_chaos_line(args, result))
    return 0


def _chaos_line(args: argparse.Namespace, result: JsonObject) -> str:
    """One human line about what a chaos request did (``result``: the controller's answer, free-form:
    each kind of pitstop.local.chaos answers with fields of its own)."""
    where = (f" on {args.node}" if args.node else "") + (f" ({args.method})" if args.method else "")
    kind = result.get("kind")
    if kind == "compute-error":
        armed = ", ".join(f"{f['code']} {f['reason']} x{f['left']}" for f in result.get("armed", []))
        return f"armed: the next {args.times} mutating Compute call(s){where} fail; now armed: {armed}"
    if kind == "actuate-crash-after-effect":
        return f"armed: actuate dies after its next {args.times} mutating Compute call(s){where}"
    if kind == "publish-timeout":
        return f"armed: the next {args.times} notification publish(es) from actuate{where} time out"
    if kind in ("agent-down", "agent-up"):
        return f"slurm agent: {result.get('agent')}"
    if kind in ("webhook-down", "webhook-up"):
        return f"webhook sink: {'down (503)' if kind == 'webhook-down' else 'up'}"
    if kind == "firestore-restart":
        return "firestore emulator restarted with its data"
    if kind == "hang":
        runs = ", ".join(f"job {j} (run {r})" for j, r in (result.get("runs") or {}).items())
        return f"hung: {runs} stop beating{where or ' (no culprit node: a software hang)'}"
    if kind in ("straggler", "degrading", "heal"):
        state = (result.get("gpu") or {}).get("state")
        readers = "the Monitoring stand-in's node policies (and, on GKE, the PromQL stand-in) read it"
        return f"{args.node}: GPU state {state or 'healthy'}; {readers}"
    return "every armed fault and flag cleared"


def local_status(state: StackState, as_json: bool) -> int:
    report = _status_report(state)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    _print_status(report)
    return 0


def _status_report(state: StackState) -> StackStatus:
    """One picture of the stack: incidents, the scheduler's view (Slurm's, or the Kubernetes nodes
    and JobSets of a GKE stack), the fake VMs and calls, what was notified."""
    from pitstop.local import gke_stack
    from pitstop.local.stack import admin, webhook_records

    compute = admin(state, "/_admin/state")
    kube = gke_stack.Kube(state.endpoints["kube"]).effects() if "kube" in state.endpoints else None
    report: StackStatus = {"incidents": _incident_rows(state, compute.get("effects", []), kube)}
    if "kube" in state.endpoints:
        k8s = gke_stack.status(state.endpoints["kube"])
        report |= {"k8s_nodes": k8s["k8s_nodes"], "jobsets": k8s["jobsets"]}
    else:
        sinfo = _slurm_lines(state, ["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
        squeue = _slurm_lines(state, ["squeue", "-h", "-o", "%i|%T|%N|%j"])
        report["slurm_nodes"] = [
            dict(zip(("node", "state", "reason"), x.split("|"), strict=False)) for x in sinfo
        ]
        report["slurm_jobs"] = [
            dict(zip(("id", "state", "nodes", "name"), x.split("|"), strict=False)) for x in squeue
        ]
    notes = webhook_records(state)
    report |= {
        "instances": compute["instances"],
        "operations": [{"method": c["method"], "path": c["path"]} for c in compute["calls"]],
        "notifications": [n["body"]["text"] for n in notes],
        "chaos": _chaos_status(state, compute.get("faults", [])),
    }
    return report


def _chaos_status(state: StackState, faults: list[JsonObject]) -> JsonObject | None:
    """Armed faults and the controller's view (restarts, agent); None if no controller answers."""
    import json
    import urllib.request

    if "control" not in state.endpoints:
        return None
    req = urllib.request.Request(state.endpoints["control"] + "/status", data=b"{}", method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
            ctl: JsonObject = json.loads(resp.read())  # pitstop.local.control's status, shown as it is
    except OSError:
        return None
    return {**ctl, "compute_faults": faults}


def _incident_rows(
    state: StackState,
    compute_effects: Sequence[Mapping[str, object]],
    kube_effects: Sequence[Mapping[str, object]] | None = None,
) -> list[IncidentStatus]:
    """The stack's incidents from its Firestore emulator, oldest first, with the effects each caused."""
    from google.cloud import firestore

    from pitstop.core.timeline import durations
    from pitstop.local import effects
    from pitstop.local.stack import emulator_env

    with emulator_env(state.endpoints):
        db = firestore.Client(project=state.project)
    incidents = cast(  # the store's documents, as it wrote them
        list["Incident"],
        sorted(
            (d for d in (d.to_dict() for d in db.collection("pitstop_incidents").stream()) if d),
            key=lambda d: d["created_at"],
        ),
    )
    results = {d.id: d.to_dict() or {} for d in db.collection("pitstop_slurm_results").stream()}
    caused = effects.by_incident(incidents, compute_effects, results, kube_effects)
    return [
        {
            "id": i["id"],
            "node": engine.subject_name(i),
            "state": i["state"],
            "action": i["action"],
            "events": i["counts"]["events"],
            "held": i.get("held"),
            "failure": i.get("failure"),
            "durations_s": durations(i),
            "effects": caused[i["id"]],
        }
        for i in incidents
    ]


def _slurm_lines(state: StackState, argv: list[str]) -> list[str]:
    """A Slurm client command's output lines against the stack's controller (none if it fails)."""
    import os
    import subprocess

    env = {**os.environ, "SLURM_CONF": state.slurm_conf}
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=False).stdout.splitlines()


def _print_status(report: StackStatus) -> None:
    from pitstop.local.effects import compact

    print("INCIDENTS")
    for i in report["incidents"]:
        d = i["durations_s"]
        print(
            f"  {i['id']} {i['node']:<14} {i['state']:<9} {i['action']:<14} events={i['events']:<5} "
            f"effects={compact(i['effects']):<28} "
            f"resolved={d.get('resolved')}s {('held: ' + i['held']['reason']) if i['held'] else ''}"
        )
    if "k8s_nodes" in report:
        _print_k8s(report)
    else:
        print("SLURM NODES")
        for n in report["slurm_nodes"]:
            print(f"  {n.get('node'):<14} {n.get('state'):<12} {n.get('reason', '')}")
        print("SLURM JOBS")
        for j in report["slurm_jobs"]:
            print(f"  {j.get('id'):<5} {j.get('state'):<11} {j.get('nodes')}")
    print("INSTANCES")
    for inst in report["instances"]:
        print(f"  {inst['name']:<14} {inst['status']:<10} id={inst['id']} host={inst['host']}")
    print("OPERATIONS RECEIVED")
    for op in report["operations"]:
        print(f"  {op['method']:<22} {op['path']}")
    print("NOTIFICATIONS")
    for text in report["notifications"]:
        print("  " + text.replace("\n", "\n    "))


def _print_k8s(report: StackStatus) -> None:
    """A GKE stack's scheduler view, as kubectl would summarise it (cordon, taints, GPUs, restarts)."""
    print("KUBERNETES NODES")
    for n in report["k8s_nodes"]:
        flags = "Ready" if n["ready"] else "NotReady"
        flags += ",SchedulingDisabled" if n["unschedulable"] else ""
        print(f"  {n['name']:<32} {flags:<28} gpu={n['gpu_allocatable']} {' '.join(n['taints'])}")
    print("JOBSETS")
    for j in report["jobsets"]:
        print(f"  {j['name']:<14} restarts={j['restarts']:<3} {','.join(j['nodes'])}")


def add(sub: Subparsers) -> None:
    """local: the whole pipeline on this machine; one parser per sub-verb, each with its own flags."""
    lo = sub.add_parser(
        "local", help="the whole pipeline on this machine (emulators, fakes, real Slurm or a fake GKE)"
    )
    verbs = lo.add_subparsers(dest="action", required=True, metavar="{up,down,status,inject,chaos}")
    for name, text, add_flags in (
        ("up", "start the local stack", _up_flags),
        ("down", "stop the local stack", None),
        ("status", "incidents and their effects, nodes, jobs, VMs, notifications", _status_flags),
        ("inject", "LogEntries through the sink router", _inject_flags),
        ("chaos", "rehearse a failure", _chaos_flags),
    ):
        v = verbs.add_parser(name, help=text)
        v.add_argument("--workdir", default=None, help="state and logs (default .local/ in the repo)")
        if add_flags is not None:
            add_flags(v)
        v.set_defaults(func=cmd_local)


def _up_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--nodes", type=int, default=None, help="simulated nodes (default 8)")
    v.add_argument("--spot", default="", help="comma-separated node names that are Spot VMs")
    v.add_argument(
        "--scheduler",
        choices=("slurm", "gke"),
        default="slurm",
        help="the cluster's scheduler (gke: a fake Kubernetes API server; writes <workdir>/kubeconfig)",
    )
    v.add_argument(
        "--job-nodes",
        type=int,
        default=0,
        help="a running job on this many nodes (gke: a JobSet with the host-maintenance failure policy)",
    )
    v.add_argument(
        "--config", default=None, help="YAML with nodes, prefix, spot, machine_type, mig, job_nodes"
    )
    v.add_argument(
        "--sweep-interval", type=float, default=60.0, help="seconds between sweeps (Cloud Scheduler: 60)"
    )


def _status_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("--json", action="store_true", help="machine-readable")


def _inject_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("path", nargs="?", default="-", help="JSON Lines of LogEntries, or -")
    v.add_argument("--at-rate", type=float, default=0.0, help="entries per second (storms)")


def _chaos_flags(v: argparse.ArgumentParser) -> None:
    from pitstop.local.chaos import KINDS

    v.add_argument(
        "path",
        metavar="KIND",
        choices=KINDS,
        help="what fails: " + ", ".join(KINDS) + " (each: docs/cli.md)",
    )
    v.add_argument(
        "arg",
        nargs="?",
        default=None,
        help="compute-error: the HTTP status (503, 403:rateLimitExceeded); firestore-restart: seconds down; "
        "hang: link (an NVLink of --node down instead of a stuck GPU)",
    )
    v.add_argument("--times", type=int, default=1, help="how many calls the fault hits")
    v.add_argument(
        "--node",
        default=None,
        help="only calls about this node; hang|straggler|degrading|heal: the node whose GPU is at fault",
    )
    v.add_argument(
        "--method",
        default=None,
        help="compute-error/actuate-crash-after-effect: only this Compute call "
        "(reset, set_labels, report_host_as_faulty, perform_maintenance, recreate)",
    )
