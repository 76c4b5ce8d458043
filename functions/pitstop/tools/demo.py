"""`make demo` / `pitstop demo`: real fault scenarios through the real local pipeline.

Every scenario injects LogEntries through the sink router (or acts on the fake platform),
waits for the pipeline to finish, checks what happened in Firestore, Slurm, the fake
Compute and the webhook sink, and prints the incident's timeline. The last line is one
JSON object: ``{"scenarios": [...], "latency_ms": {...}}``.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pitstop.core import engine
from pitstop.core.timeline import durations
from pitstop.local import chaos
from pitstop.local.fake_compute import DURATIONS
from pitstop.local.gke_stack import (
    ATTEMPT_LABEL,
    FENCE_KEY,
    GPU,
    JOBSET_LABEL,
    NAMESPACE,
    POOL_LABEL,
    Kube,
    Watch,
    jobset,
    jobset_summary,
    node_summary,
    running,
)
from pitstop.local.serve import (
    PAGERDUTY_PATH,
)
from pitstop.local.stack import (
    HEARTBEAT_EVERY_S,
    PROJECT,
    ZONE,
    ClusterSpec,
    Router,
    Stack,
    StackState,
    admin,
    emulator_env,
    webhook_records,
)
from pitstop.tools import demo_gke_planned, demo_hang, demo_planned
from pitstop.tools.demo_stage import Result

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


def _stamp() -> str:
    """Now, as Cloud Logging writes a LogEntry's timestamp (RFC 3339, microseconds, UTC)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int((now % 1) * 1e6):06d}Z"


class Pipeline:
    """What every scenario needs of a running stack: entries in, incidents, calls and notes out."""

    def __init__(self, stack: Stack) -> None:
        assert stack.state is not None
        self.stack, self.state = stack, stack.state
        self.router = Router(self.state)
        from google.cloud import firestore

        with emulator_env(self.state.endpoints):
            self.db = firestore.Client(project=PROJECT)
        self.nodes: list[str] = self.state.cluster["node_names"]
        self.latencies: list[float] = []
        self.results: list[Result] = []
        self._ids: dict[str, str] = {}
        self._ids_at = -1e9

    # -- helpers -------------------------------------------------------------------

    def entry(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        stamp = _stamp()
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

    def kernel_prints(self, node: str, line: str, facility: int = 0) -> None:
        """The node's kernel prints ``line``: its ring buffer holds it until the VM next boots (what
        corroboration reads through the scheduler); facility 1 is a line user space wrote to /dev/kmsg."""
        admin(
            self.state,
            "/_admin/kmsg",
            {"project": PROJECT, "zone": ZONE, "instance": node, "msg": line, "facility": facility},
        )

    def fault(self, node: str, line: str, insert_id: str | None = None) -> dict[str, Any]:
        """A real driver fault on ``node``: the kernel prints it, the logging agent ships it."""
        self.kernel_prints(node, line)
        entry = self.entry(node, line, insert_id)
        self.router.publish(entry)
        return entry

    def vm_id(self, node: str) -> str:
        """The live VM's numeric id, as the logging agent on it would report it (a recreate changes it)."""
        now = time.monotonic()
        if now - self._ids_at > 1.0:
            self._ids = {i["name"]: str(i["id"]) for i in admin(self.state, "/_admin/state")["instances"]}
            self._ids_at = now
        return self._ids[node]

    def incidents(self, node: str) -> list[dict[str, Any]]:
        from pitstop.adapters.firestore import IncidentStore

        # oldest first, with storm counts' shards summed; the demo reads them as JSON
        docs = [cast(dict[str, Any], d) for d in IncidentStore(self.db).list()]
        return [d for d in docs if (d.get("node") or {}).get("instance") == node]  # a hang's: no node

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = cond()
            if v:
                return v
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for {what}{self.state_on_timeout()}")

    def state_on_timeout(self) -> str:
        """What a timed-out wait adds to its error, so a failed run says what it saw."""
        return ""

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

    def gpu_state(self, node: str, state: dict[str, Any] | None) -> None:
        """What the GPU tools will report on the node's current host (the fake Compute's admin API)."""
        admin(
            self.state,
            "/_admin/gpu_state",
            {"project": PROJECT, "zone": ZONE, "instance": node, "state": state},
        )

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

    def latency_ms(self) -> dict[str, Any]:
        return latency_summary(self.latencies)

    def real_s(self, inc: Mapping[str, Any], start: str, end: str) -> float | None:
        """Seconds between two milestones as they would pass in production.

        Only the fake Compute's operations run shortened (``compute_scale``); detection, fencing,
        Slurm and the checks run at real speed. So the operations on the node that started in the
        interval count at their real length; everything else as measured.
        """
        tl, node = inc.get("timeline") or {}, inc["node"]["instance"]
        a, b = tl.get(start), tl.get(end)
        if a is None or b is None:
            return None
        scale = self.stack.compute_scale
        effects = admin(self.state, "/_admin/state")["effects"]
        shortened = sum(
            _OPERATION_S.get(e["method"], 0.0)
            for e in effects
            if node in e.get("instances", []) and a - 2.0 <= float(e["at"]) <= b
        )
        return round(float(b) - float(a) + shortened * (1.0 - scale), 1)

    def with_times(self, r: Result) -> Result:
        """A scenario's result with resume_s and repair_s from its incident (as it is now)."""
        if r.incident is None or (r.resume_s is not None and r.repair_s is not None):
            return r
        inc = self.db.collection("pitstop_incidents").document(r.incident).get().to_dict()
        return self.timed(r, inc) if inc and inc.get("node") else r  # a hung job's: its scenario times it

    def timed(self, r: Result, inc: Mapping[str, Any]) -> Result:
        """The scenario's result with its resume_s and repair_s.

        A gang that ran again before its node was healthy did not wait for any Compute operation:
        its resume_s is as measured. One that waited for the node (no spare) waited for them too.
        """
        tl = inc["timeline"]
        healed = tl.get("validated") or tl.get("healthy")
        waited = tl.get("job_running") is not None and healed is not None and tl["job_running"] >= healed
        if waited:
            r.resume_s = self.real_s(inc, "detected", "job_running")
        elif tl.get("job_running") is not None:
            r.resume_s = round(float(tl["job_running"]) - float(tl["detected"]), 1)
        r.repair_s = self.real_s(inc, "acted", "validated" if tl.get("validated") else "healthy")
        return r

    def run_all(self, only: list[str] | None = None) -> list[Result]:
        raise NotImplementedError


# What each Compute method's operation lasts for real (the fake shortens it by its time scale).
_OPERATION_S = {
    "reset": DURATIONS["reset"],
    "report_host_as_faulty": DURATIONS["report"] + DURATIONS["report_restart"],
    "perform_maintenance": DURATIONS["maintenance"],
    "recreate": DURATIONS["recreate"],
}


def latency_summary(latencies: list[float]) -> dict[str, Any]:
    xs = sorted(x * 1000 for x in latencies)
    if not xs:
        return {"n": 0}
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return {
        "detect_to_first_action_p50": round(statistics.median(xs)),
        "detect_to_first_action_p99": round(p99),
        "n": len(xs),
        "note": "log timestamp to node fenced; excludes deliberate waits",
    }


class Scenarios(Pipeline):
    """The checks behind every Slurm scenario, against a running stack."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        assert stack.slurm is not None
        self.slurm = stack.slurm

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

    def job_among(
        self, size: int, candidates: list[str], script: str = "sleep 3600"
    ) -> tuple[str, list[str]]:
        """A gang of ``size`` nodes Slurm may place on any of ``candidates`` (the rest excluded).

        Not pinned (``-w``): after a requeue Slurm may run it on a spare, as a training job would.
        Returns the job and the nodes it got.
        """
        others = [n for n in self.nodes if n not in candidates]
        argv = ["sbatch", "--parsable", "--requeue", "-J", "train", "-o", "/dev/null", "-N", str(size)]
        argv += ["-x", ",".join(others)] if others else []
        job = subprocess.run(
            [*argv, "--wrap", script],
            env=self.slurm.env,
            capture_output=True,
            text=True,
            check=True,
            cwd=self.slurm.workdir,
        ).stdout.strip()
        return job, self.wait(lambda: self.job_nodes(job), 30, f"job {job} to run")

    def job_nodes(self, job: str) -> list[str]:
        """The nodes a running job holds (empty while it is not running)."""
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%N"],
            env=self.slurm.env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if not out:
            return []
        names = subprocess.run(
            ["scontrol", "show", "hostnames", out],
            env=self.slurm.env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        return names

    def cancel(self, job: str) -> None:
        subprocess.run(["scancel", job], env=self.slurm.env, capture_output=True, check=False)

    def lemon_history(self, node: str) -> None:
        """Three remediations in the last week: the next fault makes the node a lemon (REPLACE_NODE)."""
        key = engine.node_key({"project": PROJECT, "zone": ZONE, "instance": node, "instance_id": None})
        now = time.time()
        self.db.collection("pitstop_nodes").document(key).set(
            {
                **engine.new_node({"project": PROJECT, "zone": ZONE, "instance": node, "instance_id": None}),
                "remediations": [
                    {"at": now - d * 86400, "action": "RESET_GPU", "incident": f"past{d}"} for d in (1, 3, 6)
                ],
            }
        )

    @property
    def fresh(self) -> list[str]:
        """Nodes the back-to-training scenarios use: the last ten, after every other scenario's."""
        return self.nodes[-10:]

    # -- scenarios -------------------------------------------------------------------

    def xid79_gang(self) -> Result:
        a, b = self.nodes[0], self.nodes[1]
        job = self.job([a, b])
        self.fault(a, XID79)
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
        from pitstop.core.timefmt import to_epoch

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
        self.kernel_prints(node, XID48)
        self.kernel_prints(node, XID94)
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
        self.lemon_history(node)
        self.gpu_state(node, {"nvlink_down": [2]})  # what the diagnostic on the fenced node finds
        self.fault(node, XID48)
        inc = self.finished(node, timeout=120)
        reports = self.calls("report_host_as_faulty", node)
        resets = self.calls("reset", node)
        ok = (
            inc["action"] == "REPLACE_NODE"
            and inc["state"] == "RESOLVED"
            and len(reports) == 1
            and not resets
            and (inc.get("diagnosis") or {}).get("confirmed") is True
        )
        why = reports[0]["body"]["faultReasons"][0] if reports else {}
        return self.timed(
            Result(
                "lemon_host_replaced",
                ok,
                f"3 remediations in 7 days + Xid 48 -> {inc['action']}, confirmed by the diagnostic: "
                f"reportHostAsFaulty x{len(reports)} ({why.get('behavior')}: {why.get('description')})",
                durations(inc),
                inc["id"],
            ),
            inc,
        )

    def blast_radius(self) -> Result:
        pol = json.loads(Path(self.state.workdir, "policy.yaml").read_text())
        b = pol["budgets"]["cluster"]
        cap = min(b["max_nodes"], max(1, math.ceil(len(self.nodes) * b["max_percent"] / 100)))
        targets = self.nodes[: cap + 1]  # one more than the budget allows, whatever the cluster size
        before, t0 = len(webhook_records(self.state)), time.monotonic()
        pd_before = len(webhook_records(self.state, PAGERDUTY_PATH))

        def xid79s(n: str) -> tuple[str | None, int]:
            last = self.incidents(n)[-1:]
            return (last[0]["id"], last[0]["counts"].get("xid_79", 0)) if last else (None, 0)

        seen_before = {n: xid79s(n) for n in targets}
        for n in targets:
            self.fault(n, XID79)

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
        # Held by the budget, now or earlier: the window slides (8 s locally) and the sweep then
        # releases a held incident, which may end before all five are seen settled.
        held = [i for i in incs if i["state"] == "HELD" or i.get("holds")]
        done = [i for i in incs if i["state"] == "RESOLVED" and not i.get("holds")]

        def paged() -> tuple[list[Any], list[Any]]:
            pages = [
                w for w in webhook_records(self.state)[before:] if "blast-radius budget" in w["body"]["text"]
            ]
            # the same page on the second channel: a PagerDuty alert triggered (one per page)
            alerts = [
                w["body"]
                for w in webhook_records(self.state, PAGERDUTY_PATH)[pd_before:]
                if w["body"]["event_action"] == "trigger"
                and "blast-radius budget" in w["body"]["payload"]["summary"]
            ]
            return pages, alerts

        def on_both() -> bool:
            pages, alerts = paged()
            return bool(pages) and len(pages) == len(alerts)

        # the two sinks deliver independently: wait until both carried the page (or time out)
        with contextlib.suppress(TimeoutError):
            self.wait(on_both, 30, "the page on both sinks")
        pages, alerts = paged()
        # One page per budget window while incidents are held (engine.try_claim's paged_until): a
        # slow machine whose remediations outlast the 8 s window sees a reminder, never one per try.
        windows = 1 + int((time.monotonic() - t0) / float(pol["budgets"]["window_s"]))
        ok = (
            len(done) == cap and len(held) == len(targets) - cap and 1 <= len(pages) == len(alerts) <= windows
        )
        return Result(
            "blast_radius",
            ok,
            f"Xid 79 on {len(targets)} of {len(self.nodes)} nodes: {len(done)} "
            f"remediated ({b['max_percent']} % budget), {len(held)} held, {len(pages)} page "
            f"(and {len(alerts)} PagerDuty alert)",
            durations(done[0]) if done else {},
            done[0]["id"] if done else None,
        )

    def poison(self) -> Result:
        from google.cloud import pubsub_v1

        self.router.publish_raw(b"\x00this is not a log entry")
        node = self.nodes[6]
        self.fault(node, XID13)
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

    # -- back to training at once; diagnose; validate ------------------------------------

    def xid79_spare(self) -> Result:
        """Xid 79 on a gang with a spare: the job runs again long before the node is back."""
        job, held = self.job_among(2, self.fresh[0:3])
        bad = held[0]
        self.fault(bad, XID79)
        inc = self.finished(bad, timeout=150)
        now_on = self.job_nodes(job)
        r = self.timed(Result("xid79_with_spare", False, "", durations(inc), inc["id"]), inc)
        resume = inc.get("resume") or {}
        val = inc.get("validation") or {}
        r.passed = bool(
            inc["state"] == "RESOLVED"
            and resume.get("mode") == "early"
            and self.restarts(job) == 1
            and bad not in now_on
            and len(now_on) == 2
            and val.get("passed")
            and r.resume_s is not None
            and r.repair_s is not None
            and r.resume_s < r.repair_s
        )
        r.detail = (
            f"job {job} on {','.join(held)}; Xid 79 on {bad}: gang requeued after the fence, running on "
            f"{','.join(now_on)} after {r.resume_s} s while {bad} was reset and validated "
            f"(busbw {val.get('busbw_gbps')} GB/s via {val.get('peer')}) in {r.repair_s} s"
        )
        r.facts = {"resume": resume, "validation": val, "restarts": self.restarts(job), "now_on": now_on}
        self.cancel(job)
        return r

    def lemon_spare(self) -> Result:
        """A lemon host with a spare: the job runs again within a minute, the host report takes 10+ min."""
        job, held = self.job_among(2, self.fresh[3:6])
        bad = held[0]
        self.lemon_history(bad)
        self.gpu_state(bad, {"remap": "failure", "remap_gpu": 1})  # what the diagnostic will find
        self.fault(bad, XID48)
        inc = self.finished(bad, timeout=180)
        reports = self.calls("report_host_as_faulty", bad)
        now_on = self.job_nodes(job)
        r = self.timed(Result("lemon_with_spare", False, "", durations(inc), inc["id"]), inc)
        diagnosis = inc.get("diagnosis") or {}
        desc = reports[0]["body"]["faultReasons"][0]["description"] if reports else ""
        r.passed = bool(
            inc["state"] == "RESOLVED"
            and inc["action"] == "REPLACE_NODE"
            and diagnosis.get("confirmed")
            and len(reports) == 1
            and "diagnostic" in desc
            and (inc.get("resume") or {}).get("mode") == "early"
            and bad not in now_on
            and (inc.get("validation") or {}).get("passed")
            and r.resume_s is not None
            and r.resume_s <= 60
            and r.repair_s is not None
            and r.repair_s >= 600
        )
        r.detail = (
            f"lemon {bad} (row remap failure found by the diagnostic): job {job} running again on "
            f"{','.join(now_on)} after {r.resume_s} s; reportHostAsFaulty x{len(reports)} and validation "
            f"took {r.repair_s} s real-time equivalent"
        )
        r.facts = {"diagnosis": diagnosis, "description": desc}
        self.cancel(job)
        return r

    def degraded_after_reset(self) -> Result:
        """A reset node that fails validation (busbw 120 GB/s: an NVLink link is down) against two
        different peers, each under the fabric's NCCL setup, steps up to REPLACE_NODE; the
        diagnostic confirms it (the link down), the new host passes."""
        node = self.fresh[6]
        self.gpu_state(node, {"busbw": 120, "nvlink_down": [3]})
        self.fault(node, XID79)
        inc = self.finished(node, timeout=180)
        resets, reports = self.calls("reset", node), self.calls("report_host_as_faulty", node)
        steps = [(e["from"], e["to"]) for e in inc.get("escalations", [])]
        failed_first = [
            m for m in inc.get("measured", []) if m.get("kind") == "validate" and not m.get("passed")
        ]
        val = inc.get("validation") or {}
        peers = (failed_first[0].get("nccl_peers") or []) if failed_first else []
        r = self.timed(Result("degraded_after_reset", False, "", durations(inc), inc["id"]), inc)
        r.passed = bool(
            inc["state"] == "RESOLVED"
            and ("REBOOT_NODE", "REPLACE_NODE") in steps
            and len(resets) == 1
            and len(reports) == 1
            and failed_first
            and failed_first[0].get("busbw_gbps") == 120.0
            and len({p.get("peer") for p in peers}) == 2
            and all(p.get("verdict") == "degraded" for p in peers)
            and val.get("passed")
            and (inc.get("diagnosis") or {}).get("confirmed") is True
        )
        first = failed_first[0] if failed_first else {}
        r.detail = (
            f"{node} reset, validation busbw {first.get('busbw_gbps')} GB/s < {first.get('threshold_gbps')} "
            f"against {', '.join(str(p.get('peer')) for p in peers)} -> REPLACE_NODE, "
            f"diagnostic: {(inc.get('diagnosis') or {}).get('why')}, "
            f"reportHostAsFaulty x{len(reports)}, new host "
            f"validated at {val.get('busbw_gbps')} GB/s"
        )
        return r

    def replace_not_confirmed(self) -> Result:
        """A REPLACE on log text alone whose diagnostic finds nothing: the node is rebooted instead."""
        node = self.fresh[7]
        self.lemon_history(node)
        self.fault(node, XID48)
        inc = self.finished(node, timeout=150)
        resets, reports = self.calls("reset", node), self.calls("report_host_as_faulty", node)
        diagnosis = inc.get("diagnosis") or {}
        r = self.timed(Result("replace_not_confirmed", False, "", durations(inc), inc["id"]), inc)
        r.passed = bool(
            inc["state"] == "RESOLVED"
            and inc["action"] == "REBOOT_NODE"
            and diagnosis.get("confirmed") is False
            and len(resets) == 1
            and not reports
            and (inc.get("validation") or {}).get("passed")
        )
        r.detail = f"lemon {node}, but {diagnosis.get('why')}: reset x{len(resets)}, no host report"
        return r

    def no_spare(self) -> Result:
        """No spare for the gang: the old order (requeue once the node is back), and the incident says why."""
        pair = self.fresh[8:10]
        job, held = self.job_among(2, pair)
        bad = held[0]
        self.fault(bad, XID79)
        inc = self.finished(bad, timeout=150)
        tl = inc["timeline"]
        resume = inc.get("resume") or {}
        waiting = resume.get("waiting") or []
        r = self.timed(Result("no_spare_old_order", False, "", durations(inc), inc["id"]), inc)
        r.passed = bool(
            inc["state"] == "RESOLVED"
            and resume.get("mode") == "after_repair"
            and waiting
            and "not enough healthy capacity" in waiting[0]["why"]
            # requeued once the node was repaired (to free it for its validation), running once it was back
            and tl.get("job_requeued", 0) >= (tl.get("healthy") or 1e18)
            and tl.get("job_running", 0) >= (tl.get("validated") or 1e18)
            and self.restarts(job) == 1
        )
        r.detail = f"job {job} on {','.join(held)}; {waiting[0]['why'] if waiting else 'no reason recorded'}"
        self.cancel(job)
        return r

    # -- a hung job: localised, then back to training --------------------------------------

    @property
    def hang_pool(self) -> list[str]:
        """The hang scenarios' nodes: a gang of HANG_GANG and one spare, between the first scenarios'
        eight and the back-to-training ten."""
        return self.nodes[8 : 9 + HANG_GANG]

    def training(self) -> tuple[str, list[str]]:
        """A training run (it writes the job heartbeat) on HANG_GANG of the pool, beating."""
        others = [n for n in self.nodes if n not in self.hang_pool]
        job = self.stack.submit_training(HANG_GANG, exclude=others)
        held: list[str] = self.wait(lambda: self.job_nodes(job), 60, f"job {job} to run")
        self.wait(lambda: demo_hang.beats(self.stack, job) > 2, 60, f"job {job} to beat")
        return job, held

    def hang_ended(self, job: str, n: int = 1) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            incs = demo_hang.hang_incidents(self.db, job)
            done = len(incs) >= n and incs[n - 1]["state"] in ("RESOLVED", "FAILED")
            return incs[n - 1] if done else None

        found: dict[str, Any] = self.wait(ended, 240, f"hang incident {n} of job {job} to end")
        return found

    def hang_bad_node(self) -> Result:
        """A hang with one bad link and a spare: the node checks find nothing, the ring's NCCL test
        finds the node with an NVLink down, the culprit gets its own incident (fenced, rebooted; its
        validation measures it still slow, its diagnostic finds the link down, its host is replaced)
        and the gang trains again on the spare at once; resume_s from the last heartbeat to the
        first beat of the new run."""
        job, held = self.training()
        bad = held[1]
        chaos.apply(self.stack, "hang", "link", node=bad)
        stopped = time.time()
        time.sleep(2 * HEARTBEAT_EVERY_S)  # a beat already on its way is not the new run's
        training = demo_hang.beating_again(self.stack, job, self.wait, 300)
        hang = self.hang_ended(job)
        loc = hang.get("localisation") or {}
        culprit = self.finished(bad, timeout=240)
        now_on = self.job_nodes(job)
        times = demo_hang.breakdown(stopped, hang, culprit, training, self.stack.alert_scale)
        r = self.timed(
            Result("hang_bad_node", False, "", durations(culprit), culprit["id"], facts=times), culprit
        )
        checks = {
            "hang resolved": hang["state"] == "RESOLVED",
            "culprit named": loc.get("culprits") == [bad],
            "culprit's incident": (loc.get("incidents") or {}).get(bad) == culprit["id"],
            "culprit remediated": (culprit["kind"], culprit["state"]) == ("localised", "RESOLVED"),
            "sweep then links": times["rounds"] == ["sweep", "links"],
            "restarted once": self.restarts(job) == 1,
            "onto the spare": bad not in now_on and len(now_on) == HANG_GANG,
        }
        r.passed = all(checks.values())
        r.facts["failed"] = [k for k, ok in checks.items() if not ok]
        r.resume_s = times["real_s"]
        r.detail = (
            f"job {job} on {','.join(held)}; {bad}'s NVLink down: {len(held)} nodes swept, "
            f"{len(held)} ring pairs tested, culprit {loc.get('culprits')} -> {culprit['id']} "
            f"({culprit['action']}), training again on {','.join(now_on)} {times['local_s']} s after "
            f"the last beat here, ~{times['real_s']} s with the real alert window: {times['parts']}"
            + (f"; failed: {r.facts['failed']}" if r.facts["failed"] else "")
        )
        self.cancel(job)
        return r

    def hang_software(self) -> Result:
        """A hang with no bad node: every node and ring link checked, nothing found, the gang
        restarted in place once and a person paged with what was checked; hung again within the
        window, it is not localised again (a person decides)."""
        job, held = self.training()
        chaos.apply(self.stack, "hang")
        stopped = time.time()
        time.sleep(2 * HEARTBEAT_EVERY_S)
        training = demo_hang.beating_again(self.stack, job, self.wait, 300)
        first = self.hang_ended(job)
        loc = first.get("localisation") or {}

        def paged() -> list[dict[str, Any]]:
            return [w for w in self.notes_for(first["id"]) if "no culprit fenced" in w["body"]["text"]]

        pages = self.wait(paged, 30, "the page")
        restarts = self.restarts(job)
        chaos.apply(self.stack, "hang")  # the restarted run hangs too: the job's own fault
        second = self.hang_ended(job, 2)
        r = Result("hang_software", False, "", durations(first), first["id"])
        times = demo_hang.breakdown(stopped, first, None, training, self.stack.alert_scale)
        text = pages[0]["body"]["text"] if pages else ""
        checks = {
            "nothing found": loc.get("outcome") == "nothing_found",
            "sweep then links": [x.get("kind") for x in loc.get("rounds", [])] == ["sweep", "links"],
            "restarted in place once": restarts == 1,
            "paged with every node": all(n in text for n in held),
            "hung again: a new incident": second["id"] != first["id"],
            "not localised again": (second.get("localise") or {}).get("run") is False
            and "localisation" not in second,
            "not restarted again": self.restarts(job) == 1,
        }
        r.passed = all(checks.values())
        failed = [k for k, ok in checks.items() if not ok]
        r.detail = (
            f"job {job}: {len(held)} nodes and {len(held)} ring pairs clean; restarted in place "
            f"{restarts}x, paged ({len(pages)}); hung again -> {second['id']}: "
            f"{(second.get('localise') or {}).get('why')}; training again {times['local_s']} s after"
            f" the last beat here, ~{times['real_s']} s with the real alert window: {times['parts']}"
            + (f"; failed: {failed}" if failed else "")
        )
        r.resume_s = times["real_s"]
        r.facts = {
            "first": loc,
            "second": second.get("localise"),
            "page": text,
            "times": times,
            "failed": failed,
        }
        self.cancel(job)
        chaos.apply(self.stack, "clear")
        return r

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
            ("xid79_spare", self.xid79_spare, True),
            ("lemon_spare", self.lemon_spare, True),
            ("degraded", self.degraded_after_reset, True),
            ("replace_not_confirmed", self.replace_not_confirmed, True),
            ("no_spare", self.no_spare, True),
            # issue 24: a degraded node is a planned move (pitstop.tools.demo_planned)
            ("straggler_spare", lambda: demo_planned.straggler_spare(self), True),
            ("ecc_trend", lambda: demo_planned.ecc_trend(self), True),
            ("degraded_no_spare", lambda: demo_planned.degraded_no_spare(self), True),
            ("gang_wide_throttle", lambda: demo_planned.gang_wide_throttle(self), True),
            ("hang_bad_node", self.hang_bad_node, True),
            ("hang_software", self.hang_software, True),
        ]
        results = []
        for key, fn, needs_budget in plan:
            if only and key not in only:
                continue
            try:
                if needs_budget or key == "blast_radius":
                    self.settle()
                results.append(self.with_times(fn()))
            except Exception as exc:  # a scenario that breaks is a failed scenario, reported with its reason
                results.append(Result(key, False, f"{type(exc).__name__}: {exc}"))
            print_result(results[-1])
        return results


REGION = ZONE.rsplit("-", 1)[0]
GKE_NODES = 11  # nine nodes that take a fault each (cooldowns outlast the demo), a gang partner and a spare
GKE_COMPUTE_SCALE = 0.03  # a reset keeps the VM down ~1 s: time for the gang to restart off a preempted node
POD_GRACE_S = 30  # the JobSets' terminationGracePeriodSeconds: what a checkpoint gets after SIGTERM


def slurm_spec(nodes: int) -> ClusterSpec:
    """The demo's Slurm cluster; its fourth node is a Spot VM (the preemption scenario's: Compute
    confirms a preemption only of a Spot VM, core/corroboration.judge_system)."""
    spec = ClusterSpec(nodes=nodes)
    spec.spot = [spec.node_names[3]]
    return spec


def gke_spec(nodes: int = GKE_NODES) -> ClusterSpec:
    """The demo's GKE node pool; its fourth node is a Spot VM (the preemption scenario's)."""
    spec = ClusterSpec.gke(nodes)
    spec.spot = [spec.node_names[3]]
    return spec


@dataclass
class Gang:
    """One scenario's JobSet: where it started, and the nodes it may move to."""

    name: str
    members: list[str]
    spares: list[str]


class GkeScenarios(Pipeline):
    """The GKE scenarios: faults on JobSet members, checked in the fake API server, Compute and Firestore.

    Nodes: the faults use nodes 0-8, one each (7: the straggler, 8 with the partner: a gang-wide
    throttle, pitstop.tools.demo_gke_planned); every gang runs on its faulty member(s) and the
    partner (node 9) and may move to the spare (node 10), both freed after each scenario.
    """

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        assert "kube" in self.state.endpoints, "not a GKE stack"
        self.kube = Kube(self.state.endpoints["kube"])
        self.partner, self.spare = self.nodes[-2], self.nodes[-1]

    # -- helpers ------------------------------------------------------------------------

    def k8s_entry(self, node: str, line: str, location: str = ZONE) -> dict[str, Any]:
        """A kernel line as GKE's node-journal log ships it: a k8s_node entry with the journal record
        (``_TRANSPORT=kernel``: verified); ``location`` is the cluster's (a region for a regional one)."""
        return {
            "insertId": uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/node-journal",
            "timestamp": _stamp(),
            "jsonPayload": {
                "MESSAGE": line,
                "_TRANSPORT": "kernel",
                "SYSLOG_IDENTIFIER": "kernel",
                "PRIORITY": "3",
                "_HOSTNAME": node,
            },
            "resource": {
                "type": "k8s_node",
                "labels": {
                    "project_id": PROJECT,
                    "location": location,
                    "cluster_name": self.state.cluster["name"],
                    "node_name": node,
                },
            },
        }

    def serial_entry(self, node: str, line: str) -> dict[str, Any]:
        """A kernel line as GCE serial-port logging ships it (the GKE node's usual route): the console's
        text on a gce_instance entry, which anyone on the VM could have written (unverified)."""
        return {
            "insertId": uuid.uuid4().hex[:16],
            "logName": f"projects/{PROJECT}/logs/serialconsole.googleapis.com%2Fserial_port_1_output",
            "timestamp": _stamp(),
            "textPayload": f"[ 7341.112233] {line}",
            "resource": {
                "type": "gce_instance",
                "labels": {"instance_id": self.vm_id(node), "project_id": PROJECT, "zone": ZONE},
            },
            "labels": {"compute.googleapis.com/resource_name": node},
        }

    def gang(self, name: str, members: list[str], spares: list[str]) -> Gang:
        """A JobSet running on exactly ``members``, free to move to ``spares`` once it started."""
        for n in members:
            self.kube.label_node(n, POOL_LABEL, name)
        self.kube.create_jobset(jobset(name, len(members), pool=name, grace_s=POD_GRACE_S))
        self.wait(
            lambda: self.placed(name) == sorted(members) and running(self.kube, name) == len(members),
            30,
            f"JobSet {name} to run on {members}",
        )
        for n in spares:
            self.kube.label_node(n, POOL_LABEL, name)
        return Gang(name, members, spares)

    def state_on_timeout(self) -> str:
        try:
            listed = self.kube.pods()
            pods = [
                {
                    "pod": p["metadata"]["name"],
                    "node": p["spec"].get("nodeName"),
                    "phase": (p.get("status") or {}).get("phase"),
                    "attempt": p["metadata"].get("labels", {}).get(ATTEMPT_LABEL),
                    "deleting": bool(p["metadata"].get("deletionTimestamp")),
                }
                for p in listed
            ]
            seen = {
                "jobsets": [jobset_summary(js, listed) for js in self.kube.jobsets()],
                "pods": pods,
                "nodes": [node_summary(n) for n in self.kube.nodes()],
            }
        except (OSError, KeyError, ValueError) as exc:
            return f" (state unreadable: {exc})"
        return f"; seen: {json.dumps(seen, default=str)}"

    def placed(self, name: str) -> list[str]:
        """The nodes the JobSet's current attempt runs on."""
        js = self.kube.jobset(name)
        return (
            [] if js is None else list(jobset_summary(js, self.kube.pods(f"{JOBSET_LABEL}={name}"))["nodes"])
        )

    def restarts(self, name: str) -> int:
        js = self.kube.jobset(name)
        return -1 if js is None else int((js.get("status") or {}).get("restarts") or 0)

    def moved(self, g: Gang, bad: list[str]) -> list[str]:
        """Once the gang runs again in full, the nodes it runs on (none of them ``bad``)."""
        want = len(g.members)

        def off_bad() -> list[str] | None:
            where = self.placed(g.name)
            ok = len(where) == want and running(self.kube, g.name) == want and not set(where) & set(bad)
            return where if ok else None

        where: list[str] = self.wait(off_bad, 60, f"JobSet {g.name} to run again off {bad}")
        return where

    def done_with(self, g: Gang) -> None:
        """Remove the gang and its pool labels, so the partner and spare are free for the next one."""
        self.kube.delete_jobset(g.name)
        self.wait(lambda: not self.kube.pods(f"{JOBSET_LABEL}={g.name}"), 60, f"JobSet {g.name}'s pods to go")
        for n in [*g.members, *g.spares]:
            self.kube.label_node(n, POOL_LABEL, None)

    def device_plugin_xid(self, node: str, xid: int) -> None:
        """What GKE's GPU device plugin does on a critical Xid: XidCriticalError under this boot, one
        GPU less allocatable (reference/gke.md §2); only a reboot clears them."""
        boot = self.kube.node(node)["status"]["nodeInfo"]["bootID"]
        cond = {"type": "XidCriticalError", "status": "True", "reason": json.dumps({str(xid): True})}
        self.kube.set_node_status(
            node, {"conditions": [{**cond, "message": boot}], "allocatable": {GPU: "7"}}
        )

    def node_back(self, node: str) -> bool:
        """In service: Ready, schedulable, no Pitstop taint, every GPU allocatable, no Xid condition."""
        n = node_summary(self.kube.node(node))
        pitstop = [t for t in n["taints"] if t.startswith(FENCE_KEY)]
        return (
            n["ready"]
            and not n["unschedulable"]
            and not pitstop
            and n["gpu_allocatable"] == 8
            and not n["xid_critical"]
        )

    @staticmethod
    def fenced_by(events: list[dict[str, Any]], node: str, iid: str) -> bool:
        """Whether the node was seen cordoned with Pitstop's taint for this incident."""
        taint = {"key": FENCE_KEY, "value": iid, "effect": "NoSchedule"}
        return any(
            e["object"]["metadata"]["name"] == node
            and e["object"].get("spec", {}).get("unschedulable")
            and any({k: t.get(k) for k in taint} == taint for t in e["object"]["spec"].get("taints") or [])
            for e in events
        )

    @staticmethod
    def evictions(events: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
        """Pods on the node evicted through the Eviction API: when, and the grace period they got."""
        out: dict[str, dict[str, Any]] = {}
        for e in events:
            pod = e["object"]
            conds = (pod.get("status") or {}).get("conditions") or []
            evicted = any(
                c["type"] == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI" for c in conds
            )
            if pod.get("spec", {}).get("nodeName") != node or not evicted:
                continue
            seen = out.setdefault(
                pod["metadata"]["name"], {"pod": pod["metadata"]["name"], "at": e["at"], "grace": None}
            )
            if seen["grace"] is None:  # the grace period the deletion started with (it ends at 0)
                seen["grace"] = pod["metadata"].get("deletionGracePeriodSeconds")
        return list(out.values())

    def close_with_unfence(self, iid: str) -> dict[str, Any]:
        """What `pitstop incidents --close ID --unfence` does, through the GKE adapter (services/close.py)."""
        from pitstop.adapters.firestore import IncidentStore
        from pitstop.core import policy as policy_mod
        from pitstop.services.close import close_incident
        from pitstop.services.schedulers import Wiring, schedulers_for

        pol = policy_mod.load(Path(self.state.workdir, "policy.yaml"))
        store = IncidentStore(self.db, pol.doc["store"]["collection_prefix"])
        schedulers = schedulers_for(pol, Wiring(PROJECT, kube_endpoint=self.state.endpoints["kube"]))
        done = close_incident(store, schedulers, iid, "demo", time.time(), unfence=True)
        got = store.get(iid)
        inc: dict[str, Any] = {**(dict(got) if got else {}), "lines": done.lines}
        return inc

    def remediated(
        self, g: Gang, bad: str, entry: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str], bool, int]:
        """An Xid 79 the device plugin confirms on ``bad``, logged as ``entry``: the finished incident,
        where the gang runs again, whether the node came back, and the JobSet's restarts."""
        self.device_plugin_xid(bad, 79)
        self.router.publish(entry)
        inc = self.finished(bad)
        where = self.moved(g, [bad])
        return inc, where, self.node_back(bad), self.restarts(g.name)

    # -- scenarios ----------------------------------------------------------------------

    def xid79(self) -> Result:
        bad = self.nodes[0]
        g = self.gang("xid79", [bad, self.partner], [self.spare])
        watch = Watch(self.kube.url, "/api/v1/nodes")
        try:
            inc, where, back, restarts = self.remediated(g, bad, self.k8s_entry(bad, XID79))
            notes = self.wait(lambda: self.notes_for(inc["id"]), 30, "the notification")
        finally:
            watch.stop()
            self.done_with(g)
        fenced = self.fenced_by(watch.events, bad, inc["id"])
        resets = self.calls("reset", bad)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "REBOOT_NODE"
            and fenced
            and len(resets) == 1
            and restarts == 1
            and back
            and len(notes) == 1
        )
        return Result(
            "gke_xid79_on_jobset_member",
            ok,
            f"{bad} cordoned+tainted={fenced}, VM reset {len(resets)}x, JobSet restarted {restarts}x onto "
            f"{','.join(where)}, node verified and back in service={back}, {len(notes)} notification",
            durations(inc),
            inc["id"],
            {
                "state": inc["state"],
                "action": inc["action"],
                "fenced": fenced,
                "resets": len(resets),
                "restarts": restarts,
                "moved_to": where,
                "back": back,
                "notifications": len(notes),
            },
        )

    def two_members(self) -> Result:
        a, b = self.nodes[1], self.nodes[2]
        g = self.gang("pair", [a, b], [self.partner, self.spare])
        try:
            for n in (a, b):
                self.device_plugin_xid(n, 79)
            for n in (a, b):
                self.router.publish(self.k8s_entry(n, XID79))
            incs = [self.finished(a), self.finished(b)]
            where = self.moved(g, [a, b])
            back, restarts = [self.node_back(n) for n in (a, b)], self.restarts(g.name)
        finally:
            self.done_with(g)
        resets = [len(self.calls("reset", n)) for n in (a, b)]
        ok = (
            all(i["state"] == "RESOLVED" and i["action"] == "REBOOT_NODE" for i in incs)
            and resets == [1, 1]
            and restarts == 1
            and all(back)
        )
        return Result(
            "gke_two_members_fail_together",
            ok,
            f"Xid 79 on {a} and {b} of one JobSet: {len(incs)} incidents, resets {resets}, the JobSet "
            f"restarted {restarts}x (once) onto {','.join(where)}, both back in service={all(back)}",
            durations(incs[0]),
            incs[0]["id"],
            {
                "states": [i["state"] for i in incs],
                "resets": resets,
                "restarts": restarts,
                "moved_to": where,
                "back": back,
            },
        )

    def preemption(self) -> Result:
        bad = self.nodes[3]
        g = self.gang("spot", [bad, self.partner], [self.spare])
        try:
            before = self._instance(bad)["id"]
            self.router.publish(
                admin(self.state, "/_admin/preempt", {"project": PROJECT, "zone": ZONE, "instance": bad})
            )
            inc = self.finished(bad)
            where = self.moved(g, [bad])
            after, back, restarts = self._instance(bad), self.node_back(bad), self.restarts(g.name)
        finally:
            self.done_with(g)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "RESCHEDULE_JOB"
            and after["id"] != before
            and after["status"] == "RUNNING"
            and restarts == 1
            and back
        )
        return Result(
            "gke_spot_preemption",
            ok,
            f"Spot node {bad} preempted; the MIG recreated it (new id={after['id'] != before}), the JobSet "
            f"restarted {restarts}x onto {','.join(where)}, node back in service={back}",
            durations(inc),
            inc["id"],
            {
                "state": inc["state"],
                "action": inc["action"],
                "new_vm": after["id"] != before,
                "vm": after["status"],
                "restarts": restarts,
                "moved_to": where,
                "back": back,
            },
        )

    def _instance(self, node: str) -> dict[str, Any]:
        found: dict[str, Any] = next(
            i for i in admin(self.state, "/_admin/state")["instances"] if i["name"] == node
        )
        return found

    def _maintenance_notice(self, node: str) -> tuple[dict[str, Any], float]:
        """Upcoming maintenance of the node's VM: the system event, published; the window's start."""
        entry = admin(
            self.state,
            "/_admin/maintenance",
            {"project": PROJECT, "zone": ZONE, "instance": node, "starts_in_s": 400},
        )
        self.router.publish(entry)
        from pitstop.core.timefmt import to_epoch

        return entry, to_epoch(entry["protoPayload"]["metadata"]["windowStartTime"]) or 0.0

    def maintenance(self) -> Result:
        bad = self.nodes[4]
        g = self.gang("maint", [bad, self.partner], [self.spare])
        watch = Watch(self.kube.url, f"/api/v1/namespaces/{NAMESPACE}/pods")
        try:
            _, window = self._maintenance_notice(bad)
            inc = self.finished(bad, timeout=120)
            where = self.moved(g, [bad])
            back, restarts = self.node_back(bad), self.restarts(g.name)
        finally:
            watch.stop()
            self.done_with(g)
        evicted = self.evictions(watch.events, bad)
        graceful = bool(evicted) and all(e["grace"] == POD_GRACE_S and e["at"] < window for e in evicted)
        maint = self.calls("perform_maintenance", bad)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["action"] == "DRAIN_NODE"
            and len(evicted) == 1
            and graceful
            and len(maint) == 1
            and restarts == 1
            and back
        )
        return Result(
            "gke_upcoming_maintenance",
            ok,
            f"{len(evicted)} pod on {bad} evicted with its {POD_GRACE_S}s grace, before the window="
            f"{graceful}, "
            f"the JobSet restarted {restarts}x onto {','.join(where)}, performMaintenance x{len(maint)}, "
            f"node back in service={back}",
            durations(inc),
            inc["id"],
            {
                "state": inc["state"],
                "action": inc["action"],
                "evicted": evicted,
                "window_start": window,
                "perform_maintenance": len(maint),
                "restarts": restarts,
                "moved_to": where,
                "back": back,
            },
        )

    def pdb_blocks(self) -> Result:
        bad, pdb = self.nodes[5], "train-pdb"
        g = self.gang("pdb", [bad, self.partner], [self.spare])
        self.kube.create_pdb(pdb, {JOBSET_LABEL: g.name}, min_available=2)
        try:
            self._maintenance_notice(bad)
            inc = self.finished(bad, timeout=120)
            held = node_summary(self.kube.node(bad))
            stayed, restarts = bad in self.placed(g.name), self.restarts(g.name)
            closed = self.close_with_unfence(inc["id"])
            back = self.node_back(bad)
        finally:
            self.kube.delete_pdb(pdb)
            self.done_with(g)
        why = str((inc.get("failure") or {}).get("error") or "")
        unfence = ((closed.get("closure") or {}).get("unfence") or {}).get("outcome")
        ok = (
            inc["state"] == "FAILED"
            and f"PodDisruptionBudget {pdb}" in why
            and held["unschedulable"]
            and stayed
            and restarts == 0
            and not self.calls("perform_maintenance", bad)
            and closed.get("state") == "RESOLVED"
            and unfence == "done"
            and back
        )
        return Result(
            "gke_pdb_blocks_eviction",
            ok,
            f"eviction refused by {pdb}: incident {inc['state']} ({why[:160]}); {bad} stayed fenced="
            f"{held['unschedulable']}, the pod kept running={stayed}; closed with --unfence: {unfence}",
            durations(inc),
            inc["id"],
            {
                "state": inc["state"],
                "failure": why,
                "node_while_failed": held,
                "pod_stayed": stayed,
                "restarts": restarts,
                "perform_maintenance": len(self.calls("perform_maintenance", bad)),
                "closed": closed.get("state"),
                "unfence": unfence,
                "back": back,
            },
        )

    def regional(self) -> Result:
        bad = self.nodes[6]
        g = self.gang("regional", [bad, self.partner], [self.spare])
        try:
            self.device_plugin_xid(bad, 79)
            self.router.publish(self.k8s_entry(bad, XID79, location=REGION))
            inc = self.finished(bad)
            where = self.moved(g, [bad])
            back, restarts = self.node_back(bad), self.restarts(g.name)
        finally:
            self.done_with(g)
        resets = self.calls("reset", bad)
        ok = (
            inc["state"] == "RESOLVED"
            and inc["node"]["zone"] == ZONE
            and inc["action"] == "REBOOT_NODE"
            and len(resets) == 1
            and restarts == 1
            and back
        )
        return Result(
            "gke_regional_cluster_xid",
            ok,
            f"Xid 79 logged with location {REGION}: zone resolved to {inc['node']['zone']}, VM reset "
            f"{len(resets)}x, the JobSet restarted {restarts}x onto {','.join(where)}, node back={back}",
            durations(inc),
            inc["id"],
            {
                "state": inc["state"],
                "action": inc["action"],
                "zone": inc["node"]["zone"],
                "resets": len(resets),
                "restarts": restarts,
                "moved_to": where,
                "back": back,
            },
        )

    def serial(self) -> Result:
        """The serial console's word alone is recorded; with the device plugin's condition it is acted on."""
        forged, bad = self.nodes[7], self.nodes[8]
        self.router.publish(self.serial_entry(forged, XID79))
        self.wait(lambda: self.incidents(forged), 30, f"the record of {forged}'s line")
        g = self.gang("serial", [bad, self.partner], [self.spare])
        try:
            inc, where, back, restarts = self.remediated(g, bad, self.serial_entry(bad, XID79))
        finally:
            self.done_with(g)
        lone = self.incidents(forged)[-1]
        untouched = (
            not self.calls("reset", forged) and not node_summary(self.kube.node(forged))["unschedulable"]
        )
        resets = self.calls("reset", bad)
        ok = (
            (lone["trust"], lone["action"]) == ("unverified", "NONE")
            and untouched
            and inc["state"] == "RESOLVED"
            and (inc["trust"], inc["action"]) == ("verified", "REBOOT_NODE")
            and len(resets) == 1
            and restarts == 1
            and back
        )
        return Result(
            "gke_serial_console_xid",
            ok,
            f"serial-console Xid 79 alone on {forged}: {lone['action']} ({lone['trust']}), node untouched="
            f"{untouched}; with the device plugin's XidCriticalError on {bad}: {inc['action']} "
            f"({inc['trust']}), VM reset {len(resets)}x, JobSet restarted {restarts}x onto "
            f"{','.join(where)}, back={back}",
            durations(inc),
            inc["id"],
            {
                "lone": {"trust": lone["trust"], "action": lone["action"], "untouched": untouched},
                "state": inc["state"],
                "trust": inc["trust"],
                "action": inc["action"],
                "cluster": inc["node"].get("cluster"),
                "resets": len(resets),
                "restarts": restarts,
                "moved_to": where,
                "back": back,
            },
        )

    def run_all(self, only: list[str] | None = None) -> list[Result]:
        plan: list[tuple[str, Callable[[], Result]]] = [
            ("gke_xid79", self.xid79),
            ("gke_two_members", self.two_members),
            ("gke_preemption", self.preemption),
            ("gke_maintenance", self.maintenance),
            ("gke_pdb", self.pdb_blocks),
            ("gke_regional", self.regional),
            ("gke_serial", self.serial),
            # issue 24: a degraded node's peers read from Managed Service for Prometheus
            ("gke_straggler_spare", lambda: demo_gke_planned.straggler_spare(self)),
            ("gke_gang_wide_throttle", lambda: demo_gke_planned.gang_wide_throttle(self)),
        ]
        results = []
        for key, fn in plan:
            if only and key not in only:
                continue
            try:
                self.settle()
                results.append(self.with_times(fn()))
            except Exception as exc:  # a scenario that breaks is a failed scenario, reported with its reason
                results.append(Result(key, False, f"{type(exc).__name__}: {exc}"))
            print_result(results[-1])
        return results


def print_result(r: Result) -> None:
    mark = "PASS" if r.passed else "FAIL"
    print(f"\n[{mark}] {r.name}: {r.detail}")
    if r.timeline:
        steps = [f"{k} +{v:.1f}s" for k, v in sorted(_set(r.timeline), key=lambda kv: kv[1])]
        print(f"       incident {r.incident}: detected -> " + " -> ".join(steps))
    if r.resume_s is not None or r.repair_s is not None:
        print(f"       resume_s {r.resume_s}  repair_s {r.repair_s}  (real-time equivalent)")


def _set(timeline: Mapping[str, float | None]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in timeline.items() if v is not None]


SLURM_KEYS = (
    "xid79",
    "xid13",
    "preemption",
    "maintenance",
    "duplicates",
    "lemon",
    "blast_radius",
    "poison",
    "xid79_spare",
    "lemon_spare",
    "degraded",
    "replace_not_confirmed",
    "no_spare",
    "straggler_spare",
    "ecc_trend",
    "degraded_no_spare",
    "gang_wide_throttle",
    "hang_bad_node",
    "hang_software",
)
HANG_GANG = 4  # the hung training job's nodes (the pool has one spare more)
# eight for the first scenarios, five for the hangs (8-12), ten for the degraded-node ones, ten for the
# back-to-training ones
SLURM_NODES = 33
GKE_KEYS = (
    "gke_xid79",
    "gke_two_members",
    "gke_preemption",
    "gke_maintenance",
    "gke_pdb",
    "gke_regional",
    "gke_serial",
    "gke_straggler_spare",
    "gke_gang_wide_throttle",
)


def _on_stack(stack: Stack, scenarios: type[Pipeline], only: list[str] | None, keep: bool) -> Pipeline:
    """Bring the stack up, run its scenarios (kept in ``.results``), bring it down unless ``keep``."""
    t0 = time.time()
    print(f"starting the local stack in {stack.workdir} ...", flush=True)
    try:
        state: StackState = stack.up()
        print(
            f"stack up in {time.time() - t0:.1f}s: "
            + ", ".join(f"{k}={v}" for k, v in state.endpoints.items())
        )
        sc = scenarios(stack)
        sc.results = sc.run_all(only)
        return sc
    except Exception:
        for name in ("ingest", "actuate", "notify", "executions", "slurm-agent", "fake-compute", "kube"):
            log = stack.workdir / f"{name}.log"
            if log.exists():
                print(f"--- {name}.log (tail) ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
        raise
    finally:
        if not keep:
            stack.down()


def run(workdir: Path, only: list[str] | None = None, keep: bool = False) -> int:
    """The Slurm scenarios on a Slurm stack in ``workdir``, then the GKE ones on a GKE stack in
    ``workdir/gke`` (``only`` picks scenarios; a stack none of them needs is not started)."""
    t0 = time.time()
    runs: list[Pipeline] = []
    if not only or set(only) & set(SLURM_KEYS):
        runs.append(_on_stack(Stack(workdir, slurm_spec(SLURM_NODES)), Scenarios, only, keep))
    if not only or set(only) & set(GKE_KEYS):
        gke = Stack(workdir / "gke", gke_spec(), compute_scale=GKE_COMPUTE_SCALE)
        runs.append(_on_stack(gke, GkeScenarios, only, keep))
    results = [r for sc in runs for r in sc.results]
    summary = {
        "scenarios": [
            {
                "name": r.name,
                "passed": r.passed,
                "detail": r.detail,
                "timeline": r.timeline,
                "resume_s": r.resume_s,
                "repair_s": r.repair_s,
            }
            for r in results
        ],
        "latency_ms": latency_summary([x for sc in runs for x in sc.latencies]),
        "wall_s": round(time.time() - t0, 1),
    }
    print(json.dumps(summary))
    return 0 if results and all(r.passed for r in results) else 1
