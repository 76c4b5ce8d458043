"""Believe evidence only after checking it: where a driver line came from, and what it may start.

Three pure pieces, all total:

* :func:`text_provenance` — given a LogEntry that carries a text line, which text is the
  evidence and whether a sender on the VM could have written it. Only the systemd journal's
  trusted ``_TRANSPORT`` field (set by journald itself, never by the writer) says a line came
  from the kernel; text syslog files, serial-console output (the guest's own bytes, with no
  record of the writer) and journal entries of any other transport are ``unverified``.
* :func:`allowed_action` / :func:`decide` — given the event's trust, the action proposed for
  it (by the classifier, or after the engine's escalation) and the policy's
  ``trust.text_syslog`` knob, the action this evidence alone may start and why.
* :func:`xid_condition_confirms` / :func:`corroborated` — a second signal the writer of a line
  cannot set: on GKE, the GPU device plugin's ``XidCriticalError`` Node condition (from NVML, for
  the Xids it watches, under the node's current boot) makes an unverified Xid line verified.
  Ingest reads the Node (adapters/gke/node.py); the rule is here.

Unverified evidence is always recorded (the engine keeps and notifies it). With
``text_syslog: record`` (the default) it starts nothing; with ``act`` it may fence, reset
and reboot, but never replace a host on its own (REPLACE_NODE is lowered to REBOOT_NODE).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from pitstop.core.actions import RANK, Action
from pitstop.core.catalog import default_xid_policy
from pitstop.core.domain import FaultEvent
from pitstop.core.policy import Policy

VERIFIED = "verified"
UNVERIFIED = "unverified"
TRUST_LEVELS = (VERIFIED, UNVERIFIED)
TEXT_SYSLOG_MODES = ("record", "act")
DEFAULT_TEXT_SYSLOG = "record"
# The strongest action unverified evidence may start under ``act``: it is reversible.
UNVERIFIED_CEILING: str = Action.REBOOT_NODE.value
# Kinds whose one step reads its subject back from the platform's own API, and acts only on that
# answer (a Vertex AI job: customJobs.get, core/vertex.py): the line only names what to read, so it
# may start that step whatever its trust; what the API says decides, never the line.
READ_BACK_KINDS = frozenset({"vertex_job"})

KERNEL_TRANSPORT = "kernel"
KERNEL_FACILITY = "0"  # the kernel's own records; user-space writes to /dev/kmsg are forced to LOG_USER
# journald's transports (systemd.journal-fields(7)); only these fixed words are ever echoed.
_TRANSPORTS = frozenset({"audit", "driver", "syslog", "journal", "stdout", "kernel"})

WHY_JOURNAL_KERNEL = "systemd journal, _TRANSPORT=kernel: set by journald, not by the sender"
WHY_TEXT_SYSLOG = "text syslog: anyone on the VM can write this line"
WHY_LEGACY_AGENT = "text syslog (legacy logging agent): anyone on the VM can write this line"
WHY_NO_TRANSPORT = "journal entry without _TRANSPORT=kernel: any process on the VM can write this line"
WHY_USER_KMSG = (
    "journal kernel transport with a user-space syslog facility: written to /dev/kmsg from user space"
)
WHY_NO_TEXT = "no text payload"
# GCE serial-port logging (log id serialconsole.googleapis.com/serial_port_1_output): the console
# bytes the guest wrote. The kernel prints there, but so can any process that may write the
# serial device, and the entry keeps no record of which wrote it.
WHY_SERIAL_CONSOLE = "serial console output: written by the guest, any process on the VM can write this line"
SERIAL_PORT_LOG = re.compile(r"serialconsole\.googleapis\.com(?:%2F|/)serial_port_[1-4]_output", re.I)


class Provenance(NamedTuple):
    """The text an entry carries, and how far it can be believed (one per entry: a tuple is cheap)."""

    text: str | None
    trust: str
    reason: str
    carrier: str  # journald | syslog | legacy_agent | serial_console | none


def _journald(jp: Mapping[str, object]) -> Provenance:
    msg = jp.get("MESSAGE")
    text = msg if isinstance(msg, str) else None  # journald sends binary messages as byte arrays
    transport = jp.get("_TRANSPORT")
    if transport != KERNEL_TRANSPORT:
        why = WHY_NO_TRANSPORT
        if isinstance(transport, str) and transport in _TRANSPORTS:
            why = f"{why} (this one came in by the {transport} transport)"
        return Provenance(text, UNVERIFIED, why, "journald")
    facility = jp.get("SYSLOG_FACILITY")
    if facility is not None and facility != KERNEL_FACILITY:
        return Provenance(text, UNVERIFIED, WHY_USER_KMSG, "journald")
    return Provenance(text, VERIFIED, WHY_JOURNAL_KERNEL, "journald")


def text_provenance(entry: Mapping[str, object]) -> Provenance:
    """Which text of a LogEntry is the evidence, and its trust. Never raises.

    A journald-shaped payload (``jsonPayload.MESSAGE``: the Ops Agent ``systemd_journald``
    receiver, GKE ``node-journal``) is judged, and parsed, by its MESSAGE alone, so the trust
    always belongs to the text that is read.
    """
    jp = entry.get("jsonPayload")
    if isinstance(jp, Mapping) and "MESSAGE" in jp:
        return _journald(jp)
    if isinstance(jp, Mapping) and "message" in jp:
        msg = jp["message"]
        return Provenance(msg if isinstance(msg, str) else None, UNVERIFIED, WHY_TEXT_SYSLOG, "syslog")
    tp = entry.get("textPayload")
    ln = entry.get("logName")
    if isinstance(tp, str) and isinstance(ln, str) and SERIAL_PORT_LOG.search(ln[-80:]):
        return Provenance(tp, UNVERIFIED, WHY_SERIAL_CONSOLE, "serial_console")
    if isinstance(tp, str):
        return Provenance(tp, UNVERIFIED, WHY_LEGACY_AGENT, "legacy_agent")
    return Provenance(None, UNVERIFIED, WHY_NO_TEXT, "none")


@dataclass(frozen=True, slots=True)
class TrustDecision:
    """What one piece of evidence may start.

    ``action`` replaces the proposed action in every later decision. When ``lowered``, the
    engine keeps the event anyway (a record-only incident when ``action`` is NONE), adds
    ``reason`` to the incident's reason and notifies.
    """

    action: str
    proposed: str
    reason: str

    @property
    def lowered(self) -> bool:
        return self.action != self.proposed


def allowed_action(
    trust: str, proposed: str, text_syslog: str = DEFAULT_TEXT_SYSLOG, why: str = ""
) -> TrustDecision:
    """The pure rule. An unknown trust or mode counts as the stricter one (fail closed)."""
    if trust == VERIFIED or proposed == Action.NONE:
        return TrustDecision(proposed, proposed, "")
    source = f"unverified evidence ({why})" if why else "unverified evidence"
    if text_syslog == "act" and proposed in RANK:
        if RANK[proposed] <= RANK[UNVERIFIED_CEILING]:
            return TrustDecision(proposed, proposed, "")
        return TrustDecision(
            UNVERIFIED_CEILING,
            proposed,
            f"{source} never replaces a host by itself: {proposed} lowered to {UNVERIFIED_CEILING}"
            " until a diagnostic or a verified signal confirms it",
        )
    mode = text_syslog if text_syslog in TEXT_SYSLOG_MODES else "not a known mode"
    return TrustDecision(
        Action.NONE.value,
        proposed,
        f"{source}: recorded and notified, not acted on"
        f" ({proposed} proposed; policy trust.text_syslog is {mode})",
    )


def decide(ev: Mapping[str, object], policy: Policy, action: str | None = None) -> TrustDecision:
    """:func:`allowed_action` for a FaultEvent: ``action`` defaults to the event's own proposal.

    Pass the action after escalation (ladder, lemon host) so history cannot turn unverified
    evidence into more than it may start.
    """
    src = ev.get("source")
    src = src if isinstance(src, Mapping) else {}
    trust = src.get("trust")
    why = src.get("trust_reason")
    proposed = action if action is not None else str(ev.get("action", Action.NONE))
    if ev.get("kind") in READ_BACK_KINDS:
        return TrustDecision(proposed, proposed, "")
    return allowed_action(
        trust if isinstance(trust, str) else UNVERIFIED,
        proposed,
        policy.trust_text_syslog,
        why if isinstance(why, str) else "",
    )


# A VM created this long after the first line of evidence is a later VM of the same name (clocks
# of the logging agent and of Compute Engine may disagree by a little).
CREATED_AFTER_MARGIN_S = 5.0


def vm_identity_problem(
    node: Mapping[str, object], first_seen: float, live_id: str | None, created: float | None
) -> str | None:
    """Why the live VM is not the one the evidence names (None when it is, as far as can be told).

    Checked before the node is touched: the numeric id the log entry carries (set by the
    logging pipeline from the VM's metadata, not by the line's text) must be the live VM's, and
    the live VM must have existed when the first line was logged. A line about a VM that was
    since deleted and recreated under the same name says nothing about the new one.
    """
    name = node.get("instance")
    want = node.get("instance_id")
    if want and live_id and str(want) != str(live_id):
        return f"the evidence names VM id {want}; {name} is now VM id {live_id}"
    if created is not None and created > first_seen + CREATED_AFTER_MARGIN_S:
        return (
            f"{name} was created {int(created - first_seen)} s after the first line of evidence:"
            " the evidence is about an earlier VM of that name"
        )
    return None


# -- a second, trusted signal for a GKE node's text line -----------------------------------------
# GKE's GPU device plugin learns Xids from NVML's event API, not from any text, and for the Xids it
# watches (schemas/xid-policy.yaml ``gke_device_plugin_xids``) sets the node condition
# XidCriticalError: reason a JSON map {"<xid>": true}, message the node's bootID; a new boot clears
# it (container-engine-accelerators pkg/gpu/nvidia/health_check/health_checker.go; reference/gke.md
# §2). A process on the VM that can write the serial console cannot write the Node's status.
XID_CONDITION = "XidCriticalError"
WHY_XID_CONDITION = (
    "corroborated by the node's XidCriticalError condition (GKE GPU device plugin, from NVML events)"
)


def wants_corroboration(ev: Mapping[str, object], watched: Collection[int] | None = None) -> bool:
    """An unverified Xid line that a GKE node's device plugin would also have seen.

    ``watched``: the Xids the device plugin watches (the XID policy's list by default).
    """
    src = ev.get("source")
    if watched is None:
        watched = default_xid_policy().device_plugin_xids
    return (
        isinstance(src, Mapping)
        and src.get("trust") != VERIFIED
        and ev.get("kind") == "gpu_xid"
        and ev.get("xid") in watched
    )


def xid_condition_confirms(node_obj: Mapping[str, object], xid: int) -> str | None:
    """Why the Node's own XidCriticalError condition confirms ``xid`` on its current boot, or None.

    All of: the condition is True, its reason map names the Xid, and its message is the bootID the
    node runs now (a condition of an earlier boot says nothing about this one).
    """
    status = node_obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    info = status.get("nodeInfo")
    boot = info.get("bootID") if isinstance(info, Mapping) else None
    conds = status.get("conditions")
    for c in conds if isinstance(conds, list) else []:
        if not (isinstance(c, Mapping) and c.get("type") == XID_CONDITION and c.get("status") == "True"):
            continue
        if not (isinstance(boot, str) and boot and c.get("message") == boot):
            return None
        try:
            xids = json.loads(str(c.get("reason") or ""))
        except ValueError:
            return None
        if isinstance(xids, dict) and xids.get(str(xid)) is True:
            return f"{WHY_XID_CONDITION} for Xid {xid} on the current boot"
    return None


def corroborated(ev: FaultEvent, why: str) -> FaultEvent:
    """The event, believed on the second signal; the line's own trust stays in the reason."""
    src = ev["source"].copy()
    line = src.get("trust_reason") or "unverified line"
    src["trust"], src["trust_reason"] = VERIFIED, f"{why}; the line itself: {line}"[:512]
    reason = ev["reason"].replace(f"unverified: {line}", f"corroborated: {why}")[:512]
    return {**ev, "source": src, "reason": reason}
