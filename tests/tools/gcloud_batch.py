"""The real gcloud, one interpreter for a whole test module (tests/tools/gcloud_worker.py).

Each `gcloud` start-up costs about a second of CPU (several on a loaded machine) before it parses
anything: a deploy test that runs a few hundred commands spent minutes starting interpreters.
`GcloudWorker` starts gcloud's own Python once and sends it each command: `run` is a
`deploy.Runner`, and `path()` a PATH whose first `gcloud` (tests/tools/gcloud_shim.py) forwards to
the same worker, for a process under test (`pitstop deploy`) to find as it would find gcloud.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from tests.tools import gcloud_shim

WORKER = Path(__file__).with_name("gcloud_worker.py")
SHIM = Path(__file__).resolve().with_name("gcloud_shim.py")
OFFLINE = {  # no update check, usage report or metadata server: nothing leaves the machine
    "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
    "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
    "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
}


def send(path: str, argv: list[str], cwd: str) -> subprocess.CompletedProcess[str]:
    """One command through the worker listening on `path`, as subprocess.run would report it."""
    rc, out, err = gcloud_shim.request(path, argv, cwd)
    return subprocess.CompletedProcess(["gcloud", *argv], rc, out.decode(), err.decode())


@functools.cache
def sdk() -> tuple[str, str, bool]:
    """gcloud's interpreter, its SDK root and whether it runs with site-packages, as `gcloud info`
    reports them (bin/gcloud's own choice, which a test should not re-derive)."""
    info = subprocess.run(
        ["gcloud", "info", "--format=json(basic.python_location,basic.site_packages,installation)"],
        capture_output=True,
        text=True,
        env={**os.environ, **OFFLINE},
        timeout=300,
        check=True,
    )
    found = json.loads(info.stdout)
    basic = found["basic"]
    return basic["python_location"], found["installation"]["sdk_root"], bool(basic.get("site_packages"))


class GcloudWorker:
    """gcloud's interpreter running commands for one environment (the fake's endpoints)."""

    def __init__(self, env: Mapping[str, str], workdir: Path) -> None:
        python, root, site_packages = sdk()
        self.sockdir = tempfile.mkdtemp(prefix="gcloud-")  # short: a socket's path fits in 107 bytes
        self.socket = os.path.join(self.sockdir, "sock")
        self.errors = workdir / "gcloud-worker.stderr"
        # what bin/gcloud exports before it starts lib/gcloud.py
        worker_env = {**env, "CLOUDSDK_ROOT_DIR": root, "CLOUDSDK_ENCODING": "UTF-8"}
        worker_env["PYTHONIOENCODING"] = "UTF-8"
        flags = []
        if site_packages:
            worker_env["CLOUDSDK_PYTHON_SITEPACKAGES"] = "1"
        else:
            flags = ["-S"]
        worker_env.pop("PYTHONHOME", None)
        with self.errors.open("w") as err:
            self.proc = subprocess.Popen(
                [python, *flags, str(WORKER), root, self.socket],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                env=worker_env,
            )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.close()
            raise RuntimeError(f"gcloud worker did not start: {self.errors.read_text()[-2000:]}")
        self.bin = workdir / "bin"
        self.bin.mkdir(exist_ok=True)
        shim = self.bin / "gcloud"
        line = shlex.join([sys.executable, "-IS", str(SHIM), self.socket])
        shim.write_text(f'#!/bin/sh\nexec {line} "$@"\n')
        shim.chmod(0o755)

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return send(self.socket, argv, os.getcwd())

    def path(self) -> str:
        """PATH with this worker's `gcloud` first."""
        return f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.sockdir, ignore_errors=True)
