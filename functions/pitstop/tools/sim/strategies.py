"""The remediation strategies compared on one fault trace.

``pitstop`` decides with the real classifier and incident engine, keeping node, incident and
budget documents between calls as the store does; ``pitstop-topology`` and ``pitstop-cost`` add
the actuate step's spare choice (core/topology.pick) and priced wait / move / hold
(core/tradeoff.weigh). The others are small models of what their
systems are documented to do (reference/peers.md); they read the same NVIDIA catalog (the
classifier's proposed action) where their real counterparts read it too.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable

from pitstop.adapters.memory_store import MemoryStore
from pitstop.core import aggregate, alerts, engine, policy, topology, tradeoff
from pitstop.core.actions import JOB_ACTIONS, RECORD_ONLY_ACTIONS, Action, higher
from pitstop.core.classify import Classifier
from pitstop.core.domain import FaultEvent
from pitstop.core.envelope import Delivery
from pitstop.core.states import State
from pitstop.local import alerting
from pitstop.local.alerting import AlertNotification
from pitstop.tools.sim import placement
from pitstop.tools.sim.fleet import Fleet, Job, Response
from pitstop.tools.sim.scenario import Scenario
from pitstop.tools.sim.trace import PROJECT, Fault, entries, node_ref

T0 = 1_800_000_000.0  # epoch seconds of simulated time 0 (the engine works in epoch time)
LADDER = (Action.RESET_GPU, Action.REBOOT_NODE, Action.REPLACE_NODE)
SWEEP_S = 60.0  # Cloud Scheduler runs the sweep once a minute


@functools.cache
def _classifier() -> Classifier:
    return Classifier.default()


@functools.cache
def catalog_action(burst: tuple[str, ...], signal: str) -> str:
    """What the NVIDIA catalog (via the classifier) proposes for a burst, strongest line first."""
    probe = Fault("probe", 0.0, 0, "probe", signal, burst, "NONE", "0000:1b:00", 0.0, 0.0)
    action: str = Action.NONE
    for entry in entries(probe):
        action = higher(action, _classifier().classify(entry)["action"])
    return action


class _Base:
    """Durations in seconds and what every strategy does when only the job notices."""

    name = "base"

    def __init__(self, scn: Scenario) -> None:
        self.scn = scn
        # seconds; human_detect is a range the trace draws from, not a duration of its own
        self.d = {k: float(v) * 60.0 for k, v in scn["durations"].items() if isinstance(v, int | float)}
        self.self_detect = scn["jobs"]["self_detect_min"] * 60.0
        self.history: dict[int, list[tuple[float, str]]] = {}

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        raise NotImplementedError

    def spares_for(self, job: Job, free: list[int], need: int, sim: Fleet) -> list[int]:
        """Blind to the fabric: the first idle nodes the scheduler lists."""
        return free[:need]

    def repair_s(self, action: str) -> float:
        """How long a node action keeps the node out (reportHostAsFaulty for a replacement)."""
        d = self.d
        durations: dict[str, float] = {
            Action.RESET_GPU: d["reset_gpu"],
            Action.REBOOT_NODE: d["reboot"],
            Action.REPLACE_NODE: d["report_host_faulty"] + d["host_swap"],
        }
        return durations.get(action, 0.0)

    def job_notices(self, t: float) -> Response:
        """No node signal (or none acted on): the job's own timeout restarts it in place."""
        return Response(t + self.self_detect, None, Action.RESTART_JOB)

    def unseen(self, f: Fault, t: float) -> Response | None:
        """A fault that prints nothing this strategy reads (a hang, a straggler), or None.

        A hang: the job's own timeout restarts it in place; when a node is at fault, a person
        finds it after that (and it is repaired while the gang restarts without it). A straggler:
        its gang runs slower until a person notices, stops the job and takes the node out.
        """
        if f.signal == "hang":
            if f.needs == Action.RESTART_JOB:
                return self.job_notices(t)
            found = t + self.self_detect + f.human_s
            return Response(
                found, found + self.repair_s(f.needs), f.needs, replaced=f.needs == Action.REPLACE_NODE
            )
        if f.signal == "straggler":
            noticed = t + f.human_s
            back = noticed + self.repair_s(f.needs)
            return Response(
                noticed, back, f.needs, interrupt_at=noticed, replaced=f.needs == Action.REPLACE_NODE
            )
        return None

    def unattended_maintenance(self, f: Fault, t: float) -> Response:
        """The VM is terminated at the window; the job dies with it and restarts itself."""
        window = t + self.d["maintenance_notice"]
        back = window + self.d["maintenance"]
        return Response(window + self.self_detect, back, Action.NONE, interrupt_at=window, fixed=True)

    def host_error(self, t: float, requeue_after: float) -> Response:
        """Compute Engine restarts the VM on its own; the job must still be restarted."""
        return Response(
            t + requeue_after, t + self.d["host_error_restart"], Action.RESCHEDULE_JOB, fixed=True
        )

    def human_ladder(self, node: int, proposed: str, t: float) -> str:
        """A person repeats the catalog's action, one step stronger if the node failed within a day."""
        past = [h for h in self.history.get(node, []) if t - h[0] <= 86400.0]
        action: str = proposed
        if past and past[-1][1] in LADDER and proposed in LADDER:
            nxt = LADDER[min(LADDER.index(Action(past[-1][1])) + 1, len(LADDER) - 1)]
            action = higher(proposed, nxt)
        self.history.setdefault(node, []).append((t, action))
        return action

    def by_a_person(self, f: Fault, t: float) -> Response:
        """Manual operations: a person notices, takes the node out and requeues the job."""
        proposed = catalog_action(f.burst, f.signal)
        if proposed in RECORD_ONLY_ACTIONS:
            return self.job_notices(t)
        action = self.human_ladder(f.node, proposed, t)
        noticed = t + f.human_s
        replaced = action == Action.REPLACE_NODE
        return Response(noticed, noticed + self.repair_s(action), action, replaced=replaced)


class Manual(_Base):
    """People watch dashboards: 15-30 minutes to notice, then the runbook's action."""

    name = "manual"

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        if (r := self.unseen(f, t)) is not None:
            return r
        if f.signal == "none":
            return self.job_notices(t)
        if f.signal == "maintenance":
            r = self.unattended_maintenance(f, t)
            r.requeue_at = r.interrupt_at + f.human_s if r.interrupt_at is not None else r.requeue_at
            return r
        if f.signal == "host_error":
            return self.host_error(t, self.self_detect)
        return self.by_a_person(f, t)


class Gke(_Base):
    """GKE node auto-repair: acts on a node NotReady for ~10 min (recreates it); Xids on a
    node that stays Ready are invisible to it, so a person finds those."""

    name = "gke"

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        d = self.d
        if (r := self.unseen(f, t)) is not None:
            return r
        if f.signal == "none":
            return self.job_notices(t)
        if f.signal == "maintenance":
            return self.unattended_maintenance(f, t)
        if f.signal == "host_error":
            if d["host_error_restart"] <= d["gke_not_ready"]:
                return self.host_error(t, d["gke_not_ready"])
            back = t + d["gke_not_ready"] + d["mig_recreate"]
            return Response(t + d["gke_not_ready"], back, Action.REPLACE_NODE, fixed=True, replaced=True)
        return self.by_a_person(f, t)


class NvSentinel(_Base):
    """NVSentinel: cordon and drain within seconds and remediate by the catalog (a replacement is
    a VM recreate, no host report); it does not requeue the job, which waits for its own
    timeout. Five remediations on a node within 7 days go to a person (CONTACT_SUPPORT)."""

    name = "nvsentinel"

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        d = self.d
        if (r := self.unseen(f, t)) is not None:
            return r
        if f.signal == "none":
            return self.job_notices(t)
        if f.signal == "maintenance":
            window = t + d["maintenance_notice"]
            quarantine = max(t + SWEEP_S, window - d["nvsentinel_quarantine_before"])
            back = window + d["maintenance"] + d["nvsentinel_after_window"]
            return Response(
                quarantine + self.self_detect, back, Action.DRAIN_NODE, interrupt_at=quarantine, fixed=True
            )
        if f.signal == "host_error":
            return self.host_error(t, self.self_detect)
        proposed = catalog_action(f.burst, f.signal)
        if proposed in RECORD_ONLY_ACTIONS:
            return self.job_notices(t)
        past = [h for h in self.history.get(f.node, []) if t - h[0] <= 7 * 86400.0]
        cordoned = t + d["nvsentinel_cordon"]
        action: str
        if len(past) >= 5:
            action, back = Action.REPLACE_NODE, cordoned + f.human_s + self.repair_s(Action.REPLACE_NODE)
        elif proposed == Action.REPLACE_NODE:
            action, back = proposed, cordoned + d["mig_recreate"]
        else:
            action, back = proposed, cordoned + self.repair_s(proposed)
        self.history.setdefault(f.node, []).append((t, action))
        replaced = action == Action.REPLACE_NODE
        return Response(t + self.self_detect, back, action, replaced=replaced)


class World(MemoryStore):
    """The incident store between engine calls (the same store ``pitstop replay`` uses), and a
    count of the engine's verdicts."""

    def __init__(self, pol: policy.Policy) -> None:
        super().__init__()
        self.p = pol
        self.results: dict[str, int] = {}

    def count(self, out: engine.Outcome) -> engine.Outcome:
        self.results[out.result] = self.results.get(out.result, 0) + 1
        return out

    def feed(self, ev: FaultEvent, now: float) -> engine.Outcome:
        return self.count(self.apply(ev, self.p, now))

    def resolve(self, iid: str, at: float) -> None:
        """What the workflow's close step records once the node is back (or the job requeued)."""
        inc = self.docs.incidents[iid]
        self.decide(iid, aggregate.ResolveStep(aggregate.At(inc["step"]), {}), self.p, at)


def pitstop_policy(scn: Scenario) -> policy.Policy:
    """The shipped policy with the scenario's overlay, one cluster over the fleet, enforcing."""
    physical = scn["fleet"]["nodes"] + scn["fleet"]["spares"]
    cluster = {
        "name": "train",
        "scheduler": "slurm",
        "size": physical,
        "match": {"name_pattern": "a3-node-*"},
    }
    doc = policy.deep_merge({"clusters": [cluster]}, copy.deepcopy(scn["policy"]))
    doc["mode"] = "enforce"
    return policy.from_doc(doc, "scenario policy")


class Pitstop(_Base):
    """Today's policy: each fault's log entries go through the classifier and the incident
    engine; the engine's decision (after bursts, ladder, lemon, cooldowns and budgets) is acted
    on. The gang is requeued as soon as the node is fenced (onto a spare if one is free);
    replacements are diagnosed first, and every repaired node is validated before it returns."""

    name = "pitstop"

    def __init__(self, scn: Scenario) -> None:
        super().__init__(scn)
        self.world = World(pitstop_policy(scn))

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        if (unseen := self.unseen(f, t)) is not None:
            return unseen
        if f.signal == "none":
            return self.job_notices(t)
        decided = t + self.d["pitstop_detect"]
        iid = self._feed(f, t, decided)
        inc = self.world.docs.incidents.get(iid) if iid else None
        if iid is None or inc is None or inc["state"] == State.RESOLVED or inc["action"] == Action.NONE:
            return self._unhandled(f, t)
        start = decided
        held = inc["state"] == State.HELD
        if held:
            start = self._release(iid, decided, decided + f.human_s)
            inc = self.world.docs.incidents[iid]
        r = self._act(f, t, start, inc["action"], sim)
        r.held = held
        r.on_back = functools.partial(self._close, iid)
        if inc["action"] in RECORD_ONLY_ACTIONS:
            self._close(iid, start)
        return r

    def _feed(self, f: Fault, t: float, decided: float) -> str | None:
        """Every line of the fault through the classifier and the engine, a second apart."""
        iid = None
        for k, entry in enumerate(entries(f)):
            ev = _classifier().classify(entry)
            ev["_observed_ts"] = T0 + t + k
            out = self.world.feed(ev, T0 + decided + k)
            if out.incident is not None:
                iid = out.incident["id"]
        return iid

    def _release(self, iid: str, decided: float, human_at: float) -> float:
        """A held incident: the sweep retries it each minute; the paged person releases it."""
        w = self.world
        tick = decided + SWEEP_S
        while tick < human_at:
            if (
                w.decide(iid, aggregate.ReleaseHeld("sweep", force=False), w.p, T0 + tick).result
                == "released"
            ):
                w.count(engine.Outcome("released"))
                return tick
            tick += SWEEP_S
        w.count(w.decide(iid, aggregate.ReleaseHeld("operator", force=True), w.p, T0 + human_at))
        return human_at

    def _close(self, iid: str, at: float) -> None:
        self.world.resolve(iid, T0 + at)

    def _unhandled(self, f: Fault, t: float) -> Response:
        if f.signal == "maintenance":
            return self.unattended_maintenance(f, t)
        if f.signal == "host_error":
            return self.host_error(t, self.self_detect)
        return self.job_notices(t)

    def _act(self, f: Fault, t: float, start: float, action: str, sim: Fleet) -> Response:
        d = self.d
        fenced = start + d["fence"]
        if action in JOB_ACTIONS and f.signal == "host_error":
            return Response(fenced, t + d["host_error_restart"], action, fixed=True)
        if action in RECORD_ONLY_ACTIONS:
            return Response(fenced, None, action)
        if action == Action.DRAIN_NODE:
            window = t + d["maintenance_notice"]
            stop = fenced if sim.pool else window  # checkpoint and move now if a spare is free
            stop = min(stop, window)
            back = window + d["maintenance"] + d["validate"]
            return Response(stop, back, action, interrupt_at=stop, checkpointed=True, fixed=True)
        diagnose = d["diagnose"] if action == Action.REPLACE_NODE else 0.0
        back = fenced + diagnose + self.repair_s(action) + d["validate"]
        return Response(fenced, back, action, replaced=action == Action.REPLACE_NODE)


class PitstopTelemetry(Pitstop):
    """Pitstop with its telemetry alerts (issue 24): the heartbeat policy's and the node policies'
    notifications go through the real parser and engine like the kernel lines do. A hang is
    detected at the heartbeat's window, localised on every node of the job at once (a node at
    fault is fenced and repaired, the gang restarts without it) or restarted in place; a straggler
    is found at its policy's window and the gang moved off it at its next checkpoint, onto a spare,
    while the node is diagnosed and repaired (a planned move: nothing is lost)."""

    name = "pitstop+tel"

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        if f.signal == "hang":
            return self._hang(f, t, sim)
        if f.signal == "straggler" and sim.pool:
            return self._straggler(f, t, sim)
        return super().respond(f, t, sim)

    def _alert(self, doc: AlertNotification, t: float, decided: float) -> str | None:
        """One notification, as ingest takes it from the alerts topic, through the engine."""
        source = f"//pubsub.googleapis.com/projects/{PROJECT}/topics/{alerts.DEFAULT_TOPIC}"
        ev = _classifier().from_delivery(Delivery(dict(doc), f"alert-{t}"), source)
        ev["_observed_ts"] = T0 + t
        out = self.world.feed(ev, T0 + decided)
        return out.incident["id"] if out.incident is not None else None

    def _hang(self, f: Fault, t: float, sim: Fleet) -> Response:
        d = self.d
        decided = t + d["hang_alert"]
        job = {"cluster": "train", "job": str(max(sim.job_of[f.node], 0))}
        notice = alerting.notification(
            "job-heartbeat", "open", incident_id=f"0.{f.id}", project=PROJECT, metric_labels=job,
            resource_type="global", resource_labels={"project_id": PROJECT}, started_at=int(T0 + t),
        )  # fmt: skip
        iid = self._alert(notice, t, decided)
        found = decided + d["localise"] + d["fence"]
        if iid is not None:
            self._close(iid, found)
        if f.needs == Action.RESTART_JOB:
            return Response(found, None, Action.RESTART_JOB)  # nothing found: restarted in place once
        back = found + self.repair_s(f.needs) + d["validate"]
        return Response(found, back, f.needs, replaced=f.needs == Action.REPLACE_NODE)

    def _straggler(self, f: Fault, t: float, sim: Fleet) -> Response:
        d = self.d
        decided = t + d["straggler_alert"]
        ref = node_ref(f.node)
        notice = alerting.notification(
            "gpu-throttle", "open", incident_id=f"0.{f.id}", project=PROJECT, metric_labels={},
            resource_type="gce_instance", display_name=ref["instance"], observed="0.6",
            resource_labels={"project_id": PROJECT, "zone": ref["zone"], "instance_id": ref["instance_id"]},
            started_at=int(T0 + t),
        )  # fmt: skip
        iid = self._alert(notice, t, decided)
        inc = self.world.docs.incidents.get(iid) if iid else None
        start = decided
        if inc is not None and inc["state"] == State.HELD:  # a budget or a cooldown: the sweep, then a person
            start = self._release(inc["id"], decided, decided + f.human_s)
        stop = self._next_checkpoint(sim, f.node, start)
        back = stop + d["diagnose"] + self.repair_s(f.needs) + d["validate"]
        r = Response(stop, back, f.needs, interrupt_at=stop, checkpointed=True, fixed=True)
        r.replaced, r.held = f.needs == Action.REPLACE_NODE, start > decided
        if iid is not None:
            r.on_back = functools.partial(self._close, iid)
        return r

    @staticmethod
    def _next_checkpoint(sim: Fleet, node: int, after: float) -> float:
        """When the node's gang next finishes a checkpoint (at once if it is not running)."""
        j = sim.job_of[node]
        job = sim.jobs[j] if j >= 0 else None
        if job is None or job.phase != "run":
            return after
        cycle = sim.cp_s + sim.write_s
        done = math.floor((after - job.run_start) / cycle) + 1
        return float(job.run_start + done * cycle)


class Placed(_Base):
    """Pitstop with its telemetry alerts (``pitstop+tel``, whose decisions it keeps), placing each
    gang by the fabric as the actuate step does (services/actuate/moves.py): core/topology.pick takes
    a spare of the gang's sub-block, then of its block, then anywhere. ``priced``: at each node
    repair it also weighs waiting for the repair against moving (restart + the slower collectives
    if the move widens the gang) and holding, with core/tradeoff and the policy's ``moves`` knobs,
    the repair time the fleet's measured median once it has enough history."""

    def __init__(self, scn: Scenario, priced: bool) -> None:
        super().__init__(scn)
        self.name = "pitstop-cost" if priced else "pitstop-topology"
        self.inner = PitstopTelemetry(scn)
        self.world = self.inner.world
        self.priced = priced
        self.costs = tradeoff.costs_of(self.world.p.moves)
        self.measured: dict[str, list[float]] = {}  # action -> seconds from fence to healthy
        self.choices: dict[str, int] = {}
        self.decisions: list[tuple[str, str, str]] = []  # (action, decision, why) per weighed fault
        self.returned: dict[int, float] = {}  # node -> when it last came back from a Pitstop repair
        self.probation_s = float(self.world.p.moves["probation_s"])

    def respond(self, f: Fault, t: float, sim: Fleet) -> Response:
        r = self.inner.respond(f, t, sim)
        if r.node_back_at is None or r.action not in LADDER or r.checkpointed:
            return r  # no repair to wait for, or a planned move at a checkpoint
        r.on_back = self._measure(f.node, r.action, r.requeue_at, r.on_back)
        if self.priced and sim.job_of[f.node] >= 0:
            self._weigh(f, r, sim)
        return r

    def _measure(
        self, node: int, action: str, fenced: float, then: Callable[[float], None] | None
    ) -> Callable[[float], None]:
        def back(at: float) -> None:
            self.measured.setdefault(action, []).append(at - fenced)
            self.returned[node] = at
            if then is not None:
                then(at)

        return back

    def _weigh(self, f: Fault, r: Response, sim: Fleet) -> None:
        job = sim.jobs[sim.job_of[f.node]]
        fenced = {f.node} | job.left
        free = sim.free()
        pick = self._pick(job, fenced, free, 1, sim) if free else topology.Pick(blocked="no idle node")
        repair, source = tradeoff.repair_estimate(r.action, self.measured.get(r.action, []), self.costs)
        gpus = job.gang * self.scn["fleet"]["gpus_per_node"]
        weighed = tradeoff.weigh(
            tradeoff.Situation(r.action, job.gang, gpus, repair, source, pick), self.costs
        )
        r.wait_for_node = weighed.decision == tradeoff.WAIT
        self.choices[weighed.decision] = self.choices.get(weighed.decision, 0) + 1
        self.decisions.append((r.action, weighed.decision, weighed.why))

    def spares_for(self, job: Job, free: list[int], need: int, sim: Fleet) -> list[int]:
        if need <= 0:
            return []
        pick = self._pick(job, set(job.left), free, need, sim)
        return [int(s.node) for s in pick.spares] if pick.spares else free[:need]

    def _pick(self, job: Job, fenced: set[int], free: list[int], need: int, sim: Fleet) -> topology.Pick:
        """core/topology.pick over the gang and the idle nodes in the scheduler's order, each with
        when it came back from a Pitstop repair (the pick's probation), one seat per place and
        probation the answer can depend on (a few dozen seats for thousands of members)."""
        staying = sorted({sim.keys[n]: n for n in job.members - fenced}.values())  # one per place
        gang = [topology.Seat(str(n), sim.places[n]) for n in [*staying, *sorted(fenced)]]
        back = self.returned
        on = {n for n in free if n in back and sim.now - back[n] < self.probation_s}
        # only the first ``need`` idle nodes of a place, on probation or not, can be chosen (ties go
        # to the listed order)
        firsts = placement.first_of_each(free, lambda n: (sim.keys[n], n in on), need)
        spares = [topology.Seat(str(n), sim.places[n], back.get(n)) for n in firsts]
        return topology.pick(gang, {str(n) for n in fenced}, spares, need, False, sim.now, self.probation_s)


STRATEGIES: dict[str, Callable[[Scenario], _Base]] = {
    "manual": Manual,
    "gke": Gke,
    "nvsentinel": NvSentinel,
    "pitstop": Pitstop,
    "pitstop+tel": PitstopTelemetry,
    "pitstop-topology": functools.partial(Placed, priced=False),
    "pitstop-cost": functools.partial(Placed, priced=True),
}
