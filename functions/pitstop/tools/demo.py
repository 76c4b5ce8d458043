"""`make demo` / `pitstop demo`: real fault scenarios through the real local pipeline.

Every scenario injects LogEntries through the sink router (or acts on the fake platform),
waits for the pipeline to finish, checks what happened in Firestore, Slurm, the fake
Compute and the webhook sink, and prints the incident's timeline. The last line is one
JSON object: ``{"scenarios": [...], "latency_ms": {...}}``.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pitstop.core import engine
from pitstop.core.timeline import durations
from pitstop.local.stack import PROJECT, ZONE, Router, Stack, StackState, admin, emulator_env, webhook_records

XID79 = "NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
XID48 = (
    "NVRM: Xid (PCI:0000:1b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error "
    "(DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0."
)
XID94 = (
    "NVRM: Xid (PCI:0000:1b:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No"
)
XID13 = (
    "NVRM: Xid (PCI:0000:b5:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
    "(GPC 1, TPC 3, SM 0): Out Of Range Address"
)


@dataclass
class Result:
    name: str
    passed: bool
    detail: str
    timeline: dict[str, float | None] = field(default_factory=dict)
    incident: str | None = None


class Scenarios:
    """The checks behind every scenario, against a running stack."""

    def __init__(self, stack: Stack) -> None:
        assert stack.state is not None and stack.slurm is not None
        self.stack, self.state, self.slurm = stack, stack.state, stack.slurm
        self.router = Router(self.state)
        from google.cloud import firestore

        with emulator_env(self.state.endpoints):
            self.db = firestore.Client(project=PROJECT)
        self.nodes: list[str] = self.state.cluster["node_names"]
        self.latencies: list[float] = []
        self._ids: dict[str, str] = {}
        self._ids_at = -1e9

    # -- helpers -------------------------------------------------------------------

    def entry(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int((now % 1) * 1e6):06d}Z"
        # What Pitstop's Ops Agent config (infra/ops-agent/) ships: the kernel's own journal record,
        # whose _TRANSPORT journald sets (verified evidence; text syslog would only be recorded).
        return {
            "insertId": insert_id or uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/pitstop-kernel",
            "timestamp": stamp,
            "jsonPayload": {
                "MESSAGE": line,
                "_TRANSPORT": "kernel",
                "SYSLOG_FACILITY": "0",
                "_HOSTNAME": node,
            },
            "resource": {
                "type": "gce_instance",
                "labels": {"instance_id": self.vm_id(node), "project_id": PROJECT, "zone": ZONE},
            },
            "labels": {"compute.googleapis.com/resource_name": node},
        }

    def vm_id(self, node: str) -> str:
        """The live VM's numeric id, as the logging agent on it would report it (a recreate changes it)."""
        now = time.monotonic()
        if now - self._ids_at > 1.0:
            self._ids = {i["name"]: str(i["id"]) for i in admin(self.state, "/_admin/state")["instances"]}
            self._ids_at = now
        return self._ids[node]

    def incidents(self, node: str) -> list[dict[str, Any]]:
        docs = [d.to_dict() for d in self.db.collection("pitstop_incidents").stream()]
        return sorted((d for d in docs if d and d["node"]["instance"] == node), key=lambda d: d["created_at"])

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = cond()
            if v:
                return v
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for {what}")

    def finished(self, node: str, timeout: float = 90.0) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            incs = self.incidents(node)
            return incs[-1] if incs and incs[-1]["state"] in ("RESOLVED", "FAILED") else None

        inc: dict[str, Any] = self.wait(done, timeout, f"the incident on {node} to finish")
        tl = inc["timeline"]
        if tl.get("fenced"):
            self.latencies.append(tl["fenced"] - tl["detected"])
        return inc

    def calls(self, method: str, node: str) -> list[dict[str, Any]]:
        return [
            c
            for c in admin(self.state, "/_admin/state")["calls"]
            if c["method"] == method and f"/instances/{node}/" in c["path"]
        ]

    def notes_for(self, iid: str) -> list[dict[str, Any]]:
        return [w for w in webhook_records(self.state) if iid in w["body"]["text"]]

    def job(self, nodes: list[str], script: str | None = None) -> str:
        argv = [
            "sbatch",
            "--parsable",
            "--requeue",
            "-J",
            "train",
            "-o",
            "/dev/null",
            "-w",
            ",".join(nodes),
            "-N",
            str(len(nodes)),
            "--wrap",
            script or "sleep 3600",
        ]
        job = subprocess.run(
            argv, env=self.slurm.env, capture_output=True, text=True, check=True, cwd=self.slurm.workdir
        ).stdout.strip()
        self.wait(
            lambda: any(j["id"] == job and j["state"] == "RUNNING" for j in self.slurm.jobs()),
            30,
            f"job {job} to run",
        )
        return job

    def restarts(self, job: str) -> int:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job],
            env=self.slurm.env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for tok in out.split():
            if tok.startswith("Restarts="):
                return int(tok.split("=", 1)[1])
        return -1

    def settle(self) -> None:
        """Let the blast-radius window slide so scenarios do not spend each other's budget."""
        window = float(json.loads(Path(self.state.workdir, "policy.yaml").read_text())["budgets"]["window_s"])

        def clear() -> bool:
            now = time.time()
            return all(
                not any(
                    s.get("active") or now - s["at"] < window
                    for s in (d.to_dict() or {}).get("slots", {}).values()
                )
                for d in self.db.collection("pitstop_budgets").stream()
            )

        self.wait(clear, window + 120, "the blast-radius window to clear")

    # -- scenarios -------------------------------------------------------------------

    def xid79_gang(self) -> Result:
        a, b = self.nodes[0], self.nodes[1]
        job = self.job([a, b])
        self.router.publish(self.entry(a, XID79))
        inc = self.finished(a)
        resets = self.calls("reset", a)
        rs = self.restarts(job)
        drained = "drain" in self.slurm.node_states().get(a, "")
        notes = self.wait(lambda: self.notes_for(inc["id"]), 30, "the notification")
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "REBOOT_NODE"
            and len(resets) == 1
            and rs == 1
            and not drained
            and len(notes) == 1
        )
        return Result(
            "xid79_on_running_gang",
            ok,
            f"{a} drained, reset {len(resets)}x, job {job} requeued "
            f"{rs}x as a whole, node back in service={not drained}, {len(notes)} notification",
            durations(inc),
            inc["id"],
        )

    def xid13_storm(self) -> Result:
        node = self.nodes[2]
        for e in [self.entry(node, XID13) for _ in range(300)]:
            self.router.publish(e)
        inc = self.finished(node)
        time.sleep(3)  # let stragglers of the storm arrive
        incs = self.incidents(node)
        notes = self.wait(lambda: self.notes_for(inc["id"]), 30, "the notification")
        ok = (
            len(incs) == 1
            and inc["action"] == "RESTART_JOB"
            and not inc["timeline"].get("fenced")
            and not self.calls("reset", node)
            and len(notes) == 1
            and "drain" not in self.slurm.node_states().get(node, "")
        )
        return Result(
            "xid13_storm_is_an_application_fault",
            ok,
            f"{inc['counts']['events']} lines -> {len(incs)} incident, action {inc['action']}, no drain, "
            f"no node action, {len(notes)} notification to the job owner",
            durations(inc),
            inc["id"],
        )

    def preemption(self) -> Result:
        a, b = self.nodes[3], self.nodes[4]
        job = self.job([a, b])
        before = next(i for i in admin(self.state, "/_admin/state")["instances"] if i["name"] == a)["id"]
        entry = admin(self.state, "/_admin/preempt", {"project": PROJECT, "zone": ZONE, "instance": a})
        self.router.publish(entry)
        inc = self.finished(a)
        after = next(i for i in admin(self.state, "/_admin/state")["instances"] if i["name"] == a)
        rs = self.restarts(job)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "RESCHEDULE_JOB"
            and after["id"] != before
            and after["status"] == "RUNNING"
            and rs >= 1
            and "drain" not in self.slurm.node_states().get(a, "")
        )
        return Result(
            "spot_preemption",
            ok,
            f"{a} preempted; the MIG recreated it (new id), job {job} requeued {rs}x, node back in Slurm",
            durations(inc),
            inc["id"],
        )

    def maintenance(self) -> Result:
        node = self.nodes[5]
        marker = self.slurm.workdir / f"checkpoint-{uuid.uuid4().hex[:6]}"
        job = self.job([node], f"trap 'touch {marker}; exit 0' USR1; sleep 3600 & wait")
        entry = admin(
            self.state,
            "/_admin/maintenance",
            {"project": PROJECT, "zone": ZONE, "instance": node, "starts_in_s": 400},
        )
        self.router.publish(entry)
        inc = self.finished(node, timeout=120)
        window = entry["protoPayload"]["metadata"]["windowStartTime"]
        from pitstop.services.ingest import to_epoch

        before_window = (inc["timeline"].get("fenced") or 1e18) < (to_epoch(window) or 0)
        maint = self.calls("perform_maintenance", node)
        rs = self.restarts(job)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "DRAIN_NODE"
            and marker.exists()
            and before_window
            and len(maint) == 1
            and rs >= 1
            and "drain" not in self.slurm.node_states().get(node, "")
        )
        return Result(
            "upcoming_maintenance",
            ok,
            f"job {job} checkpointed on SIGUSR1={marker.exists()}, {node} "
            f"drained before the window={before_window}, performMaintenance x{len(maint)}, job requeued "
            f"{rs}x, node resumed",
            durations(inc),
            inc["id"],
        )

    def duplicate_storm(self) -> Result:
        node = self.nodes[6]
        dup = self.entry(node, XID48, insert_id="dup-48-" + uuid.uuid4().hex[:6])
        burst = [self.entry(node, XID94) for _ in range(500)]  # logged within moments; delivered after
        for _ in range(20):
            self.router.publish(dup)
        for e in burst:
            self.router.publish(e)
        inc = self.finished(node)
        time.sleep(3)
        incs = self.incidents(node)
        resets = self.calls("reset", node)
        ok = (
            len(incs) == 1
            and len(resets) == 1
            and inc["action"] == "RESET_GPU"
            and inc["state"] == "RESOLVED"
        )
        return Result(
            "duplicate_storm",
            ok,
            f"20x the same Xid 48 + 500 Xid 94 -> {len(incs)} incident, "
            f"{len(resets)} reset ({inc['counts'].get('xid_48', 0)} distinct 48s counted)",
            durations(inc),
            inc["id"],
        )

    def lemon(self) -> Result:
        node = self.nodes[7]
        key = engine.node_key({"project": PROJECT, "zone": ZONE, "instance": node})
        now = time.time()
        self.db.collection("pitstop_nodes").document(key).set(
            {
                **engine.new_node({"project": PROJECT, "zone": ZONE, "instance": node, "instance_id": None}),
                "remediations": [
                    {"at": now - d * 86400, "action": "RESET_GPU", "incident": f"past{d}"} for d in (1, 3, 6)
                ],
            }
        )
        self.router.publish(self.entry(node, XID48))
        inc = self.finished(node, timeout=120)
        reports = self.calls("report_host_as_faulty", node)
        resets = self.calls("reset", node)
        ok = (
            inc["action"] == "REPLACE_NODE"
            and inc["state"] == "RESOLVED"
            and len(reports) == 1
            and not resets
        )
        why = reports[0]["body"]["faultReasons"][0] if reports else {}
        return Result(
            "lemon_host_replaced",
            ok,
            f"3 remediations in 7 days + Xid 48 -> {inc['action']}: "
            f"reportHostAsFaulty x{len(reports)} ({why.get('behavior')}: {why.get('description')})",
            durations(inc),
            inc["id"],
        )

    def blast_radius(self) -> Result:
        pol = json.loads(Path(self.state.workdir, "policy.yaml").read_text())
        b = pol["budgets"]["cluster"]
        cap = min(b["max_nodes"], max(1, math.ceil(len(self.nodes) * b["max_percent"] / 100)))
        targets = self.nodes[: cap + 1]  # one more than the budget allows, whatever the cluster size
        before = len(webhook_records(self.state))

        def xid79s(n: str) -> tuple[str | None, int]:
            last = self.incidents(n)[-1:]
            return (last[0]["id"], last[0]["counts"].get("xid_79", 0)) if last else (None, 0)

        seen_before = {n: xid79s(n) for n in targets}
        for n in targets:
            self.router.publish(self.entry(n, XID79))

        def settled() -> list[dict[str, Any]] | None:
            out = []
            for n in targets:  # each node's episode has taken this Xid 79 (a new incident or a raised one)
                last = self.incidents(n)[-1:]
                if (
                    not last
                    or xid79s(n) == seen_before[n]
                    or last[0]["state"] not in ("RESOLVED", "HELD", "FAILED")
                ):
                    return None
                out.append(last[0])
            return out

        try:
            incs: list[dict[str, Any]] = self.wait(settled, 120, f"all {len(targets)} incidents to settle")
        except TimeoutError:
            seen = [
                (i["node"]["instance"], i["state"], i["action"], i.get("held"), i.get("failure"))
                for n in targets
                for i in self.incidents(n)[-1:]
            ]
            raise TimeoutError(f"incidents did not settle: {seen}") from None
        held = [i for i in incs if i["state"] == "HELD"]
        done = [i for i in incs if i["state"] == "RESOLVED"]
        time.sleep(2)
        pages = [
            w for w in webhook_records(self.state)[before:] if "blast-radius budget" in w["body"]["text"]
        ]
        ok = len(done) == cap and len(held) == len(targets) - cap and len(pages) == 1
        return Result(
            "blast_radius",
            ok,
            f"Xid 79 on {len(targets)} of {len(self.nodes)} nodes: {len(done)} "
            f"remediated ({b['max_percent']} % budget), {len(held)} held, {len(pages)} page",
            durations(done[0]) if done else {},
            done[0]["id"] if done else None,
        )

    def poison(self) -> Result:
        from google.cloud import pubsub_v1

        self.router.publish_raw(b"\x00this is not a log entry")
        node = self.nodes[6]
        self.router.publish(self.entry(node, XID13))
        with emulator_env(self.state.endpoints):
            sub = pubsub_v1.SubscriberClient()
        path = sub.subscription_path(PROJECT, "events-dead-inspect")

        def dead() -> list[Any]:
            resp = sub.pull(subscription=path, max_messages=10, timeout=5)
            return list(resp.received_messages)

        msgs = self.wait(dead, 90, "the poison message in the dead-letter topic")
        attempts = msgs[0].message.attributes.get("CloudPubSubDeadLetterSourceDeliveryCount")
        flowed = self.wait(
            lambda: [i for i in self.incidents(node) if i["action"] == "RESTART_JOB"],
            30,
            "the good event to flow",
        )
        ok = msgs[0].message.data.startswith(b"\x00this is not") and bool(flowed)
        return Result(
            "poison_message",
            ok,
            f"malformed message dead-lettered after {attempts} attempts; the "
            f"event published with it made incident {flowed[-1]['id']}",
            durations(flowed[-1]),
            flowed[-1]["id"],
        )

    def run_all(self, only: list[str] | None = None) -> list[Result]:
        plan: list[tuple[str, Callable[[], Result], bool]] = [
            ("xid79", self.xid79_gang, True),
            ("xid13", self.xid13_storm, False),
            ("preemption", self.preemption, True),
            ("maintenance", self.maintenance, True),
            ("duplicates", self.duplicate_storm, True),
            ("lemon", self.lemon, True),
            ("blast_radius", self.blast_radius, False),
            ("poison", self.poison, False),
        ]
        results = []
        for key, fn, needs_budget in plan:
            if only and key not in only:
                continue
            try:
                if needs_budget or key == "blast_radius":
                    self.settle()
                results.append(fn())
            except Exception as exc:  # a scenario that breaks is a failed scenario, reported with its reason
                results.append(Result(key, False, f"{type(exc).__name__}: {exc}"))
            print_result(results[-1])
        return results

    def latency_ms(self) -> dict[str, Any]:
        xs = sorted(x * 1000 for x in self.latencies)
        if not xs:
            return {"n": 0}
        p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
        return {
            "detect_to_first_action_p50": round(statistics.median(xs)),
            "detect_to_first_action_p99": round(p99),
            "n": len(xs),
            "note": "log timestamp to node fenced; excludes deliberate waits",
        }


def print_result(r: Result) -> None:
    mark = "PASS" if r.passed else "FAIL"
    print(f"\n[{mark}] {r.name}: {r.detail}")
    if r.timeline:
        order = ("classified", "fenced", "acted", "healthy", "job_resumed", "notified", "resolved")
        steps = [f"{k} +{r.timeline[k]:.1f}s" for k in order if r.timeline.get(k) is not None]
        print(f"       incident {r.incident}: detected -> " + " -> ".join(steps))


def run(workdir: Path, only: list[str] | None = None, keep: bool = False) -> int:
    stack = Stack(workdir)
    t0 = time.time()
    print(f"starting the local stack in {workdir} ...", flush=True)
    try:
        state: StackState = stack.up()
        print(
            f"stack up in {time.time() - t0:.1f}s: "
            + ", ".join(f"{k}={v}" for k, v in state.endpoints.items())
        )
        sc = Scenarios(stack)
        results = sc.run_all(only)
        summary = {
            "scenarios": [
                {"name": r.name, "passed": r.passed, "detail": r.detail, "timeline": r.timeline}
                for r in results
            ],
            "latency_ms": sc.latency_ms(),
            "wall_s": round(time.time() - t0, 1),
        }
        print(json.dumps(summary))
        return 0 if results and all(r.passed for r in results) else 1
    except Exception:
        for name in ("ingest", "actuate", "notify", "executions", "slurm-agent", "fake-compute"):
            log = workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log (tail) ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
        raise
    finally:
        if not keep:
            stack.down()
