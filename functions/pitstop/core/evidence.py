"""What Pitstop itself found on a node: the only thing a disruption may rest on.

A log line, a system event on the topic, an alert notification or a metric point can open and
enrich an incident; anyone with the matching write permission can produce one (schemas and
core/trust.py say who). None of them is ``Evidence``. Evidence is what one of Pitstop's own
probes read through a channel the writer of that input does not control:

- ``node_check``: the corroboration check the scheduler runs on the node (its kernel ring
  buffer, ``nvidia-smi -q``, slurmctld's view, GKE's Node conditions), core/corroboration.py;
- ``compute``: Compute Engine's own ``instances.get`` of the VM, core/corroboration.py;
- ``telemetry``: the node's own reading of the named symptom, read back by Pitstop from Cloud
  Monitoring or Managed Prometheus, core/degraded.py;
- ``sweep``: a hung job's localisation, each node's tools and the ring links, core/localise.py;
- ``diagnostic``: nvidia-smi, NVLink and DCGM on the fenced node, core/diagnose.py;
- ``validation``: the GPU count a validation run on the repaired node saw, core/checks.py.

Each value carries what it matched (node, GPU, Xid / SXid / symptom / system-event kind, when
the finding was printed or observed, which probe) so the incident keeps it and a person can
check it.

Why construction is narrow: Python cannot forbid a call, so two things make a forged value a
visible act rather than an accident. ``Evidence.__init__`` refuses any call without this
module's private token, and the only callers holding it are the constructors below, one per
kind of finding, each taking what that probe parsed. tests/core/test_evidence.py walks the
source and fails when a constructor is called outside the probe's own judge (the modules named
in ``PROBE_MODULES``), so a new input cannot quietly become evidence: it needs a probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pitstop.core.domain import EvidenceRecord

MAX_WHAT = 200


class Probe(StrEnum):
    NODE_CHECK = "node_check"
    COMPUTE = "compute"
    TELEMETRY = "telemetry"
    SWEEP = "sweep"
    DIAGNOSTIC = "diagnostic"
    VALIDATION = "validation"


# The module whose judge may build each probe's evidence (checked by tests/core/test_evidence.py).
PROBE_MODULES: dict[Probe, str] = {
    Probe.NODE_CHECK: "pitstop.core.corroboration",
    Probe.COMPUTE: "pitstop.core.corroboration",
    Probe.TELEMETRY: "pitstop.core.degraded",
    Probe.SWEEP: "pitstop.core.localise",
    Probe.DIAGNOSTIC: "pitstop.core.diagnose",
    Probe.VALIDATION: "pitstop.core.checks",
}

_TOKEN = object()  # held by this module alone: Evidence(...) without it raises


@dataclass(frozen=True)
class Evidence:
    """One finding of one of Pitstop's own probes (see the module docstring for who makes it)."""

    probe: Probe
    node: str
    what: str  # the finding, in a person's words
    at: float | None  # when the finding was printed (a kernel line) or observed (epoch s)
    gpu: str | None = None  # the GPU's PCI address, when the finding names one
    xid: int | None = None
    sxid: int | None = None
    symptom: str | None = None  # a degraded node's symptom, or a hang's finding
    event: str | None = None  # a system event's kind (preemption, host_error, ...)
    _token: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._token is not _TOKEN:
            raise TypeError("Evidence is made only by a probe's constructor in core/evidence.py")

    def record(self) -> EvidenceRecord:
        """What the incident keeps (JSON: Firestore and the notifications carry it)."""
        return {
            "probe": str(self.probe),
            "node": self.node,
            "what": self.what[:MAX_WHAT],
            "at": self.at,
            "gpu": self.gpu,
            "xid": self.xid,
            "sxid": self.sxid,
            "symptom": self.symptom,
            "event": self.event,
        }


def _new(
    probe: Probe,
    node: str,
    what: str,
    at: float | None,
    *,
    gpu: str | None = None,
    xid: int | None = None,
    sxid: int | None = None,
    symptom: str | None = None,
    event: str | None = None,
) -> Evidence:
    return Evidence(probe, node, what[:MAX_WHAT], at, gpu, xid, sxid, symptom, event, _TOKEN)


# -- the corroboration check on the node (core/corroboration.py) ---------------------------------


def kernel_line(node: str, code: int, nvswitch: bool, pci: str, printed_at: float) -> Evidence:
    """An NVRM Xid (or NVSwitch SXid) line the kernel itself printed (facility kern), dated."""
    name = f"SXid {code}" if nvswitch else f"Xid {code}"
    what = f"kernel ring buffer: {name} on {pci} (kernel facility)"
    if nvswitch:
        return _new(Probe.NODE_CHECK, node, what, printed_at, gpu=pci, sxid=code)
    return _new(Probe.NODE_CHECK, node, what, printed_at, gpu=pci, xid=code)


def node_condition(node: str, what: str, xid: int, pci: str | None, changed_at: float | None) -> Evidence:
    """A GKE Node condition set on the node (device plugin from NVML, NPD from /dev/kmsg)."""
    return _new(Probe.NODE_CHECK, node, what, changed_at, gpu=pci, xid=xid)


def gpu_state(node: str, what: str, gpu: str | None) -> Evidence:
    """What ``nvidia-smi -q`` shows now (GPUs lost or missing, a row remap pending or failed)."""
    return _new(Probe.NODE_CHECK, node, what, None, gpu=gpu)


def scheduler_state(node: str, what: str) -> Evidence:
    """slurmctld's own view of the node (its slurmd stopped answering)."""
    return _new(Probe.NODE_CHECK, node, what, None)


# -- Compute's own record of the VM (core/corroboration.judge_system) -----------------------------


def compute_record(node: str, event: str, what: str, at: float | None) -> Evidence:
    """Compute's ``instances.get`` shows the VM went through ``event`` (its own timestamp)."""
    return _new(Probe.COMPUTE, node, what, at, event=event)


# -- the node's own telemetry (core/degraded.py) -------------------------------------------------


def telemetry_reading(node: str, symptom: str, what: str, read_at: float | None) -> Evidence:
    """The node's own series for ``symptom`` over the line, read by Pitstop (not the alert's value)."""
    return _new(Probe.TELEMETRY, node, what, read_at, symptom=symptom)


# -- a hung job's localisation (core/localise.py) ------------------------------------------------


def sweep_finding(node: str, what: str, measured_at: float | None, xid: int | None = None) -> Evidence:
    """A node of the hung job whose own tools (or ring links) show a fault its peers do not."""
    return _new(Probe.SWEEP, node, what, measured_at, xid=xid, symptom="hang")


# -- the diagnostic and the validation on the fenced node ------------------------------------------


def diagnostic_finding(node: str, what: str, gpu: str | None) -> Evidence:
    """A hardware finding of the diagnostic (nvidia-smi, NVLink, DCGM) on the fenced node."""
    return _new(Probe.DIAGNOSTIC, node, what, None, gpu=gpu)


def validation_finding(node: str, what: str) -> Evidence:
    """GPUs missing on the repaired node, as the validation's own ``nvidia-smi -q`` counted them."""
    return _new(Probe.VALIDATION, node, what, None)


# -- what a disruptive op runs on (services/actuate: the handler of every disruptive op takes one) -


@dataclass(frozen=True)
class Waiver:
    """Why a disruptive op runs without a node check's Evidence: the policy turned the check off
    (``corroboration.enabled: false``), or the incident's kind is not a log line's claim and has a
    gate of its own that its op applies (a degraded node's own reading, a hang's culprit, a Vertex
    AI job read back from Vertex AI)."""

    why: str


Warrant = Evidence | Waiver


def recorded(rec: object, node: str | None) -> Evidence | None:
    """The Evidence a confirmed check kept on the incident, read back for the op it warrants.

    The record is Pitstop's own, in its own database (a writer there acts as Pitstop:
    schemas/inputs.yaml ``firestore``), so reading it back is not believing an input. None unless
    it is a confirmed check's whole record about this node, from a probe this module knows."""
    if not isinstance(rec, dict) or rec.get("confirmed") is not True:
        return None
    ev = rec.get("evidence")
    if not isinstance(ev, dict) or ev.get("node") != node or ev.get("probe") not in set(Probe):
        return None
    at, what = ev.get("at"), ev.get("what")
    return _new(
        Probe(ev["probe"]),
        str(node),
        what if isinstance(what, str) else "",
        float(at) if isinstance(at, int | float) else None,
        gpu=_str(ev.get("gpu")),
        xid=_int(ev.get("xid")),
        sxid=_int(ev.get("sxid")),
        symptom=_str(ev.get("symptom")),
        event=_str(ev.get("event")),
    )


def describe(w: Warrant) -> str:
    """One line for the log and the person: what the op rests on."""
    if isinstance(w, Waiver):
        return f"waived: {w.why}"
    return f"{w.probe} on {w.node}: {w.what}"


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
