"""infra/slurm/uninstall-agent.sh removes what install-agent.sh installs, and keeps the ledger unless
--purge. Run against a directory standing in for / (PITSTOP_ROOT) with a systemctl that records
its arguments: the script's own file operations are real."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "infra" / "slurm"
UNIT = "pitstop-slurm-agent"


def _installed(root: Path) -> None:
    """What install-agent.sh leaves on a controller (and what the running agent wrote)."""
    for path, text in {
        f"etc/systemd/system/{UNIT}.service": (SLURM / f"{UNIT}.service").read_text(),
        "opt/pitstop/venv/bin/python": "",
        "etc/pitstop/agent.env": "PITSTOP_PROJECT=p\n",
        "var/lib/pitstop/agent-ledger.sqlite": "ledger",
        "var/lib/pitstop/checks/x/out": "",
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def _uninstall(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = tmp_path / "systemctl.calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PITSTOP_ROOT": str(tmp_path / "root"), "SYSTEMCTL": str(fake)}
    proc = subprocess.run(
        ["bash", str(SLURM / "uninstall-agent.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_uninstall_stops_the_unit_and_removes_the_agent_keeping_the_ledger(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _installed(root)
    proc, calls = _uninstall(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert calls == [f"disable --now {UNIT}", "daemon-reload"]
    assert not (root / f"etc/systemd/system/{UNIT}.service").exists()
    assert not (root / "opt/pitstop").exists() and not (root / "etc/pitstop").exists()
    assert (root / "var/lib/pitstop/agent-ledger.sqlite").read_text() == "ledger"
    again, calls = _uninstall(tmp_path)  # a second run finds nothing and stops nothing
    assert again.returncode == 0 and "absent" in again.stdout
    assert calls == [f"disable --now {UNIT}", "daemon-reload"]


def test_purge_removes_the_ledger_too(tmp_path: Path) -> None:
    _installed(tmp_path / "root")
    proc, _ = _uninstall(tmp_path, "--purge")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "root/var/lib/pitstop").exists()


def test_an_unknown_flag_changes_nothing(tmp_path: Path) -> None:
    _installed(tmp_path / "root")
    proc, calls = _uninstall(tmp_path, "--everything")
    assert proc.returncode == 2 and "usage" in proc.stderr
    assert calls == [] and (tmp_path / "root/opt/pitstop").exists()


@pytest.mark.parametrize("script", ["install-agent.sh", f"{UNIT}.service"])
def test_every_path_the_install_writes_is_one_the_uninstall_removes(script: str) -> None:
    """A path added to the install (or the unit) must be added to the uninstall too."""
    written = set(
        re.findall(r"/(?:opt|etc|var/lib)/pitstop\b|/etc/systemd/system\b", (SLURM / script).read_text())
    )
    uninstall = (SLURM / "uninstall-agent.sh").read_text()
    assert written and all(path in uninstall for path in written), written
