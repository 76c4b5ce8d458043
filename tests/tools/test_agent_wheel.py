"""The Slurm agent as a wheel (`make agent-wheel`) and its startup script (infra/slurm/startup-agent.sh).

The wheel format checked here is the binary distribution format
(packaging.python.org/specifications/binary-distribution-format/): RECORD lists every file with
its urlsafe-base64 sha256 (no padding) and size. pip installs it into a fresh virtualenv; what
the agent imports from outside the standard library comes from the test's own environment (a .pth
line to its site-packages, which loads no editable install of pitstop), so nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pitstop.tools import agent_wheel

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "slurm" / "startup-agent.sh"
SA = "pitstop-slurm-a3@my-train-proj.iam.gserviceaccount.com"
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_NO_DEPS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agent_wheel.build(tmp_path_factory.mktemp("dist"))


def _with_our_deps(venv: Path) -> None:
    """The agent's third-party imports (google-cloud-pubsub, google-auth, typing-extensions) from
    this environment: a .pth line appends the directory, without running its .pth files."""
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")


def test_the_wheel_holds_the_agent_and_what_it_imports_and_its_record_is_true(wheel: Path) -> None:
    assert wheel.name == f"pitstop_slurm_agent-{agent_wheel._version()}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        record = whl.read(f"{info}/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if name == f"{info}/RECORD":
                assert digest == size == ""
                continue
            data = whl.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={want}", len(data)), name
        assert {ln.split(",")[0] for ln in record} == names
        meta = whl.read(f"{info}/METADATA").decode()
    assert "pitstop/agent/slurm/cli.py" in names and "pitstop/core/slurm_wire.py" in names
    assert not any(n.startswith(("pitstop/tools/", "pitstop/services/", "pitstop/local/")) for n in names)
    assert "pitstop/adapters/gke.py" not in names and "pitstop/adapters/log.py" in names
    requires = [ln.split(": ", 1)[1] for ln in meta.splitlines() if ln.startswith("Requires-Dist: ")]
    assert [r.split(">=")[0] for r in requires] == list(agent_wheel.REQUIRES)
    _, outside = agent_wheel.closure()
    assert outside == {"google", "typing_extensions"}  # google-cloud-pubsub (and its google-auth)
    assert agent_wheel.build(wheel.parent / "again").read_bytes() == wheel.read_bytes()  # reproducible


def _runs_alone(venv: Path) -> None:
    """The installed wheel's entry points answer, and pitstop there is the agent's part only."""
    version = subprocess.run(
        [venv / "bin" / "pitstop-slurm-agent", "--version"], capture_output=True, text=True, timeout=60
    )
    assert version.stdout.strip() == f"pitstop-slurm-agent {agent_wheel._version()}", version.stderr
    usage = subprocess.run(
        [venv / "bin" / "python", "-m", "pitstop.agent.slurm", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 0 and "--impersonate-service-account" in usage.stdout, usage.stderr
    probe = "import pitstop, importlib.util as u; print(pitstop.__file__, u.find_spec('pitstop.tools'))"
    where = subprocess.run([venv / "bin" / "python", "-c", probe], capture_output=True, text=True, timeout=60)
    installed = next(venv.glob("lib/python3*/site-packages/pitstop/__init__.py"))
    assert where.stdout.split() == [str(installed), "None"], where.stderr


@pytest.mark.parametrize("script", ["startup-agent.sh", "install-agent.sh", "uninstall-agent.sh"])
def test_the_agent_scripts_parse(script: str) -> None:
    path = ROOT / "infra" / "slurm" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=30).returncode == 0


def test_the_builder_runs_as_a_script_of_the_standard_library(tmp_path: Path, wheel: Path) -> None:
    """How `make agent-wheel` and install-agent.sh run it: a file, with no pitstop importable (-I)."""
    path = ROOT / "functions" / "pitstop" / "tools" / "agent_wheel.py"
    proc = subprocess.run(
        [sys.executable, "-I", str(path), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).read_bytes() == wheel.read_bytes()


def test_the_startup_scripts_unit_is_the_shipped_one() -> None:
    text = SCRIPT.read_text()
    embedded = text.split("<<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0] + "\n"
    assert embedded == (ROOT / "infra" / "slurm" / "pitstop-slurm-agent.service").read_text()


def _startup(root: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    calls = root / "systemctl.log"
    fake = root / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    run_env = {**os.environ, **OFFLINE, "PITSTOP_ROOT": str(root), "SYSTEMCTL": str(fake), **(env or {})}
    run_env["PYTHON"] = sys.executable
    return subprocess.run(
        ["bash", str(SCRIPT), *argv], capture_output=True, text=True, env=run_env, timeout=180
    )


def _agent_env(root: Path) -> dict[str, str]:
    lines = (root / "etc" / "pitstop" / "agent.env").read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if ln)


def test_startup_installs_the_wheel_configures_and_starts_once_and_impersonation_reaches_the_agent(
    wheel: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    argv = ("--project", "my-train-proj", "--cluster", "a3", "--wheel", str(wheel))
    first = _startup(root, *argv, "--impersonate-service-account", SA)
    assert first.returncode == 0, first.stderr
    conf = _agent_env(root)
    assert conf["PITSTOP_SUBSCRIPTION"] == "pitstop-slurm-a3-agent" and conf["PITSTOP_IMPERSONATE_SA"] == SA
    assert (root / "etc/systemd/system/pitstop-slurm-agent.service").exists()
    calls = (root / "systemctl.log").read_text().splitlines()
    assert calls == ["daemon-reload", "enable pitstop-slurm-agent", "restart pitstop-slurm-agent"]

    again = _startup(root, *argv, env={"PITSTOP_IMPERSONATE_SA": SA})  # the same, the SA from the env
    assert again.returncode == 0, again.stderr
    assert (root / "systemctl.log").read_text().splitlines()[3:] == [
        "enable pitstop-slurm-agent",
        "start pitstop-slurm-agent",  # nothing changed: no reinstall, no restart
    ]
    assert "current" in again.stdout

    # The agent, run as the unit runs it (agent.env in its environment), calls Google as SA: the
    # credentials it builds impersonate SA from the VM's own (here: a stand-in user credential).
    venv = root / "opt" / "pitstop" / "venv"
    _with_our_deps(venv)
    _runs_alone(venv)
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"})
    )
    probe = (
        "from pitstop.agent.slurm import cli, credentials\n"
        "a = cli.parse_args(['--subscription', 's', '--results-topic', 't'])\n"
        "print(credentials.for_account(a.impersonate_service_account).service_account_email)\n"
    )
    env = {**os.environ, **conf, "GOOGLE_APPLICATION_CREDENTIALS": str(adc)}
    out = subprocess.run(
        [venv / "bin" / "python", "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.strip() == SA, out.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--cluster", "a3", "--wheel", "x.whl"), "--project"),
        (("--project", "my-train-proj", "--cluster", "a3", "--wheel", "x.tar.gz"), "--wheel"),
        (
            (
                "--project",
                "my-train-proj",
                "--cluster",
                "a3",
                "--wheel",
                "x.whl",
                "--impersonate-service-account",
                "me@gmail.com",
            ),
            "not a service account email",
        ),
    ],
)
def test_startup_refuses_bad_input_before_touching_anything(
    tmp_path: Path, argv: tuple[str, ...], message: str
) -> None:
    proc = _startup(tmp_path, *argv)
    assert proc.returncode == 2 and message in proc.stderr
    assert not (tmp_path / "opt").exists() and not (tmp_path / "etc").exists()


def test_the_agent_refuses_an_impersonation_target_that_is_not_a_service_account() -> None:
    from pitstop.agent.slurm import credentials

    assert credentials.for_account(None) is None and credentials.for_account("") is None
    with pytest.raises(SystemExit, match="not a service account email"):
        credentials.for_account("someone@example.com")
