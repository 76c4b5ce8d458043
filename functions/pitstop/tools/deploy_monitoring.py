"""deploy's Cloud Monitoring alert policies and notification channel, run in-process.

gcloud's GA surface has no ``monitoring policies`` or ``channels`` (only alpha and beta), so these
steps are REST calls (adapters.monitoring.AlertConfig) written as commands of their own: argv
``[API, METHOD, PATH, field=value...]``. deploy's machinery (check, update, delete, captures) runs
them through the runner ``runner`` makes, which hands every other command to gcloud; a dry run
shows each as its REST call. GET prints the names of the members whose fields match; POST and
PATCH send a body made of the fields (``from=FILE``: the JSON file's fields) and print the name.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
from collections.abc import Callable, Mapping
from pathlib import Path

from pitstop.adapters.monitoring import MONITORING_API, AlertConfig

API = "monitoring-v3"  # argv[0] of a command run here, never by gcloud
ENDPOINT_ENV = "CLOUDSDK_API_ENDPOINT_OVERRIDES_MONITORING"  # gcloud's override, honoured the same way
Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def is_api(argv: list[str]) -> bool:
    return argv[:1] == [API]


def line(argv: list[str], inline: bool = False) -> str:
    """The REST call, as a dry run shows it (``inline``: its fields in parentheses, not a comment)."""
    method, path, *fields = argv[1:]
    what = f"{'names where' if method == 'GET' else 'body:'} {', '.join(fields)}"
    call = f"{method} {MONITORING_API}v3/{path}"
    return call if not fields else f"{call} ({what})" if inline else f"{call}  # {what}"


def body(fields: list[str]) -> dict[str, object]:
    """A request body from ``key=value`` fields: ``from`` a JSON file, ``labels.K`` a label, a
    comma-separated ``notificationChannels``."""
    out: dict[str, object] = {}
    labels: dict[str, str] = {}
    for f in fields:
        key, value = f.split("=", 1)
        if key == "from":
            out.update(json.loads(Path(value).read_text()))
        elif key.startswith("labels."):
            labels[key.removeprefix("labels.")] = value
        else:
            out[key] = value.split(",") if key == "notificationChannels" else value
    return {**out, "labels": labels} if labels else out


def _call(config: AlertConfig, argv: list[str]) -> str:
    method, path, *fields = argv[1:]
    if method == "GET":
        wanted = dict(f.split("=", 1) for f in fields)
        return "".join(f"{n}\n" for n in config.names(path, wanted["displayName"]))
    got = config.call(method, path, body(fields) if method in ("POST", "PATCH") else None)
    return str(got.get("name", ""))


def runner(run: Runner, env: Mapping[str, str]) -> Runner:
    """``run`` for gcloud's commands, this module for API's: authorised by gcloud's access token,
    at gcloud's endpoint override for Monitoring when ``env`` sets one (a local fake)."""
    configs: list[AlertConfig] = []

    def go(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if not is_api(argv):
            return run(argv)
        if not configs:
            token = run(["auth", "print-access-token"])
            if token.returncode != 0:
                return subprocess.CompletedProcess(argv, 1, "", token.stderr)
            configs.append(AlertConfig(token.stdout.strip(), env.get(ENDPOINT_ENV) or None))
        try:
            return subprocess.CompletedProcess(argv, 0, _call(configs[0], argv), "")
        except urllib.error.HTTPError as e:
            return subprocess.CompletedProcess(
                argv, 1, "", f"{line(argv)}: HTTP {e.code}: {e.read().decode()}"
            )
        except OSError as e:
            return subprocess.CompletedProcess(argv, 1, "", f"{line(argv)}: {e}")

    return go
