"""The `pitstop` command line."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson
import yaml

from pitstop.core.classify import Classifier
from pitstop.core.resources import DataFileError

if TYPE_CHECKING:
    from pathlib import Path

    from pitstop.local.stack import ClusterSpec, StackState

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def _lines(path: str) -> Iterator[bytes]:
    stream: IO[bytes] = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for raw in stream:
            if raw.strip():
                yield raw
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


_TABLE_COLS = (("kind", 10), ("action", 14), ("xid", 4), ("node", 28), ("gpu", 12), ("reason", 0))


def _table_row(ev: dict[str, Any]) -> str:
    node = ev["node"]["instance"] if ev.get("node") else "-"
    gpu = (ev.get("gpu") or {}).get("pci") or "-"
    vals = {
        "kind": ev["kind"],
        "action": ev["action"],
        "xid": "" if ev["xid"] is None else str(ev["xid"]),
        "node": node,
        "gpu": gpu,
        "reason": ev["reason"],
    }
    return "  ".join(vals[c].ljust(w) if w else vals[c] for c, w in _TABLE_COLS)


def cmd_classify(args: argparse.Namespace) -> int:
    clf = Classifier.default()
    out = sys.stdout.buffer
    if args.format == "table":
        out.write(("  ".join(c.upper().ljust(w) if w else c.upper() for c, w in _TABLE_COLS) + "\n").encode())
    for raw in _lines(args.path):
        ev = clf.classify_bytes(raw)
        if args.format == "table":
            out.write((_table_row(ev) + "\n").encode())
        else:
            out.write(orjson.dumps(ev) + b"\n")
    out.flush()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pitstop.tools import bench

    if args.target == "classify":
        result = bench.bench_classify(args.lines or 100_000)
    elif args.target == "simulate":
        result = bench.bench_simulate()
    else:
        runs = [
            bench.bench_ingest(args.lines or 20_000, args.nodes, args.workers, int(n), args.report_memory)
            for n in args.instances.split(",")
        ]
        result = {"benchmark": "ingest", "runs": runs}
    sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


def _database() -> str:
    """The database deploy creates (``pitstop``); the emulator's local stack keeps the default one."""
    import os

    named = os.environ.get("PITSTOP_FIRESTORE_DATABASE")
    return named or ("(default)" if os.environ.get("FIRESTORE_EMULATOR_HOST") else "pitstop")


def _store(project: str | None) -> Any:
    import os

    from google.cloud import firestore

    from pitstop.adapters.firestore import IncidentStore
    from pitstop.core import policy as policy_mod

    pol = policy_mod.load()
    client = firestore.Client(
        project=project or os.environ.get("GOOGLE_CLOUD_PROJECT"),
        database=_database(),
    )
    return IncidentStore(client, pol.doc["store"]["collection_prefix"]), pol


def cmd_incidents(args: argparse.Namespace) -> int:
    import time

    from pitstop.core.states import OPEN_STATES
    from pitstop.core.timeline import durations, iso, render

    store, pol = _store(args.project)
    if args.release:
        out = store.release(args.release, pol, time.time(), by=args.by or "operator")
        print(f"{args.release}: {out.result}")
        return 0 if out.result == "released" else 1
    if args.close:
        return _close_incident(store, pol, args)
    states = OPEN_STATES if args.open else None
    incidents = store.list(states)
    if args.json:
        for inc in incidents:
            sys.stdout.buffer.write(orjson.dumps({**inc, "durations_s": durations(inc)}, default=str) + b"\n")
        return 0
    print(f"{'ID':<11} {'STATE':<10} {'ACTION':<14} {'NODE':<28} {'CLUSTER':<10} {'EVENTS':>7}  DETECTED")
    for inc in incidents:
        print(
            f"{inc['id']:<11} {inc['state']:<10} {inc['action']:<14} {inc['node']['instance']:<28} "
            f"{inc.get('cluster') or '-':<10} {inc['counts']['events']:>7}  "
            f"{iso(inc['timeline'].get('detected'))}"
        )
        if inc.get("held"):
            print(f"    held: {inc['held']['reason']}")
        if inc.get("failure"):
            print(f"    failed at {inc['failure'].get('stage')}: {inc['failure'].get('error')}")
        if inc.get("closure"):
            print(f"    closed by {inc['closure']['by']} at {iso(inc['closure']['at'])}")
        if args.timeline:
            print("\n".join(render(inc)))
    return 0


def _close_incident(store: Any, pol: Any, args: argparse.Namespace) -> int:
    """`--close ID [--unfence] --by NAME`: see services/close.py."""
    import time

    if not args.by:
        print("pitstop: --close needs --by NAME (recorded on the incident)", file=sys.stderr)
        return 2
    from pitstop.services.close import close_incident
    from pitstop.services.schedulers import Wiring, schedulers_for

    schedulers = {}
    if args.unfence and any(c.scheduler in ("slurm", "gke") for c in pol.clusters):
        import os

        from google.cloud.pubsub_v1 import PublisherClient

        results = store.db.collection(f"{pol.doc['store']['collection_prefix']}_slurm_results")
        kube = os.environ.get("PITSTOP_KUBE_ENDPOINT")  # the local stack's fake API server, if any
        wiring = Wiring(store.db.project, PublisherClient(), results, kube_endpoint=kube)
        schedulers = schedulers_for(pol, wiring)
    done = close_incident(store, schedulers, args.close, args.by, time.time(), args.unfence)
    print("\n".join(done.lines))
    return 0 if done.ok else 1


def cmd_replay(args: argparse.Namespace) -> int:
    import time

    from pitstop.core import policy as policy_mod
    from pitstop.tools import replay as replay_mod

    pol = policy_mod.load(args.policy)
    if args.path:
        items = replay_mod.read_jsonl(args.path)
    else:
        if not args.project:
            raise SystemExit("pitstop replay --since needs --project (or GOOGLE_CLOUD_PROJECT)")
        items = replay_mod.cloud_logging_entries(
            args.project, _duration_s(args.since), time.time(), endpoint=args.logging_endpoint
        )
    report = replay_mod.replay(items, pol)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    t = report["totals"]
    print(f"{report['entries']} entries: {report['by_kind']}")
    print(
        f"{t['incidents']} incidents, {t['would_start']} remediations would start, "
        f"{t['held_by_budget']} held by budget ({t['released_later']} released as the window slid), "
        f"{t['held_for_human']} held for a human; by action {t['by_action']}"
    )
    for inc in report["incidents"]:
        held = f"  HELD: {inc['held']['reason']}" if inc["held"] else ""
        print(
            f"  {inc['id']} {inc['node']:<28} {inc['action']:<14} events={inc['events']:<6} "
            f"{inc['reason']}{held}"
        )
    return 0


def _duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if not text or text[-1] not in units or not text[:-1].replace(".", "", 1).isdigit():
        raise SystemExit(f"--since takes a duration like 90m, 6h or 2d, not {text!r}")
    return float(text[:-1]) * units[text[-1]]


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
    state = st.StackState.load(workdir)
    if args.action == "inject":
        return _local_inject(state, args.path, args.at_rate)
    if args.action == "chaos":
        return _local_chaos(state, args)
    return _local_status(state, args.json)


def _cluster_spec(args: argparse.Namespace) -> ClusterSpec:
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
    spec = _cluster_spec(args)
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


def _await_stack(workdir: Path, proc: Any, timeout: float = 600.0) -> dict[str, Any] | None:
    """The background process's ready.json once it is up; None if it exited first or took too long."""
    import json
    import time

    from pitstop.local import daemon

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = workdir / daemon.READY
        if ready.exists():
            doc: dict[str, Any] = json.loads(ready.read_text())
            return doc
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
    for raw in _lines(path):
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


def _chaos_line(args: argparse.Namespace, result: dict[str, Any]) -> str:
    """One human line about what a chaos request did."""
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
    return "every armed fault and flag cleared"


def _local_status(state: StackState, as_json: bool) -> int:
    report = _status_report(state)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    _print_status(report)
    return 0


def _status_report(state: StackState) -> dict[str, Any]:
    """One picture of the stack: incidents, the scheduler's view (Slurm's, or the Kubernetes nodes
    and JobSets of a GKE stack), the fake VMs and calls, what was notified."""
    from pitstop.local import gke_stack
    from pitstop.local.stack import admin, webhook_records

    compute = admin(state, "/_admin/state")
    kube = gke_stack.Kube(state.endpoints["kube"]).effects() if "kube" in state.endpoints else None
    incidents = _incident_rows(state, compute.get("effects", []), kube)
    scheduler: dict[str, Any]
    if "kube" in state.endpoints:
        scheduler = gke_stack.status(state.endpoints["kube"])
    else:
        sinfo = _slurm_lines(state, ["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
        squeue = _slurm_lines(state, ["squeue", "-h", "-o", "%i|%T|%N|%j"])
        scheduler = {
            "slurm_nodes": [
                dict(zip(("node", "state", "reason"), x.split("|"), strict=False)) for x in sinfo
            ],
            "slurm_jobs": [
                dict(zip(("id", "state", "nodes", "name"), x.split("|"), strict=False)) for x in squeue
            ],
        }
    notes = webhook_records(state)
    return {
        "incidents": incidents,
        **scheduler,
        "instances": compute["instances"],
        "operations": [{"method": c["method"], "path": c["path"]} for c in compute["calls"]],
        "notifications": [n["body"]["text"] for n in notes],
        "chaos": _chaos_status(state, compute.get("faults", [])),
    }


def _chaos_status(state: StackState, faults: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Armed faults and the controller's view (restarts, agent); None if no controller answers."""
    import json
    import urllib.request

    if "control" not in state.endpoints:
        return None
    req = urllib.request.Request(state.endpoints["control"] + "/status", data=b"{}", method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - loopback
            ctl: dict[str, Any] = json.loads(resp.read())
    except OSError:
        return None
    return {**ctl, "compute_faults": faults}


def _incident_rows(
    state: StackState, compute_effects: list[dict[str, Any]], kube_effects: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The stack's incidents from its Firestore emulator, oldest first, with the effects each caused."""
    from google.cloud import firestore

    from pitstop.core.timeline import durations
    from pitstop.local import effects
    from pitstop.local.stack import emulator_env

    with emulator_env(state.endpoints):
        db = firestore.Client(project=state.project)
    incidents = sorted(
        (d for d in (d.to_dict() for d in db.collection("pitstop_incidents").stream()) if d),
        key=lambda d: d["created_at"],
    )
    results = {d.id: d.to_dict() or {} for d in db.collection("pitstop_slurm_results").stream()}
    caused = effects.by_incident(incidents, compute_effects, results, kube_effects)
    return [
        {
            "id": i["id"],
            "node": i["node"]["instance"],
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


def _print_status(report: dict[str, Any]) -> None:
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


def _print_k8s(report: dict[str, Any]) -> None:
    """A GKE stack's scheduler view, as kubectl would summarise it (cordon, taints, GPUs, restarts)."""
    print("KUBERNETES NODES")
    for n in report["k8s_nodes"]:
        flags = "Ready" if n["ready"] else "NotReady"
        flags += ",SchedulingDisabled" if n["unschedulable"] else ""
        print(f"  {n['name']:<32} {flags:<28} gpu={n['gpu_allocatable']} {' '.join(n['taints'])}")
    print("JOBSETS")
    for j in report["jobsets"]:
        print(f"  {j['name']:<14} restarts={j['restarts']:<3} {','.join(j['nodes'])}")


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pitstop.local.stack import default_workdir
    from pitstop.tools import demo

    return demo.run(
        Path(args.workdir) if args.workdir else default_workdir() / "demo", args.only or None, keep=args.keep
    )


def cmd_deploy(args: argparse.Namespace) -> int:
    from pitstop.tools import deploy

    try:
        conf = deploy.load_config(args.config)
    except (OSError, ValueError, yaml.YAMLError) as e:
        print(f"pitstop deploy: {e}", file=sys.stderr)
        return 2
    region = args.region or conf["region"]
    if args.command == "teardown":
        return deploy.teardown(deploy.plan(args.project, region, conf), args.purge)
    if args.dry_run:
        for line in deploy.dry_run_lines(args.project, region, conf):
            print(line)
        return 0
    with tempfile.TemporaryDirectory(prefix="pitstop-src-") as staged:  # gone once gcloud has uploaded it
        source = deploy.stage_source(conf.get("policy"), Path(staged))
        return deploy.apply(deploy.plan(args.project, region, conf, str(source)))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pitstop", description="GPU-cluster fault remediation on Google Cloud.")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _add_classify,
        _add_bench,
        _add_incidents,
        _add_replay,
        _add_local,
        _add_deploy,
        _add_demo,
        _add_doctor,
    ):
        add(sub)  # in this order: it is the order `pitstop --help` lists them
    from pitstop.tools import simulate  # its own module: the fleet model lives in tools/sim/

    simulate.register(sub)
    from pitstop.tools import report  # the HTML page: report_model.py computes, report.py lays out

    report.register(sub)
    return p


def _add_classify(sub: Subparsers) -> None:
    """classify: JSON Lines of LogEntries in, one FaultEvent line (or table row) out each."""
    c = sub.add_parser(
        "classify", help="classify log entries (JSON Lines in, one FaultEvent JSON line out each)"
    )
    c.add_argument("path", nargs="?", default="-", help="JSON Lines file, or - for standard input")
    c.add_argument("--format", choices=("json", "table"), default="json")
    c.set_defaults(func=cmd_classify)


def _add_bench(sub: Subparsers) -> None:
    """bench: speed figures, measured on demand and never asserted in tests."""
    b = sub.add_parser("bench", help="measure speed")
    b.add_argument("target", choices=("classify", "ingest", "simulate"))
    b.add_argument("--lines", type=int, default=None, help="input lines (classify: 100000, ingest: 20000)")
    b.add_argument("--nodes", type=int, default=64, help="ingest: nodes the storm spreads over")
    b.add_argument("--workers", type=int, default=8, help="ingest: concurrent deliveries")
    b.add_argument("--instances", default="1,2", help="ingest: function instances to simulate, one run each")
    b.add_argument(
        "--report-memory", action="store_true", help="ingest: also trace Python allocations (slower)"
    )
    b.set_defaults(func=cmd_bench)


def _add_incidents(sub: Subparsers) -> None:
    """incidents: read the incident store, release one held past its budget, or close one."""
    i = sub.add_parser("incidents", help="list incidents (Firestore), release a held one, or close one")
    i.add_argument("--open", action="store_true", help="only open, held and failed incidents")
    i.add_argument("--json", action="store_true")
    i.add_argument("--timeline", action="store_true", help="print each incident's timeline")
    i.add_argument("--release", metavar="ID", help="release a HELD incident past its budget")
    i.add_argument("--close", metavar="ID", help="end an OPEN, HELD or FAILED incident (RESOLVED by you)")
    i.add_argument("--unfence", action="store_true", help="with --close: lift Pitstop's drain on the node")
    i.add_argument("--by", default=None, help="who releases (default operator) or closes (required)")
    i.add_argument("--project", default=None)
    i.set_defaults(func=cmd_incidents)


def _add_replay(sub: Subparsers) -> None:
    """replay: what the policy would have done with past entries (observe mode, no side effects)."""
    r = sub.add_parser("replay", help="what the policy would have done with past log entries (observe mode)")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("path", nargs="?", help="JSON Lines export of LogEntries")
    src.add_argument("--since", help="read Cloud Logging with the pipeline's filters, e.g. 6h")
    r.add_argument("--policy", help="policy.yaml to evaluate (default: $PITSTOP_POLICY or shipped defaults)")
    r.add_argument("--project", default=None)
    r.add_argument("--logging-endpoint", default=None, help=argparse.SUPPRESS)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_replay)


def _add_local(sub: Subparsers) -> None:
    """local: the whole pipeline on this machine."""
    lo = sub.add_parser(
        "local", help="the whole pipeline on this machine (emulators, fakes, real Slurm or a fake GKE)"
    )
    lo.add_argument("action", choices=("up", "down", "status", "inject", "chaos"))
    lo.add_argument(
        "path", nargs="?", default="-", help="inject: JSON Lines of LogEntries, or -; chaos: the KIND"
    )
    lo.add_argument(
        "arg",
        nargs="?",
        default=None,
        help="chaos compute-error: the HTTP status (503, 403:rateLimitExceeded); "
        "firestore-restart: seconds down",
    )
    lo.add_argument("--workdir", default=None, help="state and logs (default .local/ in the repo)")
    lo.add_argument("--nodes", type=int, default=None, help="up: simulated nodes (default 8)")
    lo.add_argument("--spot", default="", help="up: comma-separated node names that are Spot VMs")
    lo.add_argument(
        "--scheduler",
        choices=("slurm", "gke"),
        default="slurm",
        help="up: the cluster's scheduler (gke: a fake Kubernetes API server; writes <workdir>/kubeconfig)",
    )
    lo.add_argument(
        "--job-nodes",
        type=int,
        default=0,
        help="up: a running job on this many nodes (gke: a JobSet with the host-maintenance failure policy)",
    )
    lo.add_argument(
        "--config", default=None, help="up: YAML with nodes, prefix, spot, machine_type, mig, job_nodes"
    )
    lo.add_argument("--at-rate", type=float, default=0.0, help="inject: entries per second (storms)")
    lo.add_argument("--json", action="store_true", help="status: machine-readable")
    lo.add_argument(
        "--sweep-interval", type=float, default=60.0, help="up: seconds between sweeps (Cloud Scheduler: 60)"
    )
    lo.add_argument("--times", type=int, default=1, help="chaos: how many calls the fault hits")
    lo.add_argument("--node", default=None, help="chaos: only calls about this node")
    lo.add_argument(
        "--method",
        default=None,
        help="chaos compute-error/actuate-crash-after-effect: only this Compute call "
        "(reset, set_labels, report_host_as_faulty, perform_maintenance, recreate)",
    )
    lo.set_defaults(func=cmd_local)


def _add_deploy(sub: Subparsers) -> None:
    """deploy and teardown share their options; each has one flag of its own."""
    for name, text in (
        ("deploy", "deploy the pipeline into a project with gcloud (idempotent)"),
        ("teardown", "remove what deploy created"),
    ):
        dp = sub.add_parser(name, help=text)
        dp.add_argument("--project", required=True)
        dp.add_argument("--region", default=None)
        dp.add_argument("--config", default=None, help="deploy.yaml (see infra/deploy.defaults.yaml)")
        if name == "deploy":
            dp.add_argument("--dry-run", action="store_true", help="print the gcloud commands, one per line")
        else:
            dp.add_argument("--purge", action="store_true", help="also say how to delete incident data")
        dp.set_defaults(func=cmd_deploy)


def _add_demo(sub: Subparsers) -> None:
    """demo: the local stack plus the fault scenarios."""
    d = sub.add_parser("demo", help="start the local stack, run the fault scenarios, stop it")
    d.add_argument(
        "--only",
        nargs="*",
        help="xid79 xid13 preemption maintenance duplicates lemon blast_radius poison xid79_spare "
        "lemon_spare degraded replace_not_confirmed no_spare; GKE: gke_xid79 gke_two_members "
        "gke_preemption gke_maintenance gke_pdb gke_regional gke_serial",
    )
    d.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    d.add_argument("--workdir", default=None)
    d.set_defaults(func=cmd_demo)


def _add_doctor(sub: Subparsers) -> None:
    """doctor: what in a cluster would keep Pitstop from restarting a gang once."""
    d = sub.add_parser("doctor", help="check a GKE cluster's JobSets can restart as a gang after a fault")
    d.add_argument("--kubeconfig", default=None, help="kubeconfig of the cluster (default: kubectl's)")
    d.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per JobSet that cannot restart on a disruption; exit 1 when there is any."""
    from kubernetes import config

    from pitstop.adapters.gke import doctor_findings

    api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)  # type: ignore[no-untyped-call]
    findings = doctor_findings(api)
    for line in findings:
        print(line)
    if not findings:
        print(
            "every JobSet restarts as a gang on a disruption (failure policy, no Ignore on DisruptionTarget)"
        )
    return 1 if findings else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except BrokenPipeError:
        return 0
    except (FileNotFoundError, IsADirectoryError, PermissionError, DataFileError) as exc:
        print(f"pitstop: {exc}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
