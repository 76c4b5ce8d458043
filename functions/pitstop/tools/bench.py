"""Benchmarks (`pitstop bench ...`): speed is measured here, never asserted in tests."""

from __future__ import annotations

import json
import os
import random
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from pitstop.core.classify import Classifier

_XID_LINES = [
    "[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, "
    "Contained: SM (0x1). RST: No, D-RST: No",
    "[Fri Apr  5 21:29:39 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
    "(GPC 1, TPC 3, SM 0): Out Of Range Address",
    "kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c "
    "caused by previous Xid 145",
    "[ 3947.590120] NVRM: Xid (PCI:0000:61:00): 119, pid=123417, name=nv-hostengine, Timeout after 6s of "
    "waiting for RPC response from GPU0 GSP! Expected function 10 (FREE) (0xc0000005 0x0).",
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 "
    "0x00000000 0x00100000 0x00000004)",
]
_NOISE = [
    "systemd[1]: Started Session 42 of user root.",
    "kernel: [ 12.345678] EXT4-fs (sda1): mounted filesystem with ordered data mode.",
    "google_guest_agent[812]: Updating keys for user alice.",
]


_AUDIT_METHODS = [
    "compute.instances.preempted",
    "compute.instances.hostError",
    "compute.instances.upcomingMaintenance",
]


def _gce_instance(i: int) -> dict[str, Any]:
    """The monitored resource a VM's log lines and system events carry."""
    return {
        "type": "gce_instance",
        "labels": {
            "instance_id": str(7_000_000_000 + i),
            "zone": "us-central1-a",
            "project_id": "train-prod",
        },
    }


def _driver_entry(flavour: int, line: str, node: str, i: int) -> dict[str, Any]:
    """A kernel line as each collector ships it: 0 Pitstop's Ops Agent journald receiver (verified),
    1 legacy agent text (unverified), 2 GKE node journal (kernel transport)."""
    if flavour == 0:
        return {
            "logName": "projects/train-prod/logs/pitstop-kernel",
            "jsonPayload": {"MESSAGE": line, "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0"},
            "resource": _gce_instance(i),
            "labels": {"compute.googleapis.com/resource_name": node},
        }
    if flavour == 1:
        return {
            "logName": "projects/train-prod/logs/syslog",
            "textPayload": line,
            "resource": _gce_instance(i),
            "labels": {"compute.googleapis.com/resource_name": node},
        }
    return {
        "logName": "projects/train-prod/logs/node-journal",
        "jsonPayload": {"MESSAGE": line, "_TRANSPORT": "kernel"},
        "resource": {
            "type": "k8s_node",
            "labels": {
                "project_id": "train-prod",
                "location": "us-central1-a",
                "cluster_name": "train",
                "node_name": node,
            },
        },
    }


def _audit_entry(method: str, node: str, i: int) -> dict[str, Any]:
    """A Compute Engine system event (preemption, host error, upcoming maintenance)."""
    return {
        "logName": "projects/train-prod/logs/cloudaudit.googleapis.com%2Fsystem_event",
        "severity": "INFO",
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "status": {"message": "Instance was preempted."},
            "authenticationInfo": {"principalEmail": "system@google.com"},
            "serviceName": "compute.googleapis.com",
            "methodName": method,
            "resourceName": f"projects/train-prod/zones/us-central1-a/instances/{node}",
            "metadata": {
                "maintenanceStatus": "PENDING",
                "type": "SCHEDULED",
                "windowStartTime": "2026-11-22T19:00:00Z",
                "windowEndTime": "2026-11-22T22:00:00Z",
            },
        },
        "resource": _gce_instance(i),
    }


def realistic_mix(n: int, seed: int = 7) -> list[bytes]:
    """A storm-shaped corpus: mostly Xid lines (Ops Agent, legacy agent, GKE), some noise and audit events."""
    rnd = random.Random(seed)  # noqa: S311 - a reproducible corpus, not a secret
    out: list[bytes] = []
    for i in range(n):
        node = f"a3-node-{rnd.randrange(64):03d}"
        base: dict[str, Any] = {
            "insertId": f"{i:012x}",
            "timestamp": "2026-11-21T10:42:31.325309Z",
            "receiveTimestamp": "2026-11-21T10:42:31.782066320Z",
            "severity": "ERROR",
        }
        r = rnd.random()
        if r < 0.80:
            line = rnd.choice(_XID_LINES) if r < 0.70 else rnd.choice(_NOISE)
            base |= _driver_entry(rnd.randrange(3), line, node, i)
        else:
            base |= _audit_entry(rnd.choice(_AUDIT_METHODS), node, i)
        out.append(json.dumps(base).encode())
    return out


def _best_of(runs: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_classify(n: int = 100_000, runs: int = 3) -> dict[str, Any]:
    lines = realistic_mix(n)
    clf = Classifier.default()

    def baseline() -> None:
        for raw in lines:
            json.dumps(json.loads(raw))

    def pipeline() -> None:
        for raw in lines:
            orjson.dumps(clf.classify_bytes(raw))

    t_base = _best_of(runs, baseline)
    t_clf = _best_of(runs, pipeline)
    kinds: dict[str, int] = {}
    for raw in lines[:5000]:
        k = clf.classify_bytes(raw)["kind"]
        kinds[k] = kinds.get(k, 0) + 1
    return {
        "benchmark": "classify",
        "lines": n,
        "classify_lines_per_s": round(n / t_clf),
        "json_roundtrip_lines_per_s": round(n / t_base),
        "cost_vs_json_roundtrip": round(t_clf / t_base, 3),
        "mix_first_5000": kinds,
    }


def storm(lines: int, nodes: int, seconds: float = 10.0, seed: int = 11) -> Iterator[dict[str, Any]]:
    """Push bodies of an Xid storm, made as they are consumed (a million bodies would not fit).

    ``lines`` kernel lines from the Ops Agent's journald receiver (``_TRANSPORT=kernel``:
    evidence Pitstop acts on) across ``nodes`` nodes within ``seconds`` of log time.
    """
    import base64

    rnd = random.Random(seed)  # noqa: S311 - a reproducible corpus, not a secret
    start = 1_800_000_000.0
    texts = _XID_LINES[:2] + _XID_LINES[4:5]
    for i in range(lines):
        node = f"a3-node-{i % nodes:03d}"
        ts = start + seconds * i / lines
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1e6):06d}Z"
        payload = {"MESSAGE": rnd.choice(texts), "SYSLOG_FACILITY": "0", "_TRANSPORT": "kernel"}
        entry = {
            "insertId": f"storm-{i:08d}",
            "logName": "projects/train-prod/logs/pitstop-kernel",
            "timestamp": stamp,
            "jsonPayload": {**payload, "SYSLOG_IDENTIFIER": "kernel", "_HOSTNAME": node},
            "resource": _gce_instance(i % nodes),
            "labels": {"compute.googleapis.com/resource_name": node},
        }
        data = base64.b64encode(json.dumps(entry).encode()).decode()
        yield {"message": {"data": data, "messageId": str(i), "publishTime": stamp}}


def _rss_mib() -> float:
    """This process's resident memory now (Linux), MiB."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS mark (Linux ≥ 4.0), so a peak covers one phase, not the process.

    Without it the peak of a storm would include whatever ran before it in the process (a
    previous run of ``--instances 1,2``, the emulator's start-up).
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mib(since_reset: bool) -> float:
    """Peak resident memory since :func:`_reset_peak_rss` (``VmHWM``), else over the process's life."""
    if since_reset:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- pitstop simulate ----------------------------------------------------------------------------
